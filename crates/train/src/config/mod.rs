//! The run configuration: one TOML file, every field defaulted and documented, unknown keys
//! rejected, validated into the resolved config that is saved with the run. The sections and
//! their closed enums (the TOML face) live in sections.rs and grpo.rs.

mod checks;
mod device;
pub mod docs;
mod grpo;
mod length;
mod registered;
mod sections;

pub use grpo::*;
pub use registered::{builtin_estimators, builtin_losses, builtin_shapers, Choice, Chosen};
pub use sections::*;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use terse_optim::AdamWConfig;
use terse_reward::Advantage;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub run: RunSection,
    pub model: ModelSection,
    pub data: DataSection,
    pub sft: SftSection,
    pub grpo: GrpoSection,
    pub reward: RewardSection,
    /// The advantage estimator: a built-in `Advantage` or a registered one by
    /// `advantage.estimator` (registered.rs).
    pub advantage: Chosen<Advantage>,
    pub optim: AdamWConfig,
    pub checkpoint: CheckpointSection,
    pub eval: EvalSection,
    pub log: LogSection,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            run: RunSection::default(),
            model: ModelSection::default(),
            data: DataSection::default(),
            sft: SftSection::default(),
            grpo: GrpoSection::default(),
            reward: RewardSection::default(),
            advantage: Chosen::default(),
            optim: AdamWConfig {
                weight_decay: 0.0,
                ..AdamWConfig::default()
            },
            checkpoint: CheckpointSection::default(),
            eval: EvalSection::default(),
            log: LogSection::default(),
        }
    }
}

impl RunConfig {
    /// Parses TOML; errors name the file and the key.
    /// Every `l_max` the file leaves out is `grpo.max_new_tokens` (length.rs).
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let at = |e: String| anyhow::anyhow!("{}: {e}", origin.display());
        let raw: toml::Table = toml::from_str(text)
            .map_err(|e: toml::de::Error| at(e.message().trim().to_string()))?;
        if let Some(e) = moved_key(&raw) {
            bail!("{}: {e}", origin.display());
        }
        let mut cfg = Self::parse(text).map_err(at)?;
        cfg.default_l_max(&raw);
        cfg.validate()
            .with_context(|| origin.display().to_string())?;
        Ok(cfg)
    }

    /// Parses TOML without validating (the resolved config rank 0 sends).
    pub(crate) fn parse(text: &str) -> std::result::Result<Self, String> {
        toml::from_str(text).map_err(|e: toml::de::Error| e.message().trim().to_string())
    }

    /// The config as TOML, registered methods at their keys: what `parse` reads back.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string_pretty(self).context("serialising the config")
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading run config {}", path.display()))?;
        Self::from_toml(&text, path)
    }

    /// Checks every section (each validates itself, checks.rs) and the reward, advantage and
    /// optimizer sections of the other crates; the error names the key and its value.
    pub fn validate(&self) -> Result<()> {
        // Every float key, wherever it sits: NaN compares false, so `nan` would silently switch
        // a limit off (`clip_high`, `dual_clip`, `log_ratio_clamp`, ...).
        let tree = toml::Value::try_from(self).context("serialising the config")?;
        if let Some((key, v)) = non_finite(&tree, "") {
            bail!("{key} must be a finite number, got {v}");
        }
        self.run.validate()?;
        self.model.validate()?;
        self.grpo.validate(self.data.train.is_some())?;
        self.reward
            .builtin()
            .validate()
            .map_err(|e| anyhow::anyhow!("reward.{e}"))?;
        if let Chosen::Builtin(a) = &self.advantage {
            a.validate().map_err(anyhow::Error::msg)?;
        }
        self.optim
            .validate()
            .map_err(|e| anyhow::anyhow!("optim.{}", e.to_string().trim_start_matches("adamw.")))?;
        self.data.validate()?;
        self.sft.validate(self.data.task)?;
        self.eval.validate(self.data.generated_eval())
    }
}

/// The keys a config may no longer set, each with the one that replaced it.
const MOVED: [(&[&str], &str); 1] = [(
    &["grpo", "step_exit", "triggers"],
    "grpo.step_triggers (Step-GRPO's one trigger list: the step reward, the exit and eval's reflections)",
)];

/// The first moved key `raw` sets, as a one-line error naming its replacement.
fn moved_key(raw: &toml::Table) -> Option<String> {
    if raw.contains_key("plugins") {
        return Some("[plugins] is gone: name a registered shaper in reward.shaper.method, an estimator in advantage.estimator and a loss in grpo.loss (the other keys of their tables, and [grpo.loss_params] for a loss, go to the factory)".into());
    }
    MOVED.iter().find_map(|(path, new)| {
        let (last, parents) = path.split_last()?;
        let mut t = raw;
        for k in parents {
            t = t.get(*k)?.as_table()?;
        }
        t.contains_key(*last)
            .then(|| format!("{} is no longer a key: set {new}", path.join(".")))
    })
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
