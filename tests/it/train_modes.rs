//! The trainer's optional modes end to end: Step-GRPO's truncated rollout from a run config,
//! DAPO dynamic sampling (with resume), the NaN stop, SFT on its own, and the dataset tasks
//! (K&K generated and from a file, math from a file) with their one-line errors.

use std::path::Path;
use terse_train::task::Task;
use terse_train::RunConfig;

fn grpo_lines(run: &Path) -> Vec<terse_train::StepReport> {
    terse_train::report::read_steps(&run.join("metrics.jsonl")).expect("metrics")
}

#[test]
fn step_grpo_truncated_rollout_runs_from_the_config() {
    let root = crate::scratch("modes-step");
    let mut c = crate::from_sft(&root, "step", 2);
    c.data.levels = vec![1, 2];
    let extra: RunConfig = toml::from_str(
        r#"
        [reward.shaper]
        method = "step_grpo"
        [grpo]
        step_triggers = ["Wait"]
        [grpo.step_exit]
        induction = "</think> <answer>"
        close = "</answer> <|im_end|>"
        answer_stops = ["</answer>"]
        max_ans_tokens = 2
        delta = 0.5
        "#,
    )
    .expect("toml");
    c.reward = extra.reward;
    c.grpo.step_exit = extra.grpo.step_exit;
    c.grpo.step_triggers = extra.grpo.step_triggers;
    let s = terse_train::train(&c).expect("train");
    let lines = grpo_lines(&s.dir);
    let exits: f64 = lines.iter().map(|l| l.early_exit).sum();
    let judges: f64 = lines.iter().map(|l| l.judge_mean).sum();
    // The SFT model re-checks with "Wait" after easy chains, where a trial answer is confident.
    assert!(exits > 0.0 && judges > 0.0, "no early exits: {lines:?}");
    assert!(lines.iter().all(|l| l.entropy > 0.0));
    // A step with exits reports their accuracy, one without reports none.
    for l in &lines {
        match l.exit_accuracy {
            Some(a) => assert!(l.early_exit > 0.0 && (0.0..=1.0).contains(&a), "{l:?}"),
            None => assert_eq!(l.early_exit, 0.0, "{l:?}"),
        }
    }

    // Without the induction text the config is rejected with the key named.
    let bad = "[grpo.step_exit]\nmax_ans_tokens = 2\n";
    let e = RunConfig::from_toml(bad, Path::new("s.toml")).expect_err("no induction");
    assert!(format!("{e:#}").contains("induction"), "{e:#}");
}

#[test]
fn dynamic_sampling_drops_all_equal_groups_and_resumes_exactly() {
    let root = crate::scratch("modes-dynamic");
    let cfg = |name: &str, steps| {
        let mut c = crate::from_sft(&root, name, steps);
        // Level 1 is easy: most groups are all correct, so dynamic sampling has work to do.
        c.data.levels = vec![1, 3];
        c.grpo.dynamic_sampling = Some(terse_train::config::DynamicSampling { max_rounds: 3 });
        c
    };
    let straight = terse_train::train(&cfg("straight", 4)).expect("straight");
    terse_train::train(&cfg("resumed", 2)).expect("first half");
    let resumed = crate::train::resume_changed(&cfg("resumed", 4)).expect("second half");
    let (a, b) = (grpo_lines(&straight.dir), grpo_lines(&resumed.dir));
    let strip = |v: &[terse_train::StepReport]| -> Vec<terse_train::StepReport> {
        v.iter()
            .map(|l| terse_train::StepReport {
                time: Default::default(),
                ..l.clone()
            })
            .collect()
    };
    assert_eq!(strip(&a), strip(&b), "resume changed the data stream");
    let dropped: usize = a.iter().map(|l| l.dropped_groups).sum();
    let rounds: usize = a.iter().map(|l| l.rounds).sum();
    assert!(
        dropped > 0 && rounds > 4,
        "dropped {dropped}, rounds {rounds}"
    );
    // Kept groups are informative unless a step ran out of rounds.
    for l in &a {
        if l.rounds < 4 {
            assert_eq!(l.zero_std_groups, 0.0, "{l:?}");
        }
    }
}

#[test]
fn a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let root = crate::scratch("modes-nan");
    let c = crate::from_sft(&root, "nan", 3);
    // A research shaper that returns NaN rewards from step 1 on.
    let shaper = |groups: &[terse_reward::Group], ctx: &terse_reward::StepCtx| {
        let v = if ctx.step >= 1 { f64::NAN } else { 1.0 };
        terse_reward::Shaped {
            rewards: groups
                .iter()
                .map(|g| (0..g.samples.len()).map(|i| v * i as f64).collect())
                .collect(),
            diagnostics: Default::default(),
        }
    };
    let e = terse_train::GrpoTrainer::builder(c.clone())
        .shaper(Box::new(shaper))
        .run()
        .expect_err("must stop");
    let msg = format!("{e:#}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(
        msg.contains("step 1") && msg.contains("non-finite"),
        "{msg}"
    );
    let dir = root.join("nan");
    assert_eq!(grpo_lines(&dir).len(), 1, "the bad step must not be logged");
    let last = dir.join("step_000001");
    assert!(last.join("DONE").is_file());
    terse_model::Qwen3::load(&last, &candle_core::Device::Cpu, candle_core::DType::F32)
        .expect("last good checkpoint loads");
}

#[test]
fn sft_alone_writes_a_model_a_grpo_run_starts_from() {
    let root = crate::scratch("modes-sft");
    let mut c = crate::from_sft(&root, "warm", 1);
    c.model.path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/testbed");
    c.model.init = terse_train::config::Init::Random;
    c.sft.steps = 3;
    c.sft.batch_size = 4;
    let out = terse_train::sft_only(&c).expect("sft");
    assert_eq!(out, root.join("warm/sft"));
    let lines =
        terse_train::report::read_sft(&root.join("warm/sft_metrics.jsonl")).expect("sft metrics");
    assert_eq!(lines.len(), 3);
    let mut g = crate::from_sft(&root, "grpo", 1);
    g.model.path = out;
    terse_train::train(&g).expect("GRPO from the SFT output");
}

#[test]
fn dataset_tasks_load_score_and_fail_in_one_line() {
    let root = crate::scratch("modes-data");
    let mut d = terse_train::config::DataSection::default();
    let model = crate::fixture("testbed-sft");

    // Generated K&K with Logic-RL's prompt: the reference solution scores as correct.
    d.task = terse_train::config::TaskKind::Kk;
    d.levels = vec![3];
    d.template = "logic_rl_qwen_instruct".into();
    let t = Task::new(&d, &model, 7).expect("kk");
    let it = t.train_item(0).expect("item");
    assert!(it.prompt.ends_with("<|im_start|>assistant\n<think>") && it.level == 3);
    let good = format!(" reasoning </think><answer>{}</answer>", it.answer);
    assert!(t.score(&it, &good).correct);
    assert!(!t.score(&it, "no tags at all").format_ok);
    assert_eq!(t.eval_items(2).expect("eval")[0].1.len(), 2);

    // A math JSONL with nested answer and a level column, Short-RL's scorer.
    let f = root.join("math.jsonl");
    std::fs::write(
        &f,
        "{\"problem\": \"1+1?\", \"rm\": {\"gt\": \"2\"}, \"level\": 1}\n{\"problem\": \"2*3?\", \"rm\": {\"gt\": \"6\"}, \"level\": 2}\n",
    )
    .expect("write");
    let mut m = terse_train::config::DataSection {
        task: terse_train::config::TaskKind::Math,
        train: Some(f.clone()),
        eval: Some(f.clone()),
        level_column: Some("level".into()),
        template: "User: {prompt}\nAssistant: <think>".into(),
        ..Default::default()
    };
    m.columns.prompt = "problem".into();
    m.columns.answer = "rm.gt".into();
    let t = Task::new(&m, &model, 0).expect("math");
    let it = t.train_item(3).expect("wraps around");
    assert_eq!(it.answer, "6");
    assert!(t.score(&it, " 2*3 </think> <answer> 6 </answer>").correct);
    assert!(!t.score(&it, " 2*3 </think> <answer> 5 </answer>").correct);
    let levels: Vec<usize> = t.eval_items(0).expect("eval").iter().map(|l| l.0).collect();
    assert_eq!(levels, [1, 2]);

    // A missing dataset file: one line naming it, before any training.
    m.train = Some(root.join("nope.parquet"));
    let e = format!("{:#}", Task::new(&m, &model, 0).expect_err("missing"));
    assert!(e.contains("nope.parquet") && e.lines().count() == 1, "{e}");
    let mut c = crate::from_sft(&root, "missing", 1);
    c.data = m;
    let e = format!("{:#}", terse_train::train(&c).expect_err("missing dataset"));
    assert!(e.contains("nope.parquet") && e.lines().count() == 1, "{e}");
    // SFT needs the testbed's teacher.
    let e = RunConfig::from_toml("[data]\ntask = \"kk\"\nlevels = [3]\n", Path::new("k.toml"))
        .expect_err("sft on kk");
    assert!(format!("{e:#}").contains("sft.steps"), "{e:#}");
}

#[test]
fn mini_batches_and_epochs_give_one_update_each() {
    let root = crate::scratch("modes-minibatch");
    let mut c = crate::from_sft(&root, "mb", 1);
    c.grpo.mini_batch_prompts = Some(3); // 4 prompts -> mini-batches of 3 and 1
    c.grpo.epochs = 2;
    c.grpo.schedule.peak_lr = 1e-2;
    let s = terse_train::train(&c).expect("train");
    let l = &grpo_lines(&s.dir)[0];
    assert_eq!(l.updates, 4, "{l:?}");
    // Later updates see a changed policy, so some ratios leave the clip range at this lr.
    assert!(l.clip_frac_low + l.clip_frac_high > 0.0, "{l:?}");
    let e = RunConfig::from_toml("[grpo]\nmini_batch_prompts = 0\n", Path::new("m.toml"))
        .expect_err("zero");
    assert!(format!("{e:#}").contains("mini_batch_prompts"), "{e:#}");
}
