//! The per-seed trajectory table of a v4 study (trajectory.csv, beside seeds.csv): what a run
//! did between its start and its end that seeds.csv's final numbers do not hold, namely the
//! rollout length's growth, the starting evaluation and CARE's direction counts. The premise
//! checks (premise.rs) and the effect sizes against the papers (effect.rs) read it with
//! seeds.csv. Data flow: each run's metrics.jsonl -> [`from_run`] -> [`write_csv`] ->
//! trajectory.csv -> [`read_csv`] -> premise.rs / effect.rs -> the v4 reports.

use super::overthink::WINDOW;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One run's trajectory numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct TrajRow {
    pub method: String,
    /// The run's index in the study (`-s<index>`), the pairing key shared with seeds.csv.
    pub seed: u64,
    /// Rollout length, mean of the last `WINDOW` steps over the mean of the first `WINDOW`
    /// (overthink.rs's measure; NaN for a run shorter than two windows).
    pub growth: f64,
    /// The evaluation at step 0 (the SFT checkpoint under this run's sampling seed).
    pub start_accuracy: f64,
    pub start_tokens: f64,
    /// CARE's groups per step with d = +1 (longer) and d = −1 (shorter), mean over steps
    /// (the reward's `care_dir_longer` / `care_dir_shorter` diagnostics; None for other rows).
    pub care_longer: Option<f64>,
    pub care_shorter: Option<f64>,
    /// The starting evaluation's pass@1 by level, easiest first.
    pub start_pass1_by_level: Vec<f64>,
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// A shaper diagnostic averaged over the steps that report it.
fn step_mean(steps: &[terse_train::report::StepReport], key: &str) -> Option<f64> {
    let v: Vec<f64> = steps.iter().filter_map(|l| l.diagnostic(key)).collect();
    (!v.is_empty()).then(|| mean(&v))
}

/// Reads one finished run's trajectory from its metrics.jsonl; a run without an evaluation at
/// step 0 is an error naming the file.
pub fn from_run(method: &str, seed: u64, metrics: &Path) -> Result<TrajRow> {
    let steps = terse_train::report::read_steps(metrics)?;
    let evals = terse_train::report::read_evals(metrics)?;
    let start = evals
        .iter()
        .find(|e| e.step == 0)
        .with_context(|| format!("{} has no evaluation at step 0", metrics.display()))?;
    let lens: Vec<f64> = steps
        .iter()
        .map(|l| l.len_mean.unwrap_or(f64::NAN))
        .collect();
    let n = lens.len();
    let growth = if n >= 2 * WINDOW {
        mean(&lens[n - WINDOW..]) / mean(&lens[..WINDOW])
    } else {
        f64::NAN
    };
    Ok(TrajRow {
        method: method.into(),
        seed,
        growth,
        start_accuracy: start.report.accuracy,
        start_tokens: start.report.len_mean,
        care_longer: step_mean(&steps, "care_dir_longer"),
        care_shorter: step_mean(&steps, "care_dir_shorter"),
        start_pass1_by_level: start.report.by_level.iter().map(|l| l.pass1).collect(),
    })
}

const FIXED: [&str; 7] = [
    "method",
    "seed",
    "growth",
    "start_accuracy",
    "start_tokens",
    "care_longer",
    "care_shorter",
];

fn opt(x: Option<f64>) -> String {
    x.map_or(String::new(), |x| x.to_string())
}

/// The CSV text: a header, then the rows in the order given (shortest round-trip numbers, so
/// reading them back gives the same bits; an empty field is a diagnostic the run lacks).
pub fn write_csv(rows: &[TrajRow]) -> Result<String> {
    let levels = rows.first().map_or(0, |r| r.start_pass1_by_level.len());
    let mut s = FIXED.join(",");
    for l in 1..=levels {
        write!(s, ",start_pass1_L{l}")?;
    }
    s.push('\n');
    for r in rows {
        if r.start_pass1_by_level.len() != levels {
            bail!(
                "trajectory.csv: {} seed {} has {} levels, the table {levels}",
                r.method,
                r.seed,
                r.start_pass1_by_level.len()
            );
        }
        if r.method.contains([',', '\n', '"']) {
            bail!(
                "trajectory.csv: method name `{}` holds a comma or quote",
                r.method
            );
        }
        write!(
            s,
            "{},{},{},{},{},{},{}",
            r.method,
            r.seed,
            r.growth,
            r.start_accuracy,
            r.start_tokens,
            opt(r.care_longer),
            opt(r.care_shorter)
        )?;
        for v in &r.start_pass1_by_level {
            write!(s, ",{v}")?;
        }
        s.push('\n');
    }
    Ok(s)
}

/// Parses trajectory.csv text (`what` names it in errors) into each method's rows in seed
/// order.
pub fn read_csv(text: &str, what: &str) -> Result<BTreeMap<String, Vec<TrajRow>>> {
    let row = |f: &super::csv::Fields, levels: usize| -> Result<TrajRow> {
        let row = TrajRow {
            method: f.method(),
            seed: f.seed()?,
            growth: f.num(2)?,
            start_accuracy: f.num(3)?,
            start_tokens: f.num(4)?,
            care_longer: f.maybe(5)?,
            care_shorter: f.maybe(6)?,
            start_pass1_by_level: (0..levels)
                .map(|l| f.num(FIXED.len() + l))
                .collect::<Result<_>>()?,
        };
        Ok(row)
    };
    super::csv::read_rows(text, what, &FIXED, row, |r| (r.method.as_str(), r.seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_s_trajectory_round_trips_and_bad_input_names_the_place() {
        let dir = std::env::temp_dir().join(format!("terse-traj-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let eval = |step: u64, a: f64, t: f64| {
            format!(
                "{{\"phase\":\"eval\",\"step\":{step},\"accuracy\":{a},\"len_mean\":{t},\
                 \"by_level\":[{{\"level\":1,\"pass1\":{a},\"pass_k\":1.0,\"len_mean\":{t},\
                 \"reflections_mean\":0.0}}]}}\n"
            )
        };
        let mut text = eval(0, 0.6, 40.0);
        for s in 1..=6u64 {
            // Lengths 30, 30, 30 then 45, 45, 45: growth 1.5; CARE's counts 2 and 3 a step.
            let len = if s <= 3 { 30.0 } else { 45.0 };
            text.push_str(&format!(
                "{{\"phase\":\"grpo\",\"step\":{s},\"len_mean\":{len},\
                 \"care_dir_longer\":2.0,\"care_dir_shorter\":{}}}\n",
                2.0 + (s % 2) as f64
            ));
        }
        text.push_str(&eval(6, 0.7, 50.0));
        let path = dir.join("metrics.jsonl");
        std::fs::write(&path, text).expect("temp dir");
        let row = from_run("care", 3, &path).expect("row");
        assert_eq!(row.growth, 1.5);
        assert_eq!((row.start_accuracy, row.start_tokens), (0.6, 40.0));
        assert_eq!((row.care_longer, row.care_shorter), (Some(2.0), Some(2.5)));
        assert_eq!(row.start_pass1_by_level, vec![0.6]);
        let csv = write_csv(std::slice::from_ref(&row)).expect("csv");
        assert_eq!(read_csv(&csv, "t.csv").expect("read")["care"], vec![row]);
        let bad = csv.replace(",1.5,", ",x,");
        let e = read_csv(&bad, "t.csv").expect_err("bad").to_string();
        assert!(e.contains("t.csv:2") && e.contains("growth = `x`"), "{e}");
        // A run without a starting evaluation cannot say how it changed.
        std::fs::write(&path, eval(6, 0.7, 50.0)).expect("temp dir");
        let e = from_run("care", 3, &path)
            .expect_err("no start")
            .to_string();
        assert!(e.contains("no evaluation at step 0"), "{e}");
        std::fs::remove_dir_all(&dir).expect("temp dir");
    }
}
