//! Parity of a whole model: a small random Qwen3 decoding through the kernels against the
//! composite ops, and the training path in bf16 against f32.

use super::common::{diff, row, Row};
use candle_core::{DType, Device, Result, Tensor};

/// A small random Qwen3 with the GPU shapes that matter (head size 128, GQA 2:1).
fn small_config() -> Result<crate::Config> {
    crate::Config::synthetic(1024, 256, 512, 2, 4, 2, 128, true)
}

/// Prefill + 16 greedy decode steps through the kernels (`DecodePath::Kernels`, on the decoding
/// copy whose projections are stacked where the device stacks them) and through the composite
/// ops (`DecodePath::Composite`, the model's own weights) on the same device, the same tokens
/// fed to both: the logits' max difference and how many steps pick a different token.
pub(super) fn model_decode(dev: &Device) -> Result<Vec<Row>> {
    decode_rows(dev, small_config()?, "model")
}

/// `model_decode` for the same shape as a Qwen2 (q/k/v biases, no q/k norm): the kernels path
/// runs the same layer code with the biases added.
pub(super) fn model_decode_qwen2(dev: &Device) -> Result<Vec<Row>> {
    decode_rows(dev, small_config()?.as_qwen2()?, "qwen2 model")
}

fn decode_rows(dev: &Device, config: crate::Config, what: &str) -> Result<Vec<Row>> {
    use crate::cache::DecodePath;
    let dt = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let model = crate::Qwen3::random(config, 7, dev, dt)?;
    let mut fast = model.merged()?;
    fast.stack_projections()?;
    let prompts: Vec<Vec<u32>> = vec![(1..9).collect(), (20..25).collect()];
    let batch = crate::Batch::from_rows(&prompts, 0, crate::Padding::Left, dev)?;
    let (b, t) = batch.input_ids.dims2()?;
    let mask = batch.mask.clone();
    let mut caches = [model.new_cache(b, t + 17)?, model.new_cache(b, t + 17)?];
    let paths = [DecodePath::Kernels, DecodePath::Composite];
    let models = [&fast, &model];
    let snaps = [fast.decode_weights(), model.decode_weights()];
    // The prefill (several slots per row) runs the composite ops on either path.
    let mut logits = vec![];
    for (c, (m, snap)) in caches.iter_mut().zip(models.iter().zip(&snaps)) {
        let (ids, pos) = (&batch.input_ids, &batch.position_ids);
        logits.push(m.forward_cached_with(DecodePath::Composite, snap, c, ids, pos, &mask)?);
    }
    let mut pos: Vec<u32> = prompts.iter().map(|p| p.len() as u32).collect();
    let (mut worst, mut disagree) = (0.0f64, 0usize);
    for _ in 0..16 {
        let next: Vec<u32> = logits[1].argmax(1)?.to_vec1::<u32>()?;
        let other: Vec<u32> = logits[0].argmax(1)?.to_vec1::<u32>()?;
        disagree += next.iter().zip(&other).filter(|(a, b)| a != b).count();
        let ids = Tensor::from_vec(next.clone(), (b, 1), dev)?;
        let p = Tensor::from_vec(pos.clone(), (b, 1), dev)?;
        for (i, (c, path)) in caches.iter_mut().zip(paths).enumerate() {
            let (m, snap) = (models[i], &snaps[i]);
            logits[i] = m.forward_cached_with(path, snap, c, &ids, &p, &vec![1; b])?;
        }
        worst = worst.max(diff(&logits[0], &logits[1])?);
        if worst.is_nan() {
            break;
        }
        pos.iter_mut().for_each(|x| *x += 1);
    }
    let tol = if dev.is_cuda() { 0.1 } else { 2e-4 };
    let paged = paged_worst(&fast, &model, &prompts)?;
    Ok(vec![
        Row {
            name: format!("{what} paged decode logits, stacked kernels vs composite (8 steps)"),
            max_diff: paged,
            tolerance: tol,
        },
        Row {
            name: format!("{what} decode logits, kernels vs composite (16 steps)"),
            max_diff: worst,
            tolerance: tol,
        },
        Row {
            name: format!("{what} decode greedy tokens that differ (of 32)"),
            max_diff: disagree as f64,
            tolerance: if dev.is_cuda() { 1.0 } else { 0.0 },
        },
    ])
}

/// The paged step as rollout runs it, the stacked copy `fast` through the fused paged ops (on
/// CUDA: `paged_qkv`, `swiglu_stacked`, the residual's last add left to the next norm), against
/// `model`'s own weights through the composite paged path: prefill, then 8 greedy steps fed the
/// composite side's tokens -> the logits' max difference.
fn paged_worst(fast: &crate::Qwen3, model: &crate::Qwen3, prompts: &[Vec<u32>]) -> Result<f64> {
    use crate::paged::PagedPath;
    use crate::{BlockTable, PagedSeq};
    let dt = model.compute_dtype();
    let sides = [(fast, PagedPath::Kernels), (model, PagedPath::Composite)];
    let snaps = [fast.decode_weights(), model.decode_weights()];
    let mut caches = [
        fast.new_paged_cache(16, 16, dt)?,
        model.new_paged_cache(16, 16, dt)?,
    ];
    let mut tables: [Vec<BlockTable>; 2] = Default::default();
    let mut logits = vec![];
    for (i, (m, path)) in sides.iter().enumerate() {
        let mut rows = vec![];
        for p in prompts {
            let mut t = BlockTable::default();
            if !caches[i].reserve(&mut t, p.len())? {
                crate::fail!("parity: paged decode pool too small");
            }
            let mut s = [PagedSeq {
                table: &mut t,
                tokens: p,
            }];
            rows.push(m.forward_paged_with(*path, &snaps[i], &mut caches[i], &mut s)?); // (1, V)
            tables[i].push(t);
        }
        logits.push(Tensor::cat(&rows, 0)?); // (B, V)
    }
    let mut worst = diff(&logits[0], &logits[1])?;
    for _ in 0..8 {
        let next: Vec<u32> = logits[1].argmax(1)?.to_vec1::<u32>()?;
        for (i, (m, path)) in sides.iter().enumerate() {
            for t in tables[i].iter_mut() {
                if !caches[i].reserve(t, 1)? {
                    crate::fail!("parity: paged decode pool too small");
                }
            }
            let ids: Vec<[u32; 1]> = next.iter().map(|&x| [x]).collect();
            let mut seqs = PagedSeq::zip(&mut tables[i], &ids);
            logits[i] = m.forward_paged_with(*path, &snaps[i], &mut caches[i], &mut seqs)?;
        }
        worst = worst.max(diff(&logits[0], &logits[1])?);
    }
    Ok(worst)
}

/// The training path (token log-probs through the fused head, backward to every weight) in
/// bf16 against f32 on the same device: log-prob difference and the relative difference of
/// the global gradient norm; and the checkpointed backward against the plain one.
pub(super) fn model_training(dev: &Device) -> Result<Vec<Row>> {
    let low = if dev.is_cuda() {
        DType::BF16
    } else {
        DType::F32
    };
    let rows: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            (0..48)
                .map(|j| ((i * 131 + j * 17) % 1000) as u32)
                .collect()
        })
        .collect();
    let run = |dt: DType| -> Result<(Tensor, f64)> {
        let model = crate::Qwen3::random(small_config()?, 11, dev, dt)?;
        let batch = crate::Batch::from_rows(&rows, 0, crate::Padding::Right, dev)?;
        let sel: Vec<u32> = (0..4u32)
            .flat_map(|r| (0..47).map(move |j| r * 48 + j))
            .collect();
        let tgt: Vec<u32> = rows.iter().flat_map(|r| r[1..].to_vec()).collect();
        let lp = model.token_logprobs(&batch, &sel, &tgt, true)?;
        let g = lp.sum_all()?.backward()?;
        let mut sq = 0.0f64;
        for v in model.vars().values() {
            if let Some(t) = g.get(v) {
                sq += f64::from(
                    t.to_dtype(DType::F32)?
                        .sqr()?
                        .sum_all()?
                        .to_scalar::<f32>()?,
                );
            }
        }
        Ok((lp.to_dtype(DType::F32)?, sq.sqrt()))
    };
    let (lp_hi, n_hi) = run(DType::F32)?;
    let (lp_lo, n_lo) = run(low)?;
    let rel = (n_hi - n_lo).abs() / n_hi.max(1e-12);
    let (tol_lp, tol_g) = if dev.is_cuda() {
        (0.1, 0.05)
    } else {
        (0.0, 0.0)
    };
    Ok(vec![
        row("training log-probs bf16 vs f32", &lp_lo, &lp_hi, tol_lp)?,
        Row {
            name: "training gradient norm bf16 vs f32 (relative)".into(),
            max_diff: if n_lo.is_finite() { rel } else { f64::NAN },
            tolerance: tol_g,
        },
        pool_memory_counts_as_free(dev)?,
    ]
    .into_iter()
    .chain(checkpointed_backward(dev, low, &rows)?)
    .collect())
}

/// The free memory the kept layers and the rollout's KV budget are sized from
/// (`device::memory`) counts what the memory pool holds unused: 256 MiB allocated, dropped and
/// synchronised leave it where it was (in MiB; the driver alone would read 256 less, since the
/// pool keeps freed memory). The CPU has no such figure: 0.
fn pool_memory_counts_as_free(dev: &Device) -> Result<Row> {
    let free = || -> Result<f64> {
        dev.synchronize()?;
        Ok(crate::device::memory(dev).map_or(0.0, |(f, _)| f as f64))
    };
    let before = free()?;
    drop(Tensor::zeros(64 << 20, DType::F32, dev)?);
    let after = free()?;
    Ok(Row {
        name: "free memory after 256 MiB freed into the pool, MiB from before".into(),
        max_diff: (after - before).abs() / (1u64 << 20) as f64,
        tolerance: 1.0,
    })
}

/// The layer-checkpointed backward of a packed batch (on CUDA each layer's backward written
/// out, model/layer_grad.rs) against the plain autograd backward, same model, same dtype: the
/// largest relative difference of any weight's gradient (max |a - b| / max |b|). And the same
/// checkpointed backward with its last two layers kept rather than recomputed
/// (`KeepLayers::Count(2)`) against every layer recomputed: the same ops on the same inputs,
/// so bit-identical.
fn checkpointed_backward(dev: &Device, dt: DType, rows: &[Vec<u32>]) -> Result<Vec<Row>> {
    let mut model = crate::Qwen3::random(small_config()?, 12, dev, dt)?;
    let batch = crate::Batch::packed(rows, dev)?;
    let (sel, tgt) = batch.next_token_selection();
    let mut grads = |checkpoint: bool, keep: usize| {
        model.options.checkpoint_layers = checkpoint;
        model.options.keep_layers = crate::KeepLayers::Count(keep);
        let mut loss = |lp: &Tensor| lp.sum_all()?.neg();
        model.logprob_backward(&batch, &sel, &tgt, &mut loss)
    };
    let (written, kept, plain) = (grads(true, 0)?, grads(true, 2)?, grads(false, 0)?);
    Ok(vec![
        Row {
            name: format!("checkpointed (written on CUDA) vs plain backward {dt:?} (relative)"),
            max_diff: worst_relative(&written, &plain)?,
            tolerance: if dev.is_cuda() { 0.05 } else { 1e-5 },
        },
        Row {
            name: format!("checkpointed, last 2 layers kept vs recomputed {dt:?} (relative)"),
            max_diff: worst_relative(&kept, &written)?,
            tolerance: 0.0,
        },
    ])
}

/// The largest relative difference (max |a - b| / max |b|) of any gradient of `b` in `a`; NaN
/// when any difference is.
fn worst_relative(a: &crate::backward::Gradients, b: &crate::backward::Gradients) -> Result<f64> {
    let mut worst = 0f64;
    for (k, g) in b {
        let Some(h) = a.get(k) else {
            crate::fail!("parity: a checkpointed backward gave no gradient for `{k}`");
        };
        let f = |t: Tensor| -> Result<f64> {
            Ok(f64::from(
                t.to_dtype(DType::F32)?.max_all()?.to_scalar::<f32>()?,
            ))
        };
        let d = f((h - g)?.abs()?)?;
        let scale = f(g.abs()?)?.max(1e-12);
        worst = if d.is_nan() || worst.is_nan() {
            f64::NAN
        } else {
            worst.max(d / scale)
        };
    }
    Ok(worst)
}
