//! The generated part of the seed corpus, written by `terse-fuzz --write-seeds DIR` and
//! committed under corpus/ (corpus/README.md lists which files come from here): a real run of
//! a tiny testbed Qwen3 through `terse_train::train` (its step directory, metrics.jsonl and
//! resolved config.toml), a LoRA run's checkpoint, the same weights in bf16, and K&K pairs
//! from the puzzle generator. Everything is seeded, so the files regenerate identically except
//! for the wall-clock "time" figures of metrics.jsonl.

use anyhow::{Context, Result};
use std::path::Path;
use terse_tasks::kk;

/// A Qwen3 small enough that its checkpoint is a few kilobytes: the testbed's vocabulary and
/// context, 1 layer of width 16.
fn tiny_config_json() -> String {
    let mut cfg: serde_json::Value =
        serde_json::from_str(&terse_tasks::testbed::model_config_json()).unwrap_or_default();
    for (k, v) in [
        ("hidden_size", 16),
        ("intermediate_size", 32),
        ("num_hidden_layers", 1),
        ("num_attention_heads", 2),
        ("num_key_value_heads", 1),
        ("head_dim", 8),
    ] {
        cfg[k] = v.into();
    }
    serde_json::to_string_pretty(&cfg).unwrap_or_default() + "\n"
}

fn write(path: &Path, bytes: impl AsRef<[u8]>) -> Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write(to, bytes)
}

/// The run config of the corpus runs: SFT, two GRPO steps with Short-RL, an evaluation and a
/// checkpoint after each.
fn run_config(model: &Path, runs: &Path, name: &str, lora: bool) -> Result<terse_train::RunConfig> {
    let text = format!(
        r#"[run]
name = "{name}"
dir = {runs:?}
[model]
path = {model:?}
init = "checkpoint"
{lora}
[data]
task = "testbed"
levels = [1, 2]
[sft]
steps = {sft}
batch_size = 2
[grpo]
steps = 2
prompts_per_step = 2
group_size = 2
max_new_tokens = 24
[reward.shaper]
method = "short_rl"
tau_len = 4
[checkpoint]
every = 1
keep_last = 5
[eval]
every = 1
per_level = 2
samples = 1
"#,
        runs = runs.display().to_string(),
        model = model.display().to_string(),
        lora = if lora { "[model.lora]\nrank = 2" } else { "" },
        sft = if lora { 0 } else { 2 },
    );
    terse_train::RunConfig::from_toml(&text, Path::new("seeds.toml"))
}

/// Writes the generated seeds into `out` (corpus/ layout: one folder per target).
pub fn write_seeds(out: &Path) -> Result<()> {
    let work = out.join("work");
    let model = work.join("tiny-model");
    write(&model.join("config.json"), tiny_config_json())?;
    write(
        &model.join("tokenizer.json"),
        terse_tasks::testbed::tokenizer_json(),
    )?;
    let cfg = terse_model::Config::from_file(&model.join("config.json"))?;
    let dev = candle_core::Device::Cpu;
    let m = terse_model::Qwen3::random(cfg, 0, &dev, candle_core::DType::F32)?;
    m.save(&model, &terse_model::SaveOptions::default())?;

    let runs = work.join("runs");
    terse_train::train(&run_config(&model, &runs, "full", false)?)?;
    terse_train::train(&run_config(&model, &runs, "lora", true)?)?;

    let step = runs.join("full").join(terse_train::step_name(2));
    let ckpt = out.join("checkpoint");
    for f in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
        "tokenizer.json",
    ] {
        copy(&step.join(f), &ckpt.join(f))?;
    }
    // A sharded index over the same weights (one shard), as transformers writes for big models.
    let tensors = candle_core::safetensors::load(step.join("model.safetensors"), &dev)?;
    let map: serde_json::Map<String, serde_json::Value> = tensors
        .keys()
        .map(|k| (k.clone(), "model.safetensors".into()))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    write(
        &ckpt.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index)? + "\n",
    )?;
    let lora = runs.join("lora").join(terse_train::step_name(2));
    for f in [
        "adapter_model.safetensors",
        "optimizer.safetensors",
        "state.json",
    ] {
        copy(&lora.join(f), &ckpt.join(format!("lora--{f}")))?;
    }
    // The base model's path made relative, as in the resolved config below.
    let adapter = std::fs::read_to_string(lora.join("adapter_config.json"))?
        .replace(&model.display().to_string(), "models/tiny");
    write(&ckpt.join("lora--adapter_config.json"), adapter)?;

    let st = out.join("safetensors");
    copy(
        &step.join("model.safetensors"),
        &st.join("model.safetensors"),
    )?;
    copy(
        &step.join("optimizer.safetensors"),
        &st.join("optimizer.safetensors"),
    )?;
    copy(
        &lora.join("adapter_model.safetensors"),
        &st.join("adapter_model.safetensors"),
    )?;
    let bf16 = terse_model::SaveOptions {
        dtype: candle_core::DType::BF16,
        ..Default::default()
    };
    let m = terse_model::Qwen3::load(&step, &dev, candle_core::DType::F32)?;
    m.save(&work.join("bf16"), &bf16)?;
    copy(
        &work.join("bf16").join("model.safetensors"),
        &st.join("model-bf16.safetensors"),
    )?;

    copy(
        &runs.join("full").join("metrics.jsonl"),
        &out.join("metrics").join("run.jsonl"),
    )?;
    // The resolved config with the scratch paths made relative, so the file names no machine.
    let resolved = std::fs::read_to_string(runs.join("full").join("config.toml"))?
        .replace(&runs.display().to_string(), "runs")
        .replace(&model.display().to_string(), "models/tiny");
    write(&out.join("config").join("resolved-run.toml"), resolved)?;
    copy(
        &step.join("tokenizer.json"),
        &out.join("tokenizer").join("testbed.json"),
    )?;
    write_kk(out)?;
    std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))
}

/// K&K seeds: for 2 to 8 people a generated puzzle's solution with three completions (right,
/// one role wrong, tags broken), in the two prompt formats Logic-RL uses; and a JSONL dataset
/// in Logic-RL's columns.
fn write_kk(out: &Path) -> Result<()> {
    let mut rows = String::new();
    for n in 2..=8usize {
        let p = kk::generate(n, n as u64);
        let truth = p.solution_text();
        let mut wrong = truth.clone();
        wrong = if wrong.contains("knight") {
            wrong.replacen("knight", "knave", 1)
        } else {
            wrong.replacen("knave", "knight", 1)
        };
        let chat = |answer: &str| {
            format!(
                "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>Check each claim.</think><answer>{answer}</answer><|im_end|>",
                p.quiz()
            )
        };
        let base = |answer: &str| {
            format!("User:{}\nAssistant: <think>Suppose the first is a knight.</think> <answer> {answer} </answer>", p.quiz())
        };
        let cases = [
            ("right", chat(&truth)),
            ("wrong", base(&wrong)),
            (
                "tags",
                format!("Assistant: <answer>{truth}</answer><think></think>"),
            ),
        ];
        for (label, completion) in cases {
            write(
                &out.join("kk").join(format!("p{n}-{label}.txt")),
                format!("{completion}\n#### solution\n{truth}"),
            )?;
        }
        if n <= 4 {
            let row = serde_json::json!({"quiz": p.quiz(), "solution_text_format": truth});
            rows.push_str(&format!("{row}\n"));
        }
    }
    write(&out.join("dataset").join("kk.jsonl"), rows)
}
