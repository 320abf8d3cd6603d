//! The targets that read weights: safetensors files (a model's, an optimizer's: header JSON,
//! header length and data offsets, then the name, shape and dtype checks) and whole checkpoint
//! directories as a resume reads them (state.json, config.json, the weights, optimizer state,
//! tokenizer.json, a sharded index, a LoRA checkpoint's adapter files), one file mutated per
//! input. The committed checkpoint is a real run's step directory (crates/fuzz/corpus/README.md).

use super::{subdir, Ctx, Target};
use crate::corpus::{corpus_root, Input};
use candle_core::{DType, Device, Var};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use terse_optim::{AdamW, AdamWConfig};
use terse_train::step::{encode, load_checkpoint_model, load_tokenizer};
use terse_train::RunConfig;
use terse_train::{checkpoints_newest_first, first_non_finite_weight, last_good};
use terse_train::{read_state, step_name};

/// The committed full checkpoint: its config.json and weights are the safetensors target's
/// model, and the base of the LoRA checkpoint.
fn model_dir() -> PathBuf {
    corpus_root().join("checkpoint")
}

/// safetensors: model and optimizer safetensors files.
pub fn safetensors() -> Target {
    Target {
        name: "safetensors",
        about: "Qwen3::load (checkpoint::read_weights: header, offsets, names, shapes, dtypes \
                against config.json), candle's load_buffer, checkpoint::first_non_finite_weight, \
                AdamW::from_safetensors",
        dict: include_str!("../../dict/safetensors.dict"),
        words: None,
        max_len: 256 << 10,
        planted: false,
        builtin: &[],
        run: run_safetensors,
    }
}

/// The committed model's variables (what an optimizer file must match).
fn model_vars() -> &'static BTreeMap<String, Var> {
    static VARS: OnceLock<BTreeMap<String, Var>> = OnceLock::new();
    VARS.get_or_init(|| {
        terse_model::Qwen3::load(&model_dir(), &Device::Cpu, DType::F32)
            .map(|m| m.vars().clone())
            .unwrap_or_else(|e| panic!("harness: the committed checkpoint does not load: {e}"))
    })
}

fn run_safetensors(input: &Input, ctx: &Ctx) {
    let dir = subdir(ctx, "weights");
    if !dir.join("config.json").is_file() {
        std::fs::copy(model_dir().join("config.json"), dir.join("config.json"))
            .unwrap_or_else(|e| panic!("harness: copying config.json: {e}"));
    }
    ctx.file("weights/model.safetensors", &input.bytes);
    let _ = terse_model::Qwen3::load(&dir, &Device::Cpu, DType::F32);
    let _ = candle_core::safetensors::load_buffer(&input.bytes, &Device::Cpu);
    let _ = first_non_finite_weight(&dir);
    let _ = AdamW::from_safetensors(AdamWConfig::default(), model_vars(), &input.bytes);
}

/// checkpoint: a run's step directory.
pub fn checkpoint() -> Target {
    Target {
        name: "checkpoint",
        about: "a resume's reads of a step directory: checkpoints_newest_first, read_state, the \
                shaper's restore, load_checkpoint_model (config.json, weights or LoRA adapters), \
                first_non_finite, AdamW::from_safetensors, load_tokenizer, last_good",
        dict: include_str!("../../dict/checkpoint.dict"),
        words: None,
        max_len: 256 << 10,
        planted: false,
        builtin: &[],
        run: run_checkpoint,
    }
}

/// Corpus entries that a real checkpoint does not hold: each is added for its own inputs
/// only (a sharded index over the same weights).
const ADDED: &[&str] = &["model.safetensors.index.json"];

/// The prefix of the LoRA checkpoint's entries (`lora--adapter_config.json`).
const LORA: &str = "lora--";

/// Two run directories in the scratch folder, each with one complete checkpoint made from the
/// committed entries once per child: the full one, and the LoRA one (the `lora--` entries:
/// adapter files, its optimizer and state).
struct Runs {
    full: PathBuf,
    lora: PathBuf,
}

fn runs(ctx: &Ctx) -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let make = |name: &str, dest: &dyn Fn(&str) -> Option<String>| {
            let run = subdir(ctx, name);
            let ckpt = run.join(step_name(2));
            std::fs::create_dir_all(&ckpt)
                .unwrap_or_else(|e| panic!("harness: creating {}: {e}", ckpt.display()));
            let entries = std::fs::read_dir(&ctx.corpus_dir)
                .unwrap_or_else(|e| panic!("harness: reading the corpus: {e}"));
            for e in entries.flatten() {
                let file = e.file_name().to_string_lossy().into_owned();
                if let Some(to) = dest(&file) {
                    std::fs::copy(e.path(), ckpt.join(to))
                        .unwrap_or_else(|e| panic!("harness: placing {file}: {e}"));
                }
            }
            std::fs::write(ckpt.join("DONE"), b"").unwrap_or_else(|e| panic!("harness: {e}"));
            run
        };
        let full = make("run", &|f| {
            (!f.starts_with(LORA) && !ADDED.contains(&f)).then(|| f.to_string())
        });
        let lora = make("run-lora", &|f| f.strip_prefix(LORA).map(str::to_string));
        Runs { full, lora }
    })
}

/// The config a resume runs under: Short-RL (its state is in state.json), the committed
/// model as the LoRA base.
fn resume_config() -> &'static RunConfig {
    static CFG: OnceLock<RunConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let text = format!(
            "[model]\npath = {:?}\ninit = \"checkpoint\"\n[reward.shaper]\nmethod = \"short_rl\"\n",
            model_dir().display().to_string()
        );
        RunConfig::from_toml(&text, Path::new("resume.toml"))
            .unwrap_or_else(|e| panic!("harness: the resume config: {e:#}"))
    })
}

fn run_checkpoint(input: &Input, ctx: &Ctx) {
    let runs = runs(ctx);
    let (run, file) = match input.name.strip_prefix(LORA) {
        Some(f) => (&runs.lora, f),
        None => (&runs.full, input.name.as_str()),
    };
    let path = run.join(step_name(2)).join(file);
    let original = std::fs::read(&path).ok();
    std::fs::write(&path, &input.bytes).unwrap_or_else(|e| panic!("harness: {e}"));
    resume(run, resume_config());
    // Put the committed file back (or take the added one away) for the next input.
    match original {
        Some(bytes) => std::fs::write(&path, bytes),
        None => std::fs::remove_file(&path),
    }
    .unwrap_or_else(|e| panic!("harness: restoring {}: {e}", path.display()));
}

/// What a resume reads, in its order (start.rs: the newest complete checkpoint, its state,
/// the shaper's state, the weights, their finiteness, the optimizer), and the tokenizer the
/// run loads beside it; `last_good` is what every stop message names.
fn resume(run: &Path, cfg: &RunConfig) {
    let _ = last_good(Some(run));
    let Ok(ckpts) = checkpoints_newest_first(run) else {
        return;
    };
    for ckpt in ckpts {
        let Ok(state) = read_state(&ckpt) else {
            continue;
        };
        if let Ok(mut shaper) = terse_train::registry::configured_shaper(cfg) {
            let _ = shaper.restore(&state.shaper);
        }
        let Ok(m) = load_checkpoint_model(cfg, &ckpt, &Device::Cpu, DType::F32) else {
            continue;
        };
        let _ = m.first_non_finite();
        if let Ok(bytes) = std::fs::read(ckpt.join("optimizer.safetensors")) {
            let _ = AdamW::from_safetensors(cfg.optim.clone(), m.vars(), &bytes);
        }
        if let Ok(tok) = load_tokenizer(&ckpt) {
            let _ = encode(&tok, "Q x = 3 ; x + 4 = ? A");
        }
    }
}
