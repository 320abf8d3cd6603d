//! `cargo xtask bench train-memory`: forward+backward of one sequence through a Qwen3-0.6B
//! slice (its head counts and head_dim, 2 layers, the 151,936-token head through the fused
//! log-prob) at T = 1k ... 16k tokens: the peak heap above the weights and tokens/s, the old
//! path (composite attention, every activation kept) against the new one (flash attention and
//! layer checkpointing), measured in the same run. The old path is skipped where its
//! predicted peak would not fit in this machine's available memory, and the table says so.
//! A last row runs the new path with LoRA rank-64 adapters (the base frozen) beside full
//! fine-tuning, and times the merged copy the rollout decodes.

use crate::mem;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Instant;
use terse_model::{Batch, Config, ForwardOptions, Padding, Qwen3};

/// Peak heap above the weights (bytes) and seconds of one forward+backward over one row of
/// `t` tokens.
fn step(m: &Qwen3, t: usize) -> Result<(usize, f64)> {
    let v = m.config.vocab_size as u32;
    let row: Vec<u32> = (0..t).map(|j| ((j * 7919 + 13) as u32) % v).collect();
    let batch = Batch::from_rows(&[row], 0, Padding::Right, m.device())?;
    let (sel, targets) = batch.next_token_selection();
    let base = mem::reset_peak();
    let t0 = Instant::now();
    let mut loss = |lp: &Tensor| lp.sum_all()?.neg();
    let grads = m.logprob_backward(&batch, &sel, &targets, &mut loss)?;
    let secs = t0.elapsed().as_secs_f64();
    let peak = mem::peak_above(base);
    drop(grads);
    Ok((peak, secs))
}

/// MemAvailable of /proc/meminfo in bytes (None where there is no such file).
fn available_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn train_memory(as_json: bool, max_t: usize) -> Result<ExitCode> {
    let dev = Device::Cpu;
    let cfg = Config::synthetic(151_936, 1024, 3072, 2, 16, 8, 128, true)?;
    let mut m = Qwen3::random(cfg.clone(), 0, &dev, DType::F32)?;
    let avail = available_bytes().unwrap_or(usize::MAX);
    let mib = |x: usize| x as f64 / (1 << 20) as f64;
    let mut rows = vec![];
    println!(
        "Qwen3-0.6B slice (2 layers, 16/8 heads, head_dim 128, vocab 151936), one sequence, f32, {} threads",
        candle_core::utils::get_num_threads()
    );
    println!(
        "{:>6} | {:>14} {:>10} | {:>14} {:>10} | memory old/new",
        "T", "old peak MiB", "tok/s", "new peak MiB", "tok/s"
    );
    // One short step of each path first: thread pools, first-touch page faults and the
    // allocator's growth would otherwise land on whichever path runs first.
    for flash in [true, false] {
        m.options = options(flash, flash);
        step(&m, 256)?;
    }
    let mut t = 1024;
    while t <= max_t {
        m.options = options(true, true);
        let (new_peak, new_s) = step(&m, t)?;
        // The composite attention keeps about eleven (heads, T, T) f32 tensors per layer
        // (measured: 7.2 GiB at 2k on this slice).
        let predicted_old = cfg.num_hidden_layers * 11 * cfg.num_attention_heads * t * t * 4;
        let old = if predicted_old < avail / 5 * 4 {
            m.options = options(false, false);
            Some(step(&m, t)?)
        } else {
            None
        };
        let (new_tps, ratio) = (
            t as f64 / new_s,
            old.map(|(p, _)| p as f64 / new_peak as f64),
        );
        // The memory plan's figure for the same step: activations, the gradients, the log-prob
        // chunks (xtask plan adds the weights and the optimizer state on top).
        let chunk = terse_model::logprob::DEFAULT_CHUNK_ROWS * cfg.vocab_size * 4;
        let planned = terse_train::planning::activation_bytes(&cfg, t as u64, 4, true) as usize
            + cfg.num_parameters() * 4
            + 3 * chunk;
        match old {
            Some((p, s)) => println!(
                "{t:>6} | {:>14.0} {:>10.0} | {:>14.0} {:>10.0} | x{:.1}",
                mib(p),
                t as f64 / s,
                mib(new_peak),
                new_tps,
                ratio.unwrap_or(0.0)
            ),
            None => println!(
                "{t:>6} | {:>14} {:>10} | {:>14.0} {:>10.0} | old path skipped: ~{:.0} GiB predicted, {:.0} GiB available",
                "-",
                "-",
                mib(new_peak),
                new_tps,
                predicted_old as f64 / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            ),
        }
        println!(
            "{:>6}   plan: {:.0} MiB for the new path, measured / plan = {:.2}",
            "",
            mib(planned),
            new_peak as f64 / planned as f64
        );
        rows.push(json!({
            "t": t, "plan_mib": mib(planned), "measured_over_plan": new_peak as f64 / planned as f64,
            "new_peak_mib": mib(new_peak), "new_tokens_per_s": new_tps,
            "old_peak_mib": old.map(|(p, _)| mib(p)), "old_tokens_per_s": old.map(|(_, s)| t as f64 / s),
            "old_skipped": old.is_none(), "memory_ratio": ratio,
        }));
        t *= 2;
    }
    // Linear growth: the new path's peak at the largest T over its peak at 1k, against T's ratio.
    let peak_at = |r: &Value| {
        (
            r["t"].as_u64().unwrap_or(0),
            r["new_peak_mib"].as_f64().unwrap_or(0.0),
        )
    };
    if let (Some(first), Some(last)) = (rows.first().map(peak_at), rows.last().map(peak_at)) {
        println!(
            "new path: peak({}) / peak({}) = {:.2} while T grew x{} (peaks include the weight-sized gradients)",
            last.0, first.0, last.1 / first.1, last.0 / first.0.max(1)
        );
    }
    let lora = lora_row(&cfg, &mut m, 1024.min(max_t))?;
    if as_json {
        println!(
            "{}",
            Value::Object(serde_json::Map::from_iter([
                ("train_memory".to_string(), Value::Array(rows)),
                ("lora".to_string(), lora),
            ]))
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Flash attention at every length (or the composite attention), with or without layer
/// checkpointing.
fn options(flash: bool, checkpoint_layers: bool) -> ForwardOptions {
    let mut o = ForwardOptions::default();
    o.flash = flash;
    o.flash_min_tokens = 0;
    o.checkpoint_layers = checkpoint_layers;
    o
}

/// The LoRA row: the same step with rank-64 adapters on every projection (the base frozen),
/// its peak and speed against full fine-tuning's measured here, and the per-step merge that
/// gives the rollout its weights, against the step's time.
fn lora_row(cfg: &Config, full: &mut Qwen3, t: usize) -> Result<Value> {
    let options = options(true, true);
    full.options = options;
    let mut m = Qwen3::random(cfg.clone(), 0, full.device(), DType::F32)?;
    m.options = options;
    let targets: Vec<String> = terse_model::lora::TARGETS
        .iter()
        .map(|t| t.to_string())
        .collect();
    let lc = terse_model::LoraConfig::new(64, 128.0, &targets, terse_model::LoraInit::Kaiming)?;
    let adapters = lc.parameters(cfg);
    m.add_lora(lc, 1)?;
    step(&m, 256)?;
    let (full_peak, full_s) = step(full, t)?;
    let (peak, secs) = step(&m, t)?;
    let t0 = Instant::now();
    let merged = m.merged()?;
    let merge_s = t0.elapsed().as_secs_f64();
    drop(merged);
    let mib = |x: usize| x as f64 / (1 << 20) as f64;
    println!(
        "LoRA r64 ({adapters} adapter parameters), T = {t}: peak {:.0} MiB vs full {:.0} MiB (x{:.2}), {:.0} vs {:.0} tok/s (x{:.2}); the rollout's merged copy takes {:.3} s = {:.2} of a training step",
        mib(peak),
        mib(full_peak),
        peak as f64 / full_peak as f64,
        t as f64 / secs,
        t as f64 / full_s,
        full_s / secs,
        merge_s,
        merge_s / secs
    );
    Ok(json!({
        "t": t, "rank": 64, "adapter_parameters": adapters,
        "peak_mib": mib(peak), "full_peak_mib": mib(full_peak), "peak_over_full": peak as f64 / full_peak as f64,
        "tokens_per_s": t as f64 / secs, "full_tokens_per_s": t as f64 / full_s,
        "merge_s": merge_s, "merge_over_step": merge_s / secs,
    }))
}
