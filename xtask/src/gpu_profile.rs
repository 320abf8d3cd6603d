//! gpu-check's `profile` (issue 57's item 1, the training half): one packed, layer-checkpointed
//! forward+backward of the Qwen3-0.6B shape (random bf16 weights) at 16k tokens through the
//! written layer backward and the log-prob head, then clipping and an AdamW step (lr 1e-6),
//! after one unprofiled forward+backward, with
//! `terse_model::profile` on: each category's device milliseconds by CUDA events (matmuls,
//! flash forward and backward, the head's forward and backward, norms, RoPE, elementwise,
//! casts, the optimizer), its share of the step's wall time, and what no span covers (the embedding, the
//! final norm, layout copies, allocation and the host's own time between launches).

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Map, Value};
use std::time::Instant;
use terse_model::{Batch, ForwardOptions, KeepLayers, Qwen3};

/// Tokens of the profiled step: issue 57's 16k.
const TOKENS: usize = 16384;

/// The training step's options: flash attention, packed, layers checkpointed where the memory
/// plan says (the written layer backward on CUDA).
fn training_options() -> ForwardOptions {
    let mut options = ForwardOptions::default();
    options.flash = true;
    options.flash_min_tokens = 0;
    options.checkpoint_layers = true;
    options.keep_layers = KeepLayers::Auto;
    options
}

pub fn profile(dev: &Device, model: &mut Qwen3) -> Result<Value> {
    let before = model.options;
    model.options = training_options();
    let r = profiled(dev, model, TOKENS);
    model.options = before;
    r
}

/// On the emulated device: the same profile of a 2-layer bf16 model at 64 tokens, so that CI
/// runs the CUDA events; the times say nothing there and are removed, the span counts stay
/// and must cover every category.
pub fn emulated(dev: &Device) -> Result<Value> {
    let cfg = terse_model::Config::synthetic(1024, 64, 128, 2, 16, 8, 128, true)?;
    let mut m = Qwen3::random(cfg, 0, dev, DType::BF16)?;
    m.options = training_options();
    let mut row = profiled(dev, &m, 64)?;
    let cats = row["categories"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut spans = Map::new();
    for (k, v) in cats {
        spans.insert(k, v["spans"].clone());
    }
    for want in terse_model::profile::Category::ALL.map(|c| c.name()) {
        if spans.get(want).and_then(Value::as_u64).unwrap_or(0) == 0 {
            bail!("profile on the emulated device: no `{want}` span in {spans:?}");
        }
    }
    Ok(json!({"t": 64, "spans": spans}))
}

/// One profiled forward+backward of `t` packed tokens (two sequences, 5/8 and 3/8).
pub fn profiled(dev: &Device, model: &Qwen3, t: usize) -> Result<Value> {
    let rows = crate::gpu_long::packed_rows(t, model.config.vocab_size);
    let batch = Batch::packed(&rows, dev)?;
    let (sel, targets) = batch.next_token_selection();
    let mut loss = |lp: &Tensor| lp.sum_all()?.neg();
    // Once unprofiled: module loading and the first allocations are not the step's.
    drop(model.logprob_backward(&batch, &sel, &targets, &mut loss)?);
    dev.synchronize()?;
    // The optimizer's state is made before the profile: a run makes it once.
    let mut opt = terse_optim::AdamW::new(terse_optim::AdamWConfig::default(), model.vars())?;
    terse_model::profile::start();
    let t0 = Instant::now();
    let mut step = || -> Result<terse_model::backward::Gradients> {
        let mut grads = model.logprob_backward(&batch, &sel, &targets, &mut loss)?;
        terse_optim::clip_grad_norm(&mut grads, 1.0)?;
        opt.step(model.vars(), &grads, 1e-6)?;
        Ok(grads)
    };
    let grads = step();
    let totals = terse_model::profile::finish(dev);
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    let grads = grads?;
    let totals = totals?;
    let finite = grads
        .values()
        .next()
        .map(|g| g.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>())
        .transpose()?;
    if finite.is_some_and(|x| !x.is_finite()) {
        bail!("profile T={t}: a gradient is not finite");
    }
    let covered: f64 = totals.iter().map(|c| c.ms).sum();
    let mut categories = Map::new();
    let mut line = vec![];
    for c in &totals {
        let share = c.ms / wall_ms;
        categories.insert(
            c.category.name().into(),
            json!({"ms": c.ms, "spans": c.spans, "share": share}),
        );
        line.push(format!(
            "{} {:.1} ms ({:.0} %)",
            c.category.name(),
            c.ms,
            100.0 * share
        ));
    }
    println!(
        "profile T={t}: {wall_ms:.1} ms; {}; uncovered {:.1} ms",
        line.join(", "),
        wall_ms - covered
    );
    Ok(json!({
        "t": t,
        "wall_ms": wall_ms,
        "categories": categories,
        "uncovered_ms": wall_ms - covered,
    }))
}
