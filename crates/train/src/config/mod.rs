//! The run configuration: one TOML file, every field defaulted and documented, unknown keys
//! rejected, validated into the resolved config that is saved with the run. The sections and
//! their closed enums (the TOML face) live in sections.rs and grpo.rs.

mod device;
pub mod docs;
mod grpo;
mod length;
mod registered;
mod sections;

pub use grpo::*;
pub use registered::{Choice, Registered, BUILTIN_ESTIMATORS, BUILTIN_LOSSES, BUILTIN_SHAPERS};
pub use sections::*;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use terse_optim::AdamWConfig;
use terse_reward::{Advantage, RewardConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub run: RunSection,
    pub model: ModelSection,
    pub data: DataSection,
    pub sft: SftSection,
    pub grpo: GrpoSection,
    pub reward: RewardConfig,
    pub advantage: Advantage,
    pub optim: AdamWConfig,
    pub checkpoint: CheckpointSection,
    pub eval: EvalSection,
    pub log: LogSection,
    /// Research code's registered methods, chosen by `reward.shaper.method`,
    /// `advantage.estimator` and `grpo.loss` (registered.rs): taken out of the TOML before the
    /// typed sections read it, and put back by `to_toml`.
    #[serde(skip)]
    pub(crate) registered: Registered,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            run: RunSection::default(),
            model: ModelSection::default(),
            data: DataSection::default(),
            sft: SftSection::default(),
            grpo: GrpoSection::default(),
            reward: RewardConfig::default(),
            advantage: Advantage::default(),
            optim: AdamWConfig {
                weight_decay: 0.0,
                ..AdamWConfig::default()
            },
            checkpoint: CheckpointSection::default(),
            eval: EvalSection::default(),
            log: LogSection::default(),
            registered: Registered::default(),
        }
    }
}

impl RunConfig {
    /// Parses TOML; errors name the file and the key.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg = Self::parse(text).map_err(|e| anyhow::anyhow!("{}: {e}", origin.display()))?;
        cfg.validate()
            .with_context(|| origin.display().to_string())?;
        Ok(cfg)
    }

    /// Parses TOML without validating (the resolved config rank 0 sends): registered methods
    /// are taken out of their keys first (registered.rs); a config that names none is read
    /// as written.
    pub(crate) fn parse(text: &str) -> std::result::Result<Self, String> {
        let message = |e: toml::de::Error| e.message().trim().to_string();
        let mut table: toml::Table = toml::from_str(text).map_err(message)?;
        let registered = registered::take(&mut table)?;
        let mut cfg: RunConfig = if registered == Registered::default() {
            toml::from_str(text).map_err(message)?
        } else {
            table.try_into().map_err(message)?
        };
        cfg.registered = registered;
        Ok(cfg)
    }

    /// The config as TOML, registered methods at their keys: what `parse` reads back.
    pub fn to_toml(&self) -> Result<String> {
        if self.registered == Registered::default() {
            return toml::to_string_pretty(self).context("serialising the config");
        }
        let mut table = toml::Table::try_from(self).context("serialising the config")?;
        registered::put(&mut table, &self.registered);
        toml::to_string_pretty(&table).context("serialising the config")
    }

    /// The registered methods this config chooses.
    pub fn registered(&self) -> &Registered {
        &self.registered
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading run config {}", path.display()))?;
        Self::from_toml(&text, path)
    }

    pub fn validate(&self) -> Result<()> {
        // Every float key, wherever it sits: NaN compares false, so `nan` would silently switch
        // a limit off (`clip_high`, `dual_clip`, `log_ratio_clamp`, ...).
        let tree = toml::Value::try_from(self).context("serialising the config")?;
        if let Some((key, v)) = non_finite(&tree, "") {
            bail!("{key} must be a finite number, got {v}");
        }
        if self.run.lock_wait_s < 0.0 {
            bail!("run.lock_wait_s must be >= 0, got {}", self.run.lock_wait_s);
        }
        let g = &self.grpo;
        if g.group_size < 2 {
            bail!("grpo.group_size must be >= 2, got {}", g.group_size);
        }
        if g.prompts_per_step == 0
            || g.max_new_tokens == 0
            || g.micro_batch_tokens == 0
            || g.epochs == 0
            || g.mini_batch_prompts == Some(0)
        {
            bail!("grpo.prompts_per_step, max_new_tokens, micro_batch_tokens, epochs and mini_batch_prompts must be > 0");
        }
        if !(0.0..1.0).contains(&g.gspo_clip_low) || g.gspo_clip_high < 0.0 {
            bail!(
                "grpo.gspo_clip_low must be in [0, 1) and gspo_clip_high >= 0, got {} and {}",
                g.gspo_clip_low,
                g.gspo_clip_high
            );
        }
        if let Some(l) = &self.model.lora {
            l.to_config()?;
        }
        if let Some(rc) = &g.rollout_correction {
            if rc.cap <= 1.0 {
                bail!("grpo.rollout_correction.cap must be > 1, got {}", rc.cap);
            }
        }
        if !(0.0..1.0).contains(&g.clip_low) || g.clip_high < 0.0 {
            bail!(
                "grpo.clip_low must be in [0, 1) and clip_high >= 0, got {} and {}",
                g.clip_low,
                g.clip_high
            );
        }
        if let Some(c) = g.dual_clip {
            if c <= 1.0 {
                bail!("grpo.dual_clip must be > 1, got {c}");
            }
        }
        g.paging
            .validate()
            .map_err(|e| anyhow::anyhow!("grpo.{e}"))?;
        if !(g.kl_coef >= 0.0 && g.kl_coef.is_finite()) {
            bail!(
                "grpo.kl_coef must be a finite number >= 0, got {}",
                g.kl_coef
            );
        }
        if g.grad_clip.is_nan() || g.grad_clip <= 0.0 {
            bail!("grpo.grad_clip must be > 0, got {}", g.grad_clip);
        }
        g.sampling.validate().map_err(anyhow::Error::msg)?;
        if let Some(e) = g.data_epochs {
            if !(e > 0.0 && e.is_finite()) || self.data.train.is_none() {
                bail!("grpo.data_epochs = {e}: needs a number > 0 and a data.train file");
            }
        }
        if let Some(se) = &g.step_exit {
            se.validate().map_err(|e| anyhow::anyhow!("grpo.{e}"))?;
        }
        g.validate_length_methods()?;
        g.schedule
            .validate()
            .map_err(|e| anyhow::anyhow!("grpo.{e}"))?;
        if self.sft.steps > 0 {
            self.sft
                .schedule
                .validate()
                .map_err(|e| anyhow::anyhow!("sft.{e}"))?;
        }
        self.reward
            .validate()
            .map_err(|e| anyhow::anyhow!("reward.{e}"))?;
        self.advantage.validate().map_err(anyhow::Error::msg)?;
        self.optim
            .validate()
            .map_err(|e| anyhow::anyhow!("optim.{}", e.to_string().trim_start_matches("adamw.")))?;
        let max_level = match self.data.task {
            TaskKind::Testbed => terse_tasks::testbed::MAX_LEVEL,
            TaskKind::Kk | TaskKind::Math => 8,
        };
        let min_level = if self.data.task == TaskKind::Kk { 2 } else { 1 };
        let generated = self.data.task == TaskKind::Testbed
            || (self.data.task == TaskKind::Kk && self.data.train.is_none());
        for (key, v) in [
            ("recheck_prob", self.data.recheck_prob),
            ("hard_rate", self.data.hard_rate),
            (
                "recheck_hard_prob",
                self.data.recheck_hard_prob.unwrap_or(0.0),
            ),
            ("overturn_easy", self.data.overturn_easy),
            ("overturn_hard", self.data.overturn_hard),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail!("data.{key} = {v}: must be a probability in [0, 1]");
            }
        }
        if self.data.overturn_from_round == 0 {
            bail!("data.overturn_from_round = 0: rounds count from 1");
        }
        if generated {
            if self.data.levels.is_empty() {
                bail!("data.levels must not be empty");
            }
            if let Some(l) = self
                .data
                .levels
                .iter()
                .find(|l| !(min_level..=max_level).contains(*l))
            {
                bail!("data.levels: level {l} is outside {min_level}..={max_level}");
            }
        }
        if self.data.task != TaskKind::Testbed && self.sft.steps > 0 {
            bail!(
                "sft.steps = {}: SFT warm-up needs teacher traces, which only data.task = \"testbed\" has; set sft.steps = 0",
                self.sft.steps
            );
        }
        // per_level sizes the generated held-out set (a dataset's eval file has its own size).
        let generated_eval = self.data.task == TaskKind::Testbed
            || (self.data.task == TaskKind::Kk && self.data.eval.is_none());
        if generated_eval && self.eval.per_level == 0 {
            bail!("eval.per_level (--per-level) must be > 0 for generated problems, got 0");
        }
        if self.eval.samples == 0 {
            bail!("eval.samples (--samples) must be > 0, got 0");
        }
        Ok(())
    }
}

/// The dotted key of the first non-finite float under `v`, with its value.
fn non_finite(v: &toml::Value, path: &str) -> Option<(String, f64)> {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        toml::Value::Float(x) if !x.is_finite() => Some((path.to_string(), *x)),
        toml::Value::Table(t) => t.iter().find_map(|(k, x)| non_finite(x, &join(k))),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| non_finite(x, &format!("{path}[{i}]"))),
        _ => None,
    }
}
