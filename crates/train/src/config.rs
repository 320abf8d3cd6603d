//! The run configuration: one TOML file, every field defaulted and documented, unknown keys
//! rejected, validated into the resolved config that is saved with the run.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use terse_optim::{AdamWConfig, Schedule};
use terse_reward::{Advantage, RewardConfig};
use terse_rollout::SamplingParams;

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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Run name: the run directory is `<dir>/<name>`.
    pub name: String,
    pub dir: PathBuf,
    /// Every random stream (init, data, sampling, tie-breaks) derives from this seed.
    pub seed: u64,
    /// "cpu", "cuda" or "cuda:N".
    pub device: String,
    /// "auto": continue from the newest complete checkpoint of the run directory, if any;
    /// "never": start fresh (refusing to overwrite an existing run's metrics).
    pub resume: String,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            name: "default".into(),
            dir: "runs".into(),
            seed: 0,
            device: "cpu".into(),
            resume: "auto".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A directory with config.json and tokenizer.json (and weights unless `init = "random"`).
    pub path: PathBuf,
    /// "checkpoint" loads the weights; "random" initialises from `run.seed` (the testbed).
    pub init: String,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: "models/testbed".into(),
            init: "random".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// "testbed" (generated); other tasks arrive with their datasets.
    pub task: String,
    /// Testbed levels trained and evaluated.
    pub levels: Vec<usize>,
    /// Redundant re-check probability of the SFT teacher.
    pub recheck_prob: f64,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            task: "testbed".into(),
            levels: vec![1, 2, 3, 4, 5, 6],
            recheck_prob: 0.5,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftSection {
    /// Warm-up steps (0 = none).
    pub steps: u64,
    pub batch_size: usize,
    pub schedule: Schedule,
}

impl Default for SftSection {
    fn default() -> Self {
        Self {
            steps: 300,
            batch_size: 32,
            schedule: Schedule {
                peak_lr: 3e-3,
                warmup_steps: 20,
                decay: terse_optim::Decay::Cosine,
                total_steps: 300,
                min_lr: 3e-4,
            },
        }
    }
}

/// How per-token losses become one number (verl's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    TokenMean,
    SeqMeanTokenMean,
    SeqMeanTokenSum,
    SeqMeanTokenSumNorm,
}

/// KL estimator against the reference policy (Schulman's k1, k2, k3 = verl's low_var_kl).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    K1,
    K2,
    K3,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoSection {
    pub steps: u64,
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub schedule: Schedule,
    pub clip_low: f64,
    pub clip_high: f64,
    /// Dual-clip constant c (> 1) bounding the loss of negative advantages; None = off.
    pub dual_clip: Option<f64>,
    /// |log ratio| is clamped to this before exponentiating.
    pub log_ratio_clamp: f64,
    /// β; 0 loads no reference model.
    pub kl_coef: f64,
    pub kl_estimator: KlEstimator,
    pub loss_agg: LossAgg,
    /// The constant length of `seq-mean-token-sum-norm` (Dr.GRPO); default max_new_tokens.
    pub norm_len: Option<usize>,
    /// Tokens per micro-batch (gradient accumulation keeps the loss identical).
    pub micro_batch_tokens: usize,
    pub grad_clip: f64,
}

impl Default for GrpoSection {
    fn default() -> Self {
        Self {
            steps: 60,
            prompts_per_step: 8,
            group_size: 8,
            max_new_tokens: 96,
            sampling: SamplingParams::default(),
            schedule: Schedule {
                peak_lr: 2e-4,
                ..Schedule::default()
            },
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: Some(3.0),
            log_ratio_clamp: 20.0,
            kl_coef: 0.0,
            kl_estimator: KlEstimator::K3,
            loss_agg: LossAgg::TokenMean,
            norm_len: None,
            micro_batch_tokens: 4096,
            grad_clip: 1.0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Save every N GRPO steps (and at the end); 0 = only at the end.
    pub every: u64,
    pub keep_last: usize,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            every: 20,
            keep_last: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Validate every N GRPO steps (and before the first and after the last); 0 = ends only.
    pub every: u64,
    /// Held-out problems per level.
    pub per_level: usize,
    /// Samples per problem (pass@k uses k = n).
    pub samples: usize,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            every: 0,
            per_level: 16,
            samples: 4,
        }
    }
}

impl RunConfig {
    /// Parses TOML; errors name the file and the key.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self> {
        let cfg: RunConfig = toml::from_str(text)
            .map_err(|e| anyhow::anyhow!("{}: {}", origin.display(), e.message().trim()))?;
        cfg.validate()
            .with_context(|| origin.display().to_string())?;
        Ok(cfg)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading run config {}", path.display()))?;
        Self::from_toml(&text, path)
    }

    pub fn validate(&self) -> Result<()> {
        let g = &self.grpo;
        if g.group_size < 2 {
            bail!("grpo.group_size must be >= 2, got {}", g.group_size);
        }
        if g.prompts_per_step == 0 || g.max_new_tokens == 0 || g.micro_batch_tokens == 0 {
            bail!("grpo.prompts_per_step, max_new_tokens and micro_batch_tokens must be > 0");
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
        if self.data.task != "testbed" {
            bail!(
                "data.task `{}` is not supported yet (only `testbed`)",
                self.data.task
            );
        }
        if let Some(l) = self
            .data
            .levels
            .iter()
            .find(|l| !(1..=terse_tasks::testbed::MAX_LEVEL).contains(l))
        {
            bail!(
                "data.levels: level {l} is outside 1..={}",
                terse_tasks::testbed::MAX_LEVEL
            );
        }
        if !["checkpoint", "random"].contains(&self.model.init.as_str()) {
            bail!(
                "model.init must be `checkpoint` or `random`, got `{}`",
                self.model.init
            );
        }
        if !["auto", "never"].contains(&self.run.resume.as_str()) {
            bail!(
                "run.resume must be `auto` or `never`, got `{}`",
                self.run.resume
            );
        }
        Ok(())
    }
}
