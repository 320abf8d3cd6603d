//! The repro study's report: reads every run's metrics.jsonl under the study's run directory and
//! writes docs/results.md (a table in the shape of Short-RL's Table 1, mean ± sd over seeds, and
//! the claims decided by claims.rs) and the length / accuracy curves. Deterministic: the same runs give the same bytes.

use crate::methods::{Method, Testbed, DEFAULT_SEEDS};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use terse_train::evals::EvalReport;
use terse_train::records::{band_chart, line_chart, Band, Series};
use terse_train::report::{read_evals, read_steps, EvalLine};
use terse_train::study::{claims, overthink, RunStats};

/// pass@1 by level, the mean over levels, and eval tokens.
type Eval = (Vec<(usize, f64)>, f64, f64);

/// What one run contributes to the table.
struct RunResult {
    /// Final evaluation pass@1 by level, and its mean over levels.
    by_level: Vec<(usize, f64)>,
    acc: f64,
    eval_tokens: f64,
    /// Final evaluation tokens by level, in level order.
    tokens_by_level: Vec<f64>,
    /// The SFT start's evaluation (step 0), for the first row.
    start: Option<Eval>,
    /// Rollout length per step: averaged over steps, and at the last step.
    len_avg: f64,
    len_last: f64,
    /// γ_ℓ averaged over the steps that report it (Short-RL variants).
    gamma: Option<f64>,
    /// CARE's direction per step, averaged over steps: groups with d = +1, with d = -1.
    care_dirs: Option<(f64, f64)>,
    /// Step-GRPO's early exits: the fraction of rollouts that exited (mean over steps) and
    /// the fraction of those that were right (pooled over steps); None without exits.
    exits: Option<(f64, f64)>,
    len_curve: Vec<f64>,
    acc_curve: Vec<f64>,
    /// The first (step 0) and the last evaluation, whole.
    first_eval: Option<EvalReport>,
    last_eval: EvalReport,
}

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

fn read_run(dir: &Path) -> Result<RunResult> {
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
fn exit_stats(steps: &[terse_train::report::StepReport]) -> Option<(f64, f64)> {
    let (mut rate, mut right) = (0.0, 0.0);
    for l in steps.iter().filter(|l| l.early_exit > 0.0) {
        rate += l.early_exit;
        right += l.early_exit * l.exit_accuracy?;
    }
    (rate > 0.0).then(|| (rate / steps.len() as f64, right / rate))
}

/// "mean ± sd" over seeds (sd with ddof 1; just the mean for one seed).
fn cell(xs: &[f64], digits: usize) -> String {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return format!("{m:.digits$}");
    }
    let sd = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    format!("{m:.digits$} ± {sd:.digits$}")
}

/// Per-step mean over seeds, then a trailing moving average over 5 steps.
fn curve(runs: &[RunResult], pick: impl Fn(&RunResult) -> &Vec<f64>) -> Series {
    curve_band(runs, pick).0
}

/// [`curve`] and its 95 % band: each seed's curve is smoothed (5 steps) first, then the t
/// interval of the mean over seeds is taken step by step (no band with one seed).
fn curve_band(runs: &[RunResult], pick: impl Fn(&RunResult) -> &Vec<f64>) -> (Series, Band) {
    let steps = runs.iter().map(|r| pick(r).len()).min().unwrap_or(0);
    let smooth = |c: &Vec<f64>, i: usize| {
        let w = &c[i.saturating_sub(4)..=i];
        w.iter().sum::<f64>() / w.len() as f64
    };
    let mut series = vec![];
    let mut band = vec![];
    for i in 0..steps {
        let at: Vec<f64> = runs.iter().map(|r| smooth(pick(r), i)).collect();
        let iv = claims::paired(&at);
        series.push((i as f64, iv.mean));
        if let Some((lo, hi)) = iv.ci {
            band.push((i as f64, lo, hi));
        }
    }
    (series, band)
}

/// The methods drawn with bands (all of them would hide each other).
const BANDED: [&str; 6] = [
    "standard",
    "kimi",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo",
];

/// What a study was: its testbed, base config (and that config's `grpo.max_new_tokens`, which
/// the overrides' `{l_max}` stands for), seed count and whether it was `--quick`.
pub struct Study<'a> {
    pub testbed: Testbed,
    pub config: &'a Path,
    pub l_max: usize,
    pub seeds: u64,
    pub quick: bool,
}

/// Which report a study writes: its file suffix, title suffix and the `repro` arguments that
/// made it. Every study but a testbed's default one (its methods, `DEFAULT_SEEDS`) has a file
/// of its own, so results.md is always what `cargo xtask repro [--testbed v3]` writes.
struct ReportKind {
    suffix: String,
    title: &'static str,
    command: String,
}

fn report_kind(methods: &[&Method], study: &Study) -> ReportKind {
    let kind = |suffix: String, title, command| ReportKind {
        suffix,
        title,
        command,
    };
    let seeds = study.seeds;
    let names: Vec<&str> = methods.iter().map(|m| m.name).collect();
    let default_set = names
        .iter()
        .copied()
        .eq(study.testbed.methods().iter().map(|m| m.name));
    let every = names
        .iter()
        .copied()
        .eq(crate::methods::known().map(|m| m.name));
    if study.quick {
        kind("-quick".into(), " (quick)", " --quick".into())
    } else if every && !default_set {
        let (suffix, arg) = match seeds {
            DEFAULT_SEEDS => (String::new(), String::new()),
            n => (format!("-seeds{n}"), format!(" --seeds {n}")),
        };
        kind(
            format!("-all{suffix}"),
            " (every method and variant)",
            format!("{arg} --methods all"),
        )
    } else if !default_set {
        kind(
            "-focus".into(),
            " (a part of it, more seeds)",
            format!(" --seeds {seeds} --methods {}", names.join(",")),
        )
    } else if seeds != DEFAULT_SEEDS {
        kind(
            format!("-seeds{seeds}"),
            " (every method, more seeds)",
            format!(" --seeds {seeds}"),
        )
    } else {
        kind(String::new(), "", String::new())
    }
}

/// One method's runs over the seeds.
type MethodRuns<'a> = (&'a Method, Vec<RunResult>);

/// Writes the report (results.md; results-quick.md for `--quick`; results-all.md for every
/// method and variant; results-focus.md when `methods` is a part of the testbed's study;
/// results-seeds<N>.md for all its methods with another seed count) and the curves into `out`.
pub fn write(root: &Path, methods: &[&Method], study: &Study, out: &Path) -> Result<PathBuf> {
    let (seeds, config) = (study.seeds, study.config);
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut all = vec![];
    for &m in methods {
        let runs = (0..seeds)
            .map(|s| read_run(&root.join(format!("{}-s{s}", m.name))))
            .collect::<Result<Vec<_>>>()?;
        all.push((m, runs));
    }
    let ReportKind {
        suffix,
        title,
        mut command,
    } = report_kind(methods, study);
    let config = config.display().to_string();
    if config != study.testbed.config() {
        command = format!(" --config {config}{command}");
    }
    let testbed = study.testbed.label();
    if !testbed.is_empty() {
        command = format!(" --testbed{testbed}{command}");
    }

    let mut md = String::new();
    writeln!(
        md,
        "# Reproduction study on the CPU testbed{testbed}{title}\n"
    )?;
    writeln!(
        md,
        "Generated by `cargo xtask repro{command}` from {config}: every method starts from the same SFT checkpoint and trains with the same GRPO settings; only the length term differs. {seeds} seed(s) per method; cells are mean ± sd over seeds. Accuracy is pass@1 on held-out problems after the last step, by level (the number of necessary steps); lengths are completion tokens of the training rollouts (averaged over steps, and at the last step) and of the final evaluation. γ_ℓ is Short-RL's length-control rate averaged over steps.\n"
    )?;
    table(&mut md, &all)?;
    figures(&mut md, methods, &suffix)?;
    verdicts(&mut md, &all)?;
    mechanisms(&mut md, &all)?;
    overrides(&mut md, methods, &config, study.l_max)?;
    // The hand-written reading of the table (a committed input, so the output stays reproducible).
    let reading = out.join(format!("results{suffix}-reading.md"));
    if reading.is_file() {
        md.push('\n');
        md.push_str(&std::fs::read_to_string(&reading)?);
    }
    let path = out.join(format!("results{suffix}.md"));
    terse_model::checkpoint::atomic_write(&path, md.as_bytes())?;
    charts(out, &suffix, &all)?;
    Ok(path)
}

/// The results table: the SFT start, then one row per method (mean ± sd over seeds).
fn table(md: &mut String, all: &[MethodRuns]) -> Result<()> {
    let levels: Vec<usize> = all[0].1[0].by_level.iter().map(|l| l.0).collect();
    let lv: String = levels.iter().map(|l| format!(" L{l} |")).collect();
    writeln!(
        md,
        "| Method |{lv} Avg | Len (avg by steps) | Len (last step) | Eval tokens | γ_ℓ |"
    )?;
    writeln!(
        md,
        "|---|{}---|---|---|---|---|",
        "---|".repeat(levels.len())
    )?;
    // The SFT start: the step-0 evaluation (the same checkpoint for every method of a seed).
    let starts: Vec<_> = all[0].1.iter().filter_map(|r| r.start.clone()).collect();
    if !starts.is_empty() {
        let per: String = (0..levels.len())
            .map(|i| {
                format!(
                    " {} |",
                    cell(&starts.iter().map(|s| s.0[i].1).collect::<Vec<_>>(), 3)
                )
            })
            .collect();
        let acc: Vec<f64> = starts.iter().map(|s| s.1).collect();
        let tok: Vec<f64> = starts.iter().map(|s| s.2).collect();
        writeln!(
            md,
            "| SFT start |{per} {} | - | - | {} | - |",
            cell(&acc, 3),
            cell(&tok, 1)
        )?;
    }
    for (m, runs) in all {
        let col = |f: &dyn Fn(&RunResult) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        let per: String = (0..levels.len())
            .map(|i| format!(" {} |", cell(&col(&|r| r.by_level[i].1), 3)))
            .collect();
        let gamma = if runs.iter().all(|r| r.gamma.is_some()) {
            cell(&col(&|r| r.gamma.unwrap_or(0.0)), 3)
        } else {
            "-".into()
        };
        writeln!(
            md,
            "| {} |{per} {} | {} | {} | {} | {gamma} |",
            m.label,
            cell(&col(&|r| r.acc), 3),
            cell(&col(&|r| r.len_avg), 1),
            cell(&col(&|r| r.len_last), 1),
            cell(&col(&|r| r.eval_tokens), 1),
        )?;
    }
    Ok(())
}

/// The links to the curves.
fn figures(md: &mut String, methods: &[&Method], suffix: &str) -> Result<()> {
    writeln!(
        md,
        "\n![length](repro{suffix}_length.png)\n\n![accuracy](repro{suffix}_accuracy.png)\n"
    )?;
    if methods.iter().any(|m| BANDED.contains(&m.name)) {
        writeln!(
            md,
            "The main methods with 95 % bands over seeds (t interval of the mean, step by step, after a 5-step average):\n\n![length, bands](repro{suffix}_length_bands.png)\n\n![accuracy, bands](repro{suffix}_accuracy_bands.png)\n"
        )?;
    }
    Ok(())
}

/// The overthinking analysis of Standard and the computed verdicts of the claims.
fn verdicts(md: &mut String, all: &[MethodRuns]) -> Result<()> {
    let runs_of = |name: &str| -> Vec<overthink::Run> {
        all.iter()
            .filter(|(m, _)| m.name == name)
            .flat_map(|(_, runs)| runs)
            .filter_map(|r| {
                Some(overthink::Run {
                    start: r.first_eval.as_ref()?,
                    end: &r.last_eval,
                    len_curve: &r.len_curve,
                })
            })
            .collect()
    };
    let compare: Vec<(&str, Vec<overthink::Run>)> = [
        "short_rl",
        "grpo_lambda",
        "care",
        "step_grpo",
        "step_grpo_kept",
    ]
    .into_iter()
    .map(|n| (n, runs_of(n)))
    .collect();
    let standard = runs_of("standard");
    if !standard.is_empty() {
        writeln!(
            md,
            "{}",
            overthink::section("Standard", &standard, &compare)
        )?;
    }
    let stats: std::collections::BTreeMap<&str, Vec<RunStats>> = all
        .iter()
        .map(|(m, runs)| {
            let s = runs
                .iter()
                .map(|r| RunStats {
                    acc: r.acc,
                    tokens: r.eval_tokens,
                    tokens_by_level: r.tokens_by_level.clone(),
                })
                .collect();
            (m.name, s)
        })
        .collect();
    writeln!(md, "{}", claims::section(&stats))?;
    Ok(())
}

/// The signals behind CARE's and Step-GRPO's rows.
fn mechanisms(md: &mut String, all: &[MethodRuns]) -> Result<()> {
    // CARE's direction signal, the reason behind its rows: how many of a step's groups it
    // pushed toward length (d = +1) and toward brevity (d = -1).
    if let Some((_, runs)) = all.iter().find(|(m, _)| m.name == "care") {
        let dirs: Vec<(f64, f64)> = runs.iter().filter_map(|r| r.care_dirs).collect();
        if !dirs.is_empty() {
            let n = dirs.len() as f64;
            let longer = dirs.iter().map(|d| d.0).sum::<f64>() / n;
            let shorter = dirs.iter().map(|d| d.1).sum::<f64>() / n;
            writeln!(
                md,
                "CARE's direction signal, per step (mean over steps and seeds): d = +1 (longer) in {longer:.2} groups, d = -1 (shorter) in {shorter:.2}, and d = 0 (an all-right or all-wrong group, or equal halves) in the others.\n"
            )?;
        }
    }
    // Step-GRPO's early exits, the reason behind its rows: how often a rollout exited at a
    // `Wait` and how often that trial answer was right.
    for (m, runs) in all {
        // (exit rate, exits right, final pass@1) by seed.
        let ex: Vec<(f64, f64, f64)> = runs
            .iter()
            .filter_map(|r| r.exits.map(|(rate, right)| (rate, right, r.acc)))
            .collect();
        if ex.is_empty() {
            continue;
        }
        let n = ex.len() as f64;
        let by_seed: Vec<String> = ex
            .iter()
            .map(|(rate, right, acc)| {
                format!("{:.0} % / {:.0} % / {acc:.3}", 100.0 * rate, 100.0 * right)
            })
            .collect();
        writeln!(
            md,
            "{}'s early exits (mean over steps and seeds): {:.0} % of rollouts exit at a `Wait`, and {:.0} % of those trial answers are right. By seed (exit rate / exits right / final pass@1): {}.\n",
            m.label,
            100.0 * ex.iter().map(|e| e.0).sum::<f64>() / n,
            100.0 * ex.iter().map(|e| e.1).sum::<f64>() / n,
            by_seed.join("; ")
        )?;
    }
    Ok(())
}

/// Each method's overrides of the study's base config.
fn overrides(md: &mut String, methods: &[&Method], config: &str, l_max: usize) -> Result<()> {
    writeln!(md, "## Method overrides\n\nEach run is {config} plus:\n")?;
    for m in methods {
        writeln!(
            md,
            "- **{}** (`{}`): `{}`",
            m.label,
            m.name,
            m.resolved(l_max).trim().replace('\n', "; ")
        )?;
    }
    Ok(())
}

/// The length and accuracy curves, and their 95 % bands for the main methods.
fn charts(out: &Path, suffix: &str, all: &[MethodRuns]) -> Result<()> {
    for (file, title, y, pick) in [
        (
            "length",
            "Rollout length (mean over seeds, 5-step average)",
            "tokens",
            0,
        ),
        (
            "accuracy",
            "Rollout accuracy (mean over seeds, 5-step average)",
            "accuracy",
            1,
        ),
    ] {
        let series: Vec<(String, Series)> = all
            .iter()
            .map(|(m, runs)| {
                let c = curve(runs, |r| {
                    if pick == 0 {
                        &r.len_curve
                    } else {
                        &r.acc_curve
                    }
                });
                (m.name.to_string(), c)
            })
            .collect();
        let p = out.join(format!("repro{suffix}_{file}.png"));
        line_chart(&p, title, "step", y, &series)?;
        let (series, bands): (Vec<(String, Series)>, Vec<Band>) = all
            .iter()
            .filter(|(m, _)| BANDED.contains(&m.name))
            .map(|(m, runs)| {
                let (c, b) = curve_band(runs, |r| {
                    if pick == 0 {
                        &r.len_curve
                    } else {
                        &r.acc_curve
                    }
                });
                ((m.name.to_string(), c), b)
            })
            .unzip();
        if series.is_empty() {
            continue;
        }
        let p = out.join(format!("repro{suffix}_{file}_bands.png"));
        band_chart(
            &p,
            &title.replace("mean over seeds", "95 % band over seeds"),
            "step",
            y,
            &series,
            &bands,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_study_writes_results_md() {
        let all: Vec<&Method> = crate::methods::METHODS.iter().collect();
        let study = |testbed, seeds, quick| Study {
            testbed,
            config: Path::new(Testbed::config(testbed)),
            l_max: 112,
            seeds,
            quick,
        };
        let v2 = |seeds, quick| study(Testbed::V2, seeds, quick);
        assert_eq!(report_kind(&all, &v2(DEFAULT_SEEDS, false)).suffix, "");
        assert_eq!(report_kind(&all, &v2(10, false)).suffix, "-seeds10");
        assert_eq!(report_kind(&all[..2], &v2(10, false)).suffix, "-focus");
        assert_eq!(report_kind(&all, &v2(1, true)).suffix, "-quick");
        // v3's default study is its own method set, and it writes results.md too.
        let v3 = study(Testbed::V3, DEFAULT_SEEDS, false);
        assert_eq!(report_kind(&Testbed::V3.methods(), &v3).suffix, "");
        assert_eq!(report_kind(&all, &v3).suffix, "-focus");
        let every: Vec<&Method> = crate::methods::known().collect();
        let kind = report_kind(&every, &v3);
        assert_eq!(
            (kind.suffix.as_str(), kind.command.as_str()),
            ("-all", " --methods all")
        );
    }

    #[test]
    fn exit_accuracy_pools_the_steps_by_their_exit_rate() {
        let step = |rate: f64, acc: Option<f64>| terse_train::report::StepReport {
            early_exit: rate,
            exit_accuracy: acc,
            ..Default::default()
        };
        // Step 1: half the rollouts exit, all right; step 2: a quarter exit, none right;
        // step 3: none exit. Pooled: 0.5 / 0.75 of the exits are right.
        let steps = [step(0.5, Some(1.0)), step(0.25, Some(0.0)), step(0.0, None)];
        let (rate, right) = exit_stats(&steps).expect("exits");
        assert!((rate - 0.25).abs() < 1e-12, "{rate}");
        assert!((right - 2.0 / 3.0).abs() < 1e-12, "{right}");
        assert_eq!(exit_stats(&steps[2..]), None);
        // An older run's exits without their accuracy are not counted as wrong.
        assert_eq!(exit_stats(&[step(0.5, None)]), None);
    }
}
