//! `cargo xtask bench model --skeleton`: what one training step asks of the device, for the new
//! path and, in the same run, today's composite path behind `TERSE_FUSED=0` as the baseline.
//! Meant for the emulated device (`cargo xtask fake-gpu -- bench model --skeleton --json`),
//! whose libcuda counts launches, allocations and bytes allocated (fake_gpu/fake_gpu.h's
//! counters, read through bench_decode.rs's `Counters`); elsewhere it reports wall time only.
//!
//! One training step: the packed batch's layer-checkpointed forward and backward through the
//! fused log-prob head (`Qwen3::logprob_backward`), gradient clipping and one AdamW step, on a
//! Qwen3-0.6B-shaped skeleton (bench_decode.rs's `skeleton`: 28 layers, its head layout and
//! vocabulary, hidden size 64).
//!
//! Data flow: `train_step` -> `measure` (a warm-up step per path, then one counted step per
//! path: `step`) -> bench_decode.rs's `per_step` figures -> the printed line and the JSON.

use crate::bench_decode::{per_step, ratio, set_env, skeleton, Counters, Counts};
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;
use terse_model::{Batch, Qwen3};
use terse_optim::{clip_grad_norm, AdamW, AdamWConfig};

/// The switch that turns the new training path into today's composite one.
const BASELINE: (&str, &str) = ("TERSE_FUSED", "0");

/// The packed rows of a step: lengths, so that two sequences share the packed batch.
const ROWS: [usize; 2] = [24, 16];

/// One training step (forward, backward, clipping, AdamW); the counters' growth over it and
/// its wall time.
fn step(
    m: &Qwen3,
    opt: &mut AdamW,
    batch: &Batch,
    counters: Option<&dyn Fn() -> Counts>,
) -> Result<(u64, Option<Counts>)> {
    let (sel, targets) = batch.next_token_selection();
    let before = counters.map(|c| c());
    let t0 = Instant::now();
    let mut loss = |lp: &Tensor| lp.mean_all()?.neg();
    let mut grads = m.logprob_backward(batch, &sel, &targets, &mut loss)?;
    let norm = clip_grad_norm(&mut grads, 1.0)?;
    if !norm.is_finite() {
        bail!("bench model: the skeleton's gradient norm is {norm}, not finite");
    }
    opt.step(m.vars(), &grads, 1e-3)?;
    drop(grads);
    let wall_ns = t0.elapsed().as_nanos() as u64;
    let after = counters.map(|c| c());
    Ok((wall_ns, before.zip(after).map(|(b, a)| a.since(&b))))
}

/// The new path's step and the baseline's (`BASELINE`), each after a warm-up step of its own
/// (module loads and first allocations stay outside the figures), and baseline/new ratios.
fn measure(m: &Qwen3, counters: Option<&dyn Fn() -> Counts>) -> Result<Value> {
    let v = m.config.vocab_size;
    let rows: Vec<Vec<u32>> = ROWS
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| ((i * 131 + j * 17) % v) as u32).collect())
        .collect();
    let batch = Batch::packed(&rows, m.device())?;
    let mut opt = AdamW::new(AdamWConfig::default(), m.vars())?;
    let mut path = |baseline: bool, counted: bool| -> Result<(u64, Option<Counts>)> {
        let old = set_env(BASELINE.0, baseline.then_some(BASELINE.1));
        let r = step(m, &mut opt, &batch, counters.filter(|_| counted));
        set_env(BASELINE.0, old.as_deref());
        r
    };
    for baseline in [false, true] {
        path(baseline, false)?;
    }
    let mut sides = vec![];
    for baseline in [false, true] {
        let (wall_ns, d) = path(baseline, true)?;
        sides.push(Value::Object(per_step(d.as_ref(), 1.0, wall_ns as f64)));
    }
    let [new, baseline]: [Value; 2] = sides
        .try_into()
        .map_err(|_| anyhow::anyhow!("bench model: a path's figures are missing"))?;
    let ratios = json!({
        "launches": ratio(&baseline, &new, "launches_per_step"),
        "alloc_bytes": ratio(&baseline, &new, "alloc_bytes_per_step"),
        "allocs": ratio(&baseline, &new, "allocs_per_step"),
        "host_ms": ratio(&baseline, &new, "host_ms_per_step"),
    });
    let Value::Object(mut new) = new else {
        bail!("bench model: the new path's figures are not an object");
    };
    new.insert("baseline".into(), baseline);
    new.insert("baseline_over_new".into(), ratios);
    Ok(Value::Object(new))
}

/// `cargo xtask bench model --skeleton`.
pub fn train_step(as_json: bool, out: Option<&Path>) -> Result<ExitCode> {
    let spec = if cfg!(feature = "cuda") {
        "cuda:0"
    } else {
        "cpu"
    };
    let (dev, dtype) = terse_model::device::select(spec)?;
    let cfg = skeleton()?;
    let shape = json!({"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size, "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab_size});
    let mut m = Qwen3::random(cfg, 0, &dev, dtype)?;
    // What a CUDA run's `model.checkpoint_layers = "auto"` does: checkpointed, the last layers
    // kept where the free memory holds them (on the emulated device's 16 GiB, all of them).
    m.options.checkpoint_layers = true;
    m.options.keep_layers = terse_model::KeepLayers::Auto;
    let counters = match &dev {
        Device::Cpu => Err("the device is the CPU".to_string()),
        _ => Counters::open("libcuda.so.1"),
    };
    let reader = counters.as_ref().ok().map(|c| move || c.read());
    if let Err(why) = &counters {
        println!("bench model: no device counters ({why}): wall time only");
    }
    let row = measure(&m, reader.as_ref().map(|r| r as &dyn Fn() -> Counts))?;
    print_row(&row);
    let report = json!({
        "bench": "model", "device": spec, "compute_dtype": format!("{dtype:?}"),
        "shape": "skeleton", "model": shape, "packed_rows": ROWS,
        "counters": match &counters { Ok(_) => Value::from("fake-gpu"), Err(w) => Value::from(w.as_str()) },
        "baseline_switch": format!("{}={}", BASELINE.0, BASELINE.1),
        "step": row,
    });
    crate::bench_decode::emit(&report, out, as_json)
}

/// The step's line: the new path's counts and the baseline's, with the ratios.
fn print_row(row: &Value) {
    let f = |v: &Value, k: &str| v[k].as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    let (base, r) = (&row["baseline"], &row["baseline_over_new"]);
    println!(
        "training step: {} launches, {} allocs, {} B allocated, {} ms wall; baseline {} launches, {} allocs, {} B allocated, {} ms wall (x{} fewer launches, x{} fewer bytes allocated)",
        f(row, "launches_per_step"), f(row, "allocs_per_step"), f(row, "alloc_bytes_per_step"),
        f(row, "wall_ms_per_step"), f(base, "launches_per_step"), f(base, "allocs_per_step"),
        f(base, "alloc_bytes_per_step"), f(base, "wall_ms_per_step"),
        f(r, "launches"), f(r, "alloc_bytes"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use terse_model::Config;

    /// On the CPU (no counters) a measurement still runs both paths' steps: wall times, every
    /// counter figure and ratio null, the baseline nested under the new path.
    #[test]
    fn a_cpu_measurement_runs_both_paths_with_null_counters() {
        let cfg = Config::synthetic(64, 32, 64, 2, 4, 2, 16, true).expect("config");
        let mut m = Qwen3::random(cfg, 0, &Device::Cpu, DType::F32).expect("model");
        m.options.checkpoint_layers = true;
        let row = measure(&m, None).expect("measure");
        for side in [&row, &row["baseline"]] {
            assert!(
                side["wall_ms_per_step"].as_f64().is_some_and(|w| w > 0.0),
                "{row}"
            );
            for k in [
                "launches_per_step",
                "alloc_bytes_per_step",
                "allocs_per_step",
            ] {
                assert!(side[k].is_null(), "{k} in {side}");
            }
        }
        assert!(row["baseline_over_new"]["launches"].is_null(), "{row}");
        assert!(row["baseline_over_new"]["alloc_bytes"].is_null(), "{row}");
    }
}
