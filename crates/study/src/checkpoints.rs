//! Study v5's per-checkpoint tables (docs/v5/plan.md section 12): for each fresh SFT checkpoint,
//! a seeds.csv in `seeds`' format (its one base evaluation is the row `base`, seed 0) and a
//! rechecks.csv (mean `Wait` re-checks per completion by level, every run and the base). Data
//! flow: runs/repro-v5/ck<k>/<row>-s<i>/metrics.jsonl -> [`from_run`] -> [`write`] ->
//! docs/v5/checkpoints/ck<k>/ -> [`read`] -> twolevel.rs's analysis and report.

use crate::seeds::{self, SeedRow};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The row name of a checkpoint's base evaluation (its SFT model before any GRPO step).
pub const BASE: &str = "base";

/// One run's re-checks: mean `Wait` rounds per completion of its final evaluation, by level.
#[derive(Debug, Clone, PartialEq)]
pub struct Rechecks {
    pub method: String,
    pub seed: u64,
    pub by_level: Vec<f64>,
}

/// One checkpoint's runs and its base evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint's index in the study (SFT seed = 500 + index).
    pub index: usize,
    pub runs: BTreeMap<String, Vec<SeedRow>>,
    pub rechecks: BTreeMap<String, Vec<Rechecks>>,
}

impl Checkpoint {
    /// The base evaluation's row, when the checkpoint has one.
    pub fn base(&self) -> Option<&SeedRow> {
        self.runs.get(BASE).and_then(|r| r.first())
    }

    /// The base evaluation's re-checks by level.
    pub fn base_rechecks(&self) -> Option<&[f64]> {
        self.rechecks
            .get(BASE)
            .and_then(|r| r.first())
            .map(|r| r.by_level.as_slice())
    }
}

/// One finished run's rows from its metrics.jsonl: a GRPO run's through `seeds::from_run`; the
/// base run (0 GRPO steps, one evaluation) with its rollout-length columns NaN, as it has none.
pub fn from_run(method: &str, seed: u64, metrics: &Path) -> Result<(SeedRow, Rechecks)> {
    let evals = terse_train::report::read_evals(metrics)?;
    let last = evals
        .last()
        .with_context(|| format!("{} has no evaluation", metrics.display()))?;
    let row = if method == BASE {
        SeedRow {
            method: method.into(),
            seed,
            accuracy: last.report.accuracy,
            eval_tokens: last.report.len_mean,
            len_avg: f64::NAN,
            len_last: f64::NAN,
            exit_rate: None,
            pass1_by_level: last.report.by_level.iter().map(|l| l.pass1).collect(),
            tokens_by_level: last.report.by_level.iter().map(|l| l.len_mean).collect(),
        }
    } else {
        seeds::from_run(method, seed, metrics)?
    };
    let rechecks = Rechecks {
        method: method.into(),
        seed,
        by_level: last
            .report
            .by_level
            .iter()
            .map(|l| l.reflections_mean)
            .collect(),
    };
    Ok((row, rechecks))
}

const FIXED: [&str; 2] = ["method", "seed"];

/// rechecks.csv's text: `method,seed,rechecks_L1..` in the order given, numbers in Rust's
/// shortest round-trip form.
fn rechecks_csv(rows: &[Rechecks]) -> Result<String> {
    let levels = rows.first().map_or(0, |r| r.by_level.len());
    let mut s = FIXED.join(",");
    for l in 1..=levels {
        write!(s, ",rechecks_L{l}")?;
    }
    s.push('\n');
    for r in rows {
        if r.by_level.len() != levels {
            bail!(
                "rechecks.csv: {} seed {} has {} levels, the table {levels}",
                r.method,
                r.seed,
                r.by_level.len()
            );
        }
        write!(s, "{},{}", r.method, r.seed)?;
        for v in &r.by_level {
            write!(s, ",{v}")?;
        }
        s.push('\n');
    }
    Ok(s)
}

/// Writes checkpoint `ck`'s two tables into `dir` (created) and returns their texts.
pub fn write(dir: &Path, rows: &[SeedRow], rechecks: &[Rechecks]) -> Result<(String, String)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (a, b) = (seeds::write_csv(rows)?, rechecks_csv(rechecks)?);
    for (name, text) in [("seeds.csv", &a), ("rechecks.csv", &b)] {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok((a, b))
}

/// Parses a checkpoint's two tables (`what` names the checkpoint in errors).
pub fn parse(index: usize, seeds_csv: &str, rechecks: &str, what: &str) -> Result<Checkpoint> {
    let runs = seeds::read_csv(seeds_csv, &format!("{what}/seeds.csv"))?;
    let rechecks = crate::csv::read_rows(
        rechecks,
        &format!("{what}/rechecks.csv"),
        &FIXED,
        |f, extra| {
            Ok(Rechecks {
                method: f.method(),
                seed: f.seed()?,
                by_level: (0..extra).map(|i| f.num(2 + i)).collect::<Result<_>>()?,
            })
        },
        |r| (r.method.as_str(), r.seed),
    )?;
    Ok(Checkpoint {
        index,
        runs,
        rechecks,
    })
}

/// Reads every checkpoint's tables under `dir` (its `ck<k>` folders, in index order).
pub fn read(dir: &Path) -> Result<Vec<Checkpoint>> {
    let mut out = vec![];
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in entries {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        let Some(index) = name
            .strip_prefix("ck")
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        let text = |f: &str| {
            let p = e.path().join(f);
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
        };
        let what = e.path().display().to_string();
        out.push(parse(
            index,
            &text("seeds.csv")?,
            &text("rechecks.csv")?,
            &what,
        )?);
    }
    out.sort_by_key(|c| c.index);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tables read back as written, the base's NaN rollout columns included.
    #[test]
    fn a_checkpoint_reads_back_as_written() {
        let mut base = SeedRow::fixture(BASE, 0, 0.9, 50.0);
        (base.len_avg, base.len_last) = (f64::NAN, f64::NAN);
        let rows = vec![base, SeedRow::fixture("standard", 1, 0.8, 40.5)];
        let re = vec![
            Rechecks {
                method: BASE.into(),
                seed: 0,
                by_level: vec![2.25],
            },
            Rechecks {
                method: "standard".into(),
                seed: 1,
                by_level: vec![0.1],
            },
        ];
        let (a, b) = (
            seeds::write_csv(&rows).expect("test input"),
            rechecks_csv(&re).expect("test input"),
        );
        let ck = parse(3, &a, &b, "ck3").expect("test input");
        assert_eq!(ck.base().expect("test input").eval_tokens, 50.0);
        assert!(ck.base().expect("test input").len_avg.is_nan());
        assert_eq!(ck.base_rechecks(), Some(&[2.25][..]));
        assert_eq!(ck.runs["standard"][0].accuracy, 0.8);
        let e = parse(3, &a, "method,seed,rechecks_L1\nbase,0,x\n", "ck3").expect_err("must fail");
        assert!(format!("{e:#}").contains("ck3/rechecks.csv:2"), "{e:#}");
    }
}
