//! Research code's own methods by name (issue 34): a shaper, an advantage estimator and a
//! policy loss registered in code (beside the built-ins; a name is taken once) and chosen by
//! the keys that choose the built-ins (`reward.shaper.method`, `advantage.estimator`,
//! `grpo.loss`), used by a whole run started the way `cargo xtask train --config FILE` starts
//! it; and the builder's parts (issue 44): estimator, loss, shaper, and TRL-shaped
//! per-completion rewards with weights.

use std::sync::atomic::{AtomicUsize, Ordering};
use terse_reward::{
    Advantage, AdvantageEstimator, Advantages, Group, LengthShaper, RewardError, Shaped, StepCtx,
};
use terse_train::registry::Params;
use terse_train::step::{LossInputs, LossStats, PolicyLoss, PpoParams};

// Each test counts its own calls (tests run in parallel).
static ESTIMATES: AtomicUsize = AtomicUsize::new(0);
static LOSSES: AtomicUsize = AtomicUsize::new(0);
static BUILT_ESTIMATES: AtomicUsize = AtomicUsize::new(0);
static BUILT_LOSSES: AtomicUsize = AtomicUsize::new(0);

/// 1 per right answer minus `per_token` (from `[reward.shaper]`'s other keys) per token.
fn length_penalty(p: &Params) -> anyhow::Result<Box<dyn LengthShaper>> {
    let per_token = p
        .get("per_token")
        .and_then(|v| v.as_float())
        .unwrap_or(0.01);
    Ok(Box::new(move |groups: &[Group], _: &StepCtx| {
        let mut out = Shaped {
            rewards: groups
                .iter()
                .map(|g| {
                    g.samples
                        .iter()
                        .map(|s| f64::from(u8::from(s.correct)) - per_token * s.len as f64)
                        .collect()
                })
                .collect(),
            ..Default::default()
        };
        out.diagnostics.insert("plugin_per_token".into(), per_token);
        out
    }))
}

/// GRPO's estimator, counting its calls.
struct CountedGrpo(&'static AtomicUsize);

impl AdvantageEstimator for CountedGrpo {
    fn estimate(&self, groups: &[Group], shaped: &Shaped) -> Result<Advantages, RewardError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Advantage::default().compute(groups, shaped)
    }
}

fn counted_grpo(_: &Params) -> anyhow::Result<Box<dyn AdvantageEstimator>> {
    Ok(Box::new(CountedGrpo(&ESTIMATES)))
}

/// PPO-clip, counting its calls.
struct CountedPpo(PpoParams, &'static AtomicUsize);

impl PolicyLoss for CountedPpo {
    fn loss(&self, x: &LossInputs) -> candle_core::Result<(candle_core::Tensor, LossStats)> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.loss(x)
    }
}

fn ppo(counter: &'static AtomicUsize) -> Box<dyn PolicyLoss> {
    let g = terse_train::config::GrpoSection::default();
    Box::new(CountedPpo(PpoParams::from(&g), counter))
}

fn counted_ppo(_: &Params) -> anyhow::Result<Box<dyn PolicyLoss>> {
    Ok(ppo(&LOSSES))
}

#[test]
fn registered_methods_run_from_a_config_by_name() {
    terse_train::register_shaper("length_penalty", length_penalty).expect("a new name");
    terse_train::register_estimator("counted_grpo", counted_grpo).expect("a new name");
    terse_train::register_loss("counted_ppo", counted_ppo).expect("a new name");
    // A name is taken once, a built-in's included: one line says so.
    let e = terse_train::register_loss("counted_ppo", counted_ppo).expect_err("twice");
    assert_eq!(
        e.to_string(),
        "loss \"counted_ppo\" is already registered; a name is registered once"
    );
    let e = terse_train::register_shaper("short_rl", length_penalty).expect_err("built-in");
    assert!(e.to_string().contains("built-in"), "{e}");
    let root = crate::scratch("plugins");
    let text = format!(
        "[run]\ndir = {dir:?}\nname = \"plugged\"\n\n[model]\npath = {model:?}\ninit = \"checkpoint\"\n\n\
         [sft]\nsteps = 0\n\n[grpo]\nsteps = 1\nprompts_per_step = 4\ngroup_size = 4\nmax_new_tokens = 48\n\
         loss = \"counted_ppo\"\n\n[eval]\nper_level = 1\nsamples = 1\n\n\
         [reward.shaper]\nmethod = \"length_penalty\"\nper_token = 0.02\n\n\
         [advantage]\nestimator = \"counted_grpo\"\n",
        dir = root.display().to_string(),
        model = crate::fixture("testbed-sft").display().to_string(),
    );
    let file = root.join("plugged.toml");
    std::fs::write(&file, text).expect("config");
    let cfg = terse_train::RunConfig::from_file(&file).expect("config names registered plugins");
    // The resolved config.toml names them where the file did (and reads back the same).
    let again = terse_train::RunConfig::from_toml(&cfg.to_toml().expect("toml"), &file)
        .expect("the resolved config reads back");
    assert_eq!(again, cfg);
    let (e0, l0) = (
        ESTIMATES.load(Ordering::Relaxed),
        LOSSES.load(Ordering::Relaxed),
    );
    terse_train::train(&cfg).expect("run");
    assert!(
        ESTIMATES.load(Ordering::Relaxed) > e0,
        "the registered estimator did not run"
    );
    assert!(
        LOSSES.load(Ordering::Relaxed) > l0,
        "the registered loss did not run"
    );
    let written = std::fs::read_to_string(root.join("plugged/config.toml")).expect("config.toml");
    assert!(
        written.contains("method = \"length_penalty\"")
            && written.contains("estimator = \"counted_grpo\"")
            && written.contains("loss = \"counted_ppo\""),
        "{written}"
    );
    let steps =
        terse_train::report::read_steps(&root.join("plugged/metrics.jsonl")).expect("steps");
    assert_eq!(
        steps[0].diagnostic("plugin_per_token"),
        Some(0.02),
        "the shaper or its params"
    );

    // An unknown name stops the run before anything is written, naming what is registered.
    let bad = std::fs::read_to_string(&file)
        .expect("config")
        .replace("counted_ppo", "nope")
        .replace("\"plugged\"", "\"misspelt\"");
    let cfg = terse_train::RunConfig::from_toml(&bad, &file).expect("parses");
    let e = format!("{:#}", terse_train::train(&cfg).expect_err("unknown"));
    assert!(
        e.contains("grpo.loss = \"nope\" is neither built in nor registered")
            && e.contains("gspo-token")
            && e.contains("counted_ppo"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
    // The section of earlier versions is refused in one line that says where the names go.
    let old = terse_train::RunConfig::from_toml("[plugins]\nshaper = \"length_penalty\"\n", &file)
        .expect_err("[plugins] is gone");
    let old = format!("{old:#}");
    assert!(
        old.contains("[plugins] is gone: name a registered shaper in reward.shaper.method"),
        "{old}"
    );
    assert_eq!(old.lines().count(), 1, "{old}");
    assert!(
        !root.join("misspelt/config.toml").exists(),
        "a refused run wrote its config"
    );
}

static BUILT_SHAPES: AtomicUsize = AtomicUsize::new(0);

/// The builder attaches research code's parts to a trainer built from a config.
#[test]
fn the_builder_attaches_an_estimator_and_a_loss() {
    let root = crate::scratch("plugins-builder");
    let cfg = crate::from_sft(&root, "built", 1);
    let mut t = terse_train::GrpoTrainer::builder(cfg.clone())
        .estimator(Box::new(CountedGrpo(&BUILT_ESTIMATES)))
        .loss(ppo(&BUILT_LOSSES))
        .shaper(Box::new(|groups: &[Group], ctx: &StepCtx| {
            BUILT_SHAPES.fetch_add(1, Ordering::Relaxed);
            terse_reward::BuiltinShaper::new(Default::default())
                .expect("the default method")
                .shape(groups, ctx)
                .expect("shape")
        }))
        .build()
        .expect("trainer");
    t.step().expect("step");
    assert_eq!(
        BUILT_SHAPES.load(Ordering::Relaxed),
        1,
        "the built shaper did not run"
    );
    assert_eq!(
        BUILT_ESTIMATES.load(Ordering::Relaxed),
        1,
        "one step, one estimate"
    );
    assert!(
        BUILT_LOSSES.load(Ordering::Relaxed) > 0,
        "the built loss did not run"
    );
}

/// The base rewards one step's shaper sees, in sample order, with each sample's length.
fn seen_base_rewards(b: terse_train::TrainerBuilder) -> Vec<(f64, usize, bool)> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let into = seen.clone();
    let mut t = b
        .shaper(Box::new(move |groups: &[Group], _: &StepCtx| {
            let mut v = into.lock().expect("lock");
            for s in groups.iter().flat_map(|g| &g.samples) {
                v.push((s.base_reward, s.len, s.correct));
            }
            Shaped::base(groups)
        }))
        .build()
        .expect("trainer");
    t.step().expect("step");
    let v = seen.lock().expect("lock").clone();
    v
}

/// TRL-shaped rewards with weights add to the verifier's base reward before the shaper sees
/// it: base + 0.5 x 1 + 0.01 x (-len), for the same rollout (the same seed) as without them;
/// `correct` stays the verifier's.
#[test]
fn weighted_completion_rewards_add_to_the_verifier_s_reward() {
    let root = crate::scratch("plugins-rewards");
    let cfg = crate::from_sft(&root, "rewards", 1);
    let plain = seen_base_rewards(terse_train::GrpoTrainer::builder(cfg.clone()));
    let weighted = seen_base_rewards(
        terse_train::GrpoTrainer::builder(cfg)
            .reward(|_: &str, _: &str, _: &terse_reward::SampleStat| 1.0, 0.5)
            .reward(
                |_: &str, _: &str, s: &terse_reward::SampleStat| -(s.len as f64),
                0.01,
            ),
    );
    assert_eq!(plain.len(), 16);
    assert_eq!(plain.len(), weighted.len());
    for ((b0, len0, c0), (b1, len1, c1)) in plain.iter().zip(&weighted) {
        assert_eq!((len0, c0), (len1, c1), "the same rollout");
        assert_eq!(*b1, b0 + 0.5 * 1.0 + 0.01 * -(*len0 as f64));
    }
    assert!(plain.iter().any(|s| s.1 > 0));
}

/// `.model(..)` starts a built trainer from a model made in code (here the SFT checkpoint's
/// own weights, so the step is the one `model.path` gives); `.run()` refuses it with one line
/// naming it, and writes nothing.
#[test]
fn the_builder_takes_a_model_for_build_and_run_refuses_it() {
    let root = crate::scratch("plugins-model");
    let cfg = crate::from_sft(&root, "given", 1);
    let (dev, dtype) = cfg.run.device_and_dtype().expect("device");
    let path = cfg.model.path.clone();
    let load = || terse_model::Qwen3::load(&path, &dev, dtype).expect("model");
    let mut given = terse_train::GrpoTrainer::builder(cfg.clone())
        .model(load())
        .build()
        .expect("build");
    let mut loaded = terse_train::GrpoTrainer::builder(cfg.clone())
        .build()
        .expect("build");
    let (a, b) = (given.step().expect("step"), loaded.step().expect("step"));
    assert_eq!((a.reward, a.loss), (b.reward, b.loss));
    let e = terse_train::GrpoTrainer::builder(cfg)
        .model(load())
        .run()
        .expect_err("run with a given model")
        .to_string();
    assert!(e.contains("`.model(..)`") && !e.contains('\n'), "{e}");
    assert!(
        !root.join("given/config.toml").exists(),
        "a refused run wrote its config"
    );
}
