//! v4's confirmatory report (docs/v4/plan.md): every finished run under the study's run
//! directory becomes a row of the per-seed table (seeds.csv, `study::seeds`), and results.md is
//! written from that table alone with `study::confirmatory` (raw and Holm-adjusted decisions,
//! each claim's rule in words), a per-method summary and the deviations from the plan. Data
//! flow: runs/<study>/<method>-s<i>/metrics.jsonl -> seeds.csv -> results.md, which
//! `study::recompute::check_report` audits against the CSV. Called by repro.rs for `--testbed
//! v4` and `v4-care`; summary.rs writes v2's and v3's reports.

use crate::methods::Testbed;
use crate::summary::Study;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use terse_train::study::confirmatory::{self, Scope, CLAIMS};
use terse_train::study::seeds::{self, SeedRow};

/// The seeds per method the plan fixes (section 6).
const PLANNED_SEEDS: u64 = 9;

/// The file names of a study's table and report: seeds.csv and results.md for the planned
/// study, with `-quick` or `-seeds<N>` for any other, so the committed pair stays the plan's.
fn names(study: &Study) -> (String, String) {
    let suffix = if study.quick {
        "-quick".to_string()
    } else if study.seeds != PLANNED_SEEDS {
        format!("-seeds{}", study.seeds)
    } else {
        String::new()
    };
    (format!("seeds{suffix}.csv"), format!("results{suffix}.md"))
}

/// The study's scope: which claim families its report decides.
fn scope(testbed: Testbed) -> Scope {
    match testbed {
        Testbed::V4Care => Scope::CarePremise,
        _ => Scope::Main,
    }
}

/// Reads every finished run (its last evaluation at step `steps`) of the testbed's rows under
/// `root` into the per-seed table, and notes each run that is there but unfinished.
fn collect(root: &Path, study: &Study, steps: u64) -> Result<(Vec<SeedRow>, Vec<String>)> {
    let (mut rows, mut notes) = (vec![], vec![]);
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
        }
    }
    Ok((rows, notes))
}

/// "mean ± sd" over seeds (sd with ddof 1; the mean alone for one seed).
fn cell(xs: &[f64], digits: usize) -> String {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return format!("{m:.digits$}");
    }
    let sd = (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    format!("{m:.digits$} ± {sd:.digits$}")
}

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
            m.label,
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
    runs: &BTreeMap<String, Vec<SeedRow>>,
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
    let sc = scope(study.testbed);
    let tables = confirmatory::tables(runs, sc);
    let mut missing: Vec<&str> = vec![];
    for c in CLAIMS {
        let decided = tables
            .lines()
            .any(|l| l.starts_with(&format!("| {} ", c.id)));
        let planned = match sc {
            Scope::Main => c.family == confirmatory::Family::Primary,
            Scope::CarePremise => c.family == confirmatory::Family::CarePremise,
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
    // Parts of the plan `repro` does not compute yet (the plan's dated note of the wiring).
    notes.push(match sc {
        Scope::Main => "not run: section 8's robustness cells (SFT seeds 1 and 2, the sensitivity grid, v3's designs 1-2 as reports)".into(),
        Scope::CarePremise => "not computed: the premise checks 1-3 of section 7b (Standard's overthinking, CARE's direction counts, easy levels' pass@1 change); read them from the runs".into(),
    });
    notes
}

/// Writes seeds.csv and results.md (or their `-quick` / `-seeds<N>` forms) into `out` from the
/// finished runs under `root`, and returns the report's path.
pub fn write(root: &Path, study: &Study, steps: u64, out: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let (csv_name, md_name) = names(study);
    let (rows, notes) = collect(root, study, steps)?;
    let csv = seeds::write_csv(&rows)?;
    let csv_path = out.join(&csv_name);
    std::fs::write(&csv_path, &csv).with_context(|| format!("writing {}", csv_path.display()))?;
    // The report reads the table back, so every number in it is the CSV's.
    let runs = seeds::read_csv(&csv, &csv_name)?;

    let config = study.config.display();
    let label = study.testbed.label().trim();
    let mut md = String::new();
    writeln!(md, "# Testbed {label}: the confirmatory study\n")?;
    writeln!(
        md,
        "Generated by `cargo xtask repro --testbed {label}` from {config} and every finished run under {}, following docs/v4/plan.md (fixed before the runs). Each (method, seed) is one row of {csv_name}, Standard's included; every number below is computed from that file alone (a test recomputes them). Seed index i is GRPO seed {} + i; runs are paired by index (the same SFT checkpoint and data order). Endpoints: accuracy is the last evaluation's pass@1, mean over levels; eval tokens its mean completion length. One α for both tests: one-sided 2.5 % (the t interval printed is the two-sided 95 % one); Holm's step-down runs over each confirmatory family; \"fails\" is a descriptive OR, only \"holds (Holm)\" is a confirmed claim.\n",
        root.display(),
        study.testbed.run_seed(0),
    )?;
    writeln!(md, "## Runs\n")?;
    summary_table(&mut md, &runs)?;
    writeln!(md, "\n## Claims\n")?;
    md.push_str(&confirmatory::tables(&runs, scope(study.testbed)));
    writeln!(md, "## Deviations from docs/v4/plan.md\n")?;
    let found = deviations(study, &runs, notes);
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
    println!("wrote {}", csv_path.display());
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use terse_train::study::recompute::check_report;

    /// A finished fake run: one GRPO step line per step and evaluations at 0 and `steps`.
    fn fake_run(root: &Path, name: &str, acc: f64, tokens: f64, steps: u64, exit: f64) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let eval = |step: u64, a: f64, t: f64| {
            format!(
                "{{\"phase\":\"eval\",\"step\":{step},\"accuracy\":{a},\"len_mean\":{t},\
                 \"by_level\":[{{\"level\":1,\"pass1\":{a},\"pass_k\":1.0,\"len_mean\":{t},\
                 \"reflections_mean\":0.0}}]}}\n"
            )
        };
        let mut text = eval(0, 0.7, 40.0);
        for s in 1..=steps {
            let len = tokens + s as f64;
            text.push_str(&format!(
                "{{\"phase\":\"grpo\",\"step\":{s},\"len_mean\":{len},\"early_exit\":{exit}}}\n"
            ));
        }
        text.push_str(&eval(steps, acc, tokens));
        std::fs::write(dir.join("metrics.jsonl"), text).expect("temp dir");
    }

    #[test]
    fn the_report_follows_from_the_csv_it_writes() {
        let tmp = std::env::temp_dir().join(format!("terse-report-v4-{}", std::process::id()));
        let (root, out) = (tmp.join("runs"), tmp.join("docs"));
        for i in 0..9u64 {
            let j = (i as f64 - 4.0) * 0.002 + (i % 3) as f64 * 0.001;
            fake_run(
                &root,
                &format!("standard-s{i}"),
                0.90 + j,
                56.0 + 10.0 * j,
                3,
                0.0,
            );
            // Shorter at kept accuracy on every seed: P1 holds raw by both tests.
            fake_run(
                &root,
                &format!("short_rl-s{i}"),
                0.90 + j,
                50.0 + 5.0 * j,
                3,
                0.0,
            );
            fake_run(
                &root,
                &format!("step_grpo_paper-s{i}"),
                0.85 + j,
                50.0,
                3,
                0.04,
            );
        }
        // An unfinished run is left out and named; a G = 16 row is not the main design's.
        fake_run(&root, "care-s0", 0.9, 56.0, 2, 0.0);
        fake_run(&root, "care_g16-s0", 0.9, 56.0, 3, 0.0);
        let study = Study {
            testbed: Testbed::V4,
            config: Path::new("configs/repro-v4.toml"),
            l_max: 160,
            seeds: 9,
            quick: false,
        };
        let md_path = write(&root, &study, 3, &out).expect("report");
        assert_eq!(md_path, out.join("results.md"));
        let csv = std::fs::read_to_string(out.join("seeds.csv")).expect("csv");
        let md = std::fs::read_to_string(&md_path).expect("md");
        check_report(&csv, &md, "fake v4", Scope::Main).expect("the report follows");
        assert_eq!(csv.lines().count(), 1 + 27, "{csv}");
        assert!(
            csv.contains("\nstandard,0,") && !csv.contains("care"),
            "{csv}"
        );
        let p1 = md.lines().find(|l| l.starts_with("| P1 ")).expect("P1");
        assert!(p1.contains("| **holds** | family incomplete |"), "{p1}");
        assert!(p1.contains("AND Δ accuracy > −0.02"), "rule in words: {p1}");
        let p4 = md.lines().find(|l| l.starts_with("| P4 ")).expect("P4");
        assert!(p4.contains("| **fails** |"), "5 points less accurate: {p4}");
        assert!(
            md.contains("run care-s0 did not finish its 3 steps"),
            "{md}"
        );
        assert!(
            md.contains("confirmatory claims P2, P3, P5, P6, P7, P8, P9 not decided"),
            "{md}"
        );
        assert!(md.contains("| Step-GRPO (paper) (`step_grpo_paper`) | 9 |") && md.contains("4 %"));
        // A changed seed value in the CSV is caught against the report.
        let bad = csv.replacen("\nshort_rl,0,0.", "\nshort_rl,0,0.1", 1);
        assert!(check_report(&bad, &md, "fake v4", Scope::Main).is_err());
        // The premise condition's report reads only its rows and decides only its family.
        let care = Study {
            testbed: Testbed::V4Care,
            ..study
        };
        let care_md =
            std::fs::read_to_string(write(&root, &care, 3, &tmp.join("care")).expect("care"))
                .expect("care md");
        assert!(
            !care_md.contains("| P1 ") && care_md.contains("C16, C6 not decided"),
            "{care_md}"
        );
        std::fs::remove_dir_all(&tmp).expect("temp dir");
    }

    /// The committed v4 report, once the study has run, follows from its committed CSV.
    #[test]
    fn the_committed_v4_reports_follow_from_their_csv() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/v4");
        for (dir, scope) in [
            (docs.clone(), Scope::Main),
            (docs.join("care"), Scope::CarePremise),
        ] {
            let (csv, md) = (dir.join("seeds.csv"), dir.join("results.md"));
            if !csv.is_file() && !md.is_file() {
                continue; // not run yet: docs/v4 holds only the plan
            }
            let read = |p: &Path| {
                std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            };
            check_report(&read(&csv), &read(&md), &md.display().to_string(), scope)
                .unwrap_or_else(|e| panic!("{e:#}"));
        }
    }
}
