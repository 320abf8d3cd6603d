//! What a run reads before it starts: the tokenizer every text passes through, text to ids,
//! and the configured starting model. Shared by the run, SFT, evaluation and rollouts.

use crate::config::RunConfig;
use crate::data;
use anyhow::{bail, Context, Result};
use std::path::Path;
use terse_model::Qwen3;

/// The tokenizer every text passes through.
pub fn load_tokenizer(model_dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = model_dir.join("tokenizer.json");
    if !path.is_file() {
        bail!(
            "model directory {} has no tokenizer.json",
            model_dir.display()
        );
    }
    tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

pub fn encode(tok: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tok
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?
        .get_ids()
        .to_vec())
}

/// The configured starting model: `model.init = "random"` draws it from the run seed (the
/// testbed), `"checkpoint"` loads `model.path`.
pub fn init_model(
    cfg: &RunConfig,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Qwen3> {
    let mut m = if cfg.model.init == crate::config::Init::Random {
        let config = terse_model::Config::from_file(&cfg.model.path.join("config.json"))?;
        Qwen3::random(config, data::mix(cfg.run.seed, 0, 0), dev, dtype)?
    } else {
        Qwen3::load(&cfg.model.path, dev, dtype)?
    };
    m.options = cfg.model.forward_options(dev);
    add_configured_lora(cfg, &mut m)?;
    Ok(m)
}

/// Fresh adapters of `[model.lora]` on `m` (nothing without the section): A from the run's
/// seed, B zero, so a fresh LoRA run starts at the base model.
pub fn add_configured_lora(cfg: &RunConfig, m: &mut Qwen3) -> Result<()> {
    if let Some(l) = &cfg.model.lora {
        m.add_lora(l.to_config()?, data::mix(cfg.run.seed, 0, 1))?;
    }
    Ok(())
}

/// Whether the run loads a separate KL reference: a KL term without LoRA (with LoRA the
/// reference is the policy with its adapters off).
pub fn needs_reference(cfg: &RunConfig) -> bool {
    cfg.grpo.kl_coef > 0.0 && cfg.model.lora.is_none()
}

/// The policy a checkpoint holds: its own weights, or (a LoRA run's checkpoint, which holds
/// the adapters only) the run's base model with the checkpoint's adapters.
pub fn load_checkpoint_model(
    cfg: &RunConfig,
    ckpt: &std::path::Path,
    dev: &candle_core::Device,
    dtype: candle_core::DType,
) -> Result<Qwen3> {
    let mut m = if ckpt.join("adapter_config.json").is_file() {
        let mut m = Qwen3::load(&cfg.model.path, dev, dtype)
            .with_context(|| format!("loading the LoRA base {}", cfg.model.path.display()))?;
        m.load_adapter(ckpt)
            .with_context(|| format!("loading the adapters of {}", ckpt.display()))?;
        m
    } else {
        Qwen3::load(ckpt, dev, dtype)?
    };
    m.options = cfg.model.forward_options(dev);
    Ok(m)
}
