//! Run checkpoints: `step_000020/` with HF-layout weights (+ tokenizer), optimizer state and
//! state.json, written into a temporary directory that is renamed into place, DONE last; resume
//! takes the newest directory with DONE; keep-last-N pruning (step 0, the GRPO start and KL
//! reference, is always kept). Every file and the directory are fsynced before DONE is
//! written, and DONE and the rename are fsynced too: after a power loss a checkpoint marked DONE
//! has all its files on disk.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use terse_model::{Qwen3, SaveOptions};
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
    let extra = |tmp: &Path| -> Result<()> {
        std::fs::write(tmp.join("optimizer.safetensors"), opt.to_safetensors()?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(state)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        // Everything on disk before the marker that says so.
        sync_tree(tmp)?;
        std::fs::write(tmp.join("DONE"), b"")
            .with_context(|| format!("writing {}", tmp.display()))?;
        sync_path(&tmp.join("DONE"))?;
        sync_path(tmp)
    };
    save_model_dir(&run_dir.join(step_name(step)), model, model_src, extra)
}

/// Writes an HF-layout model directory (weights, config, the source's tokenizer files, then
/// whatever `extra` adds) into `<dir>.tmp` and renames it over `dir`.
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
        std::fs::remove_dir_all(&tmp)
            .with_context(|| format!("removing stale {}", tmp.display()))?;
    }
    model.save(&tmp, &SaveOptions::default())?;
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        if model_src.join(f).is_file() {
            std::fs::copy(model_src.join(f), tmp.join(f))
                .with_context(|| format!("copying {f} into {}", tmp.display()))?;
        }
    }
    extra(&tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("replacing {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("renaming {} into place", tmp.display()))?;
    if let Some(parent) = dir.parent() {
        sync_path(parent)?;
    }
    Ok(dir.to_path_buf())
}

/// fsync of one file or directory (a directory's entries: creations and renames).
pub fn sync_path(p: &Path) -> Result<()> {
    std::fs::File::open(p)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", p.display()))
}

/// fsync of every file directly in `dir`, then of `dir` itself.
fn sync_tree(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let p = e?.path();
        if p.is_file() {
            sync_path(&p)?;
        }
    }
    sync_path(dir)
}

/// Where a stopped run can restart: the newest complete checkpoint, named for error messages.
pub fn last_good(run_dir: &Path) -> String {
    match complete_steps(run_dir).ok().and_then(|mut s| s.pop()) {
        Some((_, p)) => format!("the last good checkpoint is {}", p.display()),
        None => format!("{} holds no complete checkpoint", run_dir.display()),
    }
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

/// The newest complete checkpoint and its state; directories without DONE are ignored.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<(PathBuf, TrainState)>> {
    match complete_steps(run_dir)?.pop() {
        Some((_, p)) => {
            let text = std::fs::read_to_string(p.join("state.json"))
                .with_context(|| format!("reading {}", p.display()))?;
            let state: TrainState = serde_json::from_str(&text)
                .with_context(|| format!("{}/state.json", p.display()))?;
            Ok(Some((p, state)))
        }
        None => Ok(None),
    }
}

/// Deletes all but the newest `keep` complete checkpoints (step 0 always stays).
pub fn prune(run_dir: &Path, keep: usize) -> Result<()> {
    let steps: Vec<(u64, PathBuf)> = complete_steps(run_dir)?
        .into_iter()
        .filter(|(s, _)| *s > 0)
        .collect();
    let n = steps.len().saturating_sub(keep.max(1));
    for (_, p) in &steps[..n] {
        std::fs::remove_dir_all(p).with_context(|| format!("pruning {}", p.display()))?;
    }
    Ok(())
}
