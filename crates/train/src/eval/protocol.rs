//! `cargo xtask eval`'s library path: the evaluation protocol efficient-reasoning papers report.
//! A sampling preset (`--protocol r1`), accuracy at token budgets (budget.rs), the
//! efficiency metrics (metrics.rs) and, against a baseline checkpoint, AES and pass@k
//! retention; the PNG curves. Data flow: a run config + checkpoint directories -> mod.rs's
//! sampling and verdicts -> here -> table.rs's markdown and JSON.

use crate::config::{Init, RunConfig};
use crate::eval::budget::{finished_within, AtBudget, Forcing};
use crate::eval::metrics::{
    aes, efficiency, pass_k_retention, Aes, AesWeights, Efficiency, SampleOutcome,
};
use crate::eval::{level_report, sample_levels, summarize, verdicts};
use crate::report::EvalReport;
use crate::step::collect::gen_params;
use crate::task::Task;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use terse_model::Qwen3;
use terse_rollout::SamplingParams;

/// A named sampling protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// DeepSeek-R1's evaluation (arXiv 2501.12948, §3.1 "Evaluation Setup"): temperature 0.6,
    /// top-p 0.95, k samples per problem, pass@1 averaged over them (avg@k).
    R1,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "r1" => Ok(Protocol::R1),
            _ => Err(format!("unknown protocol `{s}` (known: r1)")),
        }
    }
}

impl Protocol {
    /// The protocol's sampling settings (top-k and min-p off).
    pub fn sampling(self) -> SamplingParams {
        match self {
            Protocol::R1 => {
                let mut s = SamplingParams::default();
                s.temperature = 0.6;
                s.top_p = 0.95;
                s
            }
        }
    }
}

/// What `cargo xtask eval` asks beyond the run config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalOptions {
    /// Replaces `grpo.sampling` with the protocol's settings.
    pub protocol: Option<Protocol>,
    /// Explicit settings, applied over the protocol's.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Token budgets (accuracy with a forced answer at each); the largest is the generation
    /// limit.
    pub budgets: Vec<usize>,
    pub aes: AesWeights,
    /// Folder for eval_accuracy.png, eval_tokens.png and (with budgets) eval_budgets.png.
    pub plots: Option<PathBuf>,
}

/// The settings the samples were drawn with, as the report header prints them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    pub protocol: Option<Protocol>,
    pub sampling: SamplingParams,
    /// Samples per problem (the n of avg@n, the k of pass@k).
    pub samples: usize,
    pub max_new_tokens: usize,
    pub budgets: Vec<usize>,
    pub aes: AesWeights,
}

/// Accuracy at one token budget, over every sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetPoint {
    pub budget: usize,
    pub accuracy: f64,
    /// The share of samples cut at this budget and answered by force.
    pub forced_rate: f64,
    /// Mean tokens spent: a finished sample's length, a cut one's cut + forced text + answer.
    pub tokens_mean: f64,
}

/// One checkpoint's evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEval {
    /// By level, as the trainer's validation reports it.
    pub report: EvalReport,
    pub efficiency: Efficiency,
    pub budgets: Vec<BudgetPoint>,
}

/// A checkpoint against the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VsBase {
    /// None when the baseline's accuracy or length is 0.
    pub aes: Option<Aes>,
    pub pass_k_retention: Option<f64>,
    /// Mean tokens / the baseline's (per sample).
    pub compression_rate: f64,
}

/// Everything `cargo xtask eval` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalOutcome {
    pub setup: Setup,
    pub model: ModelEval,
    pub base: Option<ModelEval>,
    pub vs_base: Option<VsBase>,
    /// The PNG files written.
    pub plots: Vec<PathBuf>,
}

/// Applies the protocol, the explicit sampling flags and the budgets to `cfg`; returns the
/// budgets sorted, without repeats.
pub fn configure(cfg: &mut RunConfig, opts: &EvalOptions) -> Result<Vec<usize>> {
    if let Some(p) = opts.protocol {
        cfg.grpo.sampling = p.sampling();
    }
    if let Some(t) = opts.temperature {
        cfg.grpo.sampling.temperature = t;
    }
    if let Some(p) = opts.top_p {
        cfg.grpo.sampling.top_p = p;
    }
    let mut budgets = opts.budgets.clone();
    budgets.sort_unstable();
    budgets.dedup();
    if budgets.first() == Some(&0) {
        bail!("--budgets: a budget is at least 1 token, got 0");
    }
    // A completion past the largest budget is cut there anyway, so sampling stops at it.
    if let Some(&max) = budgets.last() {
        cfg.grpo.max_new_tokens = max;
    }
    Ok(budgets)
}

/// Samples, scores and measures one loaded checkpoint.
pub fn evaluate_model(
    cfg: &RunConfig,
    task: &Task,
    model: &Qwen3,
    tok: &tokenizers::Tokenizer,
    budgets: &[usize],
) -> Result<ModelEval> {
    let n = cfg.eval.samples.max(1);
    let gen = gen_params(cfg, model);
    let form = match (task.answer_form(), budgets.is_empty()) {
        (Some(f), _) => Some(f),
        (None, true) => None,
        (None, false) => {
            bail!("--budgets: research code's verifier has no known answer form to force")
        }
    };
    let mut by_level = vec![];
    let mut problems: Vec<Vec<SampleOutcome>> = vec![];
    let mut at: Vec<Vec<AtBudget>> = vec![vec![]; budgets.len()];
    for level in sample_levels(cfg, task, model, tok, &gen, n)? {
        let v = verdicts(task, &level, n, tok);
        by_level.push(level_report(&level, &v, n, &cfg.grpo.step_triggers));
        problems.extend(
            level
                .samples
                .iter()
                .zip(&v)
                .map(|(s, (_, correct))| SampleOutcome {
                    len: s.len(),
                    // The limit is the largest budget or max_new_tokens alike.
                    finished: finished_within(s, usize::MAX),
                    correct: *correct,
                })
                .collect::<Vec<_>>()
                .chunks(n)
                .map(<[SampleOutcome]>::to_vec),
        );
        if let Some(form) = form.filter(|_| !budgets.is_empty()) {
            let f = Forcing {
                task,
                form,
                model,
                tok,
                gen: &gen,
            };
            for (all, these) in at.iter_mut().zip(f.at_budgets(&level, &v, budgets)?) {
                all.extend(these);
            }
        }
    }
    Ok(ModelEval {
        report: summarize(by_level),
        efficiency: efficiency(&problems),
        budgets: budgets
            .iter()
            .zip(&at)
            .map(|(&budget, s)| budget_point(budget, s))
            .collect(),
    })
}

/// Accuracy, forced share and mean tokens of the samples at one budget.
pub fn budget_point(budget: usize, samples: &[AtBudget]) -> BudgetPoint {
    let m = samples.len().max(1) as f64;
    let share = |f: &dyn Fn(&AtBudget) -> bool| samples.iter().filter(|s| f(s)).count() as f64 / m;
    BudgetPoint {
        budget,
        accuracy: share(&|s| s.correct),
        forced_rate: share(&|s| s.forced),
        tokens_mean: samples.iter().map(|s| s.tokens as f64).sum::<f64>() / m,
    }
}

/// `model` against `base`: AES with `w`, pass@k retention and the compression rate.
pub fn versus(w: AesWeights, model: &Efficiency, base: &Efficiency) -> VsBase {
    VsBase {
        aes: aes(
            w,
            model.accuracy,
            model.len_mean,
            base.accuracy,
            base.len_mean,
        ),
        pass_k_retention: pass_k_retention(model.pass_k, base.pass_k),
        compression_rate: terse_reward::metrics::compression_rate(model.len_mean, base.len_mean),
    }
}

/// Loads the checkpoint in `dir` with `cfg`'s task and device, and evaluates it.
fn evaluate_dir(cfg: &RunConfig, dir: &Path, budgets: &[usize]) -> Result<ModelEval> {
    let mut cfg = cfg.clone();
    cfg.model.path = dir.to_path_buf();
    cfg.model.init = Init::Checkpoint;
    cfg.sft.steps = 0;
    cfg.validate()?;
    let task = Task::new(&cfg.data, dir, cfg.run.seed)?;
    let (dev, dtype) = cfg.run.device_and_dtype()?;
    let model = Qwen3::load(dir, &dev, dtype)
        .with_context(|| format!("loading the checkpoint {}", dir.display()))?;
    let tok = crate::load::load_tokenizer(dir)?;
    evaluate_model(&cfg, &task, &model, &tok, budgets)
}

/// Evaluates the checkpoint `model` (and `base`, the baseline, with the same settings) under
/// `cfg` and `opts`; writes the plots when asked.
pub fn run(
    cfg: &RunConfig,
    model: &Path,
    base: Option<&Path>,
    opts: &EvalOptions,
) -> Result<EvalOutcome> {
    let mut cfg = cfg.clone();
    let budgets = configure(&mut cfg, opts)?;
    let setup = Setup {
        protocol: opts.protocol,
        sampling: cfg.grpo.sampling.clone(),
        samples: cfg.eval.samples.max(1),
        max_new_tokens: cfg.grpo.max_new_tokens,
        budgets: budgets.clone(),
        aes: opts.aes,
    };
    let m = evaluate_dir(&cfg, model, &budgets)?;
    let b = base.map(|d| evaluate_dir(&cfg, d, &budgets)).transpose()?;
    let vs_base = b
        .as_ref()
        .map(|b| versus(opts.aes, &m.efficiency, &b.efficiency));
    let plots = match &opts.plots {
        Some(dir) => plots(dir, &m, b.as_ref())?,
        None => vec![],
    };
    Ok(EvalOutcome {
        setup,
        model: m,
        base: b,
        vs_base,
        plots,
    })
}

/// eval_accuracy.png and eval_tokens.png by level; with budgets, eval_budgets.png (accuracy
/// against the token budget), model beside base.
fn plots(dir: &Path, m: &ModelEval, b: Option<&ModelEval>) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let runs: Vec<(String, &ModelEval)> = std::iter::once(("model".to_string(), m))
        .chain(b.map(|b| ("base".to_string(), b)))
        .collect();
    let reports: Vec<(String, &EvalReport)> =
        runs.iter().map(|(n, r)| (n.clone(), &r.report)).collect();
    let mut out = plot_eval(dir, &reports)?;
    if !m.budgets.is_empty() {
        let curves: Vec<(String, crate::records::plot::Series)> = runs
            .iter()
            .map(|(n, r)| {
                let pts = r
                    .budgets
                    .iter()
                    .map(|p| (p.budget as f64, p.accuracy))
                    .collect();
                (n.clone(), pts)
            })
            .collect();
        let path = dir.join("eval_budgets.png");
        crate::records::plot::line_chart(
            &path,
            "Accuracy at a token budget (answer forced at the cut)",
            "token budget",
            "accuracy",
            &curves,
        )?;
        out.push(path);
    }
    Ok(out)
}

/// eval_accuracy.png and eval_tokens.png: pass@1 and mean tokens by level for each named report.
fn plot_eval(out_dir: &Path, reports: &[(String, &EvalReport)]) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for (file, title, y, pick) in [
        ("eval_accuracy.png", "pass@1 by level", "pass@1", 0),
        (
            "eval_tokens.png",
            "Mean completion tokens by level",
            "tokens",
            1,
        ),
    ] {
        let series: Vec<(String, crate::records::plot::Series)> = reports
            .iter()
            .map(|(name, r)| {
                let pts = r
                    .by_level
                    .iter()
                    .map(|l| (l.level as f64, if pick == 0 { l.pass1 } else { l.len_mean }))
                    .collect();
                (name.clone(), pts)
            })
            .collect();
        let path = out_dir.join(file);
        crate::records::plot::line_chart(&path, title, "level", y, &series)
            .with_context(|| format!("writing {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r1_preset_and_explicit_overrides() {
        let mut cfg = RunConfig::default();
        let opts = EvalOptions {
            protocol: Some("r1".parse().expect("r1")),
            budgets: vec![64, 16, 32, 16],
            ..Default::default()
        };
        let budgets = configure(&mut cfg, &opts).expect("configure");
        assert_eq!(budgets, [16, 32, 64]);
        assert_eq!(
            (cfg.grpo.sampling.temperature, cfg.grpo.sampling.top_p),
            (0.6, 0.95)
        );
        assert_eq!(cfg.grpo.max_new_tokens, 64);
        let explicit = EvalOptions {
            temperature: Some(1.0),
            ..opts.clone()
        };
        configure(&mut cfg, &explicit).expect("configure");
        assert_eq!(
            (cfg.grpo.sampling.temperature, cfg.grpo.sampling.top_p),
            (1.0, 0.95)
        );
        let zero = EvalOptions {
            budgets: vec![0, 8],
            ..opts
        };
        let e = configure(&mut cfg, &zero).expect_err("a zero budget");
        assert!(e.to_string().contains("--budgets"), "{e}");
        assert!("r2".parse::<Protocol>().is_err());
    }

    #[test]
    fn budget_points_by_hand() {
        let s = |correct, forced, tokens| AtBudget {
            correct,
            forced,
            tokens,
        };
        let p = budget_point(
            16,
            &[
                s(true, false, 10),
                s(false, true, 19),
                s(true, true, 19),
                s(false, false, 4),
            ],
        );
        assert_eq!((p.accuracy, p.forced_rate, p.tokens_mean), (0.5, 0.5, 13.0));
    }
}
