//! The per-seed table of a study (docs/v4/seeds.csv): one row per (method, seed) with every
//! metric the v4 tables read, Standard's included, so every interval and verdict of the report
//! can be recomputed from the repository. Data flow: each run's metrics.jsonl -> [`from_run`]
//! -> [`write_csv`] -> seeds.csv -> [`read_csv`] -> confirmatory.rs's report; recompute.rs checks a
//! committed report against its CSV.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One run's final numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedRow {
    pub method: String,
    /// The run's index in the study (`-s<index>`), the pairing key.
    pub seed: u64,
    /// Final evaluation pass@1, mean over levels.
    pub accuracy: f64,
    /// Final evaluation completion tokens.
    pub eval_tokens: f64,
    /// Rollout length: averaged over steps, and at the last step.
    pub len_avg: f64,
    pub len_last: f64,
    /// Step-GRPO's share of rollouts that exited early, mean over steps (None without exits).
    pub exit_rate: Option<f64>,
    /// Final pass@1 and completion tokens by level, easiest first.
    pub pass1_by_level: Vec<f64>,
    pub tokens_by_level: Vec<f64>,
}

impl SeedRow {
    /// A one-level row for the study modules' tests: `tokens` for every length column.
    #[cfg(test)]
    pub(crate) fn fixture(method: &str, seed: u64, accuracy: f64, tokens: f64) -> SeedRow {
        SeedRow {
            method: method.into(),
            seed,
            accuracy,
            eval_tokens: tokens,
            len_avg: tokens,
            len_last: tokens,
            exit_rate: None,
            pass1_by_level: vec![accuracy],
            tokens_by_level: vec![tokens],
        }
    }
}

/// Reads one finished run's row from its metrics.jsonl.
pub fn from_run(method: &str, seed: u64, metrics: &Path) -> Result<SeedRow> {
    let steps = terse_train::report::read_steps(metrics)?;
    let evals = terse_train::report::read_evals(metrics)?;
    let last = evals
        .last()
        .with_context(|| format!("{} has no evaluation", metrics.display()))?;
    let lens: Vec<f64> = steps
        .iter()
        .map(|l| l.len_mean.unwrap_or(f64::NAN))
        .collect();
    let rate = steps.iter().map(|l| l.early_exit).sum::<f64>() / steps.len().max(1) as f64;
    Ok(SeedRow {
        method: method.into(),
        seed,
        accuracy: last.report.accuracy,
        eval_tokens: last.report.len_mean,
        len_avg: terse_reward::metrics::averaged_by_steps(&lens).0,
        len_last: lens.last().copied().unwrap_or(f64::NAN),
        exit_rate: (rate > 0.0).then_some(rate),
        pass1_by_level: last.report.by_level.iter().map(|l| l.pass1).collect(),
        tokens_by_level: last.report.by_level.iter().map(|l| l.len_mean).collect(),
    })
}

const FIXED: [&str; 7] = [
    "method",
    "seed",
    "accuracy",
    "eval_tokens",
    "len_avg",
    "len_last",
    "exit_rate",
];

/// The CSV text: a header, then the rows in the order given. Numbers are written in Rust's
/// shortest round-trip form, so reading them back gives the same f64 bits.
pub fn write_csv(rows: &[SeedRow]) -> Result<String> {
    let levels = rows.first().map_or(0, |r| r.pass1_by_level.len());
    let mut s = FIXED.join(",");
    for l in 1..=levels {
        write!(s, ",pass1_L{l}")?;
    }
    for l in 1..=levels {
        write!(s, ",tokens_L{l}")?;
    }
    s.push('\n');
    for r in rows {
        if r.pass1_by_level.len() != levels || r.tokens_by_level.len() != levels {
            bail!(
                "seeds.csv: {} seed {} has {} levels, the table {levels}",
                r.method,
                r.seed,
                r.pass1_by_level.len()
            );
        }
        if r.method.contains([',', '\n', '"']) {
            bail!(
                "seeds.csv: method name `{}` holds a comma or quote",
                r.method
            );
        }
        let exit = r.exit_rate.map_or(String::new(), |e| e.to_string());
        write!(
            s,
            "{},{},{},{},{},{},{exit}",
            r.method, r.seed, r.accuracy, r.eval_tokens, r.len_avg, r.len_last
        )?;
        for v in r.pass1_by_level.iter().chain(&r.tokens_by_level) {
            write!(s, ",{v}")?;
        }
        s.push('\n');
    }
    Ok(s)
}

/// Parses seeds.csv text (`what` names it in errors) into each method's rows in seed order.
pub fn read_csv(text: &str, what: &str) -> Result<BTreeMap<String, Vec<SeedRow>>> {
    let row = |f: &super::csv::Fields, extra: usize| -> Result<SeedRow> {
        let levels = extra / 2;
        let row = SeedRow {
            method: f.method(),
            seed: f.seed()?,
            accuracy: f.num(2)?,
            eval_tokens: f.num(3)?,
            len_avg: f.num(4)?,
            len_last: f.num(5)?,
            exit_rate: f.maybe(6)?,
            pass1_by_level: (0..levels)
                .map(|l| f.num(FIXED.len() + l))
                .collect::<Result<_>>()?,
            tokens_by_level: (0..levels)
                .map(|l| f.num(FIXED.len() + levels + l))
                .collect::<Result<_>>()?,
        };
        Ok(row)
    };
    super::csv::read_rows(text, what, &FIXED, row, |r| (r.method.as_str(), r.seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_CSV: &str = include_str!("testdata/v3-fixture-seeds.csv");

    #[test]
    fn the_csv_round_trips_and_bad_input_names_the_place() {
        let runs = read_csv(FIXTURE_CSV, "fixture").expect("csv");
        let rows: Vec<SeedRow> = runs.values().flatten().cloned().collect();
        let again = read_csv(&write_csv(&rows).expect("write"), "again").expect("read");
        assert_eq!(runs, again);
        let e = read_csv("method,seed\n", "x.csv")
            .expect_err("bad header")
            .to_string();
        assert!(e.contains("x.csv") && e.contains("header"), "{e}");
        let head = FIXTURE_CSV.lines().next().expect("header");
        let bad = format!(
            "{head}\nstandard,0,abc{}\n",
            ",1".repeat(head.split(',').count() - 3)
        );
        let e = read_csv(&bad, "x.csv").expect_err("bad number").to_string();
        assert!(
            e.contains("x.csv:2") && e.contains("accuracy = `abc`"),
            "{e}"
        );
    }
}
