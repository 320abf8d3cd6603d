//! The report's testbed section: does outcome-only GRPO (Standard) overthink, as the papers' models
//! do? Reads the Standard runs' rollout lengths and their first and last evaluations (the caller
//! passes them in: xtask/src/summary/tables.rs for the study) and decides, with 95 % t intervals
//! over seeds, whether the length grew by the goal factor while accuracy rose, and where the
//! re-checks went, level by level.

use super::claims::{paired, Interval};
use std::fmt::Write as _;
use terse_train::report::EvalReport;

/// The growth the testbed is built to show (issue #19: last step ≥ 1.2 × the first).
pub const GOAL: f64 = 1.2;

/// Steps averaged at each end of a run: one cycle of the level mix (8 prompts a step over 6
/// levels repeat every 3 steps), so both ends see the same levels.
pub const WINDOW: usize = 3;

/// One run, as the section reads it.
pub struct Run<'a> {
    pub start: &'a EvalReport,
    pub end: &'a EvalReport,
    /// Rollout length per GRPO step.
    pub len_curve: &'a [f64],
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

fn ci(i: Interval, digits: usize) -> String {
    match i.ci {
        Some((lo, hi)) => format!("{:.digits$} [{lo:.digits$}, {hi:.digits$}]", i.mean),
        None => format!("{:.digits$}", i.mean),
    }
}

/// "holds" when the whole interval is on the claimed side of `x`, "fails" when it is wholly on
/// the other, else "unresolved".
fn verdict(i: Interval, x: f64) -> &'static str {
    match i.ci {
        Some((lo, _)) if lo >= x => "**holds**",
        Some((_, hi)) if hi < x => "**fails**",
        _ => "unresolved",
    }
}

/// The section, or an empty string when no run has a starting evaluation or enough steps.
pub fn section(method: &str, runs: &[Run], compare: &[(&str, Vec<Run>)]) -> String {
    let runs: Vec<&Run> = runs
        .iter()
        .filter(|r| r.len_curve.len() >= 2 * WINDOW)
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let growth = paired(
        &runs
            .iter()
            .map(|r| {
                let n = r.len_curve.len();
                mean(&r.len_curve[n - WINDOW..]) / mean(&r.len_curve[..WINDOW])
            })
            .collect::<Vec<_>>(),
    );
    let eval_growth = paired(
        &runs
            .iter()
            .map(|r| r.end.len_mean / r.start.len_mean)
            .collect::<Vec<_>>(),
    );
    let acc_gain = paired(
        &runs
            .iter()
            .map(|r| r.end.accuracy - r.start.accuracy)
            .collect::<Vec<_>>(),
    );
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Does outcome-only GRPO overthink? ({method}, {} seed(s))\n",
        runs.len()
    );
    let _ = writeln!(
        s,
        "Computed from the runs, 95 % t intervals over seeds. Rollout lengths average the first and the last {WINDOW} steps (one cycle of the level mix).\n"
    );
    let _ = writeln!(s, "| Measure | Value | Goal | Verdict |\n|---|---|---|---|");
    let _ = writeln!(
        s,
        "| Rollout length, last / first steps | {} | ≥ {GOAL} | {} |",
        ci(growth, 2),
        verdict(growth, GOAL)
    );
    let _ = writeln!(
        s,
        "| Eval tokens, end / start | {} | > 1 | {} |",
        ci(eval_growth, 2),
        verdict(eval_growth, 1.0 + 1e-9)
    );
    let _ = writeln!(
        s,
        "| Eval pass@1, end − start | {} | > 0 | {} |\n",
        ci(acc_gain, 3),
        verdict(acc_gain, 1e-9)
    );
    // Per-level means over seeds of `f`, read at the start (`at_end` false) or the end.
    let levels = |r: &[&Run], at_end: bool, f: &dyn Fn(&EvalReport) -> Vec<f64>| -> Vec<f64> {
        let rows: Vec<Vec<f64>> = r
            .iter()
            .map(|r| f(if at_end { r.end } else { r.start }))
            .collect();
        (0..rows[0].len())
            .map(|i| mean(&rows.iter().map(|x| x[i]).collect::<Vec<_>>()))
            .collect()
    };
    let pass = |e: &EvalReport| e.by_level.iter().map(|l| l.pass1).collect::<Vec<_>>();
    let toks = |e: &EvalReport| e.by_level.iter().map(|l| l.len_mean).collect::<Vec<_>>();
    let refl = |e: &EvalReport| {
        e.by_level
            .iter()
            .map(|l| l.reflections_mean)
            .collect::<Vec<_>>()
    };
    let others: Vec<(&str, Vec<&Run>)> = compare
        .iter()
        .map(|(n, r)| (*n, r.iter().collect()))
        .filter(|(_, r): &(&str, Vec<&Run>)| !r.is_empty())
        .collect();
    let head: String = others
        .iter()
        .map(|(n, _)| format!(" re-checks, {n} |"))
        .collect();
    let _ = writeln!(
        s,
        "Per level (means over seeds; re-checks are `Wait`s per completion):\n\n| Level | pass@1 start | pass@1 end | tokens start | tokens end | re-checks start | re-checks end |{head}\n|---|---|---|---|---|---|---|{}",
        "---|".repeat(others.len())
    );
    let cols = [
        levels(&runs, false, &pass),
        levels(&runs, true, &pass),
        levels(&runs, false, &toks),
        levels(&runs, true, &toks),
        levels(&runs, false, &refl),
        levels(&runs, true, &refl),
    ];
    let extra: Vec<Vec<f64>> = others.iter().map(|(_, r)| levels(r, true, &refl)).collect();
    for (i, l) in runs[0].end.by_level.iter().enumerate() {
        let e: String = extra.iter().map(|c| format!(" {:.2} |", c[i])).collect();
        let _ = writeln!(
            s,
            "| {} | {:.3} | {:.3} | {:.1} | {:.1} | {:.2} | {:.2} |{e}",
            l.level, cols[0][i], cols[1][i], cols[2][i], cols[3][i], cols[4][i], cols[5][i]
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_train::report::LevelReport;

    fn report(acc: f64, len: f64, refl: [f64; 2]) -> EvalReport {
        EvalReport {
            accuracy: acc,
            len_mean: len,
            by_level: (0..2)
                .map(|i| LevelReport {
                    level: i + 1,
                    pass1: acc,
                    pass_k: acc,
                    len_mean: len,
                    reflections_mean: refl[i],
                    examples: vec![],
                })
                .collect(),
        }
    }

    /// One run per end report, all from `start`, with the matching length curve.
    fn pair<'a>(
        start: &'a EvalReport,
        ends: &'a [EvalReport],
        curves: &'a [Vec<f64>],
    ) -> Vec<Run<'a>> {
        ends.iter()
            .zip(curves)
            .map(|(end, c)| Run {
                start,
                end,
                len_curve: c,
            })
            .collect()
    }

    #[test]
    fn growth_and_accuracy_verdicts_follow_the_intervals() {
        let start = report(0.6, 30.0, [0.3, 1.0]);
        let ends: Vec<EvalReport> = [0.70, 0.72, 0.68]
            .iter()
            .map(|&a| report(a, 40.0, [0.6, 2.0]))
            .collect();
        let grow: Vec<Vec<f64>> = [1.30, 1.35, 1.40]
            .iter()
            .map(|g| [vec![30.0; 3], vec![31.0; 6], vec![30.0 * g; 3]].concat())
            .collect();
        let runs = pair(&start, &ends, &grow);
        let s = section("Standard", &runs, &[("short_rl", vec![])]);
        let row = |name: &str| {
            s.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            row("| Rollout length").contains("1.35 [")
                && row("| Rollout length").ends_with("**holds** |"),
            "{s}"
        );
        assert!(row("| Eval pass@1").contains("**holds**"), "{s}");
        // The per-level table: start and end re-checks, means over seeds.
        assert!(
            s.contains("| 1 | 0.600 | 0.700 | 30.0 | 40.0 | 0.30 | 0.60 |"),
            "{s}"
        );
        // Shrinking runs fail the growth goal; one seed leaves everything unresolved.
        let shrink: Vec<Vec<f64>> = (0..3)
            .map(|_| [vec![30.0; 9], vec![24.0; 3]].concat())
            .collect();
        let runs = pair(&start, &ends, &shrink);
        assert!(section("S", &runs, &[]).contains("| 0.80 [0.80, 0.80] | ≥ 1.2 | **fails** |"));
        assert!(section("S", &runs[..1], &[]).contains("| 0.80 | ≥ 1.2 | unresolved |"));
        // Runs too short for two windows give no section.
        let short = vec![30.0; 5];
        assert_eq!(
            section(
                "S",
                &[Run {
                    start: &start,
                    end: &ends[0],
                    len_curve: &short
                }],
                &[]
            ),
            ""
        );
    }
}
