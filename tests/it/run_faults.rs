//! Issue 37's defects in a running trainer, each a test named by its item: the run lock held
//! for the whole run (item 1), weights an update made non-finite are never checkpointed and a
//! resume skips such a checkpoint (item 2), the stop message of a trainer without a run
//! directory (item 4), a non-finite advantage from a research estimator (item 9), and the
//! completions the context limit cut (item 10).

use crate::train::small_config;
use std::path::Path;
use terse_train::{checkpoints_newest_first, first_non_finite_weight};

/// Watches a run and, at every record after the SFT warm-up, plays a second process: its
/// attempt to take the run's lock must be refused, naming this (the holding) process.
struct SecondProcess {
    dir: std::path::PathBuf,
    refused: Vec<String>,
}

impl terse_train::Observer for SecondProcess {
    fn record(&mut self, line: &terse_train::MetricsLine) -> anyhow::Result<()> {
        let what = match line {
            terse_train::MetricsLine::Grpo(r) => format!("grpo step {}", r.step),
            terse_train::MetricsLine::Eval(e) => format!("eval at {}", e.step),
            _ => return Ok(()),
        };
        let e = terse_train::RunLock::acquire(&self.dir, std::time::Duration::ZERO)
            .map(|_| ())
            .expect_err("a second process took the lock mid-run");
        let e = format!("{e:#}");
        assert!(
            e.contains(&format!("in use by pid {}", std::process::id())),
            "{what}: {e}"
        );
        self.refused.push(what);
        Ok(())
    }

    fn finish(&mut self, run_dir: &Path) -> anyhow::Result<()> {
        assert!(
            run_dir.join("LOCK").exists(),
            "LOCK gone before the run ended"
        );
        // The checkpoints were written while the lock was held.
        assert!(run_dir.join("step_000002/DONE").is_file());
        self.refused.push("finish".into());
        let seen = self.refused.join(", ");
        std::fs::write(run_dir.join("refused.txt"), seen).map_err(Into::into)
    }
}

/// Issue 37 item 1: LOCK is held across the GRPO steps, the checkpoints and the final
/// evaluation (on 2b0d1bf it was dropped as `start` returned), and released at the end.
#[test]
fn item1_the_lock_is_held_for_the_whole_run() {
    let root = crate::scratch("fault-lock-held");
    let c = small_config(&root, "held", 2);
    let dir = root.join("held");
    let watcher = SecondProcess {
        dir: dir.clone(),
        refused: vec![],
    };
    terse_train::GrpoTrainer::builder(c.clone())
        .observer(Box::new(watcher))
        .run()
        .expect("run");
    let seen = std::fs::read_to_string(dir.join("refused.txt")).expect("refusals");
    assert_eq!(
        seen, "eval at 0, grpo step 0, grpo step 1, eval at 2, finish",
        "the second process was not refused at every record"
    );
    // Released at the end: the next start takes it at once.
    drop(
        terse_train::RunLock::acquire(&dir, std::time::Duration::ZERO)
            .expect("LOCK still held after the run"),
    );
}

/// A config file with an absurd learning rate, as a user would write it; read and run the way
/// `cargo xtask train --config FILE` does (`RunConfig::from_file`, then `train`).
fn absurd_lr_config(root: &Path, name: &str, peak_lr: &str) -> terse_train::RunConfig {
    let text = format!(
        "[run]\ndir = {dir:?}\nname = {name:?}\n\n[model]\npath = {model:?}\ninit = \"checkpoint\"\n\n\
         [sft]\nsteps = 0\n\n[grpo]\nsteps = 4\nprompts_per_step = 4\ngroup_size = 4\nmax_new_tokens = 48\n\
         schedule = {{ peak_lr = {peak_lr} }}\n\n[checkpoint]\nevery = 1\n\n[eval]\nper_level = 1\nsamples = 1\n",
        dir = root.display().to_string(),
        model = crate::fixture("testbed-sft").display().to_string(),
    );
    let file = root.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("config");
    terse_train::RunConfig::from_file(&file).expect("config parses")
}

/// Issue 37 item 2: an update with an absurd learning rate stops before anything is written,
/// no checkpoint holds a non-finite tensor, the message names a checkpoint whose weights are
/// finite, and `resume = "auto"` skips a checkpoint of inf weights (from an older build).
#[test]
fn item2_non_finite_weights_are_never_checkpointed() {
    let root = crate::scratch("run-faults-lr");
    let cfg = absurd_lr_config(&root, "absurd", "3e38");
    let dir = root.join("absurd");
    let e = format!("{:#}", terse_train::train(&cfg).expect_err("must stop"));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("non-finite"), "{e}");
    let ckpts = checkpoints_newest_first(&dir).expect("list");
    assert!(!ckpts.is_empty());
    for c in &ckpts {
        assert_eq!(
            first_non_finite_weight(c).expect("read"),
            None,
            "{} was written with non-finite weights",
            c.display()
        );
    }
    let named = e
        .rsplit("the last good checkpoint is ")
        .next()
        .expect("named");
    assert_eq!(Path::new(named), ckpts[0], "{e}");
    // The run goes on from there with a sane learning rate.
    let sane = absurd_lr_config(&root, "absurd", "1e-5");
    crate::train::resume_changed(&sane).expect("resume after the stop");

    // A checkpoint of inf weights, as 2b0d1bf wrote them, is skipped on resume.
    let newest = checkpoints_newest_first(&dir).expect("list")[0].clone();
    assert!(newest.ends_with("step_000004"), "{}", newest.display());
    let m = terse_model::Qwen3::load(&newest, &candle_core::Device::Cpu, candle_core::DType::F32)
        .expect("load");
    let w = &m.vars()["model.norm.weight"];
    w.set(&w.as_tensor().affine(0.0, f64::INFINITY).expect("inf"))
        .expect("set");
    m.save(&newest, &Default::default()).expect("save over");
    assert_eq!(
        first_non_finite_weight(&newest).expect("read").as_deref(),
        Some("model.norm.weight")
    );
    let mut longer = absurd_lr_config(&root, "absurd", "1e-5");
    longer.grpo.steps = 5;
    crate::train::resume_changed(&longer).expect("resume skips the inf checkpoint");
    let steps: Vec<u64> = terse_train::report::read_steps(&dir.join("metrics.jsonl"))
        .expect("steps")
        .iter()
        .map(|s| s.step)
        .collect();
    assert_eq!(steps, vec![0, 1, 2, 3, 4], "resumed from step_000003");
    assert_eq!(
        first_non_finite_weight(&dir.join("step_000004")).expect("r"),
        None
    );
}

/// Issue 37 item 4: a trainer without a run directory (library use) that stops on a
/// non-finite value says no checkpoint was written, not " holds no complete checkpoint".
#[test]
fn item4_a_stop_without_a_run_directory_names_no_empty_path() {
    let root = crate::scratch("run-faults-nodir");
    let cfg = absurd_lr_config(&root, "lib", "1e39");
    let mut t = terse_train::GrpoTrainer::builder(cfg.clone())
        .build()
        .expect("trainer");
    let e = format!("{:#}", t.step().expect_err("must stop"));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("non-finite") && e.contains("no checkpoint was written"),
        "{e}"
    );
    assert!(!e.contains(" holds no"), "{e}");
}

/// A research estimator that returns NaN for one sample.
struct NanAt(usize, usize);

impl terse_reward::AdvantageEstimator for NanAt {
    fn estimate(
        &self,
        groups: &[terse_reward::Group],
        _shaped: &terse_reward::Shaped,
    ) -> Result<terse_reward::Advantages, terse_reward::RewardError> {
        let mut values: Vec<Vec<f64>> = groups.iter().map(|g| vec![0.5; g.samples.len()]).collect();
        values[self.0][self.1] = f64::NAN;
        Ok(terse_reward::Advantages {
            values,
            zero_std_groups: 0,
        })
    }
}

/// Issue 37 item 9: an inf or NaN from a research shaper or estimator stops the step before the
/// update, naming the group and the sample; the weights are untouched.
#[test]
fn item9_non_finite_rewards_and_advantages_stop_before_the_update() {
    let root = crate::scratch("run-faults-adv");
    let cfg = crate::from_sft(&root, "adv", 1);
    let mut t = terse_train::GrpoTrainer::builder(cfg.clone())
        .estimator(Box::new(NanAt(2, 3)))
        .build()
        .expect("trainer");
    let before = t.policy().tensors()["model.norm.weight"]
        .to_vec1::<f32>()
        .expect("w");
    let e = format!("{:#}", t.step().expect_err("must stop"));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("non-finite advantage") && e.contains("group 2") && e.contains("sample 3"),
        "{e}"
    );
    let after = t.policy().tensors()["model.norm.weight"]
        .to_vec1::<f32>()
        .expect("w");
    assert_eq!(before, after, "the update ran");
    // A shaper's inf: the same stop, naming its group and sample.
    let inf = |groups: &[terse_reward::Group], _: &terse_reward::StepCtx| {
        let mut rewards: Vec<Vec<f64>> =
            groups.iter().map(|g| vec![1.0; g.samples.len()]).collect();
        rewards[1][0] = f64::INFINITY;
        terse_reward::Shaped {
            rewards,
            diagnostics: Default::default(),
        }
    };
    let mut t = terse_train::GrpoTrainer::builder(cfg)
        .shaper(Box::new(inf))
        .build()
        .expect("trainer");
    let e = format!("{:#}", t.step().expect_err("must stop"));
    assert!(
        e.contains("non-finite shaped reward inf")
            && e.contains("group 1")
            && e.contains("sample 0"),
        "{e}"
    );
}

/// Issue 37 item 10: completions the model's context limit cut (prompt + max_new_tokens past
/// max_position_embeddings) are counted in the step's metrics; a run that cuts none writes no
/// such key (the default run's metrics.jsonl is unchanged).
#[test]
fn item10_completions_cut_by_the_context_are_counted() {
    let root = crate::scratch("run-faults-context");
    let model = root.join("short-context");
    std::fs::create_dir_all(&model).expect("dir");
    for e in std::fs::read_dir(crate::fixture("testbed-sft")).expect("fixture") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, model.join(p.file_name().expect("name"))).expect("copy");
    }
    let cfg_path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).expect("read")).expect("json");
    config["max_position_embeddings"] = 40.into();
    std::fs::write(&cfg_path, config.to_string()).expect("write");
    let mut c = crate::from_sft(&root, "cut", 1);
    c.model.path = model;
    terse_train::train(&c).expect("run");
    let steps = terse_train::report::read_steps(&root.join("cut/metrics.jsonl")).expect("steps");
    assert!(steps[0].context_cut > 0, "{:?}", steps[0]);
    assert!(steps[0].len_max.is_some_and(|n| n < 40));
    // Within the limit: nothing is cut and the key is not written.
    let ok = terse_train::train(&crate::from_sft(&root, "uncut", 1)).expect("run");
    let text = std::fs::read_to_string(ok.dir.join("metrics.jsonl")).expect("metrics");
    assert!(!text.contains("context_cut"), "{text}");
}

/// Issue 42 item 4: a run that fails on a sample's value fails the same way on resume (sampling
/// is deterministic); the second failure says so and names the prompt and sample, and a
/// different failure would not.
#[test]
fn a_failure_repeated_on_resume_is_named_with_its_sample() {
    let root = crate::scratch("run-faults-repeat");
    let cfg = crate::from_sft(&root, "repeat", 2);
    let inf = |groups: &[terse_reward::Group], _: &terse_reward::StepCtx| {
        let mut rewards: Vec<Vec<f64>> =
            groups.iter().map(|g| vec![1.0; g.samples.len()]).collect();
        rewards[1][2] = f64::INFINITY;
        terse_reward::Shaped {
            rewards,
            diagnostics: Default::default(),
        }
    };
    let first = terse_train::GrpoTrainer::builder(cfg.clone())
        .shaper(Box::new(inf))
        .run()
        .expect_err("must stop");
    let first = format!("{first:#}");
    assert!(!first.contains("same way"), "{first}");
    let again = terse_train::GrpoTrainer::builder(cfg.clone())
        .shaper(Box::new(inf))
        .run()
        .expect_err("must stop again");
    let again = format!("{again:#}");
    assert!(
        again.starts_with(
            "step 0 failed the same way on resume; the input that causes it is prompt "
        ) && again.contains(", sample 2 ")
            && again.ends_with(&first),
        "{again}"
    );
}

/// Issue 42 (found by the fuzzer): a checkpoint's state.json without a data cursor and with a
/// step so large that step × prompts_per_step overflows is refused with one line naming the
/// file, not a panic.
#[test]
fn a_state_without_a_cursor_and_an_overflowing_step_is_an_error() {
    let root = crate::scratch("run-faults-cursor");
    let cfg = crate::from_sft(&root, "cursor", 1);
    terse_train::train(&cfg).expect("run");
    let state = root.join("cursor/step_000001/state.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("read")).expect("json");
    v["data_cursor"] = serde_json::Value::Null;
    v["step"] = serde_json::json!(u64::MAX / 2);
    std::fs::write(&state, v.to_string()).expect("write");
    let e = format!("{:#}", terse_train::train(&cfg).expect_err("refused"));
    assert!(
        e.contains("state.json") && e.contains("is not a step of this run"),
        "{e}"
    );
}
