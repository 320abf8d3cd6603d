//! One run's contribution to the report, read from its metrics.jsonl: final pass@1 and tokens by
//! level, the SFT start's evaluation, rollout length and the methods' diagnostics per step.

use crate::methods::Method;
use anyhow::{Context, Result};
use std::path::Path;
use terse_train::evals::EvalReport;
use terse_train::report::{read_evals, read_steps, EvalLine};

/// pass@1 by level, the mean over levels, and eval tokens.
pub(super) type Eval = (Vec<(usize, f64)>, f64, f64);

/// What one run contributes to the table.
pub(super) struct RunResult {
    /// Final evaluation pass@1 by level, and its mean over levels.
    pub(super) by_level: Vec<(usize, f64)>,
    pub(super) acc: f64,
    pub(super) eval_tokens: f64,
    /// Final evaluation tokens by level, in level order.
    pub(super) tokens_by_level: Vec<f64>,
    /// The SFT start's evaluation (step 0), for the first row.
    pub(super) start: Option<Eval>,
    /// Rollout length per step: averaged over steps, and at the last step.
    pub(super) len_avg: f64,
    pub(super) len_last: f64,
    /// γ_ℓ averaged over the steps that report it (Short-RL variants).
    pub(super) gamma: Option<f64>,
    /// CARE's direction per step, averaged over steps: groups with d = +1, with d = -1.
    pub(super) care_dirs: Option<(f64, f64)>,
    /// Step-GRPO's early exits: the fraction of rollouts that exited (mean over steps) and
    /// the fraction of those that were right (pooled over steps); None without exits.
    pub(super) exits: Option<(f64, f64)>,
    pub(super) len_curve: Vec<f64>,
    pub(super) acc_curve: Vec<f64>,
    /// The first (step 0) and the last evaluation, whole.
    pub(super) first_eval: Option<EvalReport>,
    pub(super) last_eval: EvalReport,
}

/// One method's runs over the seeds.
pub(super) type MethodRuns<'a> = (&'a Method, Vec<RunResult>);

fn levels_of(e: &EvalLine) -> Vec<(usize, f64)> {
    e.report
        .by_level
        .iter()
        .map(|l| (l.level, l.pass1))
        .collect()
}

/// A shaper diagnostic averaged over the steps that report it.
fn step_mean(steps: &[terse_train::report::StepReport], key: &str) -> Option<f64> {
    let v: Vec<f64> = steps.iter().filter_map(|l| l.diagnostic(key)).collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub(super) fn read_run(dir: &Path) -> Result<RunResult> {
    let path = dir.join("metrics.jsonl");
    let grpo = read_steps(&path)?;
    let evals = read_evals(&path)?;
    let last = evals
        .last()
        .with_context(|| format!("{} has no evaluation", path.display()))?;
    let len_curve: Vec<f64> = grpo
        .iter()
        .map(|l| l.len_mean.unwrap_or(f64::NAN))
        .collect();
    Ok(RunResult {
        by_level: levels_of(last),
        acc: last.report.accuracy,
        eval_tokens: last.report.len_mean,
        tokens_by_level: last.report.by_level.iter().map(|l| l.len_mean).collect(),
        start: evals
            .iter()
            .find(|e| e.step == 0)
            .map(|e| (levels_of(e), e.report.accuracy, e.report.len_mean)),
        len_avg: terse_reward::metrics::averaged_by_steps(&len_curve).0,
        len_last: len_curve.last().copied().unwrap_or(f64::NAN),
        gamma: step_mean(&grpo, "gamma_l"),
        care_dirs: step_mean(&grpo, "care_dir_longer").zip(step_mean(&grpo, "care_dir_shorter")),
        exits: exit_stats(&grpo),
        acc_curve: grpo.iter().map(|l| l.accuracy).collect(),
        len_curve,
        first_eval: evals.iter().find(|e| e.step == 0).map(|e| e.report.clone()),
        last_eval: last.report.clone(),
    })
}

/// The exit rate averaged over steps and the accuracy of the exits pooled over steps (every
/// step samples the same number of rollouts, so a step's exits weigh by its rate). None
/// without exits, or for a run from a build that did not log the exits' accuracy.
pub(super) fn exit_stats(steps: &[terse_train::report::StepReport]) -> Option<(f64, f64)> {
    let (mut rate, mut right) = (0.0, 0.0);
    for l in steps.iter().filter(|l| l.early_exit > 0.0) {
        rate += l.early_exit;
        right += l.early_exit * l.exit_accuracy?;
    }
    (rate > 0.0).then(|| (rate / steps.len() as f64, right / rate))
}
