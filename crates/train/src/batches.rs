//! From sequences to gradients: token-budget micro-batches, each a right-padded model batch
//! whose completion tokens are scored with the fused log-prob path, a loss with global weights,
//! backward, and gradient accumulation. The same function serves SFT and GRPO.

use crate::loss::{sft_loss, LossInputs, LossStats, PolicyLoss, PpoParams};
use candle_core::{Result, Tensor};
use terse_model::{Batch, Padding, Qwen3};
use terse_optim::{accumulate, collect_grads, Grads};

/// One training sequence: prompt ⊕ completion, with per-completion-token data.
#[derive(Debug, Clone, PartialEq)]
pub struct Seq {
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Per completion token: whether it enters the loss (injected tokens do not).
    pub loss_mask: Vec<bool>,
    /// Per completion token: the sampler's log-prob (GRPO) — ignored by SFT.
    pub old_logp: Vec<f32>,
    /// Per completion token: the reference model's log-prob, when β > 0.
    pub ref_logp: Option<Vec<f32>>,
    pub advantage: f32,
    /// The aggregation weight of each of this sequence's loss tokens (see `loss::agg_weights`).
    pub weight: f32,
}

impl Seq {
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }
}

/// What to optimise.
#[derive(Clone, Copy)]
pub enum Objective<'a> {
    Sft,
    Ppo(PpoParams),
    /// Any policy loss (research code's own), fed the same per-token inputs as PPO.
    Policy(&'a dyn PolicyLoss),
}

/// Splits sequence indices into micro-batches whose padded size (rows x longest row) stays
/// within `budget` tokens (a longer sequence gets a micro-batch of its own). Sequences are taken
/// in length order so rows of similar length share a batch and little compute goes to padding;
/// the loss weights are global, so the grouping does not change the result.
pub fn micro_batches(seqs: &[Seq], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| (seqs[i].tokens.len(), i));
    let mut out: Vec<Vec<usize>> = vec![];
    for i in order {
        let n = seqs[i].tokens.len();
        // Rows arrive in ascending length, so the new row is the longest of its batch.
        let fits = out
            .last()
            .is_some_and(|mb: &Vec<usize>| (mb.len() + 1) * n <= budget);
        if !fits {
            out.push(vec![]);
        }
        out.last_mut().expect("non-empty").push(i);
    }
    out
}

/// Flat (row, target) selections of the loss tokens of `seqs` laid out as a right-padded batch.
fn selection(seqs: &[&Seq], t: usize) -> (Vec<u32>, Vec<u32>) {
    let (mut rows, mut targets) = (vec![], vec![]);
    for (r, s) in seqs.iter().enumerate() {
        for (j, &m) in s.loss_mask.iter().enumerate() {
            if m {
                let pos = s.prompt_len + j; // the target token's position
                rows.push((r * t + pos - 1) as u32);
                targets.push(s.tokens[pos]);
            }
        }
    }
    (rows, targets)
}

/// Per-token log-probs of every sequence's completion tokens under `model` (no graph), in
/// `loss_mask` order: the reference policy's pass.
pub fn logprobs(model: &Qwen3, seqs: &[Seq], budget: usize) -> Result<Vec<Vec<f32>>> {
    let mut out = vec![vec![]; seqs.len()];
    for mb in micro_batches(seqs, budget) {
        let group: Vec<&Seq> = mb.iter().map(|&i| &seqs[i]).collect();
        let rows_in: Vec<Vec<u32>> = group.iter().map(|s| s.tokens.clone()).collect();
        let batch = Batch::from_rows(&rows_in, 0, Padding::Right, model.device())?;
        let (rows, targets) = selection(&group, batch.t);
        let lp = model
            .token_logprobs(&batch, &rows, &targets, false)?
            .to_dtype(candle_core::DType::F32)?
            .to_vec1::<f32>()?;
        let mut k = 0;
        for &i in &mb {
            let n = seqs[i].loss_tokens();
            out[i] = lp[k..k + n].to_vec();
            k += n;
        }
    }
    Ok(out)
}

/// The SFT objective's stand-in where a policy loss is named (never called).
struct NoPolicy;

impl PolicyLoss for NoPolicy {
    fn loss(&self, _: &LossInputs) -> Result<(Tensor, LossStats)> {
        candle_core::bail!("no policy loss for the SFT objective")
    }
}

/// Loss and accumulated gradients over all sequences, micro-batch by micro-batch.
pub fn gradients(
    model: &Qwen3,
    seqs: &[Seq],
    objective: Objective,
    budget: usize,
) -> Result<(Grads, LossStats)> {
    let dev = model.device();
    let mut grads = Grads::new();
    let mut total = LossStats::default();
    for mb in micro_batches(seqs, budget) {
        let group: Vec<&Seq> = mb.iter().map(|&i| &seqs[i]).collect();
        if group.iter().all(|s| s.loss_tokens() == 0) {
            continue;
        }
        let rows_in: Vec<Vec<u32>> = group.iter().map(|s| s.tokens.clone()).collect();
        let batch = Batch::from_rows(&rows_in, 0, Padding::Right, dev)?;
        let (rows, targets) = selection(&group, batch.t);
        let logp = model.token_logprobs(&batch, &rows, &targets, true)?; // (N)
        let per_token = |f: &dyn Fn(&Seq) -> Vec<f32>| -> Result<Tensor> {
            let v: Vec<f32> = group.iter().flat_map(|s| f(s)).collect();
            Tensor::from_vec(v, rows.len(), dev)
        };
        let masked = |s: &Seq, v: &[f32]| -> Vec<f32> {
            s.loss_mask
                .iter()
                .zip(v)
                .filter(|(m, _)| **m)
                .map(|(_, x)| *x)
                .collect()
        };
        let w = per_token(&|s| vec![s.weight; s.loss_tokens()])?;
        let policy: &dyn PolicyLoss = match &objective {
            Objective::Sft => &NoPolicy,
            Objective::Ppo(p) => p,
            Objective::Policy(l) => *l,
        };
        let (loss, st) = if let Objective::Sft = objective {
            sft_loss(&logp, &w)?
        } else {
            let old = per_token(&|s| masked(s, &s.old_logp))?;
            let adv = per_token(&|s| vec![s.advantage; s.loss_tokens()])?;
            let wants_ref = match &objective {
                Objective::Ppo(p) => p.kl_coef > 0.0,
                _ => group.iter().all(|s| s.ref_logp.is_some()),
            };
            let reference = if wants_ref {
                Some(per_token(&|s| s.ref_logp.clone().unwrap_or_default())?)
            } else {
                None
            };
            policy.loss(&LossInputs {
                logp: &logp,
                old_logp: &old,
                ref_logp: reference.as_ref(),
                advantage: &adv,
                weight: &w,
            })?
        };
        accumulate(&mut grads, collect_grads(model.vars(), &loss.backward()?))?;
        total.loss += st.loss;
        total.tokens += st.tokens;
        total.clipped_low += st.clipped_low;
        total.clipped_high += st.clipped_high;
        total.kl_sum += st.kl_sum;
        total.logp_gap_sum += st.logp_gap_sum;
    }
    Ok((grads, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lens: &[usize], budget: usize, expect: &[&[usize]]) {
        let seqs: Vec<Seq> = lens
            .iter()
            .map(|&n| Seq {
                tokens: vec![0; n],
                prompt_len: 1,
                loss_mask: vec![true; n - 1],
                old_logp: vec![],
                ref_logp: None,
                advantage: 0.0,
                weight: 0.0,
            })
            .collect();
        assert_eq!(
            micro_batches(&seqs, budget),
            expect,
            "lens {lens:?} budget {budget}"
        );
    }

    #[test]
    fn micro_batches_group_similar_lengths_within_the_padded_budget() {
        check(&[10, 2, 9, 3], 20, &[&[1, 3], &[2, 0]]);
        check(&[10, 2, 9, 3], 1000, &[&[1, 3, 2, 0]]);
        // A row longer than the budget gets a micro-batch of its own.
        check(&[30, 5], 20, &[&[1], &[0]]);
        // Equal lengths keep their order.
        check(&[4, 4, 4], 8, &[&[0, 1], &[2]]);
    }
}
