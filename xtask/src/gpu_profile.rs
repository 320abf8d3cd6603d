//! gpu-check's `profile` (issue 57's item 1), its two halves. Training: one packed, layer-checkpointed
//! forward+backward of the Qwen3-0.6B shape (random bf16 weights) at 16k tokens through the
//! written layer backward and the log-prob head, then clipping and an AdamW step (lr 1e-6),
//! after one unprofiled forward+backward, with
//! `terse_model::profile` on: each category's device milliseconds by CUDA events (matmuls,
//! flash forward and backward, the head's forward and backward, norms, RoPE, elementwise,
//! casts, the optimizer), its share of the step's wall time, and what no span covers (the embedding, the
//! final norm, layout copies, allocation and the host's own time between launches). Decode: one
//! uncaptured paged decode step of batch 64 at a 1k context, through the device sampler, by the
//! same categories (matmuls, norms, decode attention with the fused query and key, elementwise,
//! the head, its cast, the sampler); the graphed step replays the same kernels.

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

/// The decode step's batch and context (issue 56's batch 64; a 1k context per row).
const DECODE: (usize, usize) = (64, 1024);

pub fn profile(dev: &Device, model: &mut Qwen3) -> Result<Value> {
    let before = model.options;
    model.options = training_options();
    let r = profiled(dev, model, TOKENS);
    model.options = before;
    let mut row = r?;
    row["decode"] = decode_profiled(dev, model, DECODE)?;
    Ok(row)
}

/// On the emulated device: the same profile of a 2-layer bf16 model at 64 tokens, so that CI
/// runs the CUDA events; the times say nothing there and are removed, the span counts stay
/// and must cover every category.
pub fn emulated(dev: &Device) -> Result<Value> {
    let cfg = terse_model::Config::synthetic(1024, 64, 128, 2, 16, 8, 128, true)?;
    let mut m = Qwen3::random(cfg, 0, dev, DType::BF16)?;
    m.options = training_options();
    let training = profiled(dev, &m, 64)?;
    let decode = decode_profiled(dev, &m, (4, 64))?;
    let counts = |row: &Value| -> Map<String, Value> {
        let cats = row["categories"].as_object().cloned().unwrap_or_default();
        cats.into_iter()
            .map(|(k, v)| (k, v["spans"].clone()))
            .collect()
    };
    let (spans, decode_spans) = (counts(&training), counts(&decode));
    for want in terse_model::profile::Category::ALL.map(|c| c.name()) {
        let n = |m: &Map<String, Value>| m.get(want).and_then(Value::as_u64).unwrap_or(0);
        if n(&spans) + n(&decode_spans) == 0 {
            bail!(
                "profile on the emulated device: no `{want}` span in {spans:?} or {decode_spans:?}"
            );
        }
    }
    Ok(
        json!({"t": 64, "spans": spans, "decode": {"batch": 4, "context": 64, "spans": decode_spans}}),
    )
}

/// One profiled decode step of `b` rows at `ctx` tokens of context each (a paged cache in the
/// compute dtype, filled without a prefill), logits through the device sampler, after one
/// unprofiled step; on the decoding copy rollout reads (`with_decoding_weights`: weights cast
/// once, projections stacked).
pub fn decode_profiled(dev: &Device, model: &Qwen3, shape: (usize, usize)) -> Result<Value> {
    model.with_decoding_weights(|m| decode_profiled_on(dev, m, shape))
}

fn decode_profiled_on(dev: &Device, model: &Qwen3, (b, ctx): (usize, usize)) -> Result<Value> {
    use terse_model::sample::{sample_packed, uniform_words, Warpers};
    use terse_model::BlockTable;
    const BLOCK: usize = 256;
    let blocks = b * ((ctx + 4).div_ceil(BLOCK) + 1);
    let mut cache = model.new_paged_cache(BLOCK, blocks, model.compute_dtype())?;
    let mut tables: Vec<BlockTable> = (0..b).map(|_| BlockTable::default()).collect();
    for t in tables.iter_mut() {
        if !cache.extend_filled(t, ctx, 0.01)? {
            bail!("profile decode: the pool is too small");
        }
    }
    let words: Vec<u32> = (0..b)
        .flat_map(|i| uniform_words((i as f64 + 0.5) / b as f64))
        .collect();
    let uniforms = Tensor::from_vec(words, (b, 2), dev)?;
    let warpers = Warpers {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    };
    let mut step = |cache: &mut terse_model::PagedKvCache| -> Result<Tensor> {
        let logits = crate::gpu_decode_long::step(model, cache, &mut tables, 7)?; // (B, V)
        Ok(sample_packed(&logits, &uniforms, &warpers)?)
    };
    drop(step(&mut cache)?);
    dev.synchronize()?;
    terse_model::profile::start();
    let t0 = Instant::now();
    let drawn = step(&mut cache);
    let totals = terse_model::profile::finish(dev);
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
    drop(drawn?);
    let row = report(
        &totals?,
        wall_ms,
        &format!("profile decode B={b} ctx={ctx}"),
    );
    Ok(
        json!({"batch": b, "context": ctx, "wall_ms": wall_ms, "categories": row.0, "uncovered_ms": row.1}),
    )
}

/// Each category's ms, span count and share of `wall_ms`, printed on one line after `what`;
/// -> (the categories' object, the uncovered milliseconds).
fn report(totals: &[terse_model::profile::Total], wall_ms: f64, what: &str) -> (Value, f64) {
    let covered: f64 = totals.iter().map(|c| c.ms).sum();
    let mut categories = Map::new();
    let mut line = vec![];
    for c in totals {
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
        "{what}: {wall_ms:.1} ms; {}; uncovered {:.1} ms",
        line.join(", "),
        wall_ms - covered
    );
    (Value::Object(categories), wall_ms - covered)
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
    let (categories, uncovered_ms) = report(&totals, wall_ms, &format!("profile T={t}"));
    Ok(json!({
        "t": t,
        "wall_ms": wall_ms,
        "categories": categories,
        "uncovered_ms": uncovered_ms,
    }))
}
