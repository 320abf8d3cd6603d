//! A run's last failure, remembered across resumes so that a deterministic failure is named,
//! not looped. Sampling is deterministic by design (a sample's tokens depend only on the seed,
//! the prompt id, the sample index and the model), so a step that failed on its input fails
//! again on every resume. run/run_loop.rs records each failure of the step loop in
//! `<run>/last_failure.json`; a failure at the same step with the same error as the recorded
//! one says so, and names the completion when the error carries one (`SampleFault`). A run
//! that finishes removes the record. Written and removed through `terse_model::disk`.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file under the run directory.
const FILE: &str = "last_failure.json";

/// An error caused by one completion: which step, prompt and sample. Raised where a step
/// stops on a sample's value (a non-finite reward or advantage); the loop finds it in the
/// error's chain.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleFault {
    pub step: u64,
    pub prompt_id: u64,
    pub sample: usize,
    pub message: String,
}

impl std::fmt::Display for SampleFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SampleFault {}

/// What `last_failure.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    step: u64,
    error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prompt_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sample: Option<usize>,
}

/// Records `err` (the step loop failed at `step`) in `dir` and returns the error to report:
/// unchanged the first time; when the previous run failed at the same step the same way, with
/// a first line saying so and naming the completion when known. A record that cannot be
/// written is a warning: the original error is what matters.
pub fn record(dir: &Path, step: u64, err: anyhow::Error) -> anyhow::Error {
    let fault = err
        .chain()
        .find_map(|c| c.downcast_ref::<SampleFault>())
        .cloned();
    let now = Record {
        step,
        error: format!("{err:#}"),
        prompt_id: fault.as_ref().map(|f| f.prompt_id),
        sample: fault.as_ref().map(|f| f.sample),
    };
    let before: Option<Record> = std::fs::read_to_string(dir.join(FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    if let Err(e) = write(dir, &now) {
        tracing::warn!("{e:#}");
    }
    if before.as_ref() != Some(&now) {
        return err;
    }
    let input = match (now.prompt_id, now.sample) {
        (Some(p), Some(s)) => format!(
            "the input that causes it is prompt {p}, sample {s} (its tokens depend only on the seed, the prompt and the sample index, so every resume regenerates it)"
        ),
        _ => "the failure is deterministic: resuming again will not help".into(),
    };
    err.context(format!(
        "step {step} failed the same way on resume; {input}"
    ))
}

/// The run finished: no failure to remember.
pub fn clear(dir: &Path) -> Result<()> {
    Ok(terse_model::disk::remove_file(&dir.join(FILE))?)
}

fn write(dir: &Path, r: &Record) -> Result<()> {
    let text = serde_json::to_string_pretty(r).context("serialising the failure record")?;
    terse_model::disk::atomic_write(&dir.join(FILE), text.as_bytes())
        .with_context(|| format!("writing {}", dir.join(FILE).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("terse-failure-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch");
        d
    }

    fn fault(step: u64) -> anyhow::Error {
        anyhow::Error::new(SampleFault {
            step,
            prompt_id: 17,
            sample: 3,
            message: format!("step {step}: non-finite shaped reward NaN"),
        })
    }

    /// The first failure is reported as it is; the same failure at the same step on resume
    /// names the sample; a different step or error is a new failure; a finished run forgets.
    #[test]
    fn a_repeated_failure_names_its_sample() {
        let d = scratch("repeat");
        let first = format!("{:#}", record(&d, 4, fault(4)));
        assert_eq!(first, "step 4: non-finite shaped reward NaN");
        let again = format!("{:#}", record(&d, 4, fault(4)));
        assert!(
            again.starts_with("step 4 failed the same way on resume; the input that causes it is prompt 17, sample 3"),
            "{again}"
        );
        assert!(again.ends_with("non-finite shaped reward NaN"), "{again}");
        // Another step: a new failure, reported plainly.
        let other = format!("{:#}", record(&d, 5, fault(5)));
        assert!(!other.contains("same way"), "{other}");
        // An error without a sample still says it repeats.
        let plain = || anyhow::anyhow!("loss is NaN");
        let _ = record(&d, 6, plain());
        let again = format!("{:#}", record(&d, 6, plain()));
        assert!(again.contains("deterministic"), "{again}");
        clear(&d).expect("clear");
        assert!(!d.join(FILE).exists());
        clear(&d).expect("clearing nothing is fine");
        let fresh = format!("{:#}", record(&d, 6, plain()));
        assert_eq!(fresh, "loss is NaN");
    }
}
