//! The long-sequence benchmarks of `cargo xtask gpu-check` (the `cuda` feature only): the
//! flash-attention kernel's forward alone at T = 8k, head_dim 128 (TFLOP/s and the fraction of
//! the bf16 tensor-core peak), and a Qwen3-0.6B-shaped model (28 layers, random bf16 weights)
//! through one packed forward+backward at 8k and 16k tokens with flash attention and layer
//! checkpointing: peak device memory (polled from the driver while the step runs), tokens/s
//! and MFU.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use terse_model::flash::{attention, KeyRanges};
use terse_model::{Batch, ForwardOptions, KeepLayers, Qwen3};

/// H200 (and H100 SXM) dense bf16 tensor-core peak, FLOP/s.
const BF16_PEAK: f64 = 989e12;

fn context(dev: &Device) -> Result<Arc<candle_core::cuda_backend::cudarc::driver::CudaContext>> {
    match dev {
        Device::Cuda(c) => Ok(c.cuda_stream().context().clone()),
        _ => bail!("long-context bench: not a CUDA device"),
    }
}

/// The attention forward alone at (1, 16, 8192, 128) bf16, causal, three ways in one run: the
/// tensor-core flash kernel (kernels/flash_tc.cu), the scalar flash kernel (flash_attn.cu) and
/// the composite path (cuBLAS matmuls and (1, 16, 8192, 8192) scores).
pub fn flash_kernel(dev: &Device) -> Result<Value> {
    let (hq, hkv, t, d) = (16usize, 8usize, 8192usize, 128usize);
    let q = Tensor::randn(0f32, 1.0, (1, hq, t, d), dev)?.to_dtype(DType::BF16)?;
    let k = Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev)?.to_dtype(DType::BF16)?;
    let v = Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev)?.to_dtype(DType::BF16)?;
    let ranges = KeyRanges::packed(&[t], t, dev)?;
    // Causal: half of the 2 (QK^T) + 2 (PV) flops per (query, key, dim).
    let flops = 4.0 * (hq * d) as f64 * (t * t) as f64 / 2.0;
    let timed = |f: &dyn Fn() -> candle_core::Result<Tensor>| -> Result<f64> {
        f()?;
        dev.synchronize()?;
        let t0 = Instant::now();
        f()?;
        dev.synchronize()?;
        Ok(t0.elapsed().as_secs_f64())
    };
    let mut row = serde_json::Map::new();
    row.insert("t".into(), json!(t));
    row.insert("head_dim".into(), json!(d));
    for (name, tc) in [("tensor_cores", true), ("scalar", false)] {
        terse_model::flash::set_tensor_cores(tc);
        let secs = timed(&|| attention(&q, &k, &v, &ranges));
        terse_model::flash::set_tensor_cores(terse_model::flash::tensor_cores_by_default(
            std::env::var("TERSE_FLASH_TC").ok().as_deref(),
        ));
        let secs = secs?;
        let frac = flops / secs / BF16_PEAK;
        println!(
            "flash forward ({name}) T={t} head_dim {d}: {:.1} TFLOP/s ({:.2} % of bf16 peak)",
            flops / secs / 1e12,
            100.0 * frac
        );
        row.insert(
            name.into(),
            json!({"seconds": secs, "tflops": flops / secs / 1e12, "peak_fraction": frac}),
        );
    }
    let allowed: Vec<u8> = (0..t * t).map(|x| u8::from(x % t <= x / t)).collect();
    let bias = terse_model::ops::attention_bias(&allowed, 1, t, t, DType::BF16, dev)?;
    let secs = timed(&|| terse_model::ops::gqa_attention(&q, &k, &v, &bias))?;
    println!(
        "attention forward (composite) T={t}: {:.1} TFLOP/s",
        flops / secs / 1e12
    );
    row.insert(
        "composite".into(),
        json!({"seconds": secs, "tflops": flops / secs / 1e12, "peak_fraction": flops / secs / BF16_PEAK}),
    );
    Ok(Value::Object(row))
}

/// Qwen3-0.6B shape, 28 layers: one packed forward+backward at 8k and 16k tokens, whose loss
/// must be finite; checkpointed with every layer recomputed (`"keep": "none"`, the least
/// memory), then as a run's `checkpoint_layers = "auto"` does it, the last layers kept where
/// the free memory holds them (`"keep": "auto"`).
pub fn long_context(dev: &Device, model: &mut Qwen3) -> Result<Value> {
    let before = model.options;
    let mut rows = vec![];
    for (keep, name) in [(KeepLayers::Count(0), "none"), (KeepLayers::Auto, "auto")] {
        let mut options = ForwardOptions::default();
        options.flash = true;
        options.flash_min_tokens = 0;
        options.checkpoint_layers = true;
        options.keep_layers = keep;
        model.options = options;
        let result = long_context_runs(dev, model);
        model.options = before;
        for mut r in result?.as_array().cloned().unwrap_or_default() {
            r["keep"] = name.into();
            rows.push(r);
        }
    }
    Ok(Value::Array(rows))
}

/// The long-context steps' tokens: two sequences of 5/8 and 3/8 of `t`, deterministic ids
/// below `v - 1`.
pub fn packed_rows(t: usize, v: usize) -> Vec<Vec<u32>> {
    [t * 5 / 8, t - t * 5 / 8]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|j| ((i * 131 + j * 17) % (v - 1)) as u32)
                .collect()
        })
        .collect()
}

fn long_context_runs(dev: &Device, model: &Qwen3) -> Result<Value> {
    let ctx = context(dev)?;
    let cfg = model.config.clone();
    let (free_start, total) = ctx.mem_get_info()?;
    let v = cfg.vocab_size;
    let mut out = vec![];
    for t in [8192usize, 16384] {
        let rows = packed_rows(t, v);
        let lens: Vec<usize> = rows.iter().map(Vec::len).collect();
        let batch = Batch::packed(&rows, dev)?;
        let (sel, targets) = batch.next_token_selection();
        dev.synchronize()?;
        let (free0, _) = ctx.mem_get_info()?;
        let (stop, min_free) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(free0)),
        );
        let poller = {
            let (stop, min_free, ctx) = (stop.clone(), min_free.clone(), ctx.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((f, _)) = ctx.mem_get_info() {
                        min_free.fetch_min(f, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        let t0 = Instant::now();
        let loss_value = std::cell::Cell::new(f32::NAN);
        let mut loss = |lp: &Tensor| {
            let l = lp.sum_all()?.neg()?;
            loss_value.set(l.to_dtype(DType::F32)?.to_scalar::<f32>()?);
            Ok(l)
        };
        let result = model.logprob_backward(&batch, &sel, &targets, &mut loss);
        let synced = dev.synchronize();
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let _ = poller.join();
        let grads = result?;
        synced?;
        drop(grads);
        let loss = loss_value.get();
        if !loss.is_finite() {
            bail!("long context T={t}: the loss is {loss}, not finite");
        }
        let min_free = min_free.load(Ordering::Relaxed);
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        let (peak_total, peak_step) = (
            free_start.saturating_sub(min_free),
            free0.saturating_sub(min_free),
        );
        // Model FLOPs: 6 per parameter per token, plus the causal attention (fwd 4·d·Hq per
        // query-key pair, backward twice that), per layer and packed sequence.
        let pairs: f64 = lens.iter().map(|&n| (n * n) as f64 / 2.0).sum();
        let attn = 3.0
            * 4.0
            * (cfg.num_attention_heads * cfg.head_dim) as f64
            * pairs
            * cfg.num_hidden_layers as f64;
        let flops = 6.0 * cfg.num_parameters() as f64 * t as f64 + attn;
        let mfu = flops / secs / BF16_PEAK;
        println!(
            "qwen3-0.6b fwd+bwd T={t} (packed {lens:?}, checkpointed): {:.1} GiB peak in use ({:.1} GiB above the weights), {:.0} tokens/s, MFU {:.1} %",
            gib(peak_total), gib(peak_step), t as f64 / secs, 100.0 * mfu
        );
        out.push(json!({"t": t, "packed": lens, "peak_gib": gib(peak_total), "peak_above_weights_gib": gib(peak_step),
                        "tokens_per_s": t as f64 / secs, "mfu": mfu, "device_total_gib": gib(total),
                        "loss": loss}));
    }
    Ok(Value::Array(out))
}

/// Attention forward+backward through the composite path (cuBLAS matmuls, (B, H, T, T) scores)
/// beside flash, at 1k and 4k tokens (1, 16 heads, 8 KV heads, head size 128, causal): the
/// reference for the flash kernel's speed, and where `model.attention = "auto"` should switch.
pub fn attention_paths(dev: &Device) -> Result<Value> {
    let (hq, hkv, d) = (16usize, 8usize, 128usize);
    let mut out = vec![];
    for t in [1024usize, 4096] {
        let q = candle_core::Var::from_tensor(
            &Tensor::randn(0f32, 1.0, (1, hq, t, d), dev)?.to_dtype(DType::BF16)?,
        )?;
        let k = candle_core::Var::from_tensor(
            &Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev)?.to_dtype(DType::BF16)?,
        )?;
        let v = candle_core::Var::from_tensor(
            &Tensor::randn(0f32, 1.0, (1, hkv, t, d), dev)?.to_dtype(DType::BF16)?,
        )?;
        let ranges = KeyRanges::packed(&[t], t, dev)?;
        let allowed: Vec<u8> = (0..t * t).map(|x| u8::from(x % t <= x / t)).collect();
        let bias = terse_model::ops::attention_bias(&allowed, 1, t, t, DType::BF16, dev)?;
        let time = |flash: bool| -> Result<f64> {
            let once = || -> Result<()> {
                let o = if flash {
                    attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), &ranges)?
                } else {
                    terse_model::ops::gqa_attention(
                        q.as_tensor(),
                        k.as_tensor(),
                        v.as_tensor(),
                        &bias,
                    )?
                };
                let g = o.to_dtype(DType::F32)?.sum_all()?.backward()?;
                drop(g);
                Ok(())
            };
            once()?;
            dev.synchronize()?;
            let t0 = Instant::now();
            once()?;
            dev.synchronize()?;
            Ok(t0.elapsed().as_secs_f64())
        };
        let (flash_s, composite_s) = (time(true)?, time(false)?);
        // The training path's attention (the written layer backward's): in the projections'
        // rows, bf16 in and out, no graph, three kernels.
        let rows = |x: &candle_core::Var| x.as_tensor().transpose(1, 2)?.contiguous(); // (B, T, H, D)
        let (qr, kr, vr) = (rows(&q)?, rows(&k)?, rows(&v)?);
        let dout = qr.ones_like()?;
        let rows_once = || -> Result<()> {
            let (o, lse) = terse_model::flash::attention_rows(&qr, &kr, &vr, &ranges)?;
            terse_model::flash::attention_rows_grad(&qr, &kr, &vr, &ranges, (&o, &lse), &dout)?;
            Ok(())
        };
        rows_once()?;
        dev.synchronize()?;
        let t0 = Instant::now();
        rows_once()?;
        dev.synchronize()?;
        let rows_s = t0.elapsed().as_secs_f64();
        println!(
            "attention fwd+bwd T={t}: flash {flash_s:.4} s, rows (training's) {rows_s:.4} s, composite {composite_s:.4} s"
        );
        out.push(
            json!({"t": t, "flash_s": flash_s, "rows_s": rows_s, "composite_s": composite_s,
                        "flash_over_composite": flash_s / composite_s}),
        );
    }
    Ok(Value::Array(out))
}
