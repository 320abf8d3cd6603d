//! The report's tables: the results table (mean ± sd over seeds), the claims the study decides
//! (crates/study/src/claims.rs) and the mechanism rows behind them.

use super::runs::{MethodRuns, RunResult};
use anyhow::Result;
use std::fmt::Write as _;
use terse_study::{claims, overthink, RunStats};

/// "mean ± sd" over seeds (sd with ddof 1; just the mean for one seed).
pub(crate) fn cell(xs: &[f64], digits: usize) -> String {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return format!("{m:.digits$}");
    }
    let sd = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    format!("{m:.digits$} ± {sd:.digits$}")
}

/// The results table: the SFT start, then one row per method (mean ± sd over seeds).
pub(super) fn table(md: &mut String, all: &[MethodRuns]) -> Result<()> {
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

/// The overthinking analysis of Standard and the computed verdicts of the claims.
pub(super) fn verdicts(md: &mut String, all: &[MethodRuns]) -> Result<()> {
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
pub(super) fn mechanisms(md: &mut String, all: &[MethodRuns]) -> Result<()> {
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
