//! The typed records of a run: one [`MetricsLine`] per line of metrics.jsonl (an SFT step, a
//! GRPO step's [`StepReport`], an evaluation's [`EvalReport`] by level), written by the
//! trainer and read back by the plots, the repro summary and research code through the same
//! types, so a misspelt metric is a compile error, not an empty curve. The JSON keys are the field names; a shaper's
//! diagnostics (`gamma_l`, `acc`, ...) sit beside them, flattened.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// One evaluation level's results (eval/: `evaluate` and the protocol evaluation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelReport {
    pub level: usize,
    pub pass1: f64,
    pub pass_k: f64,
    pub len_mean: f64,
    /// Mean reflections per completion: the run's trigger words (`grpo.step_triggers`, by
    /// default "Wait" and "Alternatively") before `</think>`; on the testbed, the `Wait`
    /// re-checks.
    #[serde(default)]
    pub reflections_mean: f64,
    /// The first completion of the first few items, and whether it was correct (for a look at
    /// what the model writes; not saved in metrics).
    #[serde(skip)]
    pub examples: Vec<(String, bool)>,
}

/// An evaluation's results: overall, and by level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub accuracy: f64,
    pub len_mean: f64,
    pub by_level: Vec<LevelReport>,
}

/// One line of metrics.jsonl, tagged by `"phase"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum MetricsLine {
    Sft(SftReport),
    Grpo(Box<StepReport>),
    Eval(EvalLine),
}

/// One SFT warm-up step.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SftReport {
    pub step: u64,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
}

/// Wall-clock and rollout-memory figures of a GRPO step: the only part of a line that can
/// differ between runs of one config (times always; preemptions when `kv_budget = "auto"`
/// sizes the pool from the machine's free memory).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Timing {
    pub rollout_s: f64,
    pub score_s: f64,
    pub logprob_s: f64,
    pub update_s: f64,
    pub tokens_per_s: f64,
    /// The rollout's peak KV memory (GiB) and sequences preempted for memory.
    pub kv_peak_gib: f64,
    pub preemptions: usize,
}

/// What one GRPO step did: rollout statistics, the update's figures, the shaper's diagnostics.
/// Keys a line lacks read as their defaults (files written by tools that record a subset).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepReport {
    pub step: u64,
    /// Mean shaped reward over the step's samples.
    pub reward: f64,
    /// Fraction of samples the verifier judged correct / well formatted.
    pub accuracy: f64,
    pub format_ok: f64,
    /// Completion lengths in tokens (None when the step had no sample of the kind).
    pub len_mean: Option<f64>,
    pub len_min: Option<usize>,
    pub len_max: Option<usize>,
    pub len_correct: Option<f64>,
    pub len_incorrect: Option<f64>,
    pub truncated: Option<f64>,
    /// Fraction of groups whose rewards were all equal (no signal).
    pub zero_std_groups: f64,
    pub clip_frac_low: f64,
    pub clip_frac_high: f64,
    pub kl: f64,
    /// Mean |sampler − trainer| log-prob per token (0 with an exact KV cache).
    pub logp_gap: f64,
    pub loss: f64,
    pub grad_norm: f64,
    pub updates: usize,
    pub lr: f64,
    /// Mean semantic step count (1 + trigger words).
    pub steps_mean: f64,
    pub entropy: f64,
    /// Step-GRPO: probes per sample, and the fraction of samples that exited early.
    pub judge_mean: f64,
    pub early_exit: f64,
    /// Step-GRPO: accuracy of the samples that exited early (None when none did): exits that
    /// answer wrong are the probe trusting a confidence that does not mean "done".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_accuracy: Option<f64>,
    /// Completions the model's context limit (`max_position_embeddings`) cut before
    /// `max_new_tokens`; written only when some were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub context_cut: usize,
    /// GFPO: samples its filter kept out of the advantages and the loss (`grpo.gfpo`); written
    /// only when some were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gfpo_dropped: usize,
    /// Completions the math verifier could not check within its budget (scored as wrong
    /// answers), and scorer panics (scored 0, format not ok); written only when some were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_budget_exceeded: usize,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub verify_panics: usize,
    /// Rollout correction (written only when `grpo.rollout_correction` is on): the mean
    /// |trainer − sampler| log-prob per loss token, the share of loss tokens whose ratio
    /// exceeded the cap, and the largest ratio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rc_logp_gap: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rc_capped: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rc_ratio_max: Option<f64>,
    /// Dynamic sampling: rollout rounds and groups dropped for equal rewards.
    pub rounds: usize,
    pub dropped_groups: usize,
    pub time: Timing,
    /// The shaper's per-batch diagnostics (`gamma_l`, `acc`, `acc_max`, `gate_on`, ...).
    #[serde(flatten)]
    pub diagnostics: BTreeMap<String, f64>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl StepReport {
    /// A diagnostic of the shaper, when it reported one this step.
    pub fn diagnostic(&self, name: &str) -> Option<f64> {
        self.diagnostics.get(name).copied()
    }
}

/// An evaluation on the held-out set after `step` GRPO steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalLine {
    pub step: u64,
    /// A finished run evaluated again (`xtask train --eval-again`), after its final
    /// evaluation; written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub again: bool,
    #[serde(flatten)]
    pub report: EvalReport,
}

/// Every line of a metrics file, in order. A line that is not a metrics record is an error
/// naming the file and the line, except the last one: a kill mid-write leaves a torn last line,
/// which is left out with one warning naming it.
pub fn read_metrics(path: &Path) -> Result<Vec<MetricsLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut out = Vec::with_capacity(lines.len());
    for (k, &(i, l)) in lines.iter().enumerate() {
        match serde_json::from_str(l) {
            Ok(line) => out.push(line),
            Err(e) if k + 1 == lines.len() => tracing::warn!(
                "{} line {}: left out, a torn last line ({e}); the {} lines before it are read",
                path.display(),
                i + 1,
                out.len()
            ),
            Err(e) => {
                return Err(e).with_context(|| format!("{} line {}", path.display(), i + 1));
            }
        }
    }
    Ok(out)
}

/// The GRPO steps of a metrics file.
pub fn read_steps(path: &Path) -> Result<Vec<StepReport>> {
    Ok(read_metrics(path)?
        .into_iter()
        .filter_map(|l| match l {
            MetricsLine::Grpo(s) => Some(*s),
            _ => None,
        })
        .collect())
}

/// The evaluations of a metrics file.
pub fn read_evals(path: &Path) -> Result<Vec<EvalLine>> {
    Ok(read_metrics(path)?
        .into_iter()
        .filter_map(|l| match l {
            MetricsLine::Eval(e) => Some(e),
            _ => None,
        })
        .collect())
}

/// The SFT steps of a metrics file.
pub fn read_sft(path: &Path) -> Result<Vec<SftReport>> {
    Ok(read_metrics(path)?
        .into_iter()
        .filter_map(|l| match l {
            MetricsLine::Sft(s) => Some(s),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed line round-trips and keeps the JSON keys the files have always had.
    #[test]
    fn a_step_line_round_trips_with_flat_diagnostics() {
        let mut s = StepReport {
            step: 3,
            reward: 0.5,
            len_mean: Some(12.5),
            updates: 2,
            ..Default::default()
        };
        s.diagnostics.insert("gamma_l".into(), 0.25);
        let line = MetricsLine::Grpo(Box::new(s.clone()));
        let v = serde_json::to_value(&line).expect("json");
        assert_eq!(v["phase"], "grpo");
        assert_eq!(v["gamma_l"], 0.25);
        assert_eq!(v["len_min"], serde_json::Value::Null);
        assert_eq!(v["time"]["rollout_s"], 0.0);
        let back: MetricsLine = serde_json::from_value(v).expect("back");
        assert_eq!(back, line);
        assert_eq!(s.diagnostic("gamma_l"), Some(0.25));
    }

    /// The verifier's fault counts are written only when some were: a run without them keeps
    /// its metrics.jsonl byte for byte.
    #[test]
    fn fault_counts_are_written_only_when_nonzero() {
        let s = StepReport::default();
        let text = serde_json::to_string(&s).expect("json");
        assert!(!text.contains("verify_"), "{text}");
        let s = StepReport {
            verify_budget_exceeded: 2,
            verify_panics: 1,
            ..Default::default()
        };
        let v = serde_json::to_value(&s).expect("json");
        assert_eq!(
            (
                v["verify_budget_exceeded"].as_u64(),
                v["verify_panics"].as_u64()
            ),
            (Some(2), Some(1))
        );
        let back: StepReport = serde_json::from_value(v).expect("back");
        assert_eq!(back, s);
    }
}
