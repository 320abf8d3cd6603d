//! The step-level GRPO trainer: [`GrpoTrainer::step`] = rollout -> score -> shape ->
//! advantages -> PPO update, returning a typed [`StepReport`]; each piece is callable alone
//! for research code that changes one of them. Holds the policy, the optional KL reference,
//! AdamW, the task, the tokenizer and the data cursor; knows nothing of files (the run loop,
//! run/run_loop.rs, writes checkpoints and metrics around it).

use crate::config::RunConfig;
use crate::failure::SampleFault;
use crate::report::{StepReport, Timing};
use crate::step::collect::{collect, Collected};
use crate::step::loss::PolicyLoss;
use crate::step::update::{policy_update, sequences, Learner, UpdateBatch, UpdateStats};
use crate::task::Task;
use anyhow::Result;
use std::path::PathBuf;
use std::time::Instant;
use terse_model::Qwen3;
use terse_optim::AdamW;
use terse_reward::{
    metrics::length_stats, AdvantageEstimator, Advantages, Group, LengthShaper, Shaped, StepCtx,
};
use terse_rollout::GenParams;

/// Everything one GRPO step needs, the shaper included. The fields are the crate's: research
/// code reads them through the accessors and attaches its parts with `GrpoTrainer::builder`
/// (builder.rs, the one way to assemble a trainer), so nothing computed from the config at
/// construction can go out of step with it.
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
    /// The advantage estimator: given, or the one the config names (a built-in `[advantage]`
    /// or a registered one), built by the registry.
    pub(crate) estimator: Box<dyn AdvantageEstimator>,
    /// The policy loss: given, or the one `grpo.loss` names (PPO-clip, GSPO, or a registered
    /// one), built by the registry.
    pub(crate) policy_loss: Box<dyn PolicyLoss>,
    /// The reward shaper (the configured one, or research code's own); its state is
    /// checkpointed with the run.
    pub(crate) shaper: Box<dyn LengthShaper>,
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
    pub fn shaper(&self) -> &dyn LengthShaper {
        &*self.shaper
    }

    /// The next GRPO step to run and the next training item.
    pub fn position(&self) -> (u64, u64) {
        (self.step, self.cursor)
    }

    /// Rollout and scoring of this step: G samples for each prompt from the data cursor, their
    /// verdicts and lengths as `Group`s (dynamic sampling refills within). Does not move the
    /// cursor; `step` does. Data parallel: this rank generates its share of the groups and
    /// receives the others' statistics (collect.rs).
    pub fn rollout(&mut self) -> Result<Collected> {
        // ThinkPrune: this step's token limit, a function of the step (resuming samples alike).
        let gen = match self.cfg.grpo.think_prune {
            Some(_) => {
                let mut gen = self.gen.clone();
                gen.max_new_tokens = self.cfg.grpo.step_limit(self.step);
                std::borrow::Cow::Owned(gen)
            }
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
            crate::step::length_control::gfpo_filter(f, &mut c, self.cfg.grpo.group_size)?;
        }
        Ok(c)
    }

    /// Shaped rewards (the trainer's shaper; unscorable samples are invisible to it: they are
    /// filtered here, once per step) and advantages. A non-finite shaped reward stops here, before any update.
    pub fn score(&mut self, c: &Collected) -> Result<Scored> {
        let shaper = &mut self.shaper;
        let ctx = StepCtx {
            step: self.step,
            seed: self.cfg.run.seed,
        };
        let groups = &c.groups;
        let shaped = terse_reward::shape_scorable(groups, |gs| shaper.shape(gs, &ctx))?;
        self.check_finite("shaped reward", groups, &shaped.rewards)?;
        let advantages = self.estimator.estimate(groups, &shaped)?;
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
            loss: self.policy_loss.as_ref(),
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
        use crate::phase::{within, Phase};
        let step = self.step;
        let t0 = Instant::now();
        let c = within(step, Phase::Rollout, || self.rollout())?;
        let t_rollout = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let scored = within(step, Phase::Score, || self.score(&c))?;
        let t_score = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let up = within(step, Phase::Train, || self.update(&c, &scored.advantages))?;
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
