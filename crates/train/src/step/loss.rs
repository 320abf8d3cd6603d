//! The policy loss: PPO-clip (low/high clip, dual clip, log-ratio clamp) plus a KL penalty
//! (k1/k2/k3) against a reference policy, aggregated with GLOBAL per-token weights so that
//! splitting a mini-batch into micro-batches never changes the loss or its gradient; and the
//! completion-only cross-entropy of SFT. Pure tensor functions.

use crate::config::{GrpoSection, KlEstimator, LossAgg};
use candle_core::{DType, Result, Tensor};

/// Per-token aggregation weights for a mini-batch whose sequences have `lens` loss tokens:
/// the loss is Σ_t w_t ℓ_t, with the denominators taken over the whole mini-batch.
pub fn agg_weights(agg: LossAgg, lens: &[usize], norm_len: usize) -> Vec<f64> {
    let seqs = lens.iter().filter(|&&l| l > 0).count().max(1) as f64;
    let tokens = lens.iter().sum::<usize>().max(1) as f64;
    lens.iter()
        .map(|&l| match agg {
            LossAgg::TokenMean => 1.0 / tokens,
            LossAgg::SeqMeanTokenMean => 1.0 / (seqs * l.max(1) as f64),
            LossAgg::SeqMeanTokenSum => 1.0 / seqs,
            LossAgg::SeqMeanTokenSumNorm => 1.0 / (seqs * norm_len.max(1) as f64),
        })
        .collect()
}

/// PPO-clip settings; `PpoParams::default()` is the config's defaults, then set fields.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct PpoParams {
    pub clip_low: f64,
    pub clip_high: f64,
    pub dual_clip: Option<f64>,
    pub log_ratio_clamp: f64,
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
}

impl Default for PpoParams {
    fn default() -> Self {
        Self::from(&GrpoSection::default())
    }
}

impl From<&GrpoSection> for PpoParams {
    fn from(g: &GrpoSection) -> Self {
        Self {
            clip_low: g.clip_low,
            clip_high: g.clip_high,
            dual_clip: g.dual_clip,
            log_ratio_clamp: g.log_ratio_clamp,
            kl_coef: g.kl_coef,
            kl_estimator: g.kl_estimator,
        }
    }
}

/// Detached statistics of one loss evaluation (sums; divide by `tokens` for fractions).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossStats {
    pub loss: f64,
    pub tokens: usize,
    pub clipped_low: usize,
    pub clipped_high: usize,
    pub kl_sum: f64,
    /// Σ |old − new| log-prob: the sampler-vs-trainer gap on the first update.
    pub logp_gap_sum: f64,
}

/// KL(π‖π_ref) estimate per token from log-probs (all (N)).
pub fn kl(logp: &Tensor, ref_logp: &Tensor, est: KlEstimator) -> Result<Tensor> {
    let d = (logp - ref_logp)?;
    match est {
        KlEstimator::K1 => Ok(d),
        KlEstimator::K2 => d.sqr()? * 0.5,
        // exp(r) − r − 1 with r = ref − logp, clamped as verl's low_var_kl does.
        KlEstimator::K3 => {
            let r = d.neg()?.clamp(-20f64, 20f64)?;
            ((r.exp()? - &r)? - 1.0)?.clamp(-10f64, 10f64)
        }
    }
}

/// The per-token inputs of a policy loss over one micro-batch's N loss tokens.
pub struct LossInputs<'a> {
    /// log π(token) under the current policy, differentiable (N).
    pub logp: &'a Tensor,
    /// The sampler's log-probs (N), the reference model's when a KL term is on.
    pub old_logp: &'a Tensor,
    pub ref_logp: Option<&'a Tensor>,
    /// Each token's sequence advantage (N) and aggregation weight (N; Σ over the mini-batch
    /// of weight · per-token loss is the mini-batch loss, whatever the micro-batching).
    pub advantage: &'a Tensor,
    pub weight: &'a Tensor,
    /// The loss tokens of each sequence of the micro-batch, in order: the N tokens are the
    /// sequences' tokens one sequence after another (sequence-level losses such as GSPO).
    pub seq_lens: &'a [usize],
    /// Rollout correction's per-token importance weight (N) on the policy-gradient term; None
    /// when `grpo.rollout_correction` is off.
    pub is_weight: Option<&'a Tensor>,
}

/// A policy loss: the micro-batch's weighted loss (a scalar to backpropagate) and its stats.
/// `PpoParams` (the TOML face: clip, dual clip, KL) implements it; research code passes its own
/// (a closure works) through `GrpoTrainer::policy_loss`.
pub trait PolicyLoss: Send + Sync {
    fn loss(&self, x: &LossInputs) -> Result<(Tensor, LossStats)>;

    /// Whether the loss reads the reference log-probs (`LossInputs::ref_logp`): `None` (the
    /// default) when the rollouts carry them, or a loss's own answer.
    fn uses_reference(&self) -> Option<bool> {
        None
    }
}

impl PolicyLoss for PpoParams {
    fn loss(&self, x: &LossInputs) -> Result<(Tensor, LossStats)> {
        let (pg, stats) = ppo_terms(x.logp, x.old_logp, x.advantage, self)?;
        finish(x, pg, stats, self.kl_coef, self.kl_estimator)
    }

    /// The KL term needs them, and only it.
    fn uses_reference(&self) -> Option<bool> {
        Some(self.kl_coef > 0.0)
    }
}

impl<F: Fn(&LossInputs) -> Result<(Tensor, LossStats)> + Send + Sync> PolicyLoss for F {
    fn loss(&self, x: &LossInputs) -> Result<(Tensor, LossStats)> {
        self(x)
    }
}

/// Σ_t w_t (pg_t + β kl_t) for tokens with new log-probs `logp` (differentiable), sampler
/// log-probs `old`, advantages `adv`, weights `w` and optional reference log-probs (all (N) f32).
/// The hand-checked form of `PpoParams`' loss (its test).
#[cfg(test)]
pub(crate) fn ppo_loss(
    logp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    w: &Tensor,
    ref_logp: Option<&Tensor>,
    p: &PpoParams,
) -> Result<(Tensor, LossStats)> {
    let n = logp.dims1()?;
    p.loss(&LossInputs {
        logp,
        old_logp: old,
        ref_logp,
        advantage: adv,
        weight: w,
        seq_lens: &[n],
        is_weight: None,
    })
}

/// PPO-clip's per-token policy-gradient term (N) and its clip counts.
fn ppo_terms(
    logp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    p: &PpoParams,
) -> Result<(Tensor, LossStats)> {
    let log_ratio = (logp - old)?.clamp(-p.log_ratio_clamp, p.log_ratio_clamp)?;
    let ratio = log_ratio.exp()?;
    let neg_adv = adv.neg()?;
    let pg1 = (&neg_adv * &ratio)?;
    let pg2 = (&neg_adv * ratio.clamp(1.0 - p.clip_low, 1.0 + p.clip_high)?)?;
    let mut pg = pg1.maximum(&pg2)?;
    if let Some(c) = p.dual_clip {
        // For negative advantages the loss is capped at −A·c (Ye et al., dual-clip PPO).
        let capped = pg.minimum(&(&neg_adv * c)?)?;
        let negative = adv.lt(0f64)?;
        pg = negative.where_cond(&capped, &pg)?;
    }
    let stats = clip_counts(&ratio, adv, p.clip_low, p.clip_high)?;
    Ok((pg, stats))
}

/// Tokens whose ratio (N) was clipped below (A < 0) and above (A > 0).
pub(crate) fn clip_counts(ratio: &Tensor, adv: &Tensor, low: f64, high: f64) -> Result<LossStats> {
    let r: Vec<f32> = ratio.to_dtype(DType::F32)?.to_vec1()?;
    let a: Vec<f32> = adv.to_dtype(DType::F32)?.to_vec1()?;
    Ok(LossStats {
        tokens: r.len(),
        clipped_low: r
            .iter()
            .zip(&a)
            .filter(|(r, a)| **a < 0.0 && f64::from(**r) < 1.0 - low)
            .count(),
        clipped_high: r
            .iter()
            .zip(&a)
            .filter(|(r, a)| **a > 0.0 && f64::from(**r) > 1.0 + high)
            .count(),
        ..Default::default()
    })
}

/// The weighted loss Σ_t w_t (is_t · pg_t + β kl_t) from a per-token policy-gradient term, with
/// the KL and the sampler gap added to `stats`.
pub(crate) fn finish(
    x: &LossInputs,
    pg: Tensor,
    mut stats: LossStats,
    kl_coef: f64,
    kl_estimator: KlEstimator,
) -> Result<(Tensor, LossStats)> {
    let mut per_token = match x.is_weight {
        Some(is) => (pg * is)?,
        None => pg,
    };
    if let (Some(r), true) = (x.ref_logp, kl_coef > 0.0) {
        let k = kl(x.logp, r, kl_estimator)?;
        stats.kl_sum = k.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        per_token = (per_token + (k * kl_coef)?)?;
    }
    let loss = (per_token * x.weight)?.sum_all()?;
    stats.loss = loss.to_dtype(DType::F64)?.to_scalar()?;
    stats.logp_gap_sum = (x.logp - x.old_logp)?
        .abs()?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar()?;
    Ok((loss, stats))
}

/// SFT: −Σ_t w_t log p_t.
pub fn sft_loss(logp: &Tensor, w: &Tensor) -> Result<(Tensor, LossStats)> {
    let loss = (logp * w)?.sum_all()?.neg()?;
    let stats = LossStats {
        loss: loss.to_dtype(DType::F64)?.to_scalar()?,
        tokens: logp.dims1()?,
        ..Default::default()
    };
    Ok((loss, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).expect("t")
    }

    #[test]
    fn ppo_loss_equals_a_hand_computation() {
        // Four tokens: ratio inside, above 1+ε_high (A>0: clipped), below 1−ε_low (A<0:
        // clipped), and far above with A<0 (dual clip caps it at 3·|A|).
        let old = t(&[-1.0, -1.0, -1.0, -1.0]);
        let logp = t(&[-0.9, -0.5, -1.5, 1.0]);
        let adv = t(&[1.0, 2.0, -1.0, -0.5]);
        let w = t(&[0.25, 0.25, 0.25, 0.25]);
        let p = PpoParams {
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0),
            log_ratio_clamp: 20.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
        };
        let (loss, st) = ppo_loss(&logp, &old, &adv, &w, None, &p).expect("loss");
        let r = [0.1f64.exp(), 0.5f64.exp(), (-0.5f64).exp(), 2.0f64.exp()];
        let tok = [
            -r[0],                                     // inside the clip range
            (-2.0 * r[1]).max(-2.0 * 1.28),            // A>0, clipped high: −2·1.28
            (1.0 * r[2]).max(1.0 * 0.8),               // A<0, ratio 0.61 < 0.8: max picks 0.8
            (0.5 * r[3]).clamp(0.5 * 1.28, 0.5 * 3.0), // A<0, ratio 7.39: dual clip caps at 1.5
        ];
        let expect: f64 = tok.iter().sum::<f64>() * 0.25;
        let got = f64::from(loss.to_scalar::<f32>().expect("s"));
        assert!((got - expect).abs() < 1e-6, "{got} vs {expect}");
        assert_eq!((st.clipped_low, st.clipped_high), (1, 1));
    }

    #[test]
    fn kl_estimators() {
        let (lp, rf) = (t(&[-1.0, -2.0]), t(&[-1.5, -2.0]));
        let k = |e| kl(&lp, &rf, e).expect("kl").to_vec1::<f32>().expect("v");
        assert_eq!(k(KlEstimator::K1), [0.5, 0.0]);
        assert_eq!(k(KlEstimator::K2), [0.125, 0.0]);
        let k3 = k(KlEstimator::K3);
        assert!((f64::from(k3[0]) - ((-0.5f64).exp() + 0.5 - 1.0)).abs() < 1e-6 && k3[1] == 0.0);
        // k3 is non-negative whatever the sign of the difference.
        assert!(kl(&rf, &lp, KlEstimator::K3)
            .expect("kl")
            .to_vec1::<f32>()
            .expect("v")
            .iter()
            .all(|x| *x >= 0.0));
    }

    #[test]
    fn aggregation_weights() {
        let lens = [2, 4];
        assert_eq!(
            agg_weights(LossAgg::TokenMean, &lens, 8),
            [1.0 / 6.0, 1.0 / 6.0]
        );
        assert_eq!(
            agg_weights(LossAgg::SeqMeanTokenMean, &lens, 8),
            [0.25, 0.125]
        );
        assert_eq!(agg_weights(LossAgg::SeqMeanTokenSum, &lens, 8), [0.5, 0.5]);
        assert_eq!(
            agg_weights(LossAgg::SeqMeanTokenSumNorm, &lens, 8),
            [1.0 / 16.0, 1.0 / 16.0]
        );
    }
}
