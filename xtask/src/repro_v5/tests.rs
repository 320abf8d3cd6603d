//! repro_v5.rs's tests: the smoke configuration end to end on tiny settings (two fresh SFT
//! checkpoints, one seed of the six rows, one GRPO step, trained in process), its report
//! recomputed from the CSVs it wrote; and `--checkpoints` parsing.

use super::*;

/// Checkpoint k's configs: its SFT config trains the model its base config starts from, on
/// the same teacher, at SFT seed 500 + k.
#[test]
fn each_checkpoint_starts_from_the_model_its_sft_config_writes() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let (base, sft) = (read(Testbed::V5.config()), read("configs/v5.toml"));
    let dir = Path::new("runs/repro-v5");
    for k in [0, 13] {
        let b = ck_base(&base, dir, k, None).expect("ck base");
        let b = terse_train::RunConfig::from_toml(&b, Path::new("base")).expect("base");
        let s = sft_config(&sft, dir, k, None).expect("ck sft");
        let s = terse_train::RunConfig::from_toml(&s, Path::new("sft")).expect("sft");
        assert_eq!(b.model.path, s.run.dir.join(&s.run.name).join("sft"));
        assert_eq!(b.data.teacher(), s.data.teacher());
        assert_eq!(b.data.levels, s.data.levels);
        assert_eq!(s.run.seed, 500 + k as u64);
        assert_eq!(
            (s.sft.steps, b.grpo.steps, b.eval.per_level, b.eval.samples),
            (800, 60, 128, 8)
        );
    }
}

#[test]
fn checkpoints_parse_as_a_count_or_a_range() {
    assert_eq!(parse_range("2").expect("test input"), 0..2);
    assert_eq!(parse_range("0-3").expect("test input"), 0..4);
    assert!(parse_range("0").is_err());
    let e = parse_range("a-3").expect_err("must fail");
    assert!(format!("{e:#}").contains("--checkpoints `a-3`"), "{e:#}");
}

/// A part of the plan's study (its checkpoints a-b, the plan's seeds and steps) writes its
/// tables beside the other parts', and the analysis waits until every checkpoint has one.
#[test]
fn a_part_of_the_plan_writes_where_the_plan_does_and_waits_for_the_rest() {
    let part = |checkpoints| Plan {
        checkpoints,
        seeds: Testbed::V5.default_seeds(),
        methods: crate::methods::select(&[], Testbed::V5).expect("test input"),
        steps: None,
        sft_steps: None,
    };
    let out = Path::new("docs/v5");
    assert!(part(0..PLANNED_CHECKPOINTS).planned());
    let p = part(3..6);
    assert!(p.plans_runs() && !p.planned());
    assert_eq!(crate::report_v5::out_dir(&p, out), out);
    assert!(!part(0..PLANNED_CHECKPOINTS + 1).plans_runs());
    let smoke = Plan {
        steps: Some(1),
        ..part(0..2)
    };
    assert_eq!(crate::report_v5::out_dir(&smoke, out), out.join("smoke"));

    let tables = std::env::temp_dir().join(format!("terse-v5-parts-{}", std::process::id()));
    for k in 0..PLANNED_CHECKPOINTS - 1 {
        let ck = tables.join(format!("ck{k}"));
        std::fs::create_dir_all(&ck).expect("test dir");
        if k != 4 {
            std::fs::write(ck.join("seeds.csv"), "row\n").expect("test file");
        }
    }
    let missing = crate::report_v5::missing(&tables).expect("test input");
    assert_eq!(missing, vec![4, PLANNED_CHECKPOINTS - 1]);
    std::fs::remove_dir_all(&tables).expect("test dir");
}

/// Runs the smoke plan's jobs in this process (the child processes' work, without the binary).
fn run_in_process(sfts: &Jobs, runs: &Jobs) {
    for (name, cfg) in sfts {
        let c = terse_train::RunConfig::from_file(cfg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        terse_train::sft_only(&c).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
    for (name, cfg) in runs {
        let c = terse_train::RunConfig::from_file(cfg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        terse_train::train(&c).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

#[test]
fn the_smoke_study_runs_end_to_end_and_its_report_follows_from_its_csvs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = std::env::temp_dir().join(format!("terse-repro-v5-{}", std::process::id()));
    let (dir, out) = (tmp.join("runs"), tmp.join("docs"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let model = root.join("models/testbed").display().to_string();
    // Tiny settings: 2 problems a step in groups of 2, 2 problems x 1 sample a level.
    let tiny = "[grpo]\nprompts_per_step = 2\ngroup_size = 2\n[eval]\nper_level = 2\nsamples = 1\n";
    let mut base: toml::Table = toml::from_str(&read("configs/repro-v5.toml")).expect("test input");
    merge(&mut base, toml::from_str(tiny).expect("test input"));
    let mut sft: toml::Table = toml::from_str(&read("configs/v5.toml")).expect("test input");
    merge(
        &mut sft,
        toml::from_str(&format!(
            "[model]\npath = \"{model}\"\n[sft]\nbatch_size = 4\n"
        ))
        .expect("test input"),
    );
    let (base, sft) = (
        toml::to_string(&base).expect("test input"),
        toml::to_string(&sft).expect("test input"),
    );
    let plan = Plan {
        checkpoints: 0..2,
        seeds: 1,
        methods: crate::methods::select(&[], Testbed::V5).expect("test input"),
        steps: Some(1),
        sft_steps: Some(2),
    };
    assert!(!plan.planned());
    let (sfts, runs) = jobs(&base, &sft, &dir, &plan, false).expect("test input");
    assert_eq!((sfts.len(), runs.len()), (2, 2 * (1 + 6)), "{runs:?}");
    // The SFT seeds are the plan's 500 + k; the base run trains nothing and evaluates once.
    let s1 = terse_train::RunConfig::from_file(&sfts[1].1).expect("test input");
    assert_eq!((s1.run.seed, s1.sft.steps), (501, 2));
    let b = terse_train::RunConfig::from_file(&runs[0].1).expect("test input");
    assert_eq!((b.grpo.steps, b.eval.at_start), (0, false));
    assert_eq!(b.model.path, dir.join("ck0/sft"));
    run_in_process(&sfts, &runs);

    let md_path = match crate::report_v5::write(&dir, &plan, &sft, &out).expect("test input") {
        Written::Report(p) => p,
        w => panic!("a smoke study writes its report: {w:?}"),
    };
    assert_eq!(md_path, out.join("smoke/results.md"));
    let md = std::fs::read_to_string(&md_path).expect("test input");
    // Recomputed from the CSVs alone: the same text.
    let tables = out.join("smoke/checkpoints");
    let cks = terse_study::checkpoints::read(&tables).expect("test input");
    assert_eq!(cks.len(), 2);
    assert!(
        cks.iter().all(|c| c.base().is_some() && c.runs.len() == 7),
        "{cks:?}"
    );
    let plain = crate::report_v5::plain_l1(&sft).expect("test input");
    assert_eq!(
        md,
        crate::report_v5::report(&cks, &plan, plain, &[]).expect("test input")
    );
    for id in [
        "| P1 | Short-RL",
        "| P5 | DLER",
        "| V1 level-1 re-checks",
        "| X2 |",
        "## X3",
    ] {
        assert!(md.contains(id), "{id} missing:\n{md}");
    }
    // ... and it follows them: one changed number in a CSV changes the report.
    let csv = tables.join("ck0/seeds.csv");
    let text = std::fs::read_to_string(&csv).expect("test input");
    let std_line = text
        .lines()
        .find(|l| l.starts_with("standard,"))
        .expect("test input")
        .to_string();
    let mut f: Vec<String> = std_line.split(',').map(String::from).collect();
    f[3] = "999".into(); // eval_tokens
    std::fs::write(&csv, text.replace(&std_line, &f.join(","))).expect("test input");
    let changed = terse_study::checkpoints::read(&tables).expect("test input");
    assert_ne!(
        md,
        crate::report_v5::report(&changed, &plan, plain, &[]).expect("test input")
    );
    std::fs::remove_dir_all(&tmp).expect("test input");
}

/// The committed v5 report follows from the committed checkpoint tables: its generated part is
/// what `report` computes from them, and the hand-written deviations and reading follow it as
/// committed.
#[test]
fn the_committed_v5_report_follows_from_its_checkpoint_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let cks = terse_study::checkpoints::read(&root.join("docs/v5/checkpoints")).expect("tables");
    assert_eq!(cks.len(), crate::report_v5::PLANNED_CHECKPOINTS);
    let plan = Plan {
        checkpoints: 0..crate::report_v5::PLANNED_CHECKPOINTS,
        seeds: Testbed::V5.default_seeds(),
        methods: crate::methods::select(&[], Testbed::V5).expect("test input"),
        steps: None,
        sft_steps: None,
    };
    assert!(plan.planned());
    let plain = crate::report_v5::plain_l1(&read("configs/v5.toml")).expect("plain read");
    let mut want = crate::report_v5::report(&cks, &plan, plain, &[]).expect("report");
    for input in ["docs/v5/deviations.md", "docs/v5/results-reading.md"] {
        want.push('\n');
        want.push_str(&read(input));
    }
    assert!(
        read("docs/v5/results.md") == want,
        "docs/v5/results.md does not follow from docs/v5/checkpoints/ and its hand-written parts: regenerate it (`cargo xtask repro --testbed v5 --report-only`)"
    );
}
