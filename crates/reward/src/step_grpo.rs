//! Step-GRPO's reward side (docs/methods.md, Step-GRPO): semantic steps counted by trigger words, the dynamic
//! baseline μ over correct completions, and R = (1−α)·R_acc·[1 − β·tanh((k−μ)/μ)] + α·R_form.
//! The rollout side (early exit at triggers) lives in the rollout crate.

use crate::types::{mean, Group, Shaped};
use serde::{Deserialize, Serialize};

/// Where α goes: the EasyR1 format weight (default, docs/methods.md, Step-GRPO RECON) or on accuracy (as in the
/// paper notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlphaOn {
    Format,
    Accuracy,
}

/// Which completions the step baseline μ averages over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepBaseline {
    Correct,
    All,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StepGrpo {
    pub alpha: f64,
    /// Step penalty strength β; the bracket stays in (1−β, 1+β).
    pub beta: f64,
    pub alpha_on: AlphaOn,
    pub baseline: StepBaseline,
    /// Ablation "w/o step reward": R = EasyR1 overall only.
    pub step_reward: bool,
}

impl Default for StepGrpo {
    fn default() -> Self {
        Self {
            alpha: 0.1,
            beta: 0.5,
            alpha_on: AlphaOn::Format,
            baseline: StepBaseline::Correct,
            step_reward: true,
        }
    }
}

impl StepGrpo {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(format!(
                "step_grpo.alpha must be in [0, 1], got {}",
                self.alpha
            ));
        }
        if !(0.0..=1.0).contains(&self.beta) {
            return Err(format!(
                "step_grpo.beta must be in [0, 1], got {}",
                self.beta
            ));
        }
        Ok(())
    }

    pub fn shape(&self, groups: &[Group]) -> Shaped {
        let (wa, wf) = match self.alpha_on {
            AlphaOn::Format => (1.0 - self.alpha, self.alpha),
            AlphaOn::Accuracy => (self.alpha, 1.0 - self.alpha),
        };
        let rewards = groups
            .iter()
            .map(|g| {
                let pool: Vec<f64> = g
                    .samples
                    .iter()
                    .filter(|s| s.correct || self.baseline == StepBaseline::All)
                    .map(|s| s.steps.max(1) as f64)
                    .collect();
                // No correct completion: the efficiency term is omitted (docs/methods.md, Step-GRPO).
                let mu =
                    (self.step_reward && g.samples.iter().any(|s| s.correct)).then(|| mean(&pool));
                g.samples
                    .iter()
                    .map(|s| {
                        let acc = f64::from(u8::from(s.correct));
                        let form = f64::from(u8::from(s.format_ok));
                        let bracket = match mu {
                            Some(mu) => {
                                1.0 - self.beta * ((s.steps.max(1) as f64 - mu) / mu).tanh()
                            }
                            None => 1.0,
                        };
                        wa * acc * bracket + wf * form
                    })
                    .collect()
            })
            .collect();
        Shaped {
            rewards,
            ..Default::default()
        }
    }
}

/// Which part of a completion steps are counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepScope {
    /// Up to `</think>` (the whole text when it is absent).
    #[default]
    Thinking,
    Whole,
}

/// The default trigger set (docs/methods.md, Step-GRPO).
pub fn default_triggers() -> Vec<String> {
    vec!["Wait".into(), "Alternatively".into()]
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// k = 1 + number of non-overlapping, case-sensitive, whole-word trigger occurrences (longest
/// trigger first at each position), within the chosen scope.
pub fn count_steps(text: &str, triggers: &[String], scope: StepScope) -> usize {
    let text = match scope {
        StepScope::Thinking => text.find("</think>").map_or(text, |i| &text[..i]),
        StepScope::Whole => text,
    };
    let mut trig: Vec<&str> = triggers
        .iter()
        .map(String::as_str)
        .filter(|t| !t.is_empty())
        .collect();
    trig.sort_by_key(|t| std::cmp::Reverse(t.len()));
    let mut n = 0;
    let mut i = 0;
    while i < text.len() {
        let before_ok = text[..i].chars().next_back().is_none_or(|c| !is_word(c));
        let hit = before_ok
            .then(|| {
                trig.iter().find(|t| {
                    text[i..].starts_with(**t)
                        && text[i + t.len()..]
                            .chars()
                            .next()
                            .is_none_or(|c| !is_word(c))
                })
            })
            .flatten();
        match hit {
            Some(t) => {
                n += 1;
                i += t.len();
            }
            None => i += text[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    1 + n
}
