//! The policy update of one GRPO step: samples + advantages -> sequences with loss masks and
//! sampler log-probs -> (reference log-probs for the KL term) -> for each PPO epoch and mini-batch:
//! micro-batched gradients with the mini-batch's aggregation weights, clipping, a non-finite check,
//! one AdamW step, and a check that the new weights are finite. Called by `GrpoTrainer::update`
//! (trainer.rs) after shaping. With a `Collective` of several ranks, each rank differentiates the
//! groups of every mini-batch it rolled out (with the mini-batch's global weights) and the
//! optimizer step is ZeRO-2 (`zero::sharded_step`: gradients reduce-scattered, the global norm
//! clipped, each rank's parameter shard updated, the new weights all-gathered).

use crate::config::GrpoSection;
use crate::step::batches::{gradients, logprobs, MicroBatching, Objective, Seq};
use crate::step::collect::{Collected, SampleExtra};
use crate::step::loss::{agg_weights, LossStats, PolicyLoss};
use anyhow::{bail, Result};
use std::path::Path;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::{clip_grad_norm, AdamW};

/// What the step's updates did, summed (stats) or averaged (loss, grad norm) over updates.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    pub stats: LossStats,
    /// Mean loss and pre-clip gradient norm over the optimizer updates.
    pub loss: f64,
    pub grad_norm: f64,
    pub updates: usize,
    /// Seconds spent on the reference model's log-probs (0 without a KL term).
    pub logprob_s: f64,
    /// Mean |sampler − trainer| log-prob per token, from the first update only (before the
    /// policy changes; later mini-batches see an updated policy).
    pub logp_gap: f64,
    /// Rollout correction's statistics over every rank's sequences (None when it is off).
    pub correction: Option<crate::step::correction::CorrectionStats>,
}

/// The training sequences of the groups this rank holds (all of them on one process): prompt ⊕
/// completion, the loss masking injected tokens, the sampler's plain log-probs as the old
/// policy, one advantage per sample.
pub fn sequences(c: &Collected, adv: &[Vec<f64>], g: usize) -> Vec<Seq> {
    c.samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let k = c.held[i / g];
            let mut tokens = c.prompts[k].tokens.clone();
            tokens.extend_from_slice(&s.tokens);
            Seq {
                tokens,
                prompt_len: c.prompts[k].tokens.len(),
                loss_mask: s.sampled.clone(),
                old_logp: s.logp_plain.clone(),
                ref_logp: None,
                is_weight: None,
                advantage: adv[k][i % g] as f32,
                weight: 0.0,
            }
        })
        .collect()
}

/// What an update trains and with what, borrowed from the trainer for one step.
pub struct Learner<'a> {
    pub grpo: &'a GrpoSection,
    pub policy: &'a Qwen3,
    /// The frozen reference model of the KL term (None without one).
    pub reference: Option<&'a Qwen3>,
    pub opt: &'a mut AdamW,
    /// The policy loss: the configured built-in (PPO-clip or GSPO) or research code's.
    pub loss: &'a dyn PolicyLoss,
    /// Several ranks (or one): ZeRO-2 steps; None: clip and step here.
    pub collective: Option<&'a mut dyn Collective>,
    /// Named in the error of a non-finite update (the newest good checkpoint).
    pub run_dir: Option<&'a Path>,
}

/// The data of one step's update and where the step is in the schedule.
pub struct UpdateBatch<'a> {
    /// The sequences of the groups `held` (indices into the step's groups, ascending; all
    /// groups on one process).
    pub seqs: Vec<Seq>,
    pub held: &'a [usize],
    /// Every sample of every group, so each mini-batch's aggregation weights are the global
    /// ones on every rank.
    pub extras: &'a [SampleExtra],
    pub lr: f64,
    pub step: u64,
}

/// Runs the PPO epochs over the mini-batches (of `mini_batch_prompts` groups; all groups when
/// unset), one AdamW step each at the batch's learning rate. A non-finite loss or gradient
/// stops before that update is applied; non-finite new weights stop before anything is written.
pub fn policy_update(l: Learner<'_>, b: UpdateBatch<'_>) -> Result<UpdateStats> {
    let Learner {
        grpo: g,
        policy: model,
        reference,
        opt,
        loss,
        collective: mut dp,
        run_dir,
    } = l;
    let UpdateBatch {
        mut seqs,
        held,
        extras,
        lr,
        step,
    } = b;
    let mut out = UpdateStats::default();
    let (logprob_s, correction) = prepare(g, model, reference, dp.as_deref_mut(), &mut seqs)?;
    (out.logprob_s, out.correction) = (logprob_s, correction);
    let gs = g.group_size.max(1);
    let per_mb = g.mini_batch_prompts.unwrap_or(usize::MAX).max(1);
    let n_groups = extras.len() / gs;
    if seqs.len() != held.len() * gs {
        bail!(
            "step {step}: {} sequences for {} held groups of {gs}",
            seqs.len(),
            held.len()
        );
    }
    for _ in 0..g.epochs {
        let mut at = 0; // the first of this mini-batch's sequences in `seqs`
        for first in (0..n_groups).step_by(per_mb) {
            let last = (first + per_mb).min(n_groups);
            let part = weigh_mini_batch(g, extras, held, &mut seqs, &mut at, first..last);
            let how = MicroBatching::for_model(g.micro_batch_tokens, g.packing, model);
            let (grads, st) = gradients(model, part, Objective::Policy(loss), how)?;
            let at_step = Stepping {
                g,
                model,
                lr,
                step,
                run_dir,
            };
            let (st, grad_norm) = at_step.apply(opt, dp.as_deref_mut(), grads, st)?;
            out.record(&st, grad_norm);
        }
    }
    let u = out.updates.max(1) as f64;
    out.loss /= u;
    out.grad_norm /= u;
    Ok(out)
}

/// Sets the aggregation weights of the mini-batch of `groups` (computed over every rank's
/// samples, so they are the global ones) on this rank's part of it, the sequences of the
/// groups it holds from `*at` on, and moves `*at` past them.
fn weigh_mini_batch<'s>(
    g: &GrpoSection,
    extras: &[SampleExtra],
    held: &[usize],
    seqs: &'s mut [Seq],
    at: &mut usize,
    groups: std::ops::Range<usize>,
) -> &'s [Seq] {
    let gs = g.group_size.max(1);
    let (first, last) = (groups.start, groups.end);
    let lens: Vec<usize> = extras[first * gs..last * gs]
        .iter()
        .map(|e| e.loss_tokens)
        .collect();
    let w = agg_weights(g.loss_agg, &lens, g.norm_len.unwrap_or(g.max_new_tokens));
    let n_held = held[*at / gs..].iter().take_while(|&&k| k < last).count();
    let start = *at;
    let part = &mut seqs[start..start + n_held * gs];
    for (i, s) in part.iter_mut().enumerate() {
        let k = held[start / gs + i / gs];
        s.weight = w[(k - first) * gs + i % gs] as f32;
    }
    *at += n_held * gs;
    part
}

/// What one optimizer update applies its gradients with.
struct Stepping<'a> {
    g: &'a GrpoSection,
    model: &'a Qwen3,
    lr: f64,
    step: u64,
    run_dir: Option<&'a Path>,
}

impl Stepping<'_> {
    /// Reduces (with a collective) and applies one mini-batch's gradients; returns the
    /// (reduced) loss statistics and the pre-clip gradient norm. A collective (any world size,
    /// 1 included): ZeRO-2 (gradients reduce-scattered, each rank's optimizer shard stepped,
    /// the new weights all-gathered), the step skipped when the loss or the global norm is not
    /// finite. None: clip and step here.
    fn apply<'c>(
        &self,
        opt: &mut AdamW,
        dp: Option<&mut (dyn Collective + 'c)>,
        mut grads: std::collections::BTreeMap<String, candle_core::Tensor>,
        mut st: LossStats,
    ) -> Result<(LossStats, f64)> {
        let (g, model, lr, step) = (self.g, self.model, self.lr, self.step);
        let local = dp.is_none();
        let grad_norm = match dp {
            Some(c) => {
                st = crate::step::dp::all_reduce_stats(c, st)?;
                let ok = st.loss.is_finite();
                crate::step::zero::sharded_step(c, model.vars(), opt, &grads, g.grad_clip, lr, ok)?
            }
            _ => clip_grad_norm(&mut grads, g.grad_clip)?,
        };
        if !st.loss.is_finite() || !grad_norm.is_finite() {
            bail!(
                "step {step}: non-finite {} (loss {}, grad norm {grad_norm}); stopped before updating; {}",
                if st.loss.is_finite() { "gradient" } else { "loss" },
                st.loss,
                crate::checkpoint::last_good(self.run_dir)
            );
        }
        if local {
            opt.step(model.vars(), &grads, lr)?;
        }
        // A finite gradient can still make infinite weights (an absurd learning rate):
        // stop here, before a checkpoint or an evaluation sees them.
        if let Some(name) = model.first_non_finite()? {
            bail!(
                "step {step}: the update made the weights non-finite (first: {name}; learning rate {lr:e}); stopped before writing anything; {}",
                crate::checkpoint::last_good(self.run_dir)
            );
        }
        Ok((st, grad_norm))
    }
}

impl UpdateStats {
    /// Adds one optimizer update's figures (the log-prob gap from the first only).
    fn record(&mut self, st: &LossStats, grad_norm: f64) {
        if self.updates == 0 {
            self.logp_gap = st.logp_gap_sum / st.tokens.max(1) as f64;
        }
        self.updates += 1;
        self.loss += st.loss;
        self.grad_norm += grad_norm;
        self.stats.tokens += st.tokens;
        self.stats.clipped_low += st.clipped_low;
        self.stats.clipped_high += st.clipped_high;
        self.stats.kl_sum += st.kl_sum;
    }
}

/// What the sequences need before the first update, from the policy as it sampled them: the
/// KL reference's log-probs (a separate model, or with LoRA the policy with its adapters off)
/// and, with rollout correction, the trainer's own old log-probs and importance weights.
/// Returns the reference pass's seconds and the correction's statistics (over every rank).
fn prepare<'c>(
    g: &GrpoSection,
    model: &Qwen3,
    reference: Option<&Qwen3>,
    dp: Option<&mut (dyn Collective + 'c)>,
    seqs: &mut [Seq],
) -> Result<(f64, Option<crate::step::correction::CorrectionStats>)> {
    let mut logprob_s = 0.0;
    let lora_reference = reference.is_none() && g.kl_coef > 0.0 && model.lora().is_some();
    if let Some(r) = reference.or(lora_reference.then_some(model)) {
        let t0 = std::time::Instant::now();
        let how = MicroBatching::for_model(g.micro_batch_tokens, g.packing, r);
        let ref_lp = {
            let _base = lora_reference.then(|| model.adapter_off());
            logprobs(r, seqs, how)?
        };
        for (s, lp) in seqs.iter_mut().zip(ref_lp) {
            s.ref_logp = Some(lp);
        }
        logprob_s = t0.elapsed().as_secs_f64();
    }
    let Some(rc) = &g.rollout_correction else {
        return Ok((logprob_s, None));
    };
    // The old policy's log-probs as the trainer computes them, before any update.
    let how = MicroBatching::for_model(g.micro_batch_tokens, g.packing, model);
    let trainer_lp = logprobs(model, seqs, how)?;
    let st = crate::step::correction::apply(rc, seqs, &trainer_lp);
    let st = match dp {
        Some(c) => crate::step::dp::all_reduce_correction(c, st)?,
        None => st,
    };
    Ok((logprob_s, Some(st)))
}
