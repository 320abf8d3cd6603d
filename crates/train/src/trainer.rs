//! The step-level GRPO trainer: [`GrpoTrainer::step`] = rollout -> score -> shape ->
//! advantages -> PPO update, returning a typed [`StepReport`]; each piece is callable alone
//! for research code that changes one of them. Holds the policy, the optional KL reference,
//! AdamW, the task, the tokenizer and the data cursor; knows nothing of files (run.rs writes
//! checkpoints and metrics around it).

use crate::collect::{collect, rollout_params, Collected};
use crate::config::RunConfig;
use crate::failure::SampleFault;
use crate::loss::PolicyLoss;
use crate::report::{StepReport, Timing};
pub use crate::shaper::ShaperWithState;
use crate::task::Task;
use crate::update::{policy_update, sequences, Learner, UpdateBatch, UpdateStats};
use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use terse_model::Qwen3;
use terse_optim::AdamW;
use terse_reward::{metrics::length_stats, AdvantageEstimator, Advantages, Group, Shaped, StepCtx};
use terse_rollout::GenParams;

/// Everything one GRPO step needs, the shaper included. The fields are the crate's: research
/// code reads them through the accessors and attaches its parts with `GrpoTrainer::builder`,
/// so nothing computed from the config at construction can go out of step with it.
pub struct GrpoTrainer {
    pub(crate) cfg: RunConfig,
    pub(crate) task: Task,
    pub(crate) tok: tokenizers::Tokenizer,
    pub(crate) policy: Qwen3,
    /// The KL reference (None when `grpo.kl_coef` is 0).
    pub(crate) reference: Option<Qwen3>,
    pub(crate) opt: AdamW,
    /// The rollout's sampling settings (Step-GRPO's texts tokenized).
    pub(crate) gen: GenParams,
    /// The next GRPO step and the next training item.
    pub(crate) step: u64,
    pub(crate) cursor: u64,
    /// Where the newest checkpoint is looked for when a step stops on a non-finite value.
    pub(crate) run_dir: Option<PathBuf>,
    /// Research code's advantage estimator; None uses `cfg.advantage` (the TOML face).
    pub(crate) estimator: Option<Box<dyn AdvantageEstimator>>,
    /// Research code's policy loss; None uses PPO-clip with `cfg.grpo`'s settings.
    pub(crate) policy_loss: Option<Box<dyn PolicyLoss>>,
    /// The reward shaper (`[reward]`, `[plugins] shaper`, or research code's own); its state is
    /// checkpointed with the run.
    pub(crate) shaper: Box<dyn ShaperWithState>,
    /// Data-parallel ranks (None: one process). Each rank rolls out its share of the step's
    /// groups and all see every group's statistics (collect.rs), so all shape the whole step
    /// alike; each differentiates the groups it holds with the global aggregation weights
    /// (update.rs); the optimizer is ZeRO-2 (`zero`): each
    /// rank keeps AdamW state for its parameter shard only (`opt` is dropped to it at the
    /// first update), and the updated weights are all-gathered.
    pub(crate) collective: Option<Box<dyn terse_dist::Collective>>,
}

/// One step's shaped rewards and advantages.
#[derive(Debug, Clone)]
pub struct Scored {
    pub shaped: Shaped,
    pub advantages: Advantages,
}

impl GrpoTrainer {
    /// The resolved run config (read-only: what the trainer was built with).
    pub fn config(&self) -> &RunConfig {
        &self.cfg
    }

    /// The policy being trained.
    pub fn policy(&self) -> &Qwen3 {
        &self.policy
    }

    /// The KL reference, when `grpo.kl_coef > 0`.
    pub fn reference(&self) -> Option<&Qwen3> {
        self.reference.as_ref()
    }

    /// The task the rollouts are scored by.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tok
    }

    /// The optimizer (its state).
    pub fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// The reward shaper (its state is what checkpoints save).
    pub fn shaper(&self) -> &dyn ShaperWithState {
        &*self.shaper
    }

    /// The next GRPO step to run and the next training item.
    pub fn position(&self) -> (u64, u64) {
        (self.step, self.cursor)
    }

    /// A trainer at step 0 from a validated config and loaded parts, shaping rewards with the
    /// config's shaper (`configured_shaper`).
    pub fn new(
        cfg: RunConfig,
        task: Task,
        tok: tokenizers::Tokenizer,
        policy: Qwen3,
        reference: Option<Qwen3>,
        opt: AdamW,
    ) -> Result<Self> {
        Self::assemble(cfg, task, tok, policy, reference, opt, None)
    }

    /// `new` with a given shaper (start.rs and ranks.rs, which restore its state first; the
    /// builder); None builds the configured one.
    pub(crate) fn assemble(
        cfg: RunConfig,
        task: Task,
        tok: tokenizers::Tokenizer,
        mut policy: Qwen3,
        reference: Option<Qwen3>,
        opt: AdamW,
        shaper: Option<Box<dyn ShaperWithState>>,
    ) -> Result<Self> {
        cfg.validate()?;
        let shaper = match shaper {
            Some(s) => s,
            None => crate::registry::configured_shaper(&cfg)?,
        };
        policy.options = cfg.model.forward_options(policy.device());
        let gen = rollout_params(&cfg, &policy, &tok)?;
        // `[plugins]`: registered estimator and loss by name (crate::registry).
        let p = &cfg.plugins;
        let estimator = match &p.estimator {
            Some(n) => Some(crate::registry::estimator(n, &p.params)?),
            None => None,
        };
        let policy_loss = match &p.loss {
            Some(n) => Some(crate::registry::loss(n, &p.params)?),
            None => None,
        };
        Ok(Self {
            cfg,
            task,
            tok,
            policy,
            reference,
            opt,
            gen,
            step: 0,
            cursor: 0,
            run_dir: None,
            estimator,
            policy_loss,
            shaper,
            collective: None,
        })
    }

    /// A trainer from a config with research code's parts attached (the builder way of
    /// `from_config`): `.task(..)`, `.shaper(..)`, `.estimator(..)`, `.loss(..)`,
    /// `.collective(..)`, then `.build()`.
    pub fn builder(cfg: RunConfig) -> TrainerBuilder {
        TrainerBuilder {
            cfg,
            task: None,
            shaper: None,
            estimator: None,
            loss: None,
            collective: None,
        }
    }

    /// A trainer from a config alone, for research code: the policy and tokenizer from
    /// `model.path` (a checkpoint), a fresh AdamW, the same weights as the KL reference when
    /// `grpo.kl_coef > 0`, and `task` (the config's own when None).
    pub fn from_config(cfg: RunConfig, task: Option<Task>) -> Result<Self> {
        Self::load(cfg, task, None)
    }

    /// `from_config` with research code's shaper, if any (the builder).
    fn load(
        cfg: RunConfig,
        task: Option<Task>,
        shaper: Option<Box<dyn ShaperWithState>>,
    ) -> Result<Self> {
        cfg.validate()?;
        let (dev, dtype) = cfg.run.device_and_dtype()?;
        let path = cfg.model.path.clone();
        let mut policy = Qwen3::load(&path, &dev, dtype)?;
        crate::load::add_configured_lora(&cfg, &mut policy)?;
        let reference = if crate::load::needs_reference(&cfg) {
            Some(Qwen3::load(&path, &dev, dtype)?)
        } else {
            None
        };
        let opt = AdamW::new(cfg.optim.clone(), policy.vars())?;
        let task = match task {
            Some(t) => t,
            None => Task::new(&cfg.data, &path, cfg.run.seed)?,
        };
        let tok = crate::load::load_tokenizer(&path)?;
        Self::assemble(cfg, task, tok, policy, reference, opt, shaper)
    }

    /// Rollout and scoring of this step: G samples for each prompt from the data cursor, their
    /// verdicts and lengths as `Group`s (dynamic sampling refills within). Does not move the
    /// cursor; `step` does. Data parallel: this rank generates its share of the groups and
    /// receives the others' statistics (collect.rs).
    pub fn rollout(&mut self) -> Result<Collected> {
        // ThinkPrune: this step's token limit, a function of the step (resuming samples alike).
        let gen = match self.cfg.grpo.think_prune {
            Some(_) => std::borrow::Cow::Owned(GenParams {
                max_new_tokens: self.cfg.grpo.step_limit(self.step),
                ..self.gen.clone()
            }),
            None => std::borrow::Cow::Borrowed(&self.gen),
        };
        // With LoRA the rollout decodes a merged copy, made once for the step.
        let mut c = self.policy.with_decoding_weights(|policy| {
            collect(
                &self.cfg,
                &self.task,
                policy,
                &self.tok,
                &gen,
                self.step,
                self.cursor,
                terse_dist::lend(&mut self.collective),
            )
        })?;
        // GFPO: train on the kept samples of each group alone (length_control.rs).
        if let Some(f) = &self.cfg.grpo.gfpo {
            crate::length_control::gfpo_filter(f, &mut c, self.cfg.grpo.group_size)?;
        }
        Ok(c)
    }

    /// Shaped rewards (the trainer's shaper; unscorable samples are invisible to it) and
    /// advantages. A non-finite shaped reward stops here, before any update.
    pub fn score(&mut self, c: &Collected) -> Result<Scored> {
        let shaper = &mut self.shaper;
        let ctx = StepCtx {
            step: self.step,
            seed: self.cfg.run.seed,
        };
        let groups = &c.groups;
        let shaped = terse_reward::shape_scorable(groups, |gs| shaper.shape(gs, &ctx))?;
        self.check_finite("shaped reward", groups, &shaped.rewards)?;
        let advantages = match &self.estimator {
            Some(e) => e.estimate(groups, &shaped)?,
            None => self.cfg.advantage.compute(groups, &shaped)?,
        };
        // A research estimator can return inf or NaN where the built-in ones cannot.
        self.check_finite("advantage", groups, &advantages.values)?;
        Ok(Scored { shaped, advantages })
    }

    /// The first non-finite value of a per-sample table (`what`: "shaped reward",
    /// "advantage") stops the step before the update, naming the group, the prompt and the
    /// sample (a `SampleFault`, so a failure repeated on resume names it too).
    fn check_finite(&self, what: &str, groups: &[Group], values: &[Vec<f64>]) -> Result<()> {
        let Some((k, i)) = values
            .iter()
            .enumerate()
            .find_map(|(k, r)| r.iter().position(|x| !x.is_finite()).map(|i| (k, i)))
        else {
            return Ok(());
        };
        Err(SampleFault {
            step: self.step,
            prompt_id: groups[k].prompt_id,
            sample: i,
            message: format!(
                "step {}: non-finite {what} {} (group {k}, prompt {}, sample {i}); stopped before updating; {}",
                self.step,
                values[k][i],
                groups[k].prompt_id,
                self.last_good()
            ),
        }
        .into())
    }

    /// The policy update: PPO epochs x mini-batches, each micro-batched with its global
    /// aggregation weights, clipped, one AdamW step each, at this step's learning rate.
    pub fn update(&mut self, c: &Collected, advantages: &Advantages) -> Result<UpdateStats> {
        let g = &self.cfg.grpo;
        let lr = g.schedule.lr_at(self.step);
        let seqs = sequences(c, &advantages.values, g.group_size);
        let learner = Learner {
            grpo: g,
            policy: &self.policy,
            reference: self.reference.as_ref(),
            opt: &mut self.opt,
            loss: self.policy_loss.as_deref(),
            collective: terse_dist::lend(&mut self.collective),
            run_dir: self.run_dir.as_deref(),
        };
        let batch = UpdateBatch {
            seqs,
            held: &c.held,
            extras: &c.extras,
            lr,
            step: self.step,
        };
        policy_update(learner, batch)
    }

    fn last_good(&self) -> String {
        crate::checkpoint::last_good(self.run_dir.as_deref())
    }

    /// One whole GRPO step; advances the step and the data cursor.
    pub fn step(&mut self) -> Result<StepReport> {
        let t0 = Instant::now();
        let c = self.rollout()?;
        let t_rollout = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let scored = self.score(&c)?;
        let t_score = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let up = self.update(&c, &scored.advantages)?;
        let t_update = t2.elapsed().as_secs_f64();
        let timing = Timing {
            rollout_s: t_rollout,
            score_s: t_score,
            logprob_s: up.logprob_s,
            update_s: t_update - up.logprob_s,
            tokens_per_s: c.generated_tokens as f64 / (t_rollout + t_update),
            kv_peak_gib: c.kv_peak_bytes as f64 / f64::from(1u32 << 30),
            preemptions: c.preemptions,
        };
        let report = self.report(&c, &scored, &up, timing);
        self.cursor = c.cursor;
        self.step += 1;
        Ok(report)
    }

    /// The step's metrics from its pieces.
    pub fn report(&self, c: &Collected, s: &Scored, up: &UpdateStats, time: Timing) -> StepReport {
        let (extras, groups) = (&c.extras, &c.groups);
        let st = &up.stats;
        let ls = length_stats(groups);
        let n = extras.len() as f64;
        let all = || groups.iter().flat_map(|g| &g.samples);
        let tokens = st.tokens.max(1) as f64;
        let entropy_tokens: usize = extras.iter().map(|s| s.entropy_tokens).sum();
        // `extras` lists the samples in the groups' order, so zipping pairs each with its stat.
        let (exited, exits_right) = all()
            .zip(extras)
            .filter(|(_, e)| e.early_exit)
            .fold((0, 0), |(n, r), (s, _)| (n + 1, r + usize::from(s.correct)));
        let exit_accuracy = (exited > 0).then(|| exits_right as f64 / exited as f64);
        // The mean shaped reward of the samples trained on: GFPO's dropped samples (unscorable,
        // reward 0) are left out; with every sample scorable this is the plain mean.
        let scored: Vec<f64> = groups
            .iter()
            .zip(&s.shaped.rewards)
            .flat_map(|(g, r)| g.samples.iter().zip(r).filter(|(x, _)| x.scorable))
            .map(|(_, r)| *r)
            .collect();
        let gfpo_dropped = match self.cfg.grpo.gfpo {
            Some(_) => all().filter(|s| !s.scorable).count(),
            None => 0,
        };
        StepReport {
            step: self.step,
            reward: scored.iter().sum::<f64>() / scored.len() as f64,
            accuracy: all().filter(|s| s.correct).count() as f64 / n,
            format_ok: all().filter(|s| s.format_ok).count() as f64 / n,
            len_mean: ls.mean,
            len_min: ls.min,
            len_max: ls.max,
            len_correct: ls.mean_correct,
            len_incorrect: ls.mean_incorrect,
            truncated: ls.truncated_frac,
            zero_std_groups: s.advantages.zero_std_groups as f64 / groups.len() as f64,
            clip_frac_low: st.clipped_low as f64 / tokens,
            clip_frac_high: st.clipped_high as f64 / tokens,
            kl: st.kl_sum / tokens,
            logp_gap: up.logp_gap,
            loss: up.loss,
            grad_norm: up.grad_norm,
            updates: up.updates,
            lr: self.cfg.grpo.schedule.lr_at(self.step),
            steps_mean: all().map(|s| s.steps as f64).sum::<f64>() / n,
            entropy: extras.iter().map(|s| s.entropy_sum).sum::<f64>()
                / entropy_tokens.max(1) as f64,
            judge_mean: extras.iter().map(|s| s.judge_count as f64).sum::<f64>() / n,
            early_exit: exited as f64 / n,
            exit_accuracy,
            context_cut: extras.iter().filter(|e| e.context_cut).count(),
            gfpo_dropped,
            verify_budget_exceeded: c.faults.budget_exceeded,
            verify_panics: c.faults.panics,
            rc_logp_gap: up.correction.map(|c| c.gap_sum / c.tokens.max(1) as f64),
            rc_capped: up
                .correction
                .map(|c| c.capped as f64 / c.tokens.max(1) as f64),
            rc_ratio_max: up.correction.map(|c| c.ratio_max),
            rounds: c.rounds,
            dropped_groups: c.dropped,
            time,
            diagnostics: s.shaped.diagnostics.clone(),
        }
    }
}

/// Builds a `GrpoTrainer` from a config and the parts research code brings
/// (`GrpoTrainer::builder`); what is not given comes from the config (the task, and by name
/// through `[plugins]` the estimator and the loss).
pub struct TrainerBuilder {
    cfg: RunConfig,
    task: Option<Task>,
    shaper: Option<Box<dyn ShaperWithState>>,
    estimator: Option<Box<dyn AdvantageEstimator>>,
    loss: Option<Box<dyn PolicyLoss>>,
    collective: Option<Box<dyn terse_dist::Collective>>,
}

impl TrainerBuilder {
    /// The task (default: the config's `[data]`).
    pub fn task(mut self, task: Task) -> Self {
        self.task = Some(task);
        self
    }

    /// A reward shaper: any `LengthShaper` (a closure works) (default: `[plugins] shaper`,
    /// else `[reward]`).
    pub fn shaper(mut self, s: Box<dyn ShaperWithState>) -> Self {
        self.shaper = Some(s);
        self
    }

    /// An advantage estimator (default: `[plugins] estimator`, else `[advantage]`).
    pub fn estimator(mut self, e: Box<dyn AdvantageEstimator>) -> Self {
        self.estimator = Some(e);
        self
    }

    /// A policy loss (default: `[plugins] loss`, else PPO-clip).
    pub fn loss(mut self, l: Box<dyn PolicyLoss>) -> Self {
        self.loss = Some(l);
        self
    }

    /// A data-parallel group this trainer is one rank of.
    pub fn collective(mut self, c: Box<dyn terse_dist::Collective>) -> Self {
        self.collective = Some(c);
        self
    }

    /// Loads the policy (and the KL reference) from `model.path` and attaches the parts.
    pub fn build(self) -> Result<GrpoTrainer> {
        let mut t = GrpoTrainer::load(self.cfg, self.task, self.shaper)?;
        if let Some(e) = self.estimator {
            t.estimator = Some(e);
        }
        if let Some(l) = self.loss {
            t.policy_loss = Some(l);
        }
        t.collective = self.collective;
        Ok(t)
    }
}
