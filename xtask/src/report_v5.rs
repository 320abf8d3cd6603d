//! Study v5's report (docs/v5/plan.md section 12): every finished run of each checkpoint under
//! runs/repro-v5/ck<k>/ (the base evaluation `base-s0` and each `<row>-s<i>`) becomes a row of
//! that checkpoint's tables (`terse_study::checkpoints`: docs/v5/checkpoints/ck<k>/seeds.csv and
//! rechecks.csv), and results.md is written from those tables alone by
//! `terse_study::v5_tables` (premise checks, checkpoint means, the family, sensitivity,
//! variance components, exploratory rows). A study other than the plan's (a smoke run) writes
//! into <out>/smoke/. Called by repro_v5.rs; the test recomputes the report from its CSVs.

use crate::methods::{Method, Testbed};
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use terse_study::checkpoints::{self, Checkpoint, BASE};

/// The plan's checkpoints (section 3: K = 14).
pub const PLANNED_CHECKPOINTS: usize = 14;

/// One v5 study: which checkpoints, seeds and rows, and the smoke overrides.
pub struct Plan {
    pub checkpoints: Range<usize>,
    pub seeds: u64,
    pub methods: Vec<&'static Method>,
    /// GRPO and SFT steps when not the configs' (a smoke run).
    pub steps: Option<u64>,
    pub sft_steps: Option<u64>,
}

impl Plan {
    /// Whether this is the plan's study (its report is docs/v5/results.md).
    pub fn planned(&self) -> bool {
        self.checkpoints == (0..PLANNED_CHECKPOINTS) && self.plans_runs()
    }

    /// Whether its runs are the plan's (seeds, GRPO and SFT steps) over some of the plan's
    /// checkpoints: the whole study, or a part of it run in its own session, whose tables go
    /// beside the other parts' (docs/v5/checkpoints/).
    pub fn plans_runs(&self) -> bool {
        self.checkpoints.end <= PLANNED_CHECKPOINTS
            && self.seeds == Testbed::V5.default_seeds()
            && self.steps.is_none()
            && self.sft_steps.is_none()
    }
}

/// Problems per level of the plain-teacher read behind V1's 1.25x (terse_study::verbose_start).
const PLAIN_READ: usize = 2000;

/// The plain teacher's level-1 tokens (every redundant re-check removed) of the SFT config.
pub fn plain_l1(sft: &str) -> Result<f64> {
    let cfg = terse_train::RunConfig::from_toml(sft, Path::new("configs/v5.toml"))?;
    let read = terse_study::verbose_start::read(&cfg, PLAIN_READ, 0);
    Ok(read
        .first()
        .context("the SFT config has no level")?
        .tokens_plain)
}

/// Where the tables and the report of `plan` go: `out` for the plan's study, `out`/smoke else.
pub fn out_dir(plan: &Plan, out: &Path) -> PathBuf {
    if plan.plans_runs() {
        out.to_path_buf()
    } else {
        out.join("smoke")
    }
}

/// Reads checkpoint k's finished runs under `dir`/ck<k> into its two tables (written under
/// `tables`/ck<k>); returns notes on runs left out.
fn collect(dir: &Path, k: usize, plan: &Plan, tables: &Path) -> Result<Vec<String>> {
    let ck = dir.join(format!("ck{k}"));
    let (mut rows, mut re, mut notes) = (vec![], vec![], vec![]);
    let steps = plan
        .steps
        .unwrap_or(terse_train::RunConfig::default().grpo.steps);
    let names = std::iter::once((BASE.to_string(), 0u64, 0u64)).chain(
        terse_study::v5_tables::ROWS
            .iter()
            .flat_map(|m| (0..plan.seeds).map(move |i| (m.to_string(), i, u64::MAX))),
    );
    for (m, i, want) in names {
        let metrics = ck.join(format!("{m}-s{i}")).join("metrics.jsonl");
        if !metrics.is_file() {
            continue;
        }
        let evals = terse_train::report::read_evals(&metrics)?;
        let last = evals.last().map(|e| e.step);
        // A GRPO run is finished at the config's step count (its metrics' own last step
        // line says how many it trained).
        let target = if want == u64::MAX {
            grpo_steps(&ck, &m, i).unwrap_or(steps)
        } else {
            want
        };
        if last != Some(target) {
            notes.push(format!("run ck{k}/{m}-s{i} did not finish; it is left out"));
            continue;
        }
        let (r, c) = checkpoints::from_run(&m, i, &metrics)?;
        rows.push(r);
        re.push(c);
    }
    if rows.is_empty() {
        bail!("{} holds no finished run of checkpoint {k}", ck.display());
    }
    checkpoints::write(&tables.join(format!("ck{k}")), &rows, &re)?;
    Ok(notes)
}

/// A run's planned GRPO steps, from the config the study wrote for it.
fn grpo_steps(ck: &Path, m: &str, i: u64) -> Option<u64> {
    let p = ck.join("configs").join(format!("{m}-s{i}.toml"));
    terse_train::RunConfig::from_file(&p)
        .ok()
        .map(|c| c.grpo.steps)
}

/// The report's text from the checkpoints' tables (what the test recomputes), its header
/// naming the study.
pub fn report(cks: &[Checkpoint], plan: &Plan, plain: f64, notes: &[String]) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "# Testbed v5: the confirmatory study (docs/v5/plan.md)\n"
    )?;
    writeln!(md, "Generated by `cargo xtask repro --testbed v5` from the tables under checkpoints/ (one folder per fresh SFT checkpoint k, SFT seed 500 + k: seeds.csv, its base evaluation the row `base`, and rechecks.csv); every number below is computed from those files alone (a test recomputes them). GRPO seed index i is seed 200 + i, paired across rows within a checkpoint.\n")?;
    md.push_str(&terse_study::v5_tables::render(cks, plain));
    writeln!(md, "## Deviations from docs/v5/plan.md\n")?;
    let mut devs = notes.to_vec();
    if !plan.planned() {
        devs.insert(
            0,
            format!(
                "not the plan's study: checkpoints {:?}, {} seed(s), GRPO steps {}, SFT steps {}",
                plan.checkpoints,
                plan.seeds,
                plan.steps.map_or("as planned".into(), |s| s.to_string()),
                plan.sft_steps
                    .map_or("as planned".into(), |s| s.to_string()),
            ),
        );
    }
    if devs.is_empty() {
        devs.push("none the runs show".into());
    }
    for d in devs {
        writeln!(md, "- {d}")?;
    }
    Ok(md)
}

/// Writes the study's tables and results.md from the finished runs under `dir`; returns the
/// report's path. Hand-written deviations.md and results-reading.md beside it are appended.
pub fn write(dir: &Path, plan: &Plan, sft: &str, out: &Path) -> Result<Written> {
    let out = out_dir(plan, out);
    let tables = out.join("checkpoints");
    let mut notes = vec![];
    for k in plan.checkpoints.clone() {
        notes.extend(collect(dir, k, plan, &tables)?);
    }
    // A part of the plan's study: the analysis runs once, when every checkpoint's table is in
    // (this part's and the committed earlier parts'), so no part's results are read early.
    let whole;
    let plan = if plan.plans_runs() && !plan.planned() {
        let missing = missing(&tables)?;
        if !missing.is_empty() {
            return Ok(Written::Waiting(missing));
        }
        whole = Plan {
            checkpoints: 0..PLANNED_CHECKPOINTS,
            methods: plan.methods.clone(),
            ..*plan
        };
        &whole
    } else {
        plan
    };
    let cks: Vec<Checkpoint> = checkpoints::read(&tables)?
        .into_iter()
        .filter(|c| plan.checkpoints.contains(&c.index))
        .collect();
    let mut md = report(&cks, plan, plain_l1(sft)?, &notes)?;
    for input in ["deviations.md", "results-reading.md"] {
        let path = out.join(input);
        if path.is_file() {
            md.push('\n');
            md.push_str(
                &std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?,
            );
        }
    }
    let path = out.join("results.md");
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    Ok(Written::Report(path))
}

/// What `write` wrote: the report, or (a part of the plan's study) only its checkpoints'
/// tables, with the planned checkpoints that still have none.
#[derive(Debug, PartialEq)]
pub enum Written {
    Report(PathBuf),
    Waiting(Vec<usize>),
}

/// The plan's checkpoints with no table under `tables` (no ck<k>/seeds.csv).
pub fn missing(tables: &Path) -> Result<Vec<usize>> {
    Ok((0..PLANNED_CHECKPOINTS)
        .filter(|k| !tables.join(format!("ck{k}")).join("seeds.csv").is_file())
        .collect())
}
