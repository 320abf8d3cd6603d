//! metrics.jsonl: one JSON object per step, appended and flushed as the run goes. Resuming
//! truncates lines past the checkpoint's step, so a resumed file equals an uninterrupted one.
//! Wall-clock figures live under the "time" key, the only part that differs between runs.

use anyhow::{Context, Result};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct MetricsWriter {
    path: PathBuf,
    file: std::fs::File,
}

impl MetricsWriter {
    /// Opens for appending after keeping only the lines a run resumed at GRPO step `start`
    /// would have written before it (everything when starting fresh is dropped).
    pub fn open(path: &Path, start: u64) -> Result<Self> {
        let keep: Vec<String> = if start > 0 && path.is_file() {
            std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
                .lines()
                .filter(|l| {
                    let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
                    let step = v["step"].as_u64().unwrap_or(u64::MAX);
                    match v["phase"].as_str() {
                        Some("sft") => true,
                        Some("grpo") => step < start,
                        Some("eval") => step < start || (step == 0 && start > 0),
                        _ => false,
                    }
                })
                .map(str::to_string)
                .collect()
        } else {
            vec![]
        };
        let mut text = keep.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        terse_model::checkpoint::atomic_write(path, text.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn write(&mut self, line: &Value) -> Result<()> {
        writeln!(self.file, "{line}")
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.file.flush()?;
        Ok(())
    }
}

/// The GRPO lines of a metrics file.
pub fn read_grpo(path: &Path) -> Result<Vec<Value>> {
    read_phase(path, "grpo")
}

/// The lines of one phase ("sft", "grpo", "eval") of a metrics file.
pub fn read_phase(path: &Path, phase: &str) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["phase"] == phase)
        .collect())
}
