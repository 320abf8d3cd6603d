//! v4's confirmatory report (docs/v4/plan.md): every finished run under the study's run directory
//! becomes a row of the per-seed tables (seeds.csv, `terse_study::seeds`; trajectory.csv,
//! `terse_study::trajectory`), and results.md is written from those tables alone with
//! `terse_study::confirmatory` (raw and Holm-adjusted decisions, each claim's rule in words),
//! CARE's premise checks (`terse_study::premise`, the premise condition) or the effect sizes
//! against the papers' (`terse_study::effect`, the main design and its robustness cells), the cells
//! side by side (`terse_study::robust`, the main design's report), the means by level and over
//! training (`terse_study::levels`, every report), a per-method summary and the deviations from
//! the plan. Data flow: runs/<study>/<method>-s<i>/metrics.jsonl -> seeds.csv +
//! trajectory.csv -> results.md, which `terse_study::recompute::check_report` audits against
//! seeds.csv. Called by repro.rs for `--testbed v4` (with or without `--cell`) and `v4-care` /
//! `v4-care-levels`; summary/ writes v2's and v3's reports.

use crate::cells::Cell;
use crate::methods::Testbed;
use crate::summary::tables::cell;
use crate::summary::Study;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use terse_study::confirmatory::{self, Scope, CLAIMS};
use terse_study::seeds::{self, SeedRow};
use terse_study::trajectory::{self, TrajRow};
use terse_study::{effect, levels, premise, robust};

/// The seeds per method the plan fixes (section 6).
const PLANNED_SEEDS: u64 = 9;

/// The file names of a study's table and report: seeds.csv and results.md for the planned
/// study, with `-quick` or `-seeds<N>` for any other, so the committed pair stays the plan's.
fn names(study: &Study) -> (String, String, String) {
    let suffix = if study.quick {
        "-quick".to_string()
    } else if study.seeds != PLANNED_SEEDS {
        format!("-seeds{}", study.seeds)
    } else {
        String::new()
    };
    (
        format!("seeds{suffix}.csv"),
        format!("trajectory{suffix}.csv"),
        format!("results{suffix}.md"),
    )
}

/// The study's scope: which claim families its report decides.
fn scope(testbed: Testbed, cell: Option<Cell>) -> Scope {
    match (testbed, cell) {
        (Testbed::V4Care | Testbed::V4CareLevels | Testbed::V5CareHidden, _) => Scope::CarePremise,
        (_, Some(_)) => Scope::Robustness,
        _ => Scope::Main,
    }
}

/// CARE's rows in the premise conditions and their group sizes (plan section 7b).
const CARE_ARMS: [(&str, usize); 2] = [("care", 6), ("care_g16", 16)];

/// How a premise condition sets its overturns (what its report says a failed check 2 means).
fn profile(testbed: Testbed) -> premise::Profile {
    match testbed {
        Testbed::V4CareLevels | Testbed::V5CareHidden => premise::Profile::PerLevel,
        _ => premise::Profile::Line,
    }
}

/// Reads every finished run (its last evaluation at step `steps`) of the testbed's rows under
/// `root` into the per-seed tables, and notes each run that is there but unfinished.
type Collected = (Vec<SeedRow>, Vec<TrajRow>, Vec<String>);
fn collect(root: &Path, study: &Study, steps: u64) -> Result<Collected> {
    let (mut rows, mut traj, mut notes) = (vec![], vec![], vec![]);
    for m in study.testbed.reported() {
        for i in 0..study.seeds {
            let metrics = root.join(format!("{}-s{i}", m.name)).join("metrics.jsonl");
            if !metrics.is_file() {
                continue;
            }
            let evals = terse_train::report::read_evals(&metrics)?;
            if evals.last().is_none_or(|e| e.step != steps) {
                notes.push(format!(
                    "run {}-s{i} did not finish its {steps} steps; it is left out",
                    m.name
                ));
                continue;
            }
            rows.push(seeds::from_run(m.name, i, &metrics)?);
            traj.push(trajectory::from_run(m.name, i, &metrics)?);
        }
    }
    Ok((rows, traj, notes))
}

/// The per-seed tables already beside the report, when `root` holds no finished run (a fresh
/// clone's `--report-only`, say, after a reading was edited): the report is rewritten from
/// them rather than the tables overwritten with nothing.
fn committed(root: &Path, csv: &Path, traj: &Path) -> Result<(String, String)> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).with_context(|| {
            format!(
                "{} holds no finished run and the committed table {} cannot be read: nothing \
                 to report",
                root.display(),
                p.display()
            )
        })
    };
    let tables = (read(csv)?, read(traj)?);
    eprintln!(
        "{} holds no finished run: rewriting the report from {} and {}",
        root.display(),
        csv.display(),
        traj.display()
    );
    Ok(tables)
}

/// The four Step-GRPO variants under the names docs/v4/plan.md section 7a gives them (v2-v3's
/// labels in methods.rs stay as those reports printed them).
const STEP_GRPO_NAMES: [(&str, &str); 4] = [
    ("step_grpo_paper", "Step-GRPO (paper)"),
    ("step_grpo_kept", "Step-GRPO (DEER probe)"),
    ("step_grpo", "Step-GRPO + DEER placement"),
    ("step_grpo_no_dtr", "Step-GRPO step reward only"),
];

/// One row per method: its seeds and the mean ± sd of the numbers seeds.csv holds.
fn summary_table(md: &mut String, runs: &BTreeMap<String, Vec<SeedRow>>) -> Result<()> {
    writeln!(
        md,
        "| Method | Seeds | Accuracy | Eval tokens | Rollout length (avg) | Rollout length (last) | Exit rate |"
    )?;
    writeln!(md, "|---|---|---|---|---|---|---|")?;
    for m in crate::methods::nameable() {
        let Some(rows) = runs.get(m.name) else {
            continue;
        };
        let col = |f: fn(&SeedRow) -> f64, d| cell(&rows.iter().map(f).collect::<Vec<_>>(), d);
        let exits: Vec<f64> = rows.iter().filter_map(|r| r.exit_rate).collect();
        let exit = if exits.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.0} %",
                100.0 * exits.iter().sum::<f64>() / exits.len() as f64
            )
        };
        writeln!(
            md,
            "| {} (`{}`) | {} | {} | {} | {} | {} | {exit} |",
            STEP_GRPO_NAMES
                .iter()
                .find(|(n, _)| *n == m.name)
                .map_or(m.label, |(_, label)| label),
            m.name,
            rows.len(),
            col(|r| r.accuracy, 3),
            col(|r| r.eval_tokens, 1),
            col(|r| r.len_avg, 1),
            col(|r| r.len_last, 1),
        )?;
    }
    Ok(())
}

/// The departures from the plan the runs themselves show: the seed count, a quick study,
/// unfinished runs, and each of the study's claims that its runs cannot decide.
fn deviations(
    study: &Study,
    sc: Scope,
    runs: &BTreeMap<String, Vec<SeedRow>>,
    out: &Path,
    mut notes: Vec<String>,
) -> Vec<String> {
    if study.quick {
        notes.insert(
            0,
            "a `--quick` study (1 seed, 12 steps): not the plan's".into(),
        );
    } else if study.seeds != PLANNED_SEEDS {
        notes.insert(
            0,
            format!(
                "{} seeds per method, the plan fixes {PLANNED_SEEDS}",
                study.seeds
            ),
        );
    }
    let tables = confirmatory::tables(runs, sc);
    let mut missing: Vec<&str> = vec![];
    for c in CLAIMS {
        let decided = tables
            .lines()
            .any(|l| l.starts_with(&format!("| {} ", c.id)));
        let planned = match sc {
            Scope::Main => c.family == confirmatory::Family::Primary,
            Scope::CarePremise | Scope::Robustness => sc.has(c),
        };
        if planned && !decided {
            missing.push(c.id);
        }
    }
    if !missing.is_empty() {
        notes.push(format!(
            "confirmatory claims {} not decided: their runs are missing or their seeds differ",
            missing.join(", ")
        ));
    }
    // Section 8's cells, each its own report under robust/: the main design names those not
    // run (no report there yet).
    if sc == Scope::Main {
        use clap::ValueEnum;
        let absent: Vec<String> = Cell::value_variants()
            .iter()
            .map(|c| c.spec().name)
            .filter(|n| !out.join("robust").join(n).join("results.md").is_file())
            .map(|n| format!("`{n}`"))
            .collect();
        if !absent.is_empty() {
            notes.push(format!(
                "section 8's robustness cells not run (no report under robust/): {} (`repro --testbed v4 --cell <name>`)",
                absent.join(", ")
            ));
        }
    }
    notes
}

/// Section 8's cells side by side with the main design (`study::robust`), read from each
/// committed cell's tables under `out`/robust/; empty when no cell has run.
fn robust_section(
    out: &Path,
    runs: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
) -> Result<String> {
    use clap::ValueEnum;
    let mut read = vec![];
    for c in Cell::value_variants().iter().map(|c| c.spec()) {
        let dir = out.join("robust").join(c.name);
        let (csv, tcsv) = (dir.join("seeds.csv"), dir.join("trajectory.csv"));
        if !csv.is_file() {
            continue;
        }
        let text = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let seeds = seeds::read_csv(&text(&csv)?, &csv.display().to_string())?;
        let tr = trajectory::read_csv(&text(&tcsv)?, &tcsv.display().to_string())?;
        read.push((c, seeds, tr));
    }
    if read.is_empty() {
        return Ok(String::new());
    }
    let mut cells = vec![robust::CellTables {
        name: "main",
        what: "design 3, SFT seed 0",
        seeds: runs,
        traj,
    }];
    cells.extend(read.iter().map(|(c, seeds, traj)| robust::CellTables {
        name: c.name,
        what: c.what,
        seeds,
        traj,
    }));
    Ok(robust::section(&cells))
}

/// Writes seeds.csv and results.md (or their `-quick` / `-seeds<N>` forms) into `out` from the
/// finished runs under `root`, and returns the report's path.
pub fn write(
    root: &Path,
    study: &Study,
    steps: u64,
    out: &Path,
    cell: Option<Cell>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let sc = scope(study.testbed, cell);
    let (csv_name, traj_name, md_name) = names(study);
    let (rows, traj_rows, notes) = collect(root, study, steps)?;
    let csv_path = out.join(&csv_name);
    let traj_path = out.join(&traj_name);
    let from_runs = !rows.is_empty();
    let (csv, traj_csv) = if !from_runs {
        if !notes.is_empty() {
            bail!(
                "{} holds {} unfinished run(s) and none finished: finish or remove them before \
                 the report is rewritten from the committed tables",
                root.display(),
                notes.len()
            );
        }
        committed(root, &csv_path, &traj_path)?
    } else {
        let csv = seeds::write_csv(&rows)?;
        std::fs::write(&csv_path, &csv)
            .with_context(|| format!("writing {}", csv_path.display()))?;
        let traj_csv = trajectory::write_csv(&traj_rows)?;
        std::fs::write(&traj_path, &traj_csv)
            .with_context(|| format!("writing {}", traj_path.display()))?;
        (csv, traj_csv)
    };
    // The report reads the tables back, so every number in it is the CSVs'.
    let runs = seeds::read_csv(&csv, &csv_name)?;
    let traj = trajectory::read_csv(&traj_csv, &traj_name)?;

    let config = study.config.display();
    let label = study.testbed.label().trim();
    let (invocation, title) = match cell.map(Cell::spec) {
        Some(c) => (
            format!("--testbed {label} --cell {}", c.name),
            format!(
                "Testbed {label}, robustness cell `{}` ({}; exploratory, plan section 8)",
                c.name, c.what
            ),
        ),
        None if study.testbed == Testbed::V5CareHidden => (
            format!("--testbed {label}"),
            format!(
                "Testbed {label}: study v5's exploratory row X6 (docs/v5/plan.md sections 10-11) on v4's premise condition"
            ),
        ),
        None => (
            format!("--testbed {label}"),
            format!("Testbed {label}: the confirmatory study"),
        ),
    };
    let mut md = String::new();
    writeln!(md, "# {title}\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask repro {invocation}` from {config} and every finished run under {}, following docs/v4/plan.md (fixed before the runs). Each (method, seed) is one row of {csv_name}, Standard's included, and of {traj_name} (its start and trajectory); every number below is computed from those files alone (a test recomputes them). Seed index i is GRPO seed {} + i; runs are paired by index (the same SFT checkpoint and data order). Endpoints: accuracy is the last evaluation's pass@1, mean over levels; eval tokens its mean completion length. One α for both tests: one-sided 2.5 % (the t interval printed is the two-sided 95 % one); Holm's step-down runs over each confirmatory family; \"fails\" is a descriptive OR, only \"holds (Holm)\" is a confirmed claim.\n",
        root.display(),
        study.testbed.run_seed(0),
    )?;
    writeln!(md, "## Runs\n")?;
    summary_table(&mut md, &runs)?;
    writeln!(md)?;
    if sc == Scope::CarePremise {
        md.push_str(&premise::section(
            &runs,
            &traj,
            &CARE_ARMS,
            profile(study.testbed),
        ));
    }
    writeln!(md, "## Claims\n")?;
    md.push_str(&confirmatory::tables(&runs, sc));
    if sc != Scope::CarePremise {
        md.push_str(&effect::section(&runs, &traj));
    }
    if sc == Scope::Main && !study.quick && study.seeds == PLANNED_SEEDS {
        md.push_str(&robust_section(out, &runs, &traj)?);
    }
    md.push_str(&levels::section(&runs, &traj));
    writeln!(md, "## Deviations from docs/v4/plan.md\n")?;
    let found = deviations(study, sc, &runs, out, notes);
    for d in &found {
        writeln!(md, "- {d}")?;
    }
    // Hand-written inputs, committed beside the report (so the output stays reproducible):
    // departures the runs cannot show (a changed setting, a rerun), then the reading.
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
    let path = out.join(&md_name);
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    if from_runs {
        println!("wrote {}", csv_path.display());
    }
    Ok(path)
}

#[cfg(test)]
mod tests;
