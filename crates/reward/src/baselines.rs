//! The baselines the papers compare against (docs/methods.md, Baselines): Kimi, CosFn, Efficient (Arora &
//! Zanette), DAPO soft overlong punishment, ALP, DAST and L1. Each is a pure function of a group.

use crate::grpo_lambda::sigmoid_length_rewards;
use crate::types::{mean, Group};
use serde::{Deserialize, Serialize};

/// Kimi k1.5 (docs/methods.md, Kimi): λ over all completions' min/max; correct get λ, incorrect min(0, λ).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Kimi {
    pub weight: f64,
    /// w = 0 before this step (Kimi's warm-up), constant after.
    pub start_step: u64,
    /// Paper rule: all-equal lengths give 0. False reproduces Short-RL's baseline (+0.5).
    pub equal_len_zero: bool,
}

impl Default for Kimi {
    fn default() -> Self {
        Self {
            weight: 1.0,
            start_step: 0,
            equal_len_zero: true,
        }
    }
}

impl Kimi {
    /// The length terms (before the weight).
    pub fn terms(&self, g: &Group) -> Vec<f64> {
        let lens: Vec<f64> = g.samples.iter().map(|s| s.len as f64).collect();
        let lmin = lens.iter().copied().fold(f64::INFINITY, f64::min);
        let lmax = lens.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let equal = lmax == lmin;
        g.samples
            .iter()
            .map(|s| {
                if equal && self.equal_len_zero {
                    return 0.0;
                }
                let denom = if equal {
                    1e-5
                } else {
                    lmax - lmin + if self.equal_len_zero { 0.0 } else { 1e-5 }
                };
                let lam = 0.5 - (s.len as f64 - lmin) / denom;
                if s.correct {
                    lam
                } else {
                    lam.min(0.0)
                }
            })
            .collect()
    }

    pub fn rewards(&self, g: &Group, step: u64) -> Vec<f64> {
        let w = if step >= self.start_step {
            self.weight
        } else {
            0.0
        };
        g.samples
            .iter()
            .zip(self.terms(g))
            .map(|(s, t)| s.base_reward + w * t)
            .collect()
    }
}

/// CosFn (docs/methods.md, CosFn): a cosine schedule over length, replacing the base reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CosFn {
    pub l_max: usize,
    /// Correct at L = 0 / at L = L_max.
    pub r0_correct: f64,
    pub rl_correct: f64,
    /// Wrong at L = 0 / at L = L_max (both ≤ 0).
    pub r0_wrong: f64,
    pub rl_wrong: f64,
    /// Reward when L + margin ≥ L_max.
    pub r_exceed: f64,
    pub margin: usize,
}

impl Default for CosFn {
    fn default() -> Self {
        Self {
            l_max: 14336,
            r0_correct: 2.0,
            rl_correct: 1.0,
            r0_wrong: -10.0,
            rl_wrong: 0.0,
            r_exceed: -10.0,
            margin: 16,
        }
    }
}

impl CosFn {
    fn cos(t: f64, big_t: f64, eta_min: f64, eta_max: f64) -> f64 {
        eta_min + 0.5 * (eta_max - eta_min) * (1.0 + (std::f64::consts::PI * t / big_t).cos())
    }

    pub fn reward(&self, len: usize, correct: bool) -> f64 {
        if len.saturating_add(self.margin) >= self.l_max {
            return self.r_exceed;
        }
        let (t, big_t) = (len as f64, self.l_max as f64);
        if correct {
            Self::cos(t, big_t, self.rl_correct, self.r0_correct)
        } else {
            Self::cos(t, big_t, self.rl_wrong, self.r0_wrong)
        }
    }
}

/// "Efficient" (docs/methods.md, Efficient): 1 − α·σ(z) for correct completions with EOS, 0 otherwise (replaces the base).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Efficient {
    pub alpha: f64,
}

impl Default for Efficient {
    fn default() -> Self {
        Self { alpha: 0.1 }
    }
}

impl Efficient {
    pub fn rewards(&self, g: &Group) -> Vec<f64> {
        sigmoid_length_rewards(g, self.alpha)
    }
}

/// DAPO soft overlong punishment (docs/methods.md, DAPO overlong), added to any other shaping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DapoOverlong {
    pub l_max: usize,
    pub l_cache: usize,
    pub factor: f64,
}

impl Default for DapoOverlong {
    fn default() -> Self {
        Self {
            l_max: 20480,
            l_cache: 4096,
            factor: 1.0,
        }
    }
}

impl DapoOverlong {
    pub fn validate(&self) -> Result<(), String> {
        if self.l_cache == 0 {
            return Err("dapo_overlong.l_cache must be > 0, got 0 (it divides the penalty)".into());
        }
        if self.l_cache > self.l_max {
            return Err(format!(
                "dapo_overlong.l_cache ({}) must not exceed l_max ({})",
                self.l_cache, self.l_max
            ));
        }
        Ok(())
    }

    /// factor · R_len(L): 0 up to L_max − L_cache, then linear down to −1 at L_max, −1 beyond.
    pub fn penalty(&self, len: usize) -> f64 {
        let l = len as f64;
        let l_exp = (self.l_max - self.l_cache) as f64;
        let r = if l <= l_exp {
            0.0
        } else if len <= self.l_max {
            (l_exp - l) / self.l_cache as f64
        } else {
            -1.0
        };
        self.factor * r
    }
}

/// ALP (docs/methods.md, ALP): r = 1[correct] − (β/N)·max(p_solved, 1/K)·L, with K = G and N = L_max.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alp {
    /// Required: the sources give no default.
    pub beta: f64,
    /// The normaliser N (the generation limit; a run config's default is
    /// `grpo.max_new_tokens`, and 0, the bare default, is refused by `validate`).
    #[serde(default)]
    pub l_max: usize,
}

impl Alp {
    pub fn rewards(&self, g: &Group) -> Vec<f64> {
        let k = g.samples.len().max(1) as f64;
        let per_token = self.beta / self.l_max as f64 * g.accuracy().max(1.0 / k);
        g.samples
            .iter()
            .map(|s| f64::from(u8::from(s.correct)) - per_token * s.len as f64)
            .collect()
    }
}

/// DAST (docs/methods.md, DAST): token length budget L_b = p·L̄_correct + (1 − p)·L_max and a piecewise score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dast {
    pub l_max: usize,
}

impl Default for Dast {
    fn default() -> Self {
        Self { l_max: 4096 }
    }
}

impl Dast {
    pub fn budget(&self, g: &Group) -> f64 {
        let p = g.accuracy();
        let lbar = if p > 0.0 {
            mean(&g.correct_lens())
        } else {
            0.0
        };
        p * lbar + (1.0 - p) * self.l_max as f64
    }

    pub fn rewards(&self, g: &Group) -> Vec<f64> {
        let b = self.budget(g);
        g.samples
            .iter()
            .map(|s| {
                let lam = (s.len as f64 - b) / b;
                if s.correct {
                    (-0.5 * lam + 0.5).max(0.1)
                } else {
                    (0.9 * lam - 0.1).min(-0.1)
                }
            })
            .collect()
    }
}

/// L1 / LCPO (docs/methods.md, L1 / LCPO) modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum L1Mode {
    /// r = 1[correct] − |L − n_gold| / 3000.
    Exact,
    /// r = 1[correct] · clip(0.5 − (L − n_gold)/1000, 0, 1).
    Max,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct L1 {
    pub mode: L1Mode,
}

impl Default for L1 {
    fn default() -> Self {
        Self {
            mode: L1Mode::Exact,
        }
    }
}

impl L1 {
    /// `target` is the prompt's n_gold ("Think for N tokens").
    pub fn reward(&self, len: usize, correct: bool, target: usize) -> f64 {
        let (l, n) = (len as f64, target as f64);
        let y = f64::from(u8::from(correct));
        match self.mode {
            L1Mode::Exact => y - (l - n).abs() / 3000.0,
            L1Mode::Max => y * (0.5 - (l - n) / 1000.0).clamp(0.0, 1.0),
        }
    }
}
