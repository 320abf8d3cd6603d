//! GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071): the
//! policy loss with a sequence-level importance ratio, `grpo.loss = "gspo"` or "gspo-token".
//! One `PolicyLoss` beside PPO-clip (loss.rs): update.rs picks it from the config, batches.rs
//! feeds it the micro-batch's per-token inputs with each sequence's token count.
//!
//! s_i = exp(mean_t (log π_θ(y_t) − log π_old(y_t))) over sequence i's loss tokens; the loss of
//! sequence i is max(−A_i s_i, −A_i clip(s_i, 1 − ε_low, 1 + ε_high)), written on each of its
//! tokens so the configured aggregation applies (the paper's objective is `loss_agg =
//! "seq-mean-token-mean"`: 1/G Σ_i). GSPO-token replaces s_i on token t by
//! sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]: the same value and clipping, a per-token gradient path;
//! with one advantage per sequence (GRPO's) its gradient equals GSPO's (paper §4.3).

use crate::config::{Chosen, GrpoSection, KlEstimator, PolicyLossKind};
use crate::step::loss::{clip_counts, finish, LossInputs, LossStats, PolicyLoss};
use candle_core::{Result, Tensor};

/// GSPO's settings (the TOML face: `grpo.loss`, `grpo.gspo_clip_low` / `_high`, the KL).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GspoParams {
    pub clip_low: f64,
    pub clip_high: f64,
    /// GSPO-token's per-token gradient path.
    pub token: bool,
    pub log_ratio_clamp: f64,
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
}

impl GspoParams {
    /// The config's GSPO loss, or None when `grpo.loss` is PPO or a registered loss.
    pub fn of_grpo(g: &GrpoSection) -> Option<Self> {
        let token = match g.loss {
            Chosen::Builtin(PolicyLossKind::Gspo) => false,
            Chosen::Builtin(PolicyLossKind::GspoToken) => true,
            Chosen::Builtin(PolicyLossKind::Ppo) | Chosen::Registered(_) => return None,
        };
        Some(Self {
            clip_low: g.gspo_clip_low,
            clip_high: g.gspo_clip_high,
            token,
            log_ratio_clamp: g.log_ratio_clamp,
            kl_coef: g.kl_coef,
            kl_estimator: g.kl_estimator,
        })
    }
}

/// Each token's sequence mean of `x` (N): mean over its sequence's `seq_lens` tokens, repeated.
fn seq_mean(x: &Tensor, seq_lens: &[usize]) -> Result<Tensor> {
    let mut parts = Vec::with_capacity(seq_lens.len());
    let mut at = 0;
    for &n in seq_lens {
        if n == 0 {
            continue;
        }
        let m = x.narrow(0, at, n)?.mean_all()?; // ()
        parts.push(m.broadcast_as(n)?); // (n)
        at += n;
    }
    if at != x.dims1()? {
        candle_core::bail!("gspo: {} tokens but the sequences hold {at}", x.dims1()?);
    }
    Tensor::cat(&parts, 0)
}

impl PolicyLoss for GspoParams {
    fn loss(&self, x: &LossInputs) -> Result<(Tensor, LossStats)> {
        let c = self.log_ratio_clamp;
        // log s_i on each token (N), clamped as PPO's token ratio is.
        let log_s = seq_mean(&(x.logp - x.old_logp)?, x.seq_lens)?.clamp(-c, c)?;
        let s = if self.token {
            // sg[s_i] · exp(logp − sg[logp]): the value of s_i, the gradient of logp_t.
            (log_s.detach() + (x.logp - x.logp.detach())?)?.exp()?
        } else {
            log_s.exp()?
        };
        let neg_adv = x.advantage.neg()?;
        let pg1 = (&neg_adv * &s)?;
        let pg2 = (&neg_adv * s.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)?)?;
        let pg = pg1.maximum(&pg2)?;
        let stats = clip_counts(&s, x.advantage, self.clip_low, self.clip_high)?;
        finish(x, pg, stats, self.kl_coef, self.kl_estimator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t(v: &[f64]) -> Tensor {
        Tensor::new(v, &Device::Cpu).expect("t")
    }

    fn params(token: bool) -> GspoParams {
        GspoParams {
            clip_low: 0.1,
            clip_high: 0.2,
            token,
            log_ratio_clamp: 20.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
        }
    }

    /// Two sequences (3 and 2 tokens) with seq-mean-token-mean weights: sequence 0's ratio
    /// exp(0.05) is inside the clip (A = 1), sequence 1's exp(0.5) is clipped at 1.2 (A = 2).
    const OLD: [f64; 5] = [-1.0, -2.0, -0.5, -1.0, -1.0];
    const NEW: [f64; 5] = [-0.9, -2.0, -0.45, -0.7, -0.3];
    const ADV: [f64; 5] = [1.0, 1.0, 1.0, 2.0, 2.0];
    const W: [f64; 5] = [1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.25, 0.25];
    const LENS: [usize; 2] = [3, 2];

    fn run(p: &GspoParams, new: &Tensor) -> (Tensor, LossStats) {
        p.loss(&LossInputs {
            logp: new,
            old_logp: &t(&OLD),
            ref_logp: None,
            advantage: &t(&ADV),
            weight: &t(&W),
            seq_lens: &LENS,
            is_weight: None,
        })
        .expect("loss")
    }

    #[test]
    fn gspo_equals_a_hand_computation_in_both_variants() {
        let s0 = (0.15f64 / 3.0).exp(); // mean log-ratio (0.1 + 0 + 0.05) / 3
                                        // Sequence 1: exp((0.3 + 0.7) / 2) = 1.65 clipped to 1.2, with A = 2.
        let want = 0.5 * (-s0) + 0.5 * (-2.0 * 1.2);
        for token in [false, true] {
            let (loss, st) = run(&params(token), &t(&NEW));
            let got = loss.to_scalar::<f64>().expect("scalar");
            assert!((got - want).abs() < 1e-12, "token {token}: {got} vs {want}");
            assert_eq!((st.clipped_low, st.clipped_high, st.tokens), (0, 2, 5));
        }
    }

    /// d loss / d logp against central finite differences (f64), for both variants; they
    /// agree with each other since the advantages are per sequence.
    #[test]
    fn gspo_gradients_match_finite_differences() {
        // Sequence 1 inside the clip too, so both sequences carry a gradient.
        let mut new = NEW.to_vec();
        new[3] = -0.95;
        new[4] = -0.9;
        let mut grads = vec![];
        for token in [false, true] {
            let p = params(token);
            let v = Var::new(new.as_slice(), &Device::Cpu).expect("var");
            let (loss, _) = run(&p, v.as_tensor());
            let g = loss.backward().expect("backward");
            let g: Vec<f64> = g.get(&v).expect("grad").to_vec1().expect("g");
            let h = 1e-6;
            for i in 0..new.len() {
                let at = |d: f64| {
                    let mut x = new.clone();
                    x[i] += d;
                    run(&p, &t(&x)).0.to_scalar::<f64>().expect("s")
                };
                let fd = (at(h) - at(-h)) / (2.0 * h);
                assert!(
                    (fd - g[i]).abs() < 1e-7,
                    "token {token}, {i}: {fd} vs {}",
                    g[i]
                );
            }
            grads.push(g);
        }
        for (a, b) in grads[0].iter().zip(&grads[1]) {
            assert!(
                (a - b).abs() < 1e-12,
                "GSPO vs GSPO-token gradient {a} vs {b}"
            );
        }
    }
}
