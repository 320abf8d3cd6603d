//! The policy update of one GRPO step: samples + advantages -> sequences with loss masks and
//! sampler log-probs -> (reference log-probs for the KL term) -> for each PPO epoch and
//! mini-batch: micro-batched gradients with the mini-batch's aggregation weights, clipping, a
//! non-finite check, and one AdamW step. Called by the loop in run.rs after shaping. With a
//! `Collective` of several ranks, each rank differentiates its share of every mini-batch and
//! the optimizer step is ZeRO-2 (`zero::sharded_step`: gradients reduce-scattered, the global
//! norm clipped, each rank's parameter shard updated, the new weights all-gathered).

use crate::batches::{gradients, logprobs, MicroBatching, Objective, Seq};
use crate::config::GrpoSection;
use crate::loss::{agg_weights, LossStats, PolicyLoss, PpoParams};
use anyhow::{bail, Result};
use std::path::Path;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::{clip_grad_norm, AdamW};
use terse_rollout::{Prompt, Sample};

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
}

/// The training sequences of a step: prompt ⊕ completion, the loss masking injected tokens,
/// the sampler's plain log-probs as the old policy, one advantage per sample.
pub fn sequences(prompts: &[Prompt], samples: &[Sample], adv: &[Vec<f64>], g: usize) -> Vec<Seq> {
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let k = i / g;
            let mut tokens = prompts[k].tokens.clone();
            tokens.extend_from_slice(&s.tokens);
            Seq {
                tokens,
                prompt_len: prompts[k].tokens.len(),
                loss_mask: s.sampled.clone(),
                old_logp: s.logp_plain.clone(),
                ref_logp: None,
                advantage: adv[k][i % g] as f32,
                weight: 0.0,
            }
        })
        .collect()
}

/// Runs the PPO epochs over the mini-batches (of `mini_batch_prompts` groups; all groups when
/// unset), one AdamW step each at learning rate `lr`. A non-finite loss or gradient stops before
/// that update is applied.
#[allow(clippy::too_many_arguments)]
pub fn policy_update(
    g: &GrpoSection,
    model: &Qwen3,
    reference: Option<&Qwen3>,
    opt: &mut AdamW,
    mut seqs: Vec<Seq>,
    lr: f64,
    step: u64,
    run_dir: &Path,
    custom_loss: Option<&dyn PolicyLoss>,
    mut dp: Option<&mut dyn Collective>,
) -> Result<UpdateStats> {
    let mut out = UpdateStats::default();
    let (rank, world) = dp.as_ref().map_or((0, 1), |c| (c.rank(), c.world()));
    if let Some(r) = reference {
        let t0 = std::time::Instant::now();
        let how = MicroBatching::for_model(g.micro_batch_tokens, g.packing, r);
        let ref_lp = logprobs(r, &seqs, how)?;
        for (s, lp) in seqs.iter_mut().zip(ref_lp) {
            s.ref_logp = Some(lp);
        }
        out.logprob_s = t0.elapsed().as_secs_f64();
    }
    let ppo = PpoParams::from(g);
    let per_mb = g
        .mini_batch_prompts
        .unwrap_or(usize::MAX)
        .saturating_mul(g.group_size);
    for _ in 0..g.epochs {
        for mb in seqs.chunks_mut(per_mb.max(1)) {
            let lens: Vec<usize> = mb.iter().map(Seq::loss_tokens).collect();
            let w = agg_weights(g.loss_agg, &lens, g.norm_len.unwrap_or(g.max_new_tokens));
            for (s, w) in mb.iter_mut().zip(w) {
                s.weight = w as f32;
            }
            let objective = match custom_loss {
                Some(l) => Objective::Policy(l),
                None => Objective::Ppo(ppo),
            };
            let how = MicroBatching::for_model(g.micro_batch_tokens, g.packing, model);
            // Data parallel: this rank's share of the mini-batch (its weights are global), then
            // the gradients and the loss statistics summed over ranks. One process takes it all
            // in place.
            let share: Vec<Seq>;
            let part: &[Seq] = if world == 1 {
                mb
            } else {
                share = mb.iter().skip(rank).step_by(world).cloned().collect();
                &share
            };
            let (mut grads, mut st) = gradients(model, part, objective, how)?;
            // Several ranks: ZeRO-2 (gradients reduce-scattered, each rank's optimizer shard
            // stepped, the new weights all-gathered); the step is skipped when the loss or the
            // global norm is not finite. One process: clip and step here.
            let grad_norm = match dp.as_deref_mut() {
                Some(c) if world > 1 => {
                    st = crate::dp::all_reduce_stats(c, st)?;
                    let ok = st.loss.is_finite();
                    crate::zero::sharded_step(c, model.vars(), opt, &grads, g.grad_clip, lr, ok)?
                }
                _ => clip_grad_norm(&mut grads, g.grad_clip)?,
            };
            if !st.loss.is_finite() || !grad_norm.is_finite() {
                bail!(
                    "step {step}: non-finite {} (loss {}, grad norm {grad_norm}); stopped before updating; {}",
                    if st.loss.is_finite() { "gradient" } else { "loss" },
                    st.loss,
                    crate::checkpoint::last_good(run_dir)
                );
            }
            if world == 1 {
                opt.step(model.vars(), &grads, lr)?;
            }
            if out.updates == 0 {
                out.logp_gap = st.logp_gap_sum / st.tokens.max(1) as f64;
            }
            out.updates += 1;
            out.loss += st.loss;
            out.grad_norm += grad_norm;
            out.stats.tokens += st.tokens;
            out.stats.clipped_low += st.clipped_low;
            out.stats.clipped_high += st.clipped_high;
            out.stats.kl_sum += st.kl_sum;
        }
    }
    let u = out.updates.max(1) as f64;
    out.loss /= u;
    out.grad_norm /= u;
    Ok(out)
}
