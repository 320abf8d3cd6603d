//! report_v4.rs's tests: fake study directories (finished and unfinished runs) reported as
//! the main design, CARE's premise condition and a robustness cell, each report checked
//! against the CSVs it wrote; and the committed v4 reports against their committed CSVs.

use super::*;
use terse_study::recompute::check_report;

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
    // CARE's rows log its direction counts: shorter 2.5 + a wobble, longer 1.5 a step.
    let care = if name.starts_with("care") {
        let w = name.len() as f64 * 0.01 + acc;
        format!(",\"care_dir_longer\":1.5,\"care_dir_shorter\":{}", 2.5 + w)
    } else {
        String::new()
    };
    for s in 1..=steps {
        let len = tokens + s as f64;
        text.push_str(&format!(
            "{{\"phase\":\"grpo\",\"step\":{s},\"len_mean\":{len},\"early_exit\":{exit}{care}}}\n"
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
    let md_path = write(&root, &study, 3, &out, None).expect("report");
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
        std::fs::read_to_string(write(&root, &care, 3, &tmp.join("care"), None).expect("care"))
            .expect("care md");
    assert!(
        !care_md.contains("| P1 ") && care_md.contains("C16, C6 not decided"),
        "{care_md}"
    );
    // The main report sets its cuts against the papers' and names the cells not run.
    assert!(
        md.contains("| `short_rl` | ") && md.contains("| Short-RL | 33.0 % |"),
        "{md}"
    );
    assert!(md.contains("The testbed's ceiling"), "{md}");
    assert!(
        md.contains("robustness cells not run (no report under robust/): `sft1`"),
        "{md}"
    );
    assert!(out.join("trajectory.csv").is_file());
    // With no finished run (a fresh clone's --report-only), the tables beside the report are
    // read, not overwritten with nothing, and the report is rewritten from them.
    let traj = std::fs::read_to_string(out.join("trajectory.csv")).expect("trajectory");
    let empty = tmp.join("no-runs");
    let again =
        std::fs::read_to_string(write(&empty, &study, 3, &out, None).expect("again")).expect("md");
    assert_eq!(
        std::fs::read_to_string(out.join("seeds.csv")).expect("csv"),
        csv
    );
    assert_eq!(
        std::fs::read_to_string(out.join("trajectory.csv")).expect("t"),
        traj
    );
    check_report(&csv, &again, "fake v4 again", Scope::Main).expect("the report follows");
    assert!(again.contains(p1), "{again}");
    // Unfinished runs and no finished one: their notes would contradict the committed
    // tables, so the rewrite stops and names them.
    fake_run(&empty, "short_rl-s0", 0.9, 50.0, 2, 0.0);
    let err = write(&empty, &study, 3, &out, None).expect_err("unfinished only");
    assert!(
        format!("{err:#}").contains("1 unfinished run(s)"),
        "{err:#}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("seeds.csv")).expect("csv"),
        csv
    );
    std::fs::remove_dir_all(&empty).expect("temp dir");
    // And with neither runs nor tables there is nothing to report: an error, no files.
    let err = write(&empty, &study, 3, &tmp.join("nowhere"), None).expect_err("nothing");
    assert!(format!("{err:#}").contains("nothing to report"), "{err:#}");
    assert!(!tmp.join("nowhere/seeds.csv").exists());
    std::fs::remove_dir_all(&tmp).expect("temp dir");
}

/// CARE's premise report computes checks 1-3 from the runs; a robustness cell decides
/// P1-P4 with Holm within the cell, in its own folder.
#[test]
fn the_premise_checks_and_a_robustness_cell_are_computed_from_the_runs() {
    let tmp = std::env::temp_dir().join(format!("terse-report-v4c-{}", std::process::id()));
    let root = tmp.join("runs");
    for i in 0..9u64 {
        let j = (i as f64 - 4.0) * 0.002 + (i % 3) as f64 * 0.001;
        for (m, acc, tok) in [
            ("standard", 0.90, 56.0),
            ("care", 0.90, 50.0),
            ("standard_g16", 0.90, 56.0),
            ("care_g16", 0.90, 52.0),
            ("short_rl", 0.90, 50.0),
            ("grpo_lambda", 0.90, 51.0),
            ("step_grpo_paper", 0.90, 56.0),
        ] {
            fake_run(&root, &format!("{m}-s{i}"), acc + j, tok + 10.0 * j, 6, 0.0);
        }
    }
    let study = Study {
        testbed: Testbed::V4Care,
        config: Path::new("configs/repro-v4-care.toml"),
        l_max: 160,
        seeds: 9,
        quick: false,
    };
    let care =
        std::fs::read_to_string(write(&root, &study, 6, &tmp.join("care"), None).expect("care"))
            .expect("care md");
    let row = |md: &str, p: &str| {
        md.lines()
            .find(|l| l.starts_with(p))
            .unwrap_or_default()
            .to_string()
    };
    // Rollouts 57..62 around 56 tokens: ×1.09, below the goal; CARE says shorter on
    // every seed of both arms; the easy level's pass@1 moves from 0.7 to 0.9.
    assert!(
        row(&care, "| 1. Standard still overthinks").ends_with("| **fail** |"),
        "{care}"
    );
    assert!(
        row(
            &care,
            "| 2. Reflection harms: CARE says shorter more than longer (`care_g16`"
        )
        .ends_with("| **pass** |"),
        "{care}"
    );
    assert!(
        row(&care, "| 3. Easy level 1").ends_with("| **fail** |"),
        "{care}"
    );
    assert!(
        care.contains("checks 1, 3 did not pass") && !care.contains("not computed:"),
        "{care}"
    );
    assert!(
        care.find("## CARE's premise") < care.find("## Claims"),
        "checks before claims"
    );
    let cell = Study {
        testbed: Testbed::V4,
        config: Path::new("runs/repro-v4-sft1/base.toml"),
        ..study
    };
    let out = tmp.join("robust/sft1");
    let md = std::fs::read_to_string(write(&root, &cell, 6, &out, Some(Cell::Sft1)).expect("cell"))
        .expect("cell md");
    assert!(
        md.starts_with("# Testbed v4, robustness cell `sft1` (design 3 from SFT seed 1;"),
        "{md}"
    );
    assert!(
        md.contains("`cargo xtask repro --testbed v4 --cell sft1`"),
        "{md}"
    );
    assert!(
        md.contains("Holm (primary claims): ") && md.contains(" of 4 hold by t"),
        "{md}"
    );
    assert!(
        !md.contains("| X")
            && !md.contains("not decided")
            && !md.contains("robustness cells not run"),
        "{md}"
    );
    check_report(
        &std::fs::read_to_string(out.join("seeds.csv")).expect("csv"),
        &md,
        "cell",
        Scope::Robustness,
    )
    .expect("the cell's report follows from its CSV");
    // The main design's report, written beside robust/, sets the cell beside it.
    let main = std::fs::read_to_string(write(&root, &cell, 6, &tmp, None).expect("main"))
        .expect("main md");
    let side = &main[main
        .find("## Robustness cells side by side")
        .expect("the side-by-side section")..];
    assert!(
        side.contains("\n| `main` (design 3, SFT seed 0) | 56.0 |")
            && side.contains("\n| `sft1` (design 3 from SFT seed 1) | 56.0 |")
            && side.contains("- P1: computed in 2 of 2 cells"),
        "{side}"
    );
    assert!(
        !row(&main, "- section 8's robustness cells not run").contains("`sft1`"),
        "{main}"
    );
    std::fs::remove_dir_all(&tmp).expect("temp dir");
}

/// The committed v4 report, once the study has run, follows from its committed CSV.
#[test]
fn the_committed_v4_reports_follow_from_their_csv() {
    use clap::ValueEnum;
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/v4");
    let mut reports = vec![(docs.clone(), Scope::Main, Testbed::V4)];
    for t in [
        Testbed::V4Care,
        Testbed::V4CareLevels,
        Testbed::V5CareHidden,
    ] {
        reports.push((
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(t.out()),
            Scope::CarePremise,
            t,
        ));
    }
    for c in Cell::value_variants() {
        reports.push((
            docs.join("robust").join(c.spec().name),
            Scope::Robustness,
            Testbed::V4,
        ));
    }
    for (dir, scope, testbed) in reports {
        let (csv, md) = (dir.join("seeds.csv"), dir.join("results.md"));
        // Every report the plan asks for has run (the main design, both premise conditions,
        // all nine cells): one that goes missing is a lost result, not a report not run yet.
        assert!(
            csv.is_file() && md.is_file(),
            "{}: report missing",
            dir.display()
        );
        let read = |p: &Path| {
            std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        };
        let (csv, md) = (read(&csv), read(&md));
        check_report(&csv, &md, "committed v4 report", scope).unwrap_or_else(|e| panic!("{e:#}"));
        // The premise checks and the effect sizes follow from the two tables too.
        let traj = read(&dir.join("trajectory.csv"));
        let runs = seeds::read_csv(&csv, "seeds.csv").expect("seeds.csv");
        let traj = trajectory::read_csv(&traj, "trajectory.csv").expect("trajectory.csv");
        let part = match scope {
            Scope::CarePremise => premise::section(&runs, &traj, &CARE_ARMS, profile(testbed)),
            _ => effect::section(&runs, &traj),
        };
        assert!(md.contains(&part), "{}: recomputed:\n{part}", dir.display());
        let by_level = levels::section(&runs, &traj);
        assert!(
            md.contains(&by_level),
            "{}: recomputed:\n{by_level}",
            dir.display()
        );
        // The main report's side-by-side table follows from every committed cell's tables.
        if scope == Scope::Main {
            let side = robust_section(&dir, &runs, &traj).expect("the cells' tables");
            assert!(md.contains(&side), "{}: recomputed:\n{side}", dir.display());
        }
    }
}
