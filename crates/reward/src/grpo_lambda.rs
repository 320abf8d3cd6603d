//! GRPO-λ (docs/methods.md, GRPO-λ): the sigmoid length penalty of Arora & Zanette applied only to the top-λ
//! groups of the batch by correctness ratio; the others keep the plain 0/1 reward. λ = 1 is the
//! paper's "+LP" control.

use crate::types::{mean, sigmoid, std, Group, Shaped, StepCtx};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// How λ·B becomes a group count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rounding {
    /// Half up (26 of 128 at λ = 0.2).
    Round,
    Floor,
    Ceil,
}

/// How groups with equal correctness ratios are ordered at the cut-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TieBreak {
    /// A random permutation from (seed, step): unbiased and reproducible.
    Seeded,
    /// Original index order (deterministic, biased to the sampling order).
    Index,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoLambda {
    /// Fraction of groups that get the length penalty.
    pub lambda: f64,
    /// Penalty strength α.
    pub alpha: f64,
    pub rounding: Rounding,
    pub tie_break: TieBreak,
}

impl Default for GrpoLambda {
    fn default() -> Self {
        Self {
            lambda: 0.2,
            alpha: 0.2,
            rounding: Rounding::Round,
            tie_break: TieBreak::Seeded,
        }
    }
}

/// Correct and stopped by EOS: GRPO-λ's and Arora's notion of a correct completion (a
/// truncated completion is incorrect, reward 0, docs/methods.md, GRPO-λ and Efficient).
pub fn finished_correct(s: &crate::SampleStat) -> bool {
    s.correct && !s.truncated
}

/// The fraction of a group's samples that are [`finished_correct`] (0 for an empty group).
fn finished_accuracy(g: &Group) -> f64 {
    if g.samples.is_empty() {
        return 0.0;
    }
    g.samples.iter().filter(|s| finished_correct(s)).count() as f64 / g.samples.len() as f64
}

/// Arora & Zanette's reward for one group: 1 − α·σ((L − M)/(S + 1e-7)) for correct completions
/// with an EOS (M, S: mean and population std of those lengths), 0 otherwise.
pub fn sigmoid_length_rewards(g: &Group, alpha: f64) -> Vec<f64> {
    let ok = finished_correct;
    let lens: Vec<f64> = g
        .samples
        .iter()
        .filter(|s| ok(s))
        .map(|s| s.len as f64)
        .collect();
    let (m, sd) = (mean(&lens), std(&lens, 0));
    g.samples
        .iter()
        .map(|s| {
            if ok(s) {
                1.0 - alpha * sigmoid((s.len as f64 - m) / (sd + 1e-7))
            } else {
                0.0
            }
        })
        .collect()
}

/// A per-step random stream for tie-breaking, independent of anything else the step draws.
pub(crate) fn tie_rng(ctx: &StepCtx, salt: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(ctx.seed ^ ctx.step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt)
}

impl GrpoLambda {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.lambda) {
            return Err(format!(
                "grpo_lambda.lambda must be in [0, 1], got {}",
                self.lambda
            ));
        }
        if !(self.alpha >= 0.0 && self.alpha.is_finite()) {
            return Err(format!(
                "grpo_lambda.alpha must be a finite number >= 0, got {}",
                self.alpha
            ));
        }
        Ok(())
    }

    /// n_E: λ·B rounded as configured. λ·B is computed in floats (0.29 · 100 = 28.999…), so
    /// every rounding first snaps a product within 1e-9 of a multiple of ½ onto it (the
    /// boundaries of floor, ceil and half-up: 0.58 · 25 = 14.499… rounds to 15).
    pub fn group_count(&self, b: usize) -> usize {
        let x = self.lambda * b as f64;
        let tol = 1e-9 * x.abs().max(1.0);
        let half = (2.0 * x).round() / 2.0;
        let snapped = if (x - half).abs() <= tol { half } else { x };
        match self.rounding {
            Rounding::Round => (snapped + 0.5).floor(),
            Rounding::Floor => snapped.floor(),
            Rounding::Ceil => snapped.ceil(),
        }
        .clamp(0.0, b as f64) as usize
    }

    /// Indices of the groups in E: the top n_E by correctness ratio, among groups with p > 0.
    /// A truncated completion counts as incorrect here too (docs/methods.md, GRPO-λ).
    pub fn selected(&self, groups: &[Group], ctx: &StepCtx) -> Vec<usize> {
        let n_e = self.group_count(groups.len());
        let p: Vec<f64> = groups.iter().map(finished_accuracy).collect();
        let mut order: Vec<usize> = (0..groups.len()).collect();
        if self.tie_break == TieBreak::Seeded {
            order.shuffle(&mut tie_rng(ctx, 0x6c61_6d62));
        }
        // Stable sort: equal ratios keep the (shuffled or index) order.
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        order
            .into_iter()
            .filter(|&k| p[k] > 0.0)
            .take(n_e)
            .collect()
    }

    pub fn shape(&self, groups: &[Group], ctx: &StepCtx) -> Shaped {
        let sel = self.selected(groups, ctx);
        let rewards = groups
            .iter()
            .enumerate()
            .map(|(k, g)| {
                if sel.contains(&k) {
                    sigmoid_length_rewards(g, self.alpha)
                } else {
                    g.samples
                        .iter()
                        .map(|s| f64::from(u8::from(finished_correct(s))))
                        .collect()
                }
            })
            .collect();
        let mut out = Shaped {
            rewards,
            ..Default::default()
        };
        out.diagnostics
            .insert("lambda_selected_groups".into(), sel.len() as f64);
        out
    }
}
