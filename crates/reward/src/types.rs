//! What every shaper sees and returns: per-completion outcomes grouped by prompt, the step
//! context, and the shaped rewards with their diagnostics.
//!
//! Data flow: rollout + tasks produce one `SampleStat` per completion -> `Group`s (one per
//! prompt, G samples) -> `LengthShaper::shape` -> `Shaped` -> `Advantage::compute`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One completion's outcome, as the verifier and the sampler report it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleStat {
    /// Length in tokens (docs/methods.md, Notation: sampled completion tokens incl. the stop token, or the
    /// thinking span when the trainer's `length_mode` says so).
    pub len: usize,
    /// The verifier's outcome y_i (for K&K: answer score > 0).
    pub correct: bool,
    /// The task's own reward (K&K 3 / -0.5 / -1 / -3, 0/1, ...), the substrate length terms add to.
    pub base_reward: f64,
    /// Whether the completion passed the task's format check (Step-GRPO's R_form).
    pub format_ok: bool,
    /// Semantic step count k_i = 1 + trigger occurrences (docs/methods.md, Step-GRPO).
    pub steps: usize,
    /// Stopped by the length limit, with no EOS.
    pub truncated: bool,
    /// False when the completion could not be scored at all (its advantage is then 0).
    pub scorable: bool,
}

impl SampleStat {
    /// A scorable, well-formed completion: the common case in tests and simple tasks.
    pub fn new(len: usize, correct: bool, base_reward: f64) -> Self {
        Self {
            len,
            correct,
            base_reward,
            format_ok: true,
            steps: 1,
            truncated: false,
            scorable: true,
        }
    }
}

/// The G completions of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub prompt_id: u64,
    pub samples: Vec<SampleStat>,
    /// The prompt's target length n_gold, for L1 ("Think for N tokens").
    #[serde(default)]
    pub target_len: Option<usize>,
}

impl Group {
    /// The truncation rule of DLER and ThinkPrune: a truncated completion is wrong with base
    /// reward 0, whatever the verifier said (its answer was cut off with the rest of it).
    pub fn score_truncated_as_zero(&mut self) {
        for s in self.samples.iter_mut().filter(|s| s.truncated) {
            s.correct = false;
            s.base_reward = 0.0;
        }
    }

    pub fn new(prompt_id: u64, samples: Vec<SampleStat>) -> Self {
        Self {
            prompt_id,
            samples,
            target_len: None,
        }
    }

    /// Fraction of correct samples p(q); 0 for an empty group.
    pub fn accuracy(&self) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        self.samples.iter().filter(|s| s.correct).count() as f64 / self.samples.len() as f64
    }

    /// Lengths of the correct samples.
    pub fn correct_lens(&self) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| s.correct)
            .map(|s| s.len as f64)
            .collect()
    }
}

/// Where the batch sits in the run: the step (schedules) and the seed for tie-breaking streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StepCtx {
    pub step: u64,
    pub seed: u64,
}

/// Shaped rewards, indexed like the input groups, plus named per-batch diagnostics
/// (`gamma_l`, `acc`, `acc_max`, `gate_on`, `care_dir_mean`, ...).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Shaped {
    pub rewards: Vec<Vec<f64>>,
    pub diagnostics: BTreeMap<String, f64>,
}

impl Shaped {
    /// Base rewards unchanged: the "no length term" shaping.
    pub fn base(groups: &[Group]) -> Self {
        Self {
            rewards: groups
                .iter()
                .map(|g| g.samples.iter().map(|s| s.base_reward).collect())
                .collect(),
            diagnostics: BTreeMap::new(),
        }
    }
}

/// Mean of a slice (0 when empty).
pub(crate) fn mean(x: &[f64]) -> f64 {
    if x.is_empty() {
        0.0
    } else {
        x.iter().sum::<f64>() / x.len() as f64
    }
}

/// Standard deviation with `ddof` (0 = population, 1 = unbiased); 0 when undefined.
pub(crate) fn std(x: &[f64], ddof: usize) -> f64 {
    if x.len() <= ddof {
        return 0.0;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len() - ddof) as f64).sqrt()
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// A shaping failure that is the caller's data, not a completion (e.g. L1 without a target).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardError(pub String);

impl std::fmt::Display for RewardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RewardError {}
