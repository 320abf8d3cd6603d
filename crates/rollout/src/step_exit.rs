//! Step-GRPO's dynamic truncated rollout (docs/methods.md, Step-GRPO): the configuration, trigger detection
//! on decoded text, and the confidence of a trial answer. The engine runs the probes.

use serde::{Deserialize, Serialize};

/// How the trial answer's token probabilities become one confidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfidencePolicy {
    /// exp(mean log p): the geometric mean (default).
    GeoMean,
    /// mean p (DEER's code default).
    ArithMean,
    /// min p.
    Min,
}

/// Early exit at trigger words when a greedy trial answer is confident enough.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepExit {
    /// Trigger words, matched case-sensitively at the end of the decoded completion. Not a key
    /// of `[grpo.step_exit]`: a run's triggers are one list, `grpo.step_triggers` (the step
    /// reward, this exit and eval's reflections), which the trainer copies here.
    #[serde(skip)]
    pub triggers: Vec<String>,
    /// The answer-induction text p_ind, e.g. "\n</think>\n\nThe final answer is \\boxed{";
    /// a run config names it as text and the trainer tokenizes it into `induction_ids`.
    #[serde(default)]
    pub induction: String,
    /// Text appended after the trial answer on exit (e.g. "}" then EOS), tokenized into `close_ids`.
    #[serde(default)]
    pub close: String,
    /// Token ids of the induction text (what the engine feeds).
    #[serde(default)]
    pub induction_ids: Vec<u32>,
    /// Token ids appended after the trial answer on exit; not sampled.
    #[serde(default)]
    pub close_ids: Vec<u32>,
    /// The trial answer ends at the first of these strings (default "}"); that token is excluded.
    #[serde(default = "default_answer_stops")]
    pub answer_stops: Vec<String>,
    #[serde(default = "default_max_ans_tokens")]
    pub max_ans_tokens: usize,
    /// Exit when confidence > δ.
    #[serde(default = "default_delta")]
    pub delta: f64,
    #[serde(default = "default_policy")]
    pub confidence: ConfidencePolicy,
    #[serde(default)]
    pub skip_first_token: bool,
    #[serde(default = "default_max_judge_steps")]
    pub max_judge_steps: usize,
    /// Keep the trigger that fired at the end of the path (Step-GRPO's text) or drop it (DEER).
    #[serde(default = "default_true")]
    pub include_trigger_on_exit: bool,
    /// With the trigger kept: probe the path without it (DEER's probe context) while the kept
    /// path still ends in it, so the step reward counts the trigger and its token is trained.
    /// The trial answer's tokens then stay out of the loss, since their log-probs belong to
    /// the probe's context, not the kept one. No effect when the trigger is dropped.
    #[serde(default)]
    pub probe_without_trigger: bool,
}

fn default_answer_stops() -> Vec<String> {
    vec!["}".into()]
}
fn default_max_ans_tokens() -> usize {
    20
}
fn default_delta() -> f64 {
    0.95
}
fn default_policy() -> ConfidencePolicy {
    ConfidencePolicy::GeoMean
}
fn default_max_judge_steps() -> usize {
    10
}
fn default_true() -> bool {
    true
}

impl StepExit {
    pub fn validate(&self) -> Result<(), String> {
        if self.triggers.iter().all(String::is_empty) {
            return Err(
                "step_exit.triggers must hold at least one non-empty word (a run sets them as grpo.step_triggers)"
                    .into(),
            );
        }
        if self.induction_ids.is_empty() && self.induction.is_empty() {
            return Err("step_exit: set `induction` (text) or `induction_ids`".into());
        }
        if !(0.0..=1.0).contains(&self.delta) {
            return Err(format!(
                "step_exit.delta must be in [0, 1], got {}",
                self.delta
            ));
        }
        if self.max_ans_tokens == 0 {
            return Err("step_exit.max_ans_tokens must be > 0, got 0".into());
        }
        Ok(())
    }

    /// Fills `induction_ids` / `close_ids` from the texts (when given) with the caller's tokenizer.
    pub fn resolve<E>(&mut self, encode: impl Fn(&str) -> Result<Vec<u32>, E>) -> Result<(), E> {
        if !self.induction.is_empty() {
            self.induction_ids = encode(&self.induction)?;
        }
        if !self.close.is_empty() {
            self.close_ids = encode(&self.close)?;
        }
        Ok(())
    }

    /// Tokens of the induction and close texts a probe feeds: their ids once `resolve`d, else
    /// the texts' bytes (a bound: a token holds at least one byte), as the memory plan,
    /// which has no tokenizer, counts them.
    pub fn probe_text_tokens(&self) -> (usize, usize) {
        let count = |ids: &[u32], text: &str| {
            if ids.is_empty() {
                text.len()
            } else {
                ids.len()
            }
        };
        (
            count(&self.induction_ids, &self.induction),
            count(&self.close_ids, &self.close),
        )
    }

    /// The trigger that `text` ends with, preceded by the start, whitespace or punctuation.
    pub fn trigger_at_end<'a>(&'a self, text: &str) -> Option<&'a str> {
        self.triggers
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
            .find(|t| {
                text.strip_suffix(t).is_some_and(|before| {
                    before
                        .chars()
                        .next_back()
                        .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                })
            })
    }
}

/// The confidence of a trial answer from its tokens' log-probabilities (0 when empty).
pub fn confidence(logps: &[f32], policy: ConfidencePolicy, skip_first: bool) -> f64 {
    let lp: Vec<f64> = logps
        .iter()
        .skip(usize::from(skip_first))
        .map(|&x| f64::from(x))
        .collect();
    if lp.is_empty() {
        return 0.0;
    }
    match policy {
        ConfidencePolicy::GeoMean => (lp.iter().sum::<f64>() / lp.len() as f64).exp(),
        ConfidencePolicy::ArithMean => lp.iter().map(|x| x.exp()).sum::<f64>() / lp.len() as f64,
        ConfidencePolicy::Min => lp.iter().copied().fold(f64::INFINITY, f64::min).exp(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_policies() {
        let lp = [0.9f32.ln(), 0.4f32.ln()];
        assert!((confidence(&lp, ConfidencePolicy::GeoMean, false) - 0.6).abs() < 1e-6);
        assert!((confidence(&lp, ConfidencePolicy::ArithMean, false) - 0.65).abs() < 1e-6);
        assert!((confidence(&lp, ConfidencePolicy::Min, false) - 0.4).abs() < 1e-6);
        assert!((confidence(&lp, ConfidencePolicy::Min, true) - 0.4).abs() < 1e-6);
        assert!((confidence(&lp[..1], ConfidencePolicy::GeoMean, true)).abs() < 1e-12);
    }

    #[test]
    fn triggers_need_a_boundary_before() {
        let s = StepExit {
            triggers: vec!["Wait".into(), "Alternatively".into()],
            induction: String::new(),
            close: String::new(),
            induction_ids: vec![1],
            close_ids: vec![],
            answer_stops: default_answer_stops(),
            max_ans_tokens: 20,
            delta: 0.95,
            confidence: ConfidencePolicy::GeoMean,
            skip_first_token: false,
            max_judge_steps: 10,
            include_trigger_on_exit: true,
            probe_without_trigger: false,
        };
        assert_eq!(s.trigger_at_end("x = 2. Wait"), Some("Wait"));
        assert_eq!(s.trigger_at_end("Wait"), Some("Wait"));
        assert_eq!(s.trigger_at_end("Await"), None);
        assert_eq!(s.trigger_at_end("Wait, no"), None);
    }
}
