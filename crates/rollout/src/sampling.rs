//! Exact sampling from one row of logits: temperature, then top-k, top-p and min-p truncation
//! (HF's warper order), then inverse-CDF with one uniform number from the sample's own stream.
//! Pure functions; the engine calls `sample_row` for every active row of a decode step.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How tokens are drawn. `temperature = 0` means greedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
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
}

/// One drawn token with its log-probability under the distribution it was drawn from (after
/// truncation and renormalisation) and under the plain temperature-scaled softmax (what the
/// trainer recomputes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drawn {
    pub token: u32,
    pub logp_sampled: f32,
    pub logp_plain: f32,
    /// Entropy (nats) of the plain temperature-scaled softmax the token came from.
    pub entropy: f32,
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
    let (probs, log_z, _) = distribution_with_entropy(logits, p);
    (probs, log_z)
}

/// [`distribution`] plus the entropy of the plain softmax (computed from the same exponentials).
fn distribution_with_entropy(logits: &[f32], p: &SamplingParams) -> (Vec<(u32, f64)>, f64, f64) {
    let t = if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    };
    let scaled: Vec<f64> = logits.iter().map(|&x| f64::from(x) / t).collect();
    let m = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scaled.iter().map(|x| (x - m).exp()).sum();
    let log_z = m + z.ln();
    if p.temperature == 0.0 {
        // First maximal index, as argmax does.
        let best = scaled.iter().position(|&x| x == m).unwrap_or(0);
        let entropy = scaled.iter().map(|x| (x - log_z).exp() * (log_z - x)).sum();
        return (vec![(best as u32, 1.0)], log_z, entropy);
    }
    let mut probs: Vec<(u32, f64)> = scaled
        .iter()
        .enumerate()
        .map(|(i, x)| (i as u32, (x - log_z).exp()))
        .collect();
    // H = Σ p (log Z − x); terms with p = 0 contribute nothing.
    let entropy = probs
        .iter()
        .map(|&(i, q)| {
            if q > 0.0 {
                q * (log_z - scaled[i as usize])
            } else {
                0.0
            }
        })
        .sum();
    let truncating = (p.top_k > 0 && p.top_k < probs.len()) || p.top_p < 1.0 || p.min_p > 0.0;
    if truncating {
        // Descending probability, ties by token id (deterministic).
        probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            probs.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let total: f64 = probs.iter().map(|x| x.1).sum();
            let mut cum = 0.0;
            let keep = probs
                .iter()
                .position(|x| {
                    cum += x.1 / total;
                    cum >= p.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        if p.min_p > 0.0 {
            let total: f64 = probs.iter().map(|x| x.1).sum();
            let cut = p.min_p * probs[0].1 / total;
            probs.retain(|x| x.1 / total >= cut);
        }
    }
    let total: f64 = probs.iter().map(|x| x.1).sum();
    for x in &mut probs {
        x.1 /= total;
    }
    (probs, log_z, entropy)
}

/// Draws one token from a row of logits with uniform `u` ∈ [0, 1).
pub fn sample_row(logits: &[f32], p: &SamplingParams, u: f64) -> Drawn {
    let (dist, log_z, entropy) = distribution_with_entropy(logits, p);
    let mut cum = 0.0;
    let mut pick = dist[dist.len() - 1];
    for &x in &dist {
        cum += x.1;
        if u < cum {
            pick = x;
            break;
        }
    }
    let t = if p.temperature > 0.0 {
        p.temperature
    } else {
        1.0
    };
    Drawn {
        token: pick.0,
        logp_sampled: pick.1.ln() as f32,
        logp_plain: (f64::from(logits[pick.0 as usize]) / t - log_z) as f32,
        entropy: entropy as f32,
    }
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
