//! Each section of the run config checks itself (`validate`), and `RunConfig::validate`
//! (mod.rs) calls them in the file's order. Every error is one line naming the key and its
//! value. The length methods' checks of `[grpo]` are in length.rs.

use super::{
    DataSection, EvalSection, GrpoSection, ModelSection, RunSection, SftSection, TaskKind,
};
use anyhow::{bail, Result};

impl RunSection {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.lock_wait_s < 0.0 {
            bail!("run.lock_wait_s must be >= 0, got {}", self.lock_wait_s);
        }
        Ok(())
    }
}

impl ModelSection {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(l) = &self.lora {
            l.to_config()?;
        }
        Ok(())
    }
}

impl GrpoSection {
    /// `has_train`: whether `data.train` names a file (`data_epochs` counts its rows).
    pub(crate) fn validate(&self, has_train: bool) -> Result<()> {
        self.validate_sizes()?;
        self.validate_loss()?;
        self.paging
            .validate()
            .map_err(|e| anyhow::anyhow!("grpo.{e}"))?;
        self.sampling.validate().map_err(anyhow::Error::msg)?;
        if let Some(e) = self.data_epochs {
            if !(e > 0.0 && e.is_finite() && has_train) {
                bail!("grpo.data_epochs = {e}: needs a number > 0 and a data.train file");
            }
        }
        self.validate_length_methods()?;
        self.schedule
            .validate()
            .map_err(|e| anyhow::anyhow!("grpo.{e}"))
    }

    /// The step's shape: group size, counts and token budgets.
    fn validate_sizes(&self) -> Result<()> {
        if self.group_size < 2 {
            bail!("grpo.group_size must be >= 2, got {}", self.group_size);
        }
        if self.prompts_per_step == 0
            || self.max_new_tokens == 0
            || self.micro_batch_tokens == 0
            || self.epochs == 0
            || self.mini_batch_prompts == Some(0)
        {
            bail!("grpo.prompts_per_step, max_new_tokens, micro_batch_tokens, epochs and mini_batch_prompts must be > 0");
        }
        Ok(())
    }

    /// The policy loss's clips, rollout correction, KL and gradient clip.
    fn validate_loss(&self) -> Result<()> {
        if self.loss_params.is_some() && self.loss.builtin().is_some() {
            bail!(
                "grpo.loss_params is for a registered grpo.loss; a built-in loss ({}) is configured by [grpo]'s own keys",
                super::builtin_losses().join(", ")
            );
        }
        if !(0.0..1.0).contains(&self.gspo_clip_low) || self.gspo_clip_high < 0.0 {
            bail!(
                "grpo.gspo_clip_low must be in [0, 1) and gspo_clip_high >= 0, got {} and {}",
                self.gspo_clip_low,
                self.gspo_clip_high
            );
        }
        if let Some(rc) = &self.rollout_correction {
            if rc.cap <= 1.0 {
                bail!("grpo.rollout_correction.cap must be > 1, got {}", rc.cap);
            }
        }
        if !(0.0..1.0).contains(&self.clip_low) || self.clip_high < 0.0 {
            bail!(
                "grpo.clip_low must be in [0, 1) and clip_high >= 0, got {} and {}",
                self.clip_low,
                self.clip_high
            );
        }
        if let Some(c) = self.dual_clip {
            if c <= 1.0 {
                bail!("grpo.dual_clip must be > 1, got {c}");
            }
        }
        if !(self.kl_coef >= 0.0 && self.kl_coef.is_finite()) {
            bail!(
                "grpo.kl_coef must be a finite number >= 0, got {}",
                self.kl_coef
            );
        }
        if self.grad_clip.is_nan() || self.grad_clip <= 0.0 {
            bail!("grpo.grad_clip must be > 0, got {}", self.grad_clip);
        }
        Ok(())
    }
}

impl SftSection {
    /// `task`: SFT warm-up needs the testbed's teacher traces.
    pub(crate) fn validate(&self, task: TaskKind) -> Result<()> {
        if self.steps > 0 {
            self.schedule
                .validate()
                .map_err(|e| anyhow::anyhow!("sft.{e}"))?;
        }
        if task != TaskKind::Testbed && self.steps > 0 {
            bail!(
                "sft.steps = {}: SFT warm-up needs teacher traces, which only data.task = \"testbed\" has; set sft.steps = 0",
                self.steps
            );
        }
        Ok(())
    }
}

impl DataSection {
    pub(crate) fn validate(&self) -> Result<()> {
        for (key, v) in [
            ("recheck_prob", self.recheck_prob),
            ("hard_rate", self.hard_rate),
            ("recheck_hard_prob", self.recheck_hard_prob.unwrap_or(0.0)),
            ("overturn_easy", self.overturn_easy),
            ("overturn_hard", self.overturn_hard),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail!("data.{key} = {v}: must be a probability in [0, 1]");
            }
        }
        for (key, v) in [
            ("overturn_by_level", &self.overturn_by_level),
            ("verified_by_level", &self.verified_by_level),
        ] {
            let Some(v) = v else { continue };
            if let Some(x) = v.iter().find(|x| !(0.0..=1.0).contains(*x)) {
                bail!("data.{key} has {x}: each must be a probability in [0, 1]");
            }
            let top = self.levels.iter().copied().max().unwrap_or(0);
            if v.len() < top {
                bail!(
                    "data.{key} has {} values but data.levels reaches {top}: give one per level from 1",
                    v.len()
                );
            }
        }
        if let Some(n) = self.chain_length {
            let max = terse_tasks::testbed::MAX_LEVEL;
            if !(1..=max).contains(&n) {
                bail!("data.chain_length = {n}: a testbed chain has 1 to {max} operations");
            }
        }
        if self.overturn_from_round == 0 {
            bail!("data.overturn_from_round = 0: rounds count from 1");
        }
        let generated =
            self.task == TaskKind::Testbed || (self.task == TaskKind::Kk && self.train.is_none());
        if generated {
            self.validate_levels()?;
        }
        Ok(())
    }

    /// The levels of generated problems exist for the task.
    fn validate_levels(&self) -> Result<()> {
        let max_level = match self.task {
            TaskKind::Testbed => terse_tasks::testbed::MAX_LEVEL,
            TaskKind::Kk | TaskKind::Math => 8,
        };
        let min_level = if self.task == TaskKind::Kk { 2 } else { 1 };
        if self.levels.is_empty() {
            bail!("data.levels must not be empty");
        }
        if let Some(l) = self
            .levels
            .iter()
            .find(|l| !(min_level..=max_level).contains(*l))
        {
            bail!("data.levels: level {l} is outside {min_level}..={max_level}");
        }
        Ok(())
    }

    /// Whether the held-out set is generated (so `eval.per_level` sizes it) rather than a file.
    pub(crate) fn generated_eval(&self) -> bool {
        self.task == TaskKind::Testbed || (self.task == TaskKind::Kk && self.eval.is_none())
    }
}

impl EvalSection {
    /// `generated`: whether the held-out problems are generated (`per_level` sizes them; a
    /// dataset's eval file has its own size).
    pub(crate) fn validate(&self, generated: bool) -> Result<()> {
        if generated && self.per_level == 0 {
            bail!("eval.per_level (--per-level) must be > 0 for generated problems, got 0");
        }
        if self.samples == 0 {
            bail!("eval.samples (--samples) must be > 0, got 0");
        }
        Ok(())
    }
}
