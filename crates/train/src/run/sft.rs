//! SFT warm-up: completion-only cross-entropy on the testbed teacher's traces, with the same
//! model, micro-batching and optimizer as GRPO. Runs inside `train` before the first GRPO step,
//! or alone (`cargo xtask sft`), leaving an HF-layout checkpoint a GRPO run can start from.
//! On data-parallel ranks every rank takes part (its share of each batch, ZeRO-2 steps).

use crate::checkpoint::save_model_dir;
use crate::config::RunConfig;
use crate::data;
use crate::load::{encode, init_model, load_tokenizer};
use crate::records::metrics::MetricsWriter;
use crate::records::observe::{progress_bar, Observer};
use crate::report::{MetricsLine, SftReport};
use crate::step::batches::{gradients, MicroBatching, Objective, Seq};
use crate::step::loss::agg_weights;
use anyhow::{bail, Result};
use std::path::PathBuf;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::{clip_grad_norm, AdamW};

/// Runs only the SFT warm-up of `cfg` and saves the model (weights, config, tokenizer) to
/// `<run.dir>/<run.name>/sft`, atomically. Point `model.path` there with `init = "checkpoint"`
/// and `sft.steps = 0` to start GRPO runs from it.
pub fn sft_only(cfg: &RunConfig) -> Result<PathBuf> {
    cfg.validate()?;
    if cfg.sft.steps == 0 {
        bail!("sft.steps is 0: nothing to train");
    }
    let (dev, dtype) = cfg.run.device_and_dtype()?;
    let dir = cfg.run.dir.join(&cfg.run.name);
    let _lock = crate::run::lock::RunLock::create_and_acquire(&dir, cfg.run.lock_wait())?;
    let tok = load_tokenizer(&cfg.model.path)?;
    let model = init_model(cfg, &dev, dtype)?;
    let (mut metrics, _) = MetricsWriter::open(
        &dir.join("sft_metrics.jsonl"),
        crate::records::metrics::Start::Fresh,
    )?;
    sft(cfg, &model, &tok, &mut metrics, None)?;
    save_model_dir(&dir.join("sft"), &model, &cfg.model.path, |_| Ok(()))
}

/// SFT warm-up: completion-only cross-entropy on teacher traces. With `dp`, every rank builds
/// the whole batch and its token-mean weights, differentiates every world-th sequence, and the
/// optimizer steps as in GRPO (ZeRO-2: gradients reduce-scattered, the global norm clipped,
/// each rank's shard stepped, the weights all-gathered), so all ranks end with the same model.
pub(crate) fn sft(
    cfg: &RunConfig,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
    observer: &mut dyn Observer,
    mut dp: Option<&mut dyn Collective>,
) -> Result<()> {
    let (rank, world) = dp.as_ref().map_or((0, 1), |c| (c.rank(), c.world()));
    let s = &cfg.sft;
    let teacher = cfg.data.teacher();
    let mut opt = AdamW::new(cfg.optim.clone(), model.vars())?;
    let bar = progress_bar("sft", s.steps, 0);
    let micro = MicroBatching::for_model(cfg.grpo.micro_batch_tokens, cfg.grpo.packing, model);
    for step in 0..s.steps {
        let mut seqs = vec![];
        for i in 0..s.batch_size as u64 {
            let (p, trace) = data::sft_example(
                cfg.run.seed,
                step * s.batch_size as u64 + i,
                &cfg.data.levels,
                &teacher,
            );
            let prompt = encode(tok, &p.prompt())?;
            let completion = encode(tok, &trace)?;
            let mut tokens = prompt.clone();
            tokens.extend_from_slice(&completion);
            seqs.push(Seq {
                tokens,
                prompt_len: prompt.len(),
                loss_mask: vec![true; completion.len()],
                old_logp: vec![],
                ref_logp: None,
                is_weight: None,
                advantage: 0.0,
                weight: 0.0,
            });
        }
        let lens: Vec<usize> = seqs.iter().map(Seq::loss_tokens).collect();
        for (q, w) in seqs
            .iter_mut()
            .zip(agg_weights(crate::config::LossAgg::TokenMean, &lens, 1))
        {
            q.weight = w as f32;
        }
        let lr = s.schedule.lr_at(step);
        let share: Vec<Seq>;
        let part: &[Seq] = if world == 1 {
            &seqs
        } else {
            share = seqs.into_iter().skip(rank).step_by(world).collect();
            &share
        };
        let (mut grads, mut st) = gradients(model, part, Objective::Sft, micro)?;
        let norm = match dp.as_deref_mut() {
            Some(c) => {
                st = crate::step::dp::all_reduce_stats(c, st)?;
                let ok = st.loss.is_finite();
                crate::step::zero::sharded_step(
                    c,
                    model.vars(),
                    &mut opt,
                    &grads,
                    cfg.grpo.grad_clip,
                    lr,
                    ok,
                )?
            }
            _ => clip_grad_norm(&mut grads, cfg.grpo.grad_clip)?,
        };
        if !st.loss.is_finite() || !norm.is_finite() {
            bail!(
                "sft step {step}: non-finite loss {} or grad norm {norm}",
                st.loss
            );
        }
        if dp.is_none() {
            opt.step(model.vars(), &grads, lr)?;
        }
        observer.record(&MetricsLine::Sft(SftReport {
            step,
            loss: st.loss,
            grad_norm: norm,
            lr,
        }))?;
        bar.set_message(format!("loss {:.3}", st.loss));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
