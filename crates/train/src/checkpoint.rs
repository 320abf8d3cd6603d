//! Run checkpoints: `<run>/step_000020/` with HF-layout weights (+ tokenizer), optimizer state and
//! state.json, written into a temporary directory that is renamed into place, DONE last; resume
//! takes the newest directory with DONE whose weights are finite (run/start.rs); a checkpoint
//! of non-finite weights is never written; keep-last-N pruning (step 0, the GRPO start and KL
//! reference, is always kept). Every write goes through `terse_model::disk`, in an order that
//! holds against power loss (tests/it/crash_consistency.rs replays every prefix of it): every
//! file and the temporary directory are fsynced before DONE is written, DONE is fsynced, then the
//! rename, then the run directory is fsynced, so a checkpoint marked DONE has all its files on
//! disk and one whose save returned survives. Pruning removes DONE first (made durable) so a
//! half-pruned checkpoint is never taken for a complete one.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use terse_model::{disk, Qwen3, SaveOptions};
use terse_optim::AdamW;

/// What a checkpoint restores besides weights and optimizer: the step, the data cursor and the
/// shaper's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub step: u64,
    pub shaper: serde_json::Value,
    /// Next training item (dynamic sampling draws more than `prompts_per_step` per step).
    #[serde(default)]
    pub data_cursor: Option<u64>,
}

pub fn step_name(step: u64) -> String {
    format!("step_{step:06}")
}

/// Writes the checkpoint of `step` atomically.
pub fn save_checkpoint(
    run_dir: &Path,
    step: u64,
    model: &Qwen3,
    opt: &AdamW,
    state: &TrainState,
    model_src: &Path,
) -> Result<PathBuf> {
    // A checkpoint is a promise that a run can go on from it: never one of non-finite weights.
    if let Some(name) = model.first_non_finite()? {
        anyhow::bail!(
            "step {step}: not writing {}: the weights hold non-finite values (first: {name}); {}",
            run_dir.join(step_name(step)).display(),
            last_good(Some(run_dir))
        );
    }
    let extra = |tmp: &Path| -> Result<()> {
        let state = serde_json::to_string_pretty(state)?;
        let opt = opt.to_safetensors()?;
        // Everything on disk before the marker that says so.
        for (f, bytes) in [
            ("optimizer.safetensors", &opt[..]),
            ("state.json", state.as_bytes()),
        ] {
            disk::write_file(&tmp.join(f), bytes)?;
            disk::sync(&tmp.join(f))?;
        }
        disk::write_file(&tmp.join("DONE"), b"")?;
        disk::sync(&tmp.join("DONE"))?;
        Ok(disk::sync(tmp)?)
    };
    save_model_dir(&run_dir.join(step_name(step)), model, model_src, extra)
}

/// Writes an HF-layout model directory (weights, config, the source's tokenizer files, all
/// fsynced, then whatever `extra` adds) into `<dir>.tmp`, renames it over `dir` and fsyncs the
/// parent: `dir` is durable when this returns.
pub fn save_model_dir(
    dir: &Path,
    model: &Qwen3,
    model_src: &Path,
    extra: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let mut tmp = dir.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if tmp.exists() {
        disk::remove_dir_all(&tmp).context("removing a stale checkpoint")?;
    }
    let write = || -> Result<()> {
        // A LoRA model's checkpoint is its adapters (PEFT's files); the base stays where it is.
        match model.lora() {
            Some(_) => model.save_adapter(&tmp, &model_src.display().to_string())?,
            None => model.save(&tmp, &SaveOptions::default())?,
        }
        // The weights' files are durable already (`disk::atomic_write`); the copies are made so.
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            if model_src.join(f).is_file() {
                disk::copy(&model_src.join(f), &tmp.join(f))
                    .and_then(|()| disk::sync(&tmp.join(f)))
                    .context("copying the tokenizer")?;
            }
        }
        disk::sync(&tmp)?;
        extra(&tmp)
    };
    // A write that fails (a device fault while the weights come off the GPU, a full disk)
    // leaves no half-written directory behind.
    if let Err(e) = write() {
        let _ = disk::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        disk::remove_dir_all(dir).context("replacing a checkpoint")?;
    }
    disk::rename(&tmp, dir).context("renaming a checkpoint into place")?;
    // The rename itself made durable: a checkpoint whose save returned survives a power loss.
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => disk::sync(parent)?,
        _ => disk::sync(Path::new("."))?,
    }
    Ok(dir.to_path_buf())
}

/// A LoRA checkpoint (`ckpt`, adapters of `base`) exported as `out/merged` (the adapted
/// weights merged into the base, HF layout with the base's tokenizer: transformers loads it)
/// and `out/adapter` (PEFT's files). Returns both paths.
pub fn export_lora(ckpt: &Path, base: &Path, out: &Path) -> Result<(PathBuf, PathBuf)> {
    if !ckpt.join("adapter_config.json").is_file() {
        anyhow::bail!(
            "{} holds no adapter_config.json: not a LoRA checkpoint (a full checkpoint is already in HF layout)",
            ckpt.display()
        );
    }
    let dev = candle_core::Device::Cpu;
    let mut m = Qwen3::load(base, &dev, candle_core::DType::F32)
        .with_context(|| format!("loading the base {}", base.display()))?;
    m.load_adapter(ckpt)
        .with_context(|| format!("loading the adapters of {}", ckpt.display()))?;
    let merged = m.merged()?;
    let dir = save_model_dir(&out.join("merged"), &merged, base, |_| Ok(()))?;
    let adapter = out.join("adapter");
    m.save_adapter(&adapter, &base.display().to_string())?;
    Ok((dir, adapter))
}

/// Where a stopped run can restart, for error messages: the newest complete checkpoint whose
/// weights are finite (a checkpoint written by an older build may hold inf weights). Library
/// use without a run directory says so rather than naming an empty path.
pub fn last_good(run_dir: Option<&Path>) -> String {
    let Some(run_dir) = run_dir else {
        return "no checkpoint was written (the trainer has no run directory)".into();
    };
    let good = checkpoints_newest_first(run_dir)
        .unwrap_or_default()
        .into_iter()
        .find(|p| matches!(first_non_finite_weight(p), Ok(None)));
    match good {
        Some(p) => format!("the last good checkpoint is {}", p.display()),
        None => format!(
            "{} holds no complete checkpoint with finite weights",
            run_dir.display()
        ),
    }
}

/// The first tensor of a checkpoint's weight files (every `*.safetensors` but the optimizer's)
/// holding a NaN or an infinity, read on the CPU.
pub fn first_non_finite_weight(dir: &Path) -> Result<Option<String>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "safetensors")
                && p.file_name().is_some_and(|n| n != "optimizer.safetensors")
        })
        .collect();
    files.sort();
    for f in files {
        let tensors = candle_core::safetensors::load(&f, &candle_core::Device::Cpu)
            .with_context(|| format!("reading {}", f.display()))?;
        let mut names: Vec<&String> = tensors.keys().collect();
        names.sort();
        for name in names {
            let t = tensors[name]
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?;
            if t.to_vec1::<f32>()?.iter().any(|x| !x.is_finite()) {
                return Ok(Some(name.clone()));
            }
        }
    }
    Ok(None)
}

fn complete_steps(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = vec![];
    if !run_dir.is_dir() {
        return Ok(out);
    }
    for e in std::fs::read_dir(run_dir).with_context(|| format!("listing {}", run_dir.display()))? {
        let p = e?.path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if let Some(step) = name
            .strip_prefix("step_")
            .and_then(|s| s.parse::<u64>().ok())
        {
            if p.join("DONE").is_file() {
                out.push((step, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The step of the newest complete checkpoint, if any.
pub(crate) fn newest_step(run_dir: &Path) -> Result<Option<u64>> {
    Ok(complete_steps(run_dir)?.last().map(|(s, _)| *s))
}

/// The complete checkpoints (directories with DONE), newest first.
pub fn checkpoints_newest_first(run_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(complete_steps(run_dir)?
        .into_iter()
        .rev()
        .map(|(_, p)| p)
        .collect())
}

/// A checkpoint's state.json.
pub fn read_state(ckpt: &Path) -> Result<TrainState> {
    let text = std::fs::read_to_string(ckpt.join("state.json"))
        .with_context(|| format!("reading {}", ckpt.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}/state.json", ckpt.display()))
}

/// Deletes all but the newest `keep` complete checkpoints (step 0 always stays).
pub fn prune(run_dir: &Path, keep: usize) -> Result<()> {
    let steps: Vec<(u64, PathBuf)> = complete_steps(run_dir)?
        .into_iter()
        .filter(|(s, _)| *s > 0)
        .collect();
    let n = steps.len().saturating_sub(keep.max(1));
    for (_, p) in &steps[..n] {
        // Not complete any more before any of its files goes, whatever a power loss keeps.
        disk::remove_file(&p.join("DONE"))
            .and_then(|()| disk::sync(p))
            .and_then(|()| disk::remove_dir_all(p))
            .context("pruning a checkpoint")?;
    }
    if n > 0 {
        disk::sync(run_dir)?;
    }
    Ok(())
}
