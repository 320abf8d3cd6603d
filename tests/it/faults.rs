//! The fault campaign's defects in runs, checkpoints and files (issue 15, items 7–17), each a
//! test named by its item: run lock, failed resumes that lose nothing, resumed metrics equal to
//! uninterrupted ones, context limits, plots of hostile numbers, non-finite settings and
//! weights, and zero-sized evaluations.

use crate::train::{deterministic_metrics, repo, small_config};
use candle_core::{DType, Device};
use std::path::Path;
use terse_model::Qwen3;
use terse_rollout::{generate, Finish, GenParams, Prompt};
use terse_train::RunConfig;

fn err(r: anyhow::Result<terse_train::RunSummary>) -> String {
    let e = format!("{:#}", r.expect_err("must fail"));
    assert_eq!(e.lines().count(), 1, "not one line: {e}");
    e
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let p = e.expect("entry").path();
        let dest = to.join(p.file_name().expect("name"));
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).expect("copy");
        }
    }
}

/// Keeps the first `n` lines of a run's metrics.jsonl (a stop right after they were written).
fn cut_metrics(run: &Path, keep: impl Fn(&serde_json::Value) -> bool) {
    let path = run.join("metrics.jsonl");
    let text: String = std::fs::read_to_string(&path)
        .expect("metrics")
        .lines()
        .take_while(|l| keep(&serde_json::from_str(l).expect("json")))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&path, text).expect("cut");
}

#[test]
fn item7_a_second_process_stops_at_once_naming_the_holder() {
    let root = crate::scratch("fault-lock");
    let mut c = small_config(&root, "busy", 1);
    // No wait: the start is refused at once (issue 42: the default waits 30 s first).
    c.run.lock_wait_s = 0.0;
    let dir = root.join("busy");
    std::fs::create_dir_all(&dir).expect("dir");
    let held = terse_train::RunLock::acquire(&dir, std::time::Duration::ZERO).expect("lock");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let e = err(terse_train::train(&c));
    assert!(
        e.contains(&format!(
            "in use by pid {} on host {host}",
            std::process::id()
        )),
        "{e}"
    );
    assert!(
        !dir.join("config.toml").exists(),
        "the refused run wrote config.toml"
    );
    drop(held);
}

#[test]
fn item9_and_10_failed_resumes_lose_nothing_and_resumes_equal_not_stopping() {
    let root = crate::scratch("fault-resume");
    let mut straight_cfg = small_config(&root, "straight", 4);
    straight_cfg.eval.every = 2;
    let straight = terse_train::train(&straight_cfg).expect("straight");
    let want = deterministic_metrics(&straight.dir);
    assert_eq!(want.iter().filter(|v| v["phase"] == "eval").count(), 3);
    let run_as = |name: &str| {
        let mut c = straight_cfg.clone();
        c.run.name = name.into();
        c
    };

    // Item 10a: a stop after step_000002 was saved and before its evaluation line.
    let a = root.join("cut-eval");
    copy_dir(&straight.dir, &a);
    std::fs::remove_dir_all(a.join("step_000004")).expect("rm");
    cut_metrics(&a, |v| !(v["phase"] == "eval" && v["step"] == 2));
    terse_train::train(&run_as("cut-eval")).expect("resume");
    assert_eq!(
        deterministic_metrics(&a),
        want,
        "eval line at the resume step"
    );

    // Item 10b: a stop after step_000000 and before step_000001: the SFT lines survive.
    let b = root.join("cut-sft");
    copy_dir(&straight.dir, &b);
    for s in ["step_000002", "step_000004"] {
        std::fs::remove_dir_all(b.join(s)).expect("rm");
    }
    cut_metrics(&b, |v| v["phase"] == "sft");
    terse_train::train(&run_as("cut-sft")).expect("resume");
    assert_eq!(
        deterministic_metrics(&b),
        want,
        "SFT lines after a stop at step 0"
    );

    // Item 9: a corrupt optimizer file is an error, and metrics.jsonl and config.toml are
    // untouched (the finished run keeps its final eval line).
    let c = root.join("corrupt");
    copy_dir(&straight.dir, &c);
    std::fs::write(c.join("step_000004/optimizer.safetensors"), b"garbage").expect("corrupt");
    let before = (
        std::fs::read(c.join("metrics.jsonl")).expect("m"),
        std::fs::read(c.join("config.toml")).expect("c"),
    );
    let mut longer = run_as("corrupt");
    longer.grpo.steps = 6;
    let e = err(crate::train::resume_changed(&longer));
    assert!(e.contains("optimizer.safetensors"), "{e}");
    assert!(
        !c.join("config_changes.jsonl").exists(),
        "a failed resume recorded its config change"
    );
    let after = (
        std::fs::read(c.join("metrics.jsonl")).expect("m"),
        std::fs::read(c.join("config.toml")).expect("c"),
    );
    assert!(before == after, "a failed resume changed the run directory");
    // A refused run (resume = never over an existing run) leaves config.toml alone too.
    let mut never = run_as("corrupt");
    never.run.resume = terse_train::config::Resume::Never;
    never.run.seed = 77;
    assert!(err(terse_train::train(&never)).contains("already has metrics.jsonl"));
    assert_eq!(std::fs::read(c.join("config.toml")).expect("c"), before.1);
}

#[test]
fn item12_prompts_longer_than_the_context_are_errors_and_generation_stops_at_it() {
    // Dataset prompts: an error naming the row, or skipped with skip_bad_rows.
    let root = crate::scratch("fault-context");
    let data = root.join("long.jsonl");
    let long = "word ".repeat(40);
    std::fs::write(
        &data,
        format!(
            "{{\"question\": \"short one\", \"answer\": \"1\"}}\n{{\"question\": \"{long}\", \"answer\": \"2\"}}\n"
        ),
    )
    .expect("data");
    let mut d = RunConfig::default().data;
    d.task = terse_train::config::TaskKind::Math;
    d.train = Some(data.clone());
    d.columns.prompt = "question".into();
    d.math_scorer = terse_train::config::MathScorer::Boxed;
    let words = |p: &str| Ok(p.split_whitespace().count());
    let mut t = terse_train::task::Task::new(&d, &repo("models/testbed"), 0).expect("task");
    let e = format!(
        "{:#}",
        t.check_context(&d, words, 16).expect_err("too long")
    );
    assert!(
        e.contains("long.jsonl row 2") && e.contains("40 tokens"),
        "{e}"
    );
    d.skip_bad_rows = true;
    let mut t = terse_train::task::Task::new(&d, &repo("models/testbed"), 0).expect("task");
    assert_eq!(t.check_context(&d, words, 16).expect("skip"), 1);
    assert_eq!(t.train_rows(), 1);

    // The sampler: a prompt without room is an error; rows stop at the model's limit.
    let mut m = Qwen3::load(&crate::fixture("testbed-sft"), &Device::Cpu, DType::F32).expect("m");
    m.config.max_position_embeddings = 12;
    let p = GenParams::new(64);
    let no_text = |_: &[u32]| String::new();
    let prompt = |n: usize| Prompt {
        id: 0,
        tokens: (0..n).map(|i| 5 + (i % 10) as u32).collect(),
    };
    let e = generate(&m, &[prompt(12)], 2, &p, 1, &no_text).expect_err("no room");
    assert!(
        e.to_string().contains("max_position_embeddings (12)"),
        "{e}"
    );
    for s in generate(&m, &[prompt(5)], 2, &p, 1, &no_text).expect("gen") {
        assert_eq!((s.tokens.len(), s.finish), (7, Finish::Length));
    }
}

#[test]
fn item13_plots_of_huge_or_missing_numbers_end_with_an_error() {
    let root = crate::scratch("fault-plot");
    let m = root.join("metrics.jsonl");
    std::fs::write(
        &m,
        "{\"phase\":\"grpo\",\"step\":0,\"reward\":1e308}\n{\"phase\":\"grpo\",\"step\":1,\"reward\":-1e308}\n",
    )
    .expect("m");
    let e = terse_train::records::plot_run(&m, &root).expect_err("huge");
    assert!(format!("{e:#}").contains("beyond the plottable"), "{e:#}");
    std::fs::write(&m, "").expect("empty");
    let e = terse_train::records::plot_run(&m, &root).expect_err("empty");
    assert!(format!("{e:#}").contains("no GRPO lines"), "{e:#}");
    std::fs::write(&m, "{\"phase\":\"sft\",\"step\":0,\"loss\":1.0}\n").expect("sft only");
    assert!(terse_train::records::plot_run(&m, &root).is_err());
}

#[test]
fn item14_every_float_key_rejects_non_finite_values() {
    for (toml, key) in [
        ("[grpo]\nclip_high = nan\n", "grpo.clip_high"),
        ("[grpo]\ndual_clip = nan\n", "grpo.dual_clip"),
        ("[grpo]\nlog_ratio_clamp = nan\n", "grpo.log_ratio_clamp"),
        ("[grpo]\ngrad_clip = inf\n", "grpo.grad_clip"),
        ("[grpo.sampling]\ntop_p = nan\n", "grpo.sampling.top_p"),
        ("[data]\nrecheck_prob = -inf\n", "data.recheck_prob"),
    ] {
        let e = RunConfig::from_toml(toml, Path::new("f.toml")).expect_err(key);
        let msg = format!("{e:#}");
        assert!(
            msg.contains(key) && msg.contains("must be a finite number"),
            "{key}: {msg}"
        );
    }
}

#[test]
fn testbed_keys_out_of_range_are_refused_naming_the_key() {
    for (toml, want) in [
        ("[data]\nhard_rate = 1.5\n", "data.hard_rate = 1.5"),
        ("[data]\nrecheck_prob = -0.1\n", "data.recheck_prob = -0.1"),
        (
            "[data]\nrecheck_hard_prob = 2.0\n",
            "data.recheck_hard_prob = 2",
        ),
        ("[data]\noverturn_easy = 1.5\n", "data.overturn_easy = 1.5"),
        (
            "[data]\noverturn_from_round = 0\n",
            "data.overturn_from_round = 0",
        ),
        (
            "[data]\noverturn_by_level = [0.0, 1.5]\n",
            "data.overturn_by_level has 1.5",
        ),
        (
            "[data]\noverturn_by_level = [0.0, 0.3]\n",
            "data.overturn_by_level has 2 values but data.levels reaches 6",
        ),
        (
            "[data]\nverified_by_level = [0.0, 1.0]\n",
            "data.verified_by_level has 2 values but data.levels reaches 6",
        ),
        ("[data]\nchain_length = 9\n", "data.chain_length = 9"),
        ("[data]\ntestbed = \"v4\"\n", "v4"),
    ] {
        let e = RunConfig::from_toml(toml, Path::new("f.toml")).expect_err(want);
        let msg = format!("{e:#}");
        assert!(msg.contains(want) && !msg.contains('\n'), "{want}: {msg}");
    }
    // A profile with one value per level reaches the teacher.
    let ok = "[data]\noverturn_by_level = [0.0, 0.0, 0.3, 0.3, 0.05, 0.05]\n";
    let cfg = RunConfig::from_toml(ok, Path::new("f.toml")).expect("a valid profile");
    assert_eq!(cfg.data.teacher().overturn(3), 0.3);
    // The hidden class's keys reach the teacher: the same prompt at levels 1 and 2.
    let ok = "[data]\ntestbed = \"v3\"\nlevels = [1, 2]\nchain_length = 4\nverified_by_level = [0.0, 1.0]\n";
    let t = RunConfig::from_toml(ok, Path::new("f.toml"))
        .expect("a hidden class")
        .data
        .teacher();
    assert_eq!(
        (t.verified(2), t.problem(1, 5).prompt()),
        (1.0, t.problem(2, 5).prompt())
    );
}

#[test]
fn item15_non_finite_weights_are_refused_and_the_stop_names_the_checkpoint() {
    let root = crate::scratch("fault-nan");
    let bad = root.join("nan-model");
    let m = Qwen3::load(&crate::fixture("testbed-sft"), &Device::Cpu, DType::F32).expect("m");
    let w = &m.vars()["model.norm.weight"];
    let mut v = w.as_tensor().to_vec1::<f32>().expect("v");
    v[3] = f32::NAN;
    w.set(&candle_core::Tensor::new(v, &Device::Cpu).expect("t"))
        .expect("set");
    assert_eq!(
        m.first_non_finite().expect("probe").as_deref(),
        Some("model.norm.weight")
    );
    m.save(&bad, &Default::default()).expect("save");
    std::fs::copy(
        crate::fixture("testbed-sft").join("tokenizer.json"),
        bad.join("tokenizer.json"),
    )
    .expect("tok");
    let mut c = small_config(&root, "nan", 1);
    c.model.path = bad.clone();
    c.model.init = terse_train::config::Init::Checkpoint;
    c.sft.steps = 0;
    let e = err(terse_train::train(&c));
    assert!(
        e.contains(&bad.display().to_string()) && e.contains("model.norm.weight"),
        "{e}"
    );
    assert!(!root.join("nan/step_000000").exists());
    // The stop message names the newest complete checkpoint, not the run directory.
    let ok = terse_train::train(&small_config(&root, "ok", 2)).expect("run");
    let msg = terse_train::last_good(Some(&ok.dir));
    assert!(msg.ends_with("step_000002"), "{msg}");
}

#[test]
fn item17_zero_sized_evaluations_are_errors() {
    for (toml, flag) in [
        ("[eval]\nper_level = 0\n", "eval.per_level"),
        ("[eval]\nsamples = 0\n", "eval.samples"),
    ] {
        let e = RunConfig::from_toml(toml, Path::new("e.toml")).expect_err(flag);
        assert!(format!("{e:#}").contains(flag), "{e:#}");
    }
}

/// Issue 37 item 10: a torn last line (a kill mid-write) is left out and the complete lines are
/// drawn; a torn line in the middle stays an error naming it.
#[test]
fn item10_a_torn_last_metrics_line_still_plots() {
    let root = crate::scratch("fault-torn");
    let m = root.join("metrics.jsonl");
    let good = "{\"phase\":\"grpo\",\"step\":0,\"reward\":0.5,\"len_mean\":10.0}\n\
                {\"phase\":\"grpo\",\"step\":1,\"reward\":0.6,\"len_mean\":9.0}\n";
    std::fs::write(&m, format!("{good}{{\"phase\":\"grpo\",\"step\":2,\"rew")).expect("m");
    let drawn = terse_train::records::plot_run(&m, &root).expect("the complete lines plot");
    assert!(drawn.iter().any(|p| p.ends_with("length.png")), "{drawn:?}");
    assert_eq!(terse_train::report::read_steps(&m).expect("steps").len(), 2);
    std::fs::write(&m, format!("{{\"phase\":\"grpo\",\"ste\n{good}")).expect("m");
    let e = format!(
        "{:#}",
        terse_train::records::plot_run(&m, &root).expect_err("middle")
    );
    assert!(e.contains("metrics.jsonl line 1"), "{e}");
}
