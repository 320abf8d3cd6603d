//! The one way to assemble a trainer: `GrpoTrainer::builder(cfg)` takes every part research
//! code brings (the task, TRL-shaped per-completion rewards with weights, the shaper, the
//! advantage estimator, the policy loss, observers, a data-parallel collective) and ends in
//! `.build()` (a trainer at step 0, to step by hand) or `.run()` (a whole run, written in
//! run/ranks.rs beside the ranks it dispatches to: rank 0's loop in run/run_loop.rs, which
//! starts through run/start.rs and owns checkpoints, resume and evaluation, or a follower).
//! What is not given comes from the config, by name through the registry (registry.rs).
//! run/run_loop.rs and run/ranks.rs assemble their trainers through the same builder
//! (`assemble`), from the parts they loaded.

use crate::config::RunConfig;
use crate::records::observe::Observer;
use crate::step::loss::PolicyLoss;
use crate::step::trainer::GrpoTrainer;
use crate::task::Task;
use anyhow::Result;
use std::path::PathBuf;
use std::sync::Arc;
use terse_dist::Collective;
use terse_model::Qwen3;
use terse_optim::AdamW;
use terse_reward::{AdvantageEstimator, CompletionReward, LengthShaper};

/// Builds a `GrpoTrainer` (`.build()`) or a whole run (`.run()`) from a config and the parts
/// research code brings (`GrpoTrainer::builder`).
pub struct TrainerBuilder {
    pub(crate) cfg: RunConfig,
    task: Option<Task>,
    rewards: Vec<(Arc<dyn CompletionReward>, f64)>,
    shaper: Option<Box<dyn LengthShaper>>,
    estimator: Option<Box<dyn AdvantageEstimator>>,
    loss: Option<Box<dyn PolicyLoss>>,
    pub(crate) observers: Vec<Box<dyn Observer>>,
    pub(crate) collective: Option<Box<dyn Collective>>,
    /// `.run()` on an existing run: whether a config other than the run's is accepted (each
    /// change recorded in config_changes.jsonl), and whether a finished run is evaluated
    /// again (run/config_record.rs, run_loop.rs).
    pub(crate) allow_config_change: bool,
    pub(crate) eval_again: bool,
    /// `.model(..)`: the policy to start from instead of `model.path`'s weights (`build`).
    pub(crate) model: Option<Qwen3>,
}

/// What a trainer starts from besides the builder's parts: loaded by `build` (step 0 from
/// `model.path`), by start.rs (a fresh or resumed run) or by ranks.rs (rank 0's start).
pub(crate) struct Loaded {
    pub tok: tokenizers::Tokenizer,
    pub policy: Qwen3,
    pub reference: Option<Qwen3>,
    pub opt: AdamW,
    pub step: u64,
    pub cursor: u64,
    /// Where checkpoints are (None: a trainer outside a run).
    pub run_dir: Option<PathBuf>,
}

impl GrpoTrainer {
    /// The one way to assemble a trainer: the config, then any of `.task(..)`,
    /// `.reward(f, weight)`, `.shaper(..)`, `.estimator(..)`, `.loss(..)`, `.observer(..)`,
    /// `.collective(..)`, then `.build()` or `.run()`.
    pub fn builder(cfg: RunConfig) -> TrainerBuilder {
        TrainerBuilder {
            cfg,
            task: None,
            rewards: vec![],
            shaper: None,
            estimator: None,
            loss: None,
            observers: vec![],
            collective: None,
            allow_config_change: false,
            eval_again: false,
            model: None,
        }
    }
}

impl TrainerBuilder {
    /// The task (default: the config's `[data]`).
    pub fn task(mut self, task: Task) -> Self {
        self.task = Some(task);
        self
    }

    /// A per-completion reward in TRL's shape (`reward_funcs` with `reward_weights`): any
    /// `Fn(completion, answer, &SampleStat) -> f64`. Each completion's base reward becomes the
    /// verifier's plus `weight x f(..)` of every reward given, in the order given
    /// (`terse_reward::combined_base_reward`; `f` sees the verifier's statistics). The shaper
    /// then shapes that sum like any base reward; `correct` and `format_ok` stay the
    /// verifier's, and a truncated completion's sum is zeroed like its base reward when the
    /// config scores truncation as 0.
    pub fn reward(mut self, f: impl CompletionReward + 'static, weight: f64) -> Self {
        self.rewards.push((Arc::new(f), weight));
        self
    }

    /// A reward shaper: any `LengthShaper` (a closure works) (default: the configured one,
    /// `registry::configured_shaper`). Its state is checkpointed with a run.
    pub fn shaper(mut self, s: Box<dyn LengthShaper>) -> Self {
        self.shaper = Some(s);
        self
    }

    /// An advantage estimator (default: the configured one).
    pub fn estimator(mut self, e: Box<dyn AdvantageEstimator>) -> Self {
        self.estimator = Some(e);
        self
    }

    /// A policy loss (default: the configured one, `grpo.loss`).
    pub fn loss(mut self, l: Box<dyn PolicyLoss>) -> Self {
        self.loss = Some(l);
        self
    }

    /// An observer of every record a run writes (`.run()`), after the metrics file, the
    /// progress bar and, with `log.tensorboard`, the event files.
    pub fn observer(mut self, o: Box<dyn Observer>) -> Self {
        self.observers.push(o);
        self
    }

    /// A data-parallel group this trainer is one rank of.
    pub fn collective(mut self, c: Box<dyn Collective>) -> Self {
        self.collective = Some(c);
        self
    }

    /// `.run()` on an existing run with a config other than the run's (its config.toml and
    /// config_changes.jsonl): accepted, each differing key appended to
    /// `<run>/config_changes.jsonl` as `{step, key, old, new}` (`xtask train
    /// --allow-config-change`). Without it such a start refuses, naming each key.
    pub fn allow_config_change(mut self, allow: bool) -> Self {
        self.allow_config_change = allow;
        self
    }

    /// `.run()` on a finished run: evaluate it again and append that evaluation to
    /// metrics.jsonl marked `"again": true` (`xtask train --eval-again`). Without it a
    /// finished run is left as it is and its summary read from metrics.jsonl.
    pub fn eval_again(mut self, again: bool) -> Self {
        self.eval_again = again;
        self
    }

    /// `build` starts from this policy instead of loading `model.path`'s weights (the tokenizer
    /// is still `model.path`'s): a model made in code, such as the random Qwen3-0.6B shape
    /// gpu-check's `grpo_step` times. It must be on the run's device, in its dtype; a KL
    /// reference, if the config has one, is still loaded from `model.path`. `.run()` refuses it:
    /// a run starts from its config (`model.init`), so that it can be resumed.
    pub fn model(mut self, policy: Qwen3) -> Self {
        self.model = Some(policy);
        self
    }

    /// A trainer at step 0: the policy and tokenizer from `model.path` (a checkpoint; the
    /// policy `.model(..)` gave, if any), a fresh AdamW, the same weights as the KL reference
    /// when `grpo.kl_coef > 0`.
    pub fn build(mut self) -> Result<GrpoTrainer> {
        self.check()?;
        let given = self.model.take();
        let cfg = &self.cfg;
        let (dev, dtype) = cfg.run.device_and_dtype()?;
        let path = cfg.model.path.clone();
        let mut policy = match given {
            Some(m) => m,
            None => Qwen3::load(&path, &dev, dtype)?,
        };
        crate::load::add_configured_lora(cfg, &mut policy)?;
        let reference = if crate::load::needs_reference(cfg) {
            Some(Qwen3::load(&path, &dev, dtype)?)
        } else {
            None
        };
        let opt = AdamW::new(cfg.optim.clone(), policy.vars())?;
        let task = self.take_task()?;
        let tok = crate::load::load_tokenizer(&path)?;
        let loaded = Loaded {
            tok,
            policy,
            reference,
            opt,
            step: 0,
            cursor: 0,
            run_dir: None,
        };
        self.assemble(task, loaded)
    }

    /// The config is valid and every name it gives is registered, before anything is loaded
    /// or written.
    pub(crate) fn check(&self) -> Result<()> {
        self.cfg.validate()?;
        crate::registry::check(&self.cfg)
    }

    /// The task given, or the config's (its dataset loaded).
    pub(crate) fn take_task(&mut self) -> Result<Task> {
        match self.task.take() {
            Some(t) => Ok(t),
            None => Task::new(&self.cfg.data, &self.cfg.model.path, self.cfg.run.seed),
        }
    }

    /// The shaper given, or the configured one, built once and kept: start.rs restores its
    /// state before the trainer is assembled.
    pub(crate) fn shaper_mut(&mut self) -> Result<&mut (dyn LengthShaper + 'static)> {
        let shaper = match self.shaper.take() {
            Some(s) => s,
            None => crate::registry::configured_shaper(&self.cfg)?,
        };
        Ok(&mut **self.shaper.insert(shaper))
    }

    /// The trainer from the builder's parts and the loaded ones; what is not given comes from
    /// the config (the estimator and the loss by name through the registry, else the
    /// built-in ones of `[advantage]` and `grpo.loss`).
    pub(crate) fn assemble(mut self, mut task: Task, l: Loaded) -> Result<GrpoTrainer> {
        let shaper = match self.shaper.take() {
            Some(s) => s,
            None => crate::registry::configured_shaper(&self.cfg)?,
        };
        for (f, w) in std::mem::take(&mut self.rewards) {
            task.add_reward(f, w);
        }
        let estimator = match self.estimator {
            Some(e) => e,
            None => crate::registry::configured_estimator(&self.cfg)?,
        };
        let policy_loss = match self.loss {
            Some(l) => l,
            None => crate::registry::configured_loss(&self.cfg)?,
        };
        let mut policy = l.policy;
        policy.options = self.cfg.model.forward_options(policy.device());
        let gen = crate::step::collect::rollout_params(&self.cfg, &policy, &l.tok)?;
        Ok(GrpoTrainer {
            cfg: self.cfg,
            task,
            tok: l.tok,
            policy,
            reference: l.reference,
            opt: l.opt,
            gen,
            step: l.step,
            cursor: l.cursor,
            run_dir: l.run_dir,
            estimator,
            policy_loss,
            shaper,
            collective: self.collective,
        })
    }
}
