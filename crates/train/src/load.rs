//! What a run reads before it starts: the tokenizer every text passes through, text to ids,
//! and the configured starting model. Shared by the run, SFT, evaluation and rollouts.

use crate::config::RunConfig;
use crate::data;
use anyhow::{bail, Result};
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
    Ok(m)
}
