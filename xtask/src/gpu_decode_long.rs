//! gpu-check's `decode_long` row (the `cuda` feature only): decode steps of the Qwen3-0.6B shape
//! at batch 64 over a paged bf16 cache at an 8k mean context (rows from 4k to 12k), where a
//! step is bound by reading K and V. It prints each step's time beside the KV-bandwidth
//! roofline (bytes of K/V read per step / HBM bandwidth), for flash-decoding (the split kernels,
//! the default) and for today's one-block-per-head kernel (`TERSE_FLASH_DECODING=0`) in the
//! same run, and checks that the two give the same logits (max difference, argmax agreement).
//! On the emulated device the shape is scaled down (2 layers, batch 4, a 1k mean context, so a
//! row still spans several 256-slot splits) and gpu.rs nulls the times.
//!
//! Data flow: gpu.rs's plan -> here -> `Qwen3::forward_paged` -> kernels/paged_attention.cu.

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};
use std::time::Instant;
use terse_model::paged::{reset_flash_decoding, set_flash_decoding};
use terse_model::{BlockTable, Config, PagedKvCache, PagedSeq, Qwen3};

/// H200 HBM3e bandwidth (bytes/s), as gpu_bench.rs's roofline.
const HBM_BYTES_PER_S: f64 = 4.8e12;

/// Slots per block of the row's cache: large, so that filling 8k contexts takes few copies
/// (extend_filled writes block by block); the kernels' cost per slot does not depend on it.
const BLOCK: usize = 256;

/// The row's shape: (batch, mean context, timed steps per path).
fn shape(emulated: bool) -> (usize, usize, usize) {
    if emulated {
        (4, 1024, 1)
    } else {
        (64, 8192, 8)
    }
}

/// Row i's context of `b` rows around `mean`: from mean / 2 to 3 mean / 2, evenly.
fn context(i: usize, b: usize, mean: usize) -> usize {
    mean / 2 + i * mean / (b - 1).max(1)
}

/// The emulated device's model: Qwen3-0.6B's heads (16 query, 8 KV, head size 128) on 2 layers
/// with a small hidden size and vocabulary, so the CPU runs a step in seconds.
pub fn emulated_model(dev: &Device) -> Result<Qwen3> {
    let cfg = Config::synthetic(1024, 256, 512, 2, 16, 8, 128, true)?;
    Ok(Qwen3::random(cfg, 0, dev, DType::BF16)?)
}

/// One decode step of every row (one token each, room reserved first); the logits (B, V).
/// gpu_profile.rs's decode step too.
pub(crate) fn step(
    model: &Qwen3,
    cache: &mut PagedKvCache,
    tables: &mut [BlockTable],
    token: u32,
) -> Result<Tensor> {
    for t in tables.iter_mut() {
        ensure!(
            cache.reserve(t, 1)?,
            "decode step: the paged pool is too small"
        );
    }
    let ids = [token];
    let mut seqs: Vec<PagedSeq> = tables
        .iter_mut()
        .map(|t| PagedSeq {
            table: t,
            tokens: &ids,
        })
        .collect();
    Ok(model.forward_paged(&model.decode_weights(), cache, &mut seqs)?)
}

/// Median seconds of `n` steps with flash-decoding on or off (one warm-up step first).
fn time_steps(
    dev: &Device,
    model: &Qwen3,
    cache: &mut PagedKvCache,
    tables: &mut [BlockTable],
    flash: bool,
    n: usize,
) -> Result<f64> {
    set_flash_decoding(flash);
    let mut run = || -> Result<f64> {
        step(model, cache, tables, 7)?;
        dev.synchronize()?;
        let mut times = vec![];
        for i in 0..n {
            let t0 = Instant::now();
            step(model, cache, tables, 11 + i as u32)?;
            dev.synchronize()?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    };
    let out = run();
    reset_flash_decoding();
    out
}

/// The same step from forks of the same tables, through both kernels: max |logit difference|
/// and how many rows pick the same argmax.
fn agreement(
    model: &Qwen3,
    cache: &mut PagedKvCache,
    tables: &[BlockTable],
) -> Result<(f32, usize)> {
    let mut logits = vec![];
    for flash in [true, false] {
        let mut forks: Vec<BlockTable> = tables.iter().map(|t| cache.fork(t)).collect();
        set_flash_decoding(flash);
        let l = step(model, cache, &mut forks, 5);
        for f in &mut forks {
            cache.release(f);
        }
        logits.push(l?.to_dtype(DType::F32)?);
    }
    reset_flash_decoding();
    let diff = (&logits[0] - &logits[1])?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let (a, b) = (
        logits[0].argmax(1)?.to_vec1::<u32>()?,
        logits[1].argmax(1)?.to_vec1::<u32>()?,
    );
    Ok((diff, a.iter().zip(&b).filter(|(x, y)| x == y).count()))
}

/// The row (see the module docs), on the decoding copy rollout reads (`with_decoding_weights`:
/// weights cast once, projections stacked).
pub fn decode_long(dev: &Device, model: &Qwen3, emulated: bool) -> Result<Value> {
    model.with_decoding_weights(|m| decode_long_on(dev, m, emulated))
}

fn decode_long_on(dev: &Device, model: &Qwen3, emulated: bool) -> Result<Value> {
    let (b, mean, n) = shape(emulated);
    let cfg = &model.config;
    let lens: Vec<usize> = (0..b).map(|i| context(i, b, mean)).collect();
    // Room for each row's context, the two paths' steps and the agreement's forks.
    let blocks: usize = lens
        .iter()
        .map(|&l| (l + 2 * n + 4).div_ceil(BLOCK) + 2)
        .sum();
    let mut cache = model.new_paged_cache(BLOCK, blocks, DType::BF16)?;
    let mut tables: Vec<BlockTable> = lens.iter().map(|_| BlockTable::default()).collect();
    for (t, &l) in tables.iter_mut().zip(&lens) {
        ensure!(
            cache.extend_filled(t, l, 0.01)?,
            "decode_long: pool too small"
        );
    }
    dev.synchronize()?;
    let (logits_max_diff, argmax_agree) = agreement(model, &mut cache, &tables)?;
    let flash_s = time_steps(dev, model, &mut cache, &mut tables, true, n)?;
    let reference_s = time_steps(dev, model, &mut cache, &mut tables, false, n)?;
    // K/V read per step: each row's context (about its mean over the timed steps), all
    // layers, bf16.
    let ctx: usize = tables.iter().map(|t| t.len()).sum();
    let kv_bytes = (ctx * model.kv_bytes_per_token(DType::BF16)) as f64;
    let weight_bytes: f64 = model
        .vars()
        .values()
        .map(|t| t.elem_count() as f64 * 2.0)
        .sum();
    let roofline_s = kv_bytes / HBM_BYTES_PER_S;
    println!(
        "decode batch {b}, mean context {mean} ({} layers, bf16 cache): {:.2} ms/step with flash-decoding, {:.2} ms with one block per head; KV-bandwidth roofline {:.2} ms ({:.2} GB of K/V per step at {:.1} TB/s: {:.0} % and {:.0} % of it); logits differ by at most {logits_max_diff:.3e}, argmax agrees on {argmax_agree} of {b} rows",
        cfg.num_hidden_layers,
        flash_s * 1e3,
        reference_s * 1e3,
        roofline_s * 1e3,
        kv_bytes / 1e9,
        HBM_BYTES_PER_S / 1e12,
        100.0 * roofline_s / flash_s,
        100.0 * roofline_s / reference_s,
    );
    Ok(json!({
        "batch": b, "mean_context": mean, "layers": cfg.num_hidden_layers, "block_size": BLOCK,
        "kv_bytes_per_step": kv_bytes, "weight_bytes": weight_bytes,
        "kv_roofline_ms": roofline_s * 1e3,
        "flash_step_ms": flash_s * 1e3, "reference_step_ms": reference_s * 1e3,
        "roofline_over_flash_step": roofline_s / flash_s,
        "roofline_over_reference_step": roofline_s / reference_s,
        "reference_over_flash": reference_s / flash_s,
        "logits_max_diff": logits_max_diff, "argmax_agree": argmax_agree,
    }))
}
