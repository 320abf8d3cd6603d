//! From sequences to gradients: token-budget micro-batches, each a model batch (the sequences
//! packed into one row where the model's attention allows it, else right-padded rows) whose
//! completion tokens are scored with the fused log-prob path, a loss with global weights,
//! backward, and gradient accumulation. The same function serves SFT and GRPO.

use crate::step::loss::{sft_loss, LossInputs, LossStats, PolicyLoss};
use candle_core::{Result, Tensor};
use terse_model::{Batch, Padding, Qwen3};
use terse_optim::{accumulate, Grads};

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
    /// Per loss token: rollout correction's importance weight, when it is on.
    pub is_weight: Option<Vec<f32>>,
    pub advantage: f32,
    /// The aggregation weight of each of this sequence's loss tokens (see `loss::agg_weights`).
    pub weight: f32,
}

impl Seq {
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|m| **m).count()
    }
}

/// What to optimise: the SFT loss, or a policy loss (a built-in one, `PpoParams` or GSPO's,
/// or research code's own, all fed the same per-token inputs).
#[derive(Clone, Copy)]
pub enum Objective<'a> {
    Sft,
    Policy(&'a dyn PolicyLoss),
}

/// How sequences become model batches: a token budget per micro-batch, and whether they are
/// packed into one row (no padding) or padded to the longest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatching {
    pub tokens: usize,
    pub packed: bool,
}

impl MicroBatching {
    /// Packed when asked and the model's attention keeps packed sequences apart in O(T)
    /// (flash attention); the composite attention would pay for the whole pack squared.
    pub fn for_model(tokens: usize, packing: bool, model: &Qwen3) -> Self {
        Self {
            tokens,
            packed: packing && model.flash_active(),
        }
    }

    /// The model batch of `seqs`.
    fn batch(&self, seqs: &[&Seq], dev: &candle_core::Device) -> Result<Batch> {
        let rows: Vec<Vec<u32>> = seqs.iter().map(|s| s.tokens.clone()).collect();
        if self.packed {
            Batch::packed(&rows, dev)
        } else {
            Batch::from_rows(&rows, 0, Padding::Right, dev)
        }
    }
}

/// Splits sequence indices into micro-batches whose size stays within the budget: rows x
/// longest row when padded, the sum of lengths when packed (a longer sequence gets a
/// micro-batch of its own). Sequences are taken in length order so rows of similar length
/// share a batch and little compute goes to padding; the loss weights are global, so the
/// grouping does not change the result.
pub fn micro_batches(seqs: &[Seq], mb: MicroBatching) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| (seqs[i].tokens.len(), i));
    let mut out: Vec<Vec<usize>> = vec![];
    let mut used = 0;
    for i in order {
        let n = seqs[i].tokens.len();
        // Rows arrive in ascending length, so the new row is the longest of its batch.
        let fits = out.last().is_some_and(|group: &Vec<usize>| {
            if mb.packed {
                used + n <= mb.tokens
            } else {
                (group.len() + 1) * n <= mb.tokens
            }
        });
        used = if fits { used + n } else { n };
        if !fits {
            out.push(vec![]);
        }
        out.last_mut().expect("non-empty").push(i);
    }
    out
}

/// Flat (row, target) selections of the loss tokens of `seqs` laid out in `batch`.
fn selection(seqs: &[&Seq], batch: &Batch) -> (Vec<u32>, Vec<u32>) {
    let (mut rows, mut targets) = (vec![], vec![]);
    for (r, s) in seqs.iter().enumerate() {
        let start = batch.seq_start(r);
        for (j, &m) in s.loss_mask.iter().enumerate() {
            if m {
                let pos = s.prompt_len + j; // the target token's position
                rows.push((start + pos - 1) as u32);
                targets.push(s.tokens[pos]);
            }
        }
    }
    (rows, targets)
}

/// Per-token log-probs of every sequence's completion tokens under `model` (no graph), in
/// `loss_mask` order: the reference policy's pass.
pub fn logprobs(model: &Qwen3, seqs: &[Seq], how: MicroBatching) -> Result<Vec<Vec<f32>>> {
    let mut out = vec![vec![]; seqs.len()];
    for mb in micro_batches(seqs, how) {
        let group: Vec<&Seq> = mb.iter().map(|&i| &seqs[i]).collect();
        let batch = how.batch(&group, model.device())?;
        let (rows, targets) = selection(&group, &batch);
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
    how: MicroBatching,
) -> Result<(Grads, LossStats)> {
    let dev = model.device();
    let mut grads = Grads::new();
    let mut total = LossStats::default();
    for mb in micro_batches(seqs, how) {
        let group: Vec<&Seq> = mb.iter().map(|&i| &seqs[i]).collect();
        if group.iter().all(|s| s.loss_tokens() == 0) {
            continue;
        }
        let batch = how.batch(&group, dev)?;
        let (rows, targets) = selection(&group, &batch);
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
            Objective::Policy(l) => *l,
        };
        // The loss of the micro-batch's log-probs (N); the model runs forward and backward
        // around it (checkpointed or not).
        let mut stats = None;
        let mut loss_of = |logp: &Tensor| -> Result<Tensor> {
            let (loss, st) = if let Objective::Sft = objective {
                sft_loss(logp, &w)?
            } else {
                let old = per_token(&|s| masked(s, &s.old_logp))?;
                let adv = per_token(&|s| vec![s.advantage; s.loss_tokens()])?;
                let wants_ref = policy
                    .uses_reference()
                    .unwrap_or_else(|| group.iter().all(|s| s.ref_logp.is_some()));
                let reference = if wants_ref {
                    Some(per_token(&|s| s.ref_logp.clone().unwrap_or_default())?)
                } else {
                    None
                };
                let is_weight = if group.iter().all(|s| s.is_weight.is_some()) {
                    Some(per_token(&|s| s.is_weight.clone().unwrap_or_default())?)
                } else {
                    None
                };
                let seq_lens: Vec<usize> = group.iter().map(|s| s.loss_tokens()).collect();
                policy.loss(&LossInputs {
                    logp,
                    old_logp: &old,
                    ref_logp: reference.as_ref(),
                    advantage: &adv,
                    weight: &w,
                    seq_lens: &seq_lens,
                    is_weight: is_weight.as_ref(),
                })?
            };
            stats = Some(st);
            Ok(loss)
        };
        let g = model.logprob_backward(&batch, &rows, &targets, &mut loss_of)?;
        accumulate(&mut grads, g)?;
        let Some(st) = stats else {
            candle_core::bail!("internal: the loss was not computed");
        };
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

    fn check(lens: &[usize], budget: usize, packed: bool, expect: &[&[usize]]) {
        let seqs: Vec<Seq> = lens
            .iter()
            .map(|&n| Seq {
                tokens: vec![0; n],
                prompt_len: 1,
                loss_mask: vec![true; n - 1],
                old_logp: vec![],
                ref_logp: None,
                is_weight: None,
                advantage: 0.0,
                weight: 0.0,
            })
            .collect();
        assert_eq!(
            micro_batches(
                &seqs,
                MicroBatching {
                    tokens: budget,
                    packed
                }
            ),
            expect,
            "lens {lens:?} budget {budget}"
        );
    }

    #[test]
    fn micro_batches_group_similar_lengths_within_the_padded_budget() {
        check(&[10, 2, 9, 3], 20, false, &[&[1, 3], &[2, 0]]);
        check(&[10, 2, 9, 3], 1000, false, &[&[1, 3, 2, 0]]);
        // A row longer than the budget gets a micro-batch of its own.
        check(&[30, 5], 20, false, &[&[1], &[0]]);
        // Equal lengths keep their order.
        check(&[4, 4, 4], 8, false, &[&[0, 1], &[2]]);
        // Packed: the budget bounds the sum of lengths, not rows x longest.
        check(&[10, 2, 9, 3], 20, true, &[&[1, 3, 2], &[0]]);
        check(&[30, 5], 20, true, &[&[1], &[0]]);
        check(&[4, 4, 4], 8, true, &[&[0, 1], &[2]]);
    }
}
