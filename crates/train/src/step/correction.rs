//! Rollout correction (`grpo.rollout_correction`): the sampler's log-probs (paged decode,
//! perhaps an f16 KV cache or bf16 kernels) are not the trainer's (flash attention, f32
//! master weights), so the PPO ratio against the sampler mixes the policy's change with the
//! two engines' mismatch. With the correction on, update.rs first recomputes the old policy's
//! log-probs with the trainer (before any update), and this module makes each sequence use them
//! as PPO's old log-probs and attaches the importance weight of the trainer over the sampler,
//! truncated at the cap (TIS, Yao et al. 2025; verl's `rollout_is`) or zeroed above it (MIS),
//! per token or per sequence (the product of the token ratios). The loss (loss.rs `finish`)
//! multiplies each token's policy-gradient term by that weight. Pure: no tensors.

use crate::config::{CorrectionLevel, CorrectionMethod, RolloutCorrection};
use crate::step::batches::Seq;

/// What the correction saw over one step's sequences (this rank's).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CorrectionStats {
    /// Σ |trainer − sampler| log-prob over the loss tokens.
    pub gap_sum: f64,
    pub tokens: usize,
    /// Loss tokens whose ratio exceeded the cap (truncated by TIS, dropped by MIS).
    pub capped: usize,
    /// The largest ratio seen (token or sequence, per the level).
    pub ratio_max: f64,
}

/// The weight of a ratio under the method.
fn weight(method: CorrectionMethod, ratio: f64, cap: f64) -> f64 {
    match method {
        CorrectionMethod::Tis => ratio.min(cap),
        CorrectionMethod::Mis if ratio > cap => 0.0,
        CorrectionMethod::Mis => ratio,
    }
}

/// Replaces each sequence's old log-probs at its loss tokens by the trainer's (`trainer[i]`,
/// one per loss token, as `batches::logprobs` returns them) and sets its importance weights.
pub fn apply(rc: &RolloutCorrection, seqs: &mut [Seq], trainer: &[Vec<f32>]) -> CorrectionStats {
    let mut st = CorrectionStats::default();
    for (s, lp) in seqs.iter_mut().zip(trainer) {
        // The sampler's log-prob of each loss token, in order.
        let sampler: Vec<f32> = s
            .loss_mask
            .iter()
            .zip(&s.old_logp)
            .filter(|(m, _)| **m)
            .map(|(_, x)| *x)
            .collect();
        let d: Vec<f64> = lp
            .iter()
            .zip(&sampler)
            .map(|(t, q)| f64::from(*t) - f64::from(*q))
            .collect();
        st.tokens += d.len();
        st.gap_sum += d.iter().map(|x| x.abs()).sum::<f64>();
        let w: Vec<f32> = match rc.level {
            CorrectionLevel::Token => d
                .iter()
                .map(|x| {
                    let r = x.exp();
                    st.ratio_max = st.ratio_max.max(r);
                    st.capped += usize::from(r > rc.cap);
                    weight(rc.method, r, rc.cap) as f32
                })
                .collect(),
            CorrectionLevel::Sequence => {
                let r = d.iter().sum::<f64>().exp();
                st.ratio_max = st.ratio_max.max(r);
                if r > rc.cap {
                    st.capped += d.len();
                }
                vec![weight(rc.method, r, rc.cap) as f32; d.len()]
            }
        };
        let mut k = 0;
        for (m, old) in s.loss_mask.iter().zip(s.old_logp.iter_mut()) {
            if *m {
                *old = lp[k];
                k += 1;
            }
        }
        s.is_weight = Some(w);
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(old: &[f32], mask: &[bool]) -> Seq {
        Seq {
            tokens: vec![0; old.len() + 1],
            prompt_len: 1,
            loss_mask: mask.to_vec(),
            old_logp: old.to_vec(),
            ref_logp: None,
            is_weight: None,
            advantage: 1.0,
            weight: 0.0,
        }
    }

    fn rc(method: CorrectionMethod, level: CorrectionLevel) -> RolloutCorrection {
        RolloutCorrection {
            method,
            cap: 2.0,
            level,
        }
    }

    #[test]
    fn token_and_sequence_weights_by_hand() {
        // Loss tokens: the injected middle token is skipped. Log-ratios ln 3 (capped), 0, ln 0.5.
        let mask = [true, true, false, true];
        let sampler = [-1.0f32, -2.0, -9.0, -1.0];
        let trainer = vec![vec![-1.0 + 3f32.ln(), -2.0, -1.0 + 0.5f32.ln()]];
        let near = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        let mut s = [seq(&sampler, &mask)];
        let st = apply(
            &rc(CorrectionMethod::Tis, CorrectionLevel::Token),
            &mut s,
            &trainer,
        );
        assert!(near(
            s[0].is_weight.as_deref().expect("w"),
            &[2.0, 1.0, 0.5]
        ));
        assert_eq!((st.tokens, st.capped), (3, 1));
        assert!((st.ratio_max - 3.0).abs() < 1e-5);
        // The old log-probs are the trainer's at loss tokens; the injected one is untouched.
        assert_eq!(s[0].old_logp[2], -9.0);
        assert_eq!(s[0].old_logp[3], trainer[0][2]);
        let mut s = [seq(&sampler, &mask)];
        apply(
            &rc(CorrectionMethod::Mis, CorrectionLevel::Token),
            &mut s,
            &trainer,
        );
        assert!(near(
            s[0].is_weight.as_deref().expect("w"),
            &[0.0, 1.0, 0.5]
        ));
        // Sequence: the product 3 · 1 · 0.5 = 1.5, under the cap, on every token.
        let mut s = [seq(&sampler, &mask)];
        let st = apply(
            &rc(CorrectionMethod::Tis, CorrectionLevel::Sequence),
            &mut s,
            &trainer,
        );
        assert!(near(
            s[0].is_weight.as_deref().expect("w"),
            &[1.5, 1.5, 1.5]
        ));
        assert_eq!(st.capped, 0);
    }

    #[test]
    fn identical_numerics_give_weights_of_exactly_one() {
        let sampler = [-0.3f32, -1.7, -2.25];
        let mut s = [seq(&sampler, &[true; 3])];
        for level in [CorrectionLevel::Token, CorrectionLevel::Sequence] {
            for method in [CorrectionMethod::Tis, CorrectionMethod::Mis] {
                let st = apply(&rc(method, level), &mut s, &[sampler.to_vec()]);
                assert_eq!(s[0].is_weight.as_deref(), Some(&[1.0f32; 3][..]));
                assert_eq!(s[0].old_logp, sampler);
                assert_eq!((st.gap_sum, st.capped, st.ratio_max), (0.0, 0, 1.0));
            }
        }
    }
}
