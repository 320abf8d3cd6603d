//! The trainer: micro-batch invariance of loss and gradients, resume equals not stopping,
//! a short end-to-end GRPO run that raises the reward, and one-line errors for bad input.

use candle_core::{DType, Device};
use std::path::{Path, PathBuf};
use terse_model::{Config, Qwen3};
use terse_train::config::LossAgg;
use terse_train::step::{agg_weights, PpoParams};
use terse_train::step::{gradients, micro_batches, MicroBatching, Objective, Seq};
use terse_train::RunConfig;

pub(crate) fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn testbed_model(seed: u64) -> Qwen3 {
    let cfg = Config::from_file(&repo("models/testbed/config.json")).expect("config");
    Qwen3::random(cfg, seed, &Device::Cpu, DType::F32).expect("model")
}

#[test]
fn loss_and_gradients_do_not_depend_on_micro_batching() {
    let model = testbed_model(1);
    // Six sequences of different lengths with a masked (injected) token in one of them.
    let mut seqs: Vec<Seq> = (0..6usize)
        .map(|i| {
            let prompt: Vec<u32> = (0..4 + i % 3).map(|j| (11 + (i + j) % 10) as u32).collect();
            let completion: Vec<u32> = (0..3 + i)
                .map(|j| (11 + (i * 7 + j * 3) % 14) as u32)
                .collect();
            let n = completion.len();
            let mut tokens = prompt.clone();
            tokens.extend(&completion);
            Seq {
                tokens,
                prompt_len: prompt.len(),
                loss_mask: (0..n).map(|j| !(i == 2 && j == 1)).collect(),
                old_logp: (0..n).map(|j| -3.0 + 0.1 * j as f32).collect(),
                ref_logp: None,
                is_weight: None,
                advantage: i as f32 - 2.5,
                weight: 0.0,
            }
        })
        .collect();
    let lens: Vec<usize> = seqs.iter().map(Seq::loss_tokens).collect();
    let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    // The default GRPO settings: clip 0.2 / 0.28, dual clip 3, no KL.
    let ppo = PpoParams::from(&terse_train::config::GrpoSection::default());
    for agg in [
        LossAgg::TokenMean,
        LossAgg::SeqMeanTokenMean,
        LossAgg::SeqMeanTokenSum,
        LossAgg::SeqMeanTokenSumNorm,
    ] {
        for (s, w) in seqs.iter_mut().zip(agg_weights(agg, &lens, 16)) {
            s.weight = w as f32;
        }
        let how = |tokens: usize, packed: bool| MicroBatching { tokens, packed };
        let run = |budget: usize, packed: bool| {
            gradients(&model, &seqs, Objective::Policy(&ppo), how(budget, packed)).expect("grads")
        };
        // One padded micro-batch is the reference; packed rows (one micro-batch or several)
        // give the same loss and gradients.
        let (g1, s1) = run(usize::MAX, false);
        for (parts, packed) in [(1, true), (2, false), (4, false), (2, true), (4, true)] {
            let budget = total.div_ceil(parts) + 1;
            assert!(
                micro_batches(&seqs, how(budget, packed)).len() >= parts.min(seqs.len()) - 1,
                "{agg:?}: not split"
            );
            let (g, s) = run(budget, packed);
            assert!(
                (s.loss - s1.loss).abs() < 1e-6,
                "{agg:?} {parts}: loss {} vs {}",
                s.loss,
                s1.loss
            );
            // Relative in norm, ||a - b|| / ||a||: a different split reorders float sums
            // (gradient accumulation, the embedding rows' gradient).
            for (k, a) in &g1 {
                let d = terse_model::testing::relative_diff(a, &g[k]).expect("diff");
                // Packed rows also change the flash tiles' partition of each row's keys: their
                // softmax sums round differently (measured at most 1.2e-6 here).
                let tol = if packed { 3e-6 } else { 1e-6 };
                assert!(
                    d < tol,
                    "{agg:?} {parts} micro-batches (packed {packed}): gradient of {k} differs by {d} (relative)"
                );
            }
        }
    }
}

/// A policy loss of research code's own plugs into the gradients: PPO wrapped in a closure gives
/// PPO's gradients exactly, and a plain REINFORCE closure (−A · log π, weighted) trains too.
#[test]
fn a_custom_policy_loss_plugs_into_the_gradients() {
    use terse_train::step::{LossInputs, LossStats, PolicyLoss};
    let model = testbed_model(2);
    let seqs: Vec<Seq> = (0..3usize)
        .map(|i| {
            let tokens: Vec<u32> = (0..6 + i).map(|j| (11 + (i + 2 * j) % 12) as u32).collect();
            Seq {
                prompt_len: 3,
                loss_mask: vec![true; tokens.len() - 3],
                old_logp: vec![-2.5; tokens.len() - 3],
                ref_logp: None,
                is_weight: None,
                advantage: i as f32 - 1.0,
                weight: 0.1,
                tokens,
            }
        })
        .collect();
    let ppo = PpoParams::from(&terse_train::config::GrpoSection::default());
    let how = MicroBatching {
        tokens: 64,
        packed: true,
    };
    // The built-in PPO against the same loss as research code's closure would be.
    let as_closure = |x: &LossInputs| ppo.loss(x);
    let (g_ppo, s_ppo) = gradients(&model, &seqs, Objective::Policy(&ppo), how).expect("ppo");
    let (g_dyn, s_dyn) =
        gradients(&model, &seqs, Objective::Policy(&as_closure), how).expect("dyn");
    assert_eq!(s_ppo.loss, s_dyn.loss);
    for (k, a) in &g_ppo {
        assert_eq!(crate::max_abs_diff(a, &g_dyn[k]), 0.0, "{k}");
    }
    let reinforce = |x: &LossInputs| -> candle_core::Result<(candle_core::Tensor, LossStats)> {
        let loss = ((x.advantage.neg()? * x.logp)? * x.weight)?.sum_all()?;
        let stats = LossStats {
            loss: f64::from(loss.to_scalar::<f32>()?),
            tokens: x.logp.dim(0)?,
            ..Default::default()
        };
        Ok((loss, stats))
    };
    let (g, s) = gradients(&model, &seqs, Objective::Policy(&reinforce), how).expect("reinforce");
    assert!(s.loss.is_finite() && s.tokens == 3 + 4 + 5, "{s:?}");
    let differs = g
        .iter()
        .any(|(k, a)| crate::max_abs_diff(a, &g_ppo[k]) > 0.0);
    assert!(differs, "REINFORCE gave PPO's gradients");
}

pub(crate) fn small_config(dir: &Path, name: &str, steps: u64) -> RunConfig {
    let mut c = RunConfig::default();
    c.run.dir = dir.to_path_buf();
    c.run.name = name.into();
    c.model.path = repo("models/testbed");
    c.data.levels = vec![1, 2];
    c.sft.steps = 4;
    c.sft.batch_size = 4;
    c.sft.schedule = terse_optim::Schedule {
        peak_lr: 1e-3,
        ..Default::default()
    };
    c.grpo.steps = steps;
    c.grpo.prompts_per_step = 2;
    c.grpo.group_size = 4;
    c.grpo.max_new_tokens = 20;
    c.grpo.kl_coef = 0.01;
    c.checkpoint.every = 2;
    c.eval.per_level = 2;
    c.eval.samples = 2;
    c.reward = toml::from_str("[shaper]\nmethod = \"short_rl\"\ntau_len = 2\n").expect("reward");
    c
}

/// Resumes the run of `cfg`, whose config differs from the run's (a longer run, another
/// learning rate), recording the change in config_changes.jsonl (`--allow-config-change`).
pub(crate) fn resume_changed(cfg: &RunConfig) -> anyhow::Result<terse_train::RunSummary> {
    terse_train::GrpoTrainer::builder(cfg.clone())
        .allow_config_change(true)
        .run()
        .map(|s| s.expect("one process has a summary"))
}

/// metrics.jsonl without the wall-clock "time" objects.
pub(crate) fn deterministic_metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .expect("metrics")
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).expect("json");
            if let Some(o) = v.as_object_mut() {
                o.remove("time");
            }
            v
        })
        .collect()
}

#[test]
fn resuming_equals_not_stopping_and_partial_checkpoints_are_ignored() {
    let root = crate::scratch("train-resume");
    let straight = terse_train::train(&small_config(&root, "straight", 4)).expect("straight");
    terse_train::train(&small_config(&root, "resumed", 2)).expect("first half");
    // A crash during the next checkpoint write leaves a .tmp directory and no DONE: ignored.
    std::fs::create_dir_all(root.join("resumed/step_000004.tmp")).expect("tmp");
    std::fs::write(
        root.join("resumed/step_000004.tmp/model.safetensors"),
        b"partial",
    )
    .expect("partial");
    let resumed = resume_changed(&small_config(&root, "resumed", 4)).expect("second half");
    let (a, b) = (
        deterministic_metrics(&straight.dir),
        deterministic_metrics(&resumed.dir),
    );
    assert_eq!(a.iter().filter(|v| v["phase"] == "grpo").count(), 4);
    assert_eq!(a, b, "metrics differ between straight and resumed runs");
    // Keep-last-2 plus the step-0 start.
    let mut dirs: Vec<String> = std::fs::read_dir(&straight.dir)
        .expect("dir")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step_"))
        .collect();
    dirs.sort();
    assert_eq!(dirs, ["step_000000", "step_000002", "step_000004"]);
    assert!(straight.dir.join("config.toml").is_file());
}

fn one_line_err(r: anyhow::Result<terse_train::RunSummary>) -> String {
    let e = format!("{:#}", r.expect_err("must fail"));
    assert_eq!(e.lines().count(), 1, "not one line: {e}");
    e
}

#[test]
fn bad_input_gives_one_line_errors() {
    let root = crate::scratch("train-bad");
    let e = RunConfig::from_toml("[grpo]\nstepz = 3\n", Path::new("bad.toml"))
        .map(|_| ())
        .expect_err("unknown key");
    let msg = format!("{e:#}");
    assert!(msg.contains("bad.toml") && msg.contains("stepz"), "{msg}");
    let e = RunConfig::from_toml("[data]\ntask = \"gsm8k\"\n", Path::new("c.toml"))
        .map(|_| ())
        .expect_err("task");
    assert!(format!("{e:#}").contains("gsm8k"));
    let e = RunConfig::from_toml("[grpo]\nkv_cache = \"f8\"\n", Path::new("kv.toml"))
        .map(|_| ())
        .expect_err("kv_cache");
    let msg = format!("{e:#}");
    assert!(msg.contains("kv.toml") && msg.contains("f8"), "{msg}");
    // The paged cache's settings: a bad block size or budget names the file, key and value.
    for (toml, want) in [
        (
            "[grpo.paging]\nblock_size = 24\n",
            "grpo.paging.block_size = 24",
        ),
        ("[grpo.paging]\nkv_budget = \"lots\"\n", "kv_budget `lots`"),
        (
            "[grpo.paging]\nmax_num_seqs = 0\n",
            "paging.max_num_seqs = 0",
        ),
    ] {
        let e = RunConfig::from_toml(toml, Path::new("kv.toml"))
            .map(|_| ())
            .expect_err(toml);
        let msg = format!("{e:#}");
        assert!(msg.contains("kv.toml") && msg.contains(want), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
    }
    let c = RunConfig::from_toml(
        "[grpo.paging]\nkv_budget = 2.5\nblock_size = 32\n",
        Path::new("kv.toml"),
    )
    .expect("paging");
    assert_eq!(c.grpo.paging.kv_budget, terse_rollout::KvBudget::Gib(2.5));
    let c = RunConfig::from_toml("[grpo]\nkv_cache = \"f16\"\n", Path::new("kv.toml"));
    assert_eq!(
        c.expect("f16").grpo.kv_cache,
        terse_rollout::KvCacheDtype::F16
    );

    let mut c = small_config(&root, "notok", 1);
    let empty = root.join("model-without-tokenizer");
    std::fs::create_dir_all(&empty).expect("dir");
    std::fs::copy(
        repo("models/testbed/config.json"),
        empty.join("config.json"),
    )
    .expect("copy");
    c.model.path = empty;
    assert!(one_line_err(terse_train::train(&c)).contains("has no tokenizer.json"));

    let mut c = small_config(&root, "cuda", 1);
    c.run.device = "cuda".into();
    let e = one_line_err(terse_train::train(&c));
    assert!(e.contains("cuda"), "{e}");

    // A run directory that cannot be created (its parent is a file).
    let file = root.join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let c = small_config(&file, "run", 1);
    assert!(one_line_err(terse_train::train(&c)).contains("cannot create run directory"));
}

#[test]
fn twenty_grpo_steps_from_the_sft_checkpoint_raise_the_reward_deterministically() {
    let root = crate::scratch("train-e2e");
    let mut c = RunConfig::default();
    c.run.dir = root.clone();
    c.run.name = "e2e".into();
    c.run.resume = terse_train::config::Resume::Never;
    c.model.path = crate::fixture("testbed-sft");
    c.model.init = terse_train::config::Init::Checkpoint;
    c.data.levels = vec![3, 4, 5, 6];
    c.sft.steps = 0;
    c.grpo.steps = 20;
    c.grpo.prompts_per_step = 4;
    c.grpo.group_size = 8;
    c.grpo.max_new_tokens = 96;
    c.grpo.schedule = terse_optim::Schedule {
        peak_lr: 2e-4,
        ..Default::default()
    };
    c.checkpoint.every = 0;
    c.eval.per_level = 4;
    c.eval.samples = 2;
    c.reward = toml::from_str("[shaper]\nmethod = \"none\"\n").expect("reward");
    let s = terse_train::train(&c).expect("train");
    let grpo: Vec<f64> = deterministic_metrics(&s.dir)
        .iter()
        .filter(|v| v["phase"] == "grpo")
        .map(|v| v["reward"].as_f64().expect("reward"))
        .collect();
    assert_eq!(grpo.len(), 20);
    let (first, last) = (
        grpo[..5].iter().sum::<f64>() / 5.0,
        grpo[15..].iter().sum::<f64>() / 5.0,
    );
    println!("mean reward: first 5 steps {first:.3}, last 5 steps {last:.3}");
    assert!(
        last > first,
        "GRPO did not raise the reward: {first:.3} -> {last:.3} ({grpo:?})"
    );
    for png in ["length.png", "accuracy.png", "reward.png"] {
        assert!(s.dir.join(png).is_file(), "{png} missing");
    }
    // Deterministic: the same run again gives the same metrics.
    let mut again = c.clone();
    again.run.name = "e2e-again".into();
    let s2 = terse_train::train(&again).expect("train again");
    assert_eq!(
        deterministic_metrics(&s.dir),
        deterministic_metrics(&s2.dir)
    );
}

/// Records every line it is handed, and whether the run told it that it finished.
struct Recorder(std::sync::Arc<std::sync::Mutex<(Vec<terse_train::MetricsLine>, bool)>>);

impl terse_train::Observer for Recorder {
    fn record(&mut self, line: &terse_train::MetricsLine) -> anyhow::Result<()> {
        self.0.lock().expect("lock").0.push(line.clone());
        Ok(())
    }
    fn finish(&mut self, _run_dir: &Path) -> anyhow::Result<()> {
        self.0.lock().expect("lock").1 = true;
        Ok(())
    }
}

#[test]
fn observers_see_every_record_sft_included_and_tensorboard_gets_them_all() {
    let root = crate::scratch("train-observed");
    let mut c = small_config(&root, "observed", 2);
    c.log.tensorboard = true;
    let seen = std::sync::Arc::new(std::sync::Mutex::new((vec![], false)));
    let s = terse_train::GrpoTrainer::builder(c.clone())
        .observer(Box::new(Recorder(seen.clone())))
        .run()
        .expect("train")
        .expect("one process has the summary");
    let (mut lines, finished) = seen.lock().expect("lock").clone();
    assert!(finished, "finish was not called");
    // The observer saw exactly what metrics.jsonl holds, in order, the SFT warm-up included
    // (the file leaves out the evaluations' example completions).
    for l in &mut lines {
        if let terse_train::MetricsLine::Eval(e) = l {
            e.report
                .by_level
                .iter_mut()
                .for_each(|v| v.examples.clear());
        }
    }
    let file = terse_train::report::read_metrics(&s.dir.join("metrics.jsonl")).expect("read");
    assert_eq!(lines, file);
    let sft = lines
        .iter()
        .filter(|l| matches!(l, terse_train::MetricsLine::Sft(_)))
        .count();
    assert_eq!(sft, 4);
    // The event file holds the SFT losses and every GRPO step's reward.
    let tb = std::fs::read_dir(s.dir.join("tensorboard"))
        .expect("tensorboard dir")
        .next()
        .expect("an event file")
        .expect("entry")
        .path();
    let scalars = terse_train::records::read_scalars(&tb).expect("events");
    let steps_of = |tag: &str| -> Vec<i64> {
        scalars
            .iter()
            .filter(|(_, t, _)| t == tag)
            .map(|(s, _, _)| *s)
            .collect()
    };
    assert_eq!(steps_of("sft/loss"), [0, 1, 2, 3]);
    assert_eq!(steps_of("grpo/reward"), [0, 1]);
}
