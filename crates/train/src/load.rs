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
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    // tokenizers 0.23 panics (`expect("Helper")` in the decoder's Deserialize) instead of
    // erring when the JSON breaks off or is malformed inside "decoder", e.g. a tokenizer.json
    // cut short by an interrupted download: the syntax is checked first (found by fuzzing).
    serde_json::from_str::<serde::de::IgnoredAny>(&text)
        .map_err(|e| anyhow::anyhow!("{}: not valid JSON: {e}", path.display()))?;
    // It also panics on some inconsistent files (a BPE merge longer than every token of the
    // vocabulary overruns its buffer, found by fuzzing): building runs under catch_unwind and
    // a panic is an error naming the file (the default hook still prints the panic's line).
    std::panic::catch_unwind(|| text.parse::<tokenizers::Tokenizer>())
        .map_err(|p| {
            let msg = terse_tasks::panic_message(&*p);
            anyhow::anyhow!(
                "{}: the tokenizers crate panicked reading it: {msg}",
                path.display()
            )
        })?
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzzing (terse-fuzz, target tokenizer): a tokenizer.json that breaks off inside its
    /// "decoder" (an interrupted download) made the tokenizers crate panic; it is an error
    /// naming the file.
    #[test]
    fn a_tokenizer_json_cut_inside_its_decoder_is_an_error_not_a_panic() {
        let mut tok: serde_json::Value =
            serde_json::from_str(&terse_tasks::testbed::tokenizer_json()).expect("testbed");
        tok["decoder"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": false, "use_regex": false});
        let text = serde_json::to_string_pretty(&tok).expect("json");
        let cut = &text[..text.find("\"trim_offsets\"").expect("decoder key") + 8];
        let dir = std::env::temp_dir().join(format!("terse-cut-tokenizer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("tokenizer.json"), cut).expect("write");
        let r = std::panic::catch_unwind(|| load_tokenizer(&dir));
        let _ = std::fs::remove_dir_all(&dir);
        let err = r.expect("no panic").expect_err("a cut file is an error");
        assert!(err.to_string().contains("not valid JSON"), "{err}");
        // The whole file still loads.
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("tokenizer.json"), &text).expect("write");
        let whole = load_tokenizer(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        whole.expect("the uncut file loads");
    }

    /// Fuzzing (terse-fuzz, target tokenizer): a BPE merge of two tokens longer together than
    /// every token of the vocabulary made the tokenizers crate overrun its merge buffer (a
    /// panic); it is an error naming the file.
    #[test]
    fn a_bpe_merge_longer_than_every_token_is_an_error_not_a_panic() {
        let tok = |merges: serde_json::Value| {
            serde_json::json!({"version": "1.0", "added_tokens": [], "normalizer": null,
                "pre_tokenizer": null, "post_processor": null, "decoder": null,
                "model": {"type": "BPE", "vocab": {"aaaa": 0, "bbbb": 1, "c": 2, "cc": 3},
                          "merges": merges}})
            .to_string()
        };
        let dir = std::env::temp_dir().join(format!("terse-bpe-merge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("tokenizer.json"), tok(serde_json::json!(["c c"]))).expect("write");
        let good = load_tokenizer(&dir).map(|t| t.get_vocab_size(false));
        std::fs::write(
            dir.join("tokenizer.json"),
            tok(serde_json::json!(["aaaa bbbb"])),
        )
        .expect("write");
        let bad = std::panic::catch_unwind(|| load_tokenizer(&dir));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(good.expect("a consistent merge loads"), 4);
        let err = bad.expect("no panic").expect_err("an overlong merge");
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
    }
}
