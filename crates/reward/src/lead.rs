//! GRPO-LEAD (docs/methods.md, GRPO-LEAD; arXiv 2504.09696): a length-dependent accuracy reward
//! (right: exp(−α·z), z the length z-score among the group's right completions; wrong: −1) and
//! the difficulty-aware advantage reweighting that `Advantage::Grpo { difficulty }` applies.
//!
//! Sits in two places of the data flow: the shaper (`method = "grpo_lead"`) between scoring and
//! advantages, and [`DifficultyWeight`] inside the GRPO estimator, after the group
//! normalisation.

use crate::types::{mean, std, Group};
use serde::{Deserialize, Serialize};

/// The ε of the z-score's denominator (the released code's 1e-6).
const Z_EPS: f64 = 1e-6;

/// The shaper: the base reward is replaced by exp(−α·z) for a right completion and by −1 (the
/// explicit penalty) for a wrong one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoLead {
    /// α: how strongly a right completion longer than its group's right ones is paid less
    /// (0.05 in the released code; the paper does not print a value).
    pub alpha: f64,
    /// The explicit penalty: a wrong completion gets −1. Off: 0 (the paper's ablation).
    pub explicit_penalty: bool,
}

impl Default for GrpoLead {
    fn default() -> Self {
        Self {
            alpha: 0.05,
            explicit_penalty: true,
        }
    }
}

impl GrpoLead {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.alpha >= 0.0 && self.alpha.is_finite()) {
            return Err(format!(
                "grpo_lead.alpha must be a finite number >= 0, got {}",
                self.alpha
            ));
        }
        Ok(())
    }

    /// One group's rewards. μ and σ are the mean and the unbiased std of the right
    /// completions' lengths (the released code's `torch.std`); with one right completion z is
    /// 0, with equal lengths (σ = 0) every z is 0, so a right completion then gets exactly 1.
    pub fn rewards(&self, g: &Group) -> Vec<f64> {
        let lens = g.correct_lens();
        let (mu, sigma) = (mean(&lens), std(&lens, 1));
        let wrong = if self.explicit_penalty { -1.0 } else { 0.0 };
        g.samples
            .iter()
            .map(|s| {
                if s.correct {
                    let z = (s.len as f64 - mu) / (sigma + Z_EPS);
                    (-self.alpha * z).exp()
                } else {
                    wrong
                }
            })
            .collect()
    }
}

/// GRPO-LEAD's difficulty weight: a logistic in the group's accuracy ρ,
/// w(ρ) = A + (B − A) / (1 + exp(k·(ρ − ρ₀))), falling from about B on hard prompts to about A
/// on easy ones. A positive advantage is scaled by w(ρ), a negative one by w(1 − ρ): a right
/// answer to a hard prompt and a wrong answer to an easy one are the strongest signals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DifficultyWeight {
    /// A, the weight's floor (easy prompts).
    pub a: f64,
    /// B, the weight's ceiling (hard prompts).
    pub b: f64,
    /// ρ₀, the accuracy at the logistic's midpoint.
    pub rho0: f64,
    /// k, the logistic's steepness.
    pub k: f64,
}

impl Default for DifficultyWeight {
    /// The released code's constants (`logistic_reweight`).
    fn default() -> Self {
        Self {
            a: 0.4,
            b: 1.5,
            rho0: 0.75,
            k: 10.0,
        }
    }
}

impl DifficultyWeight {
    pub fn validate(&self) -> Result<(), String> {
        for (key, v) in [("a", self.a), ("b", self.b)] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(format!(
                    "advantage.difficulty.{key} must be a finite number > 0, got {v}"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.rho0) {
            return Err(format!(
                "advantage.difficulty.rho0 must be in [0, 1], got {}",
                self.rho0
            ));
        }
        if !(self.k >= 0.0 && self.k.is_finite()) {
            return Err(format!(
                "advantage.difficulty.k must be a finite number >= 0, got {}",
                self.k
            ));
        }
        Ok(())
    }

    /// w(ρ).
    pub fn weight(&self, rho: f64) -> f64 {
        self.a + (self.b - self.a) / (1.0 + (self.k * (rho - self.rho0)).exp())
    }

    /// An advantage reweighted for a group of accuracy ρ: w(ρ)·A for A > 0, w(1 − ρ)·A
    /// otherwise (0 stays 0).
    pub fn apply(&self, adv: f64, rho: f64) -> f64 {
        if adv > 0.0 {
            adv * self.weight(rho)
        } else {
            adv * self.weight(1.0 - rho)
        }
    }
}

/// ρ of a group: the share of its scorable samples the verifier judged right (0 when it has
/// none). The released code counts positive rewards, which under the GRPO-LEAD shaper are the
/// right completions.
pub fn accuracy_of_scorable(g: &Group) -> f64 {
    let n = g.samples.iter().filter(|s| s.scorable).count();
    if n == 0 {
        return 0.0;
    }
    g.samples.iter().filter(|s| s.scorable && s.correct).count() as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{check, group};
    use crate::SampleStat;

    #[test]
    fn the_reward_is_exp_of_minus_alpha_z_over_the_right_lengths() {
        // Right lengths 100, 200, 300: μ = 200, σ (unbiased) = sqrt((100² + 0 + 100²) / 2) = 100,
        // so z = −1, 0, +1 (to 1e-8: σ + 1e-6). With α = 0.5: exp(0.5) = 1.648721,
        // exp(0) = 1, exp(−0.5) = 0.606531; the wrong one (length 50) gets −1.
        let g = group(&[100, 200, 300, 50], &[true, true, true, false]);
        let r = GrpoLead {
            alpha: 0.5,
            ..Default::default()
        }
        .rewards(&g);
        check(&r, &[1.648721, 1.0, 0.606531, -1.0]);
        // Without the explicit penalty the wrong one gets 0.
        let r = GrpoLead {
            alpha: 0.5,
            explicit_penalty: false,
        }
        .rewards(&g);
        check(&r, &[1.648721, 1.0, 0.606531, 0.0]);
    }

    #[test]
    fn edge_cases_no_right_one_right_equal_lengths_and_truncation() {
        let lead = GrpoLead::default();
        // No right completion: every sample is wrong, −1 each (no z to compute).
        check(
            &lead.rewards(&group(&[10, 20], &[false, false])),
            &[-1.0, -1.0],
        );
        // One right completion: μ = its length, σ = 0 (ddof 1 of one value), z = 0, reward 1.
        check(
            &lead.rewards(&group(&[10, 20], &[true, false])),
            &[1.0, -1.0],
        );
        // Equal lengths: σ = 0, z = 0 for all, reward exactly 1 (never NaN).
        check(
            &lead.rewards(&group(&[40, 40, 40], &[true, true, true])),
            &[1.0, 1.0, 1.0],
        );
        // A truncated completion is scored by its verdict like any other (grpo.truncated_reward
        // = "zero" makes it wrong before the shaper): here it is wrong, gets −1, and its length
        // (4096) does not enter μ: the right ones 100 and 300 have z = ∓0.707107.
        let mut g = group(&[100, 300, 4096], &[true, true, false]);
        g.samples[2].truncated = true;
        // σ = sqrt(2 · 100² / 1) = 141.421356; z = ∓100 / 141.421357 = ∓0.707107;
        // exp(±0.05 · 0.707107) = 1.035988, 0.965262.
        check(&lead.rewards(&g), &[1.035988, 0.965262, -1.0]);
    }

    #[test]
    fn the_difficulty_weight_is_the_released_logistic() {
        let w = DifficultyWeight::default();
        // ρ = ρ₀: the midpoint, A + (B − A)/2 = 0.4 + 0.55 = 0.95.
        assert!((w.weight(0.75) - 0.95).abs() < 1e-12);
        // ρ = 0.25: exp(10 · (−0.5)) = 0.006738; 0.4 + 1.1 / 1.006738 = 1.492638.
        assert!((w.weight(0.25) - 1.492638).abs() < 1e-6);
        // ρ = 1: exp(2.5) = 12.182494; 0.4 + 1.1 / 13.182494 = 0.483444.
        assert!((w.weight(1.0) - 0.483444).abs() < 1e-6);
        // A positive advantage at ρ = 0.25 uses w(0.25); a negative one uses w(0.75).
        assert!((w.apply(2.0, 0.25) - 2.0 * 1.492638).abs() < 1e-5);
        assert!((w.apply(-2.0, 0.25) + 2.0 * 0.95).abs() < 1e-12);
        assert_eq!(w.apply(0.0, 0.25), 0.0);
    }

    #[test]
    fn grpo_with_difficulty_weights_scales_positive_and_negative_advantages() {
        // Rewards [1, 0, 0, 0] (ρ = 1/4): mean 0.25, std (ddof 1) = sqrt(0.75 / 3) = 0.5, so
        // GRPO gives 1.5 and −0.5 (ε = 0). w(ρ = 0.25) = 1.492638 scales the positive one:
        // 2.238957; w(1 − ρ = 0.75) = 0.95 the negative ones: −0.475.
        let g = group(&[1, 2, 3, 4], &[true, false, false, false]);
        let shaped = crate::Shaped {
            rewards: vec![vec![1.0, 0.0, 0.0, 0.0]],
            ..Default::default()
        };
        let est = crate::Advantage::Grpo {
            std: true,
            ddof: 1,
            eps: 0.0,
            norm: crate::Norm::Group,
            difficulty: Some(DifficultyWeight::default()),
        };
        est.validate().expect("valid");
        let a = est
            .compute(std::slice::from_ref(&g), &shaped)
            .expect("advantages");
        check(&a.values[0], &[2.238957, -0.475, -0.475, -0.475]);
        // An all-equal group keeps exactly 0 whatever the weight.
        let all = crate::Shaped {
            rewards: vec![vec![1.0; 4]],
            ..Default::default()
        };
        let g = group(&[1, 2, 3, 4], &[true; 4]);
        let a = est
            .compute(std::slice::from_ref(&g), &all)
            .expect("advantages");
        assert_eq!(a.values[0], [0.0; 4]);
    }

    #[test]
    fn rho_counts_scorable_samples_only() {
        let mut g = group(&[1, 2, 3, 4], &[true, false, true, true]);
        assert_eq!(accuracy_of_scorable(&g), 0.75);
        g.samples[0].scorable = false;
        // 2 right of 3 scorable.
        assert!((accuracy_of_scorable(&g) - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(accuracy_of_scorable(&Group::new(0, vec![])), 0.0);
        let one = Group::new(0, vec![SampleStat::new(5, true, 1.0)]);
        assert_eq!(accuracy_of_scorable(&one), 1.0);
    }

    #[test]
    fn invalid_keys_are_named_with_their_value() {
        let e = GrpoLead {
            alpha: -1.0,
            ..Default::default()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(e, "grpo_lead.alpha must be a finite number >= 0, got -1");
        let e = DifficultyWeight {
            rho0: 1.5,
            ..Default::default()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(e, "advantage.difficulty.rho0 must be in [0, 1], got 1.5");
        let e = DifficultyWeight {
            a: 0.0,
            ..Default::default()
        }
        .validate()
        .expect_err("invalid");
        assert_eq!(
            e,
            "advantage.difficulty.a must be a finite number > 0, got 0"
        );
    }
}
