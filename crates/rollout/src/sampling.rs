//! Exact sampling from one row of logits: temperature, then top-k, top-p and min-p truncation
//! (HF's warper order), then inverse-CDF with one uniform number from the sample's own stream.
//! The settings (`SamplingParams`) and the streams live here; the semantics are
//! terse_model::sample's (its reference on the CPU, its kernel on CUDA), so the two paths
//! cannot drift. The scheduler samples every ready row of a step at once (`sample_rows`).

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
pub use terse_model::sample::Drawn;
use terse_model::sample::{reference, Warpers};

/// How tokens are drawn. `temperature = 0` means greedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SamplingParams {
    pub temperature: f64,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1 = off).
    pub top_p: f64,
    /// Drop tokens below min_p · p_max (0 = off).
    pub min_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "sampling.temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!(
                "sampling.top_p must be in (0, 1], got {}",
                self.top_p
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!(
                "sampling.min_p must be in [0, 1], got {}",
                self.min_p
            ));
        }
        Ok(())
    }

    /// The settings as the sampler (terse_model's reference and kernel) takes them.
    pub fn warpers(&self) -> Warpers {
        Warpers {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }
}

/// The random stream of one sample, keyed by (seed, prompt id, sample index) so a sample's
/// draws do not depend on what else is in the batch.
pub fn sample_stream(seed: u64, prompt_id: u64, sample_index: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(
        prompt_id
            .wrapping_mul(0x1_0000_0001)
            .wrapping_add(sample_index),
    );
    rng
}

/// A uniform number in [0, 1) with 53 random bits.
pub fn uniform(rng: &mut impl RngCore) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// The truncated, renormalised distribution as (token, probability) pairs, plus the plain
/// log-partition (for plain log-probs). Greedy returns the argmax with probability 1.
pub fn distribution(logits: &[f32], p: &SamplingParams) -> (Vec<(u32, f64)>, f64) {
    reference::distribution(logits, &p.warpers())
}

/// Draws one token from a row of logits with uniform `u` ∈ [0, 1).
pub fn sample_row(logits: &[f32], p: &SamplingParams, u: f64) -> Drawn {
    reference::sample_row(logits, &p.warpers(), u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_first_maximum_and_reports_plain_logp() {
        let d = sample_row(&[1.0, 3.0, 3.0, 0.0], &SamplingParams::greedy(), 0.99);
        assert_eq!(d.token, 1);
        assert_eq!(d.logp_sampled, 0.0);
        let z = (1f64.exp() + 2.0 * 3f64.exp() + 1.0).ln();
        assert!((f64::from(d.logp_plain) - (3.0 - z)).abs() < 1e-6);
        // Entropy of softmax([1, 3, 3, 0]) from its definition.
        let h: f64 = [1.0f64, 3.0, 3.0, 0.0]
            .iter()
            .map(|x| -(x - z).exp() * (x - z))
            .sum();
        assert!(
            (f64::from(d.entropy) - h).abs() < 1e-6,
            "{} vs {h}",
            d.entropy
        );
        // With temperature and truncation, the entropy is still the plain softmax's.
        let p = SamplingParams {
            temperature: 0.5,
            top_k: 1,
            ..SamplingParams::default()
        };
        let d = sample_row(&[1.0, 3.0, 3.0, 0.0], &p, 0.3);
        let s = [2.0f64, 6.0, 6.0, 0.0];
        let z = s.iter().map(|x| x.exp()).sum::<f64>().ln();
        let h: f64 = s.iter().map(|x| -(x - z).exp() * (x - z)).sum();
        assert!(
            (f64::from(d.entropy) - h).abs() < 1e-6,
            "{} vs {h}",
            d.entropy
        );
    }

    #[test]
    fn truncations_keep_the_expected_sets() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let tokens = |p: SamplingParams| {
            let mut t: Vec<u32> = distribution(&logits, &p).0.iter().map(|x| x.0).collect();
            t.sort();
            t
        };
        assert_eq!(
            tokens(SamplingParams {
                top_k: 2,
                ..Default::default()
            }),
            [2, 3]
        );
        // p = [0.032, 0.087, 0.237, 0.644]: top-p 0.7 needs the two largest.
        assert_eq!(
            tokens(SamplingParams {
                top_p: 0.7,
                ..Default::default()
            }),
            [2, 3]
        );
        assert_eq!(
            tokens(SamplingParams {
                top_p: 0.6,
                ..Default::default()
            }),
            [3]
        );
        // min-p 0.3: keep p >= 0.193.
        assert_eq!(
            tokens(SamplingParams {
                min_p: 0.3,
                ..Default::default()
            }),
            [2, 3]
        );
    }

    #[test]
    fn streams_are_independent_per_sample_and_reproducible() {
        let a: Vec<u64> = (0..3).map(|_| sample_stream(1, 2, 3).next_u64()).collect();
        assert!(a.iter().all(|x| *x == a[0]));
        assert_ne!(
            sample_stream(1, 2, 3).next_u64(),
            sample_stream(1, 2, 4).next_u64()
        );
        assert_ne!(
            sample_stream(1, 2, 3).next_u64(),
            sample_stream(1, 3, 3).next_u64()
        );
    }
}
