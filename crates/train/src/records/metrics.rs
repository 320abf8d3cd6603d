//! metrics.jsonl: one JSON object per step, appended (one write call, fsynced) as the run goes.
//! Resuming keeps exactly the lines the resumed process will not write again, so a resumed file
//! equals an uninterrupted one.
//! Wall-clock figures live under the "time" key, the only part that differs between runs.

use anyhow::{Context, Result};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct MetricsWriter {
    path: PathBuf,
    file: std::fs::File,
}

/// Where a run starts, for deciding which lines of an existing metrics file stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// No checkpoint: every line is dropped (the run writes them all again).
    Fresh,
    /// Resumed from the checkpoint of GRPO step `start` (0: after SFT, before any GRPO step)
    /// of a run of `steps` steps that evaluates every `eval_every` steps (0: at the ends only).
    Resumed {
        start: u64,
        steps: u64,
        eval_every: u64,
    },
    /// A finished run evaluated again: every line stays, the evaluation is appended.
    Finished,
}

/// Whether a line written before a stop is kept when the run resumes at `start`: exactly the
/// lines the resumed process will not write again. SFT lines always (SFT ran before step 0's
/// checkpoint); GRPO lines before `start`; evaluations before `start` (the one before the first
/// step among them when `start > 0`), and the one at `start` itself when this run evaluates
/// mid-run there (the loop writes it after saving `start`'s checkpoint; a resume that finds it
/// missing writes it). An evaluation at `start` that was the end of a shorter run is dropped.
fn kept(v: &Value, start: u64, steps: u64, eval_every: u64) -> bool {
    let step = v["step"].as_u64().unwrap_or(u64::MAX);
    match v["phase"].as_str() {
        Some("sft") => true,
        Some("grpo") => step < start,
        Some("eval") => step < start || (step == start && mid_run_eval(start, steps, eval_every)),
        _ => false,
    }
}

/// Whether a run of `steps` steps evaluating every `every` writes an evaluation inside its loop
/// after step `done` (the first and the last evaluation are written outside it).
pub fn mid_run_eval(done: u64, steps: u64, every: u64) -> bool {
    every > 0 && done > 0 && done.is_multiple_of(every) && done < steps
}

impl MetricsWriter {
    /// Opens for appending after keeping the lines a resumed run does not write again (see
    /// [`kept`]); returns the steps of the evaluation lines kept.
    pub fn open(path: &Path, start: Start) -> Result<(Self, Vec<u64>)> {
        if start == Start::Finished {
            return Ok((Self::append(path)?, vec![]));
        }
        let keep: Vec<(String, Value)> = match start {
            Start::Resumed {
                start,
                steps,
                eval_every,
            } if path.is_file() => std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?
                .lines()
                .filter_map(|l| Some((l.to_string(), serde_json::from_str::<Value>(l).ok()?)))
                .filter(|(_, v)| kept(v, start, steps, eval_every))
                .collect(),
            _ => vec![],
        };
        let evals = keep
            .iter()
            .filter(|(_, v)| v["phase"] == "eval")
            .filter_map(|(_, v)| v["step"].as_u64())
            .collect();
        let text: String = keep.iter().map(|(l, _)| format!("{l}\n")).collect();
        terse_model::checkpoint::atomic_write(path, text.as_bytes())?;
        Ok((Self::append(path)?, evals))
    }

    /// The file as it is, opened for appending.
    fn append(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends one line in one write call and syncs it: a line is on disk or absent, never cut.
    pub fn write(&mut self, line: &crate::report::MetricsLine) -> Result<()> {
        write_line(&mut self.file, line)
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

/// The line and its newline in one `write_all` of one buffer (`writeln!` on a `File` issues a
/// write per formatted piece: ~200 for a GRPO line).
fn write_line(w: &mut impl Write, line: &impl serde::Serialize) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line)?;
    text.push('\n');
    w.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the write calls a writer receives.
    #[derive(Default)]
    struct Calls(Vec<usize>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.push(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Issue 15 item 11: a metrics line reaches the file in one write call.
    #[test]
    fn item11_a_line_is_one_write() {
        let line = serde_json::json!({"phase": "grpo", "step": 3, "reward": 0.5,
            "time": {"rollout_s": 1.0}, "by_level": [{"level": 1, "pass1": 0.25}]});
        let mut w = Calls::default();
        write_line(&mut w, &line).expect("write");
        assert_eq!(w.0, vec![line.to_string().len() + 1]);
    }

    /// Issue 15 item 10: which lines a resume keeps (exactly those it will not write again).
    #[test]
    fn item10_resume_keeps_what_it_does_not_rewrite() {
        let l = |phase: &str, step: u64| serde_json::json!({"phase": phase, "step": step});
        // Resumed at step 0 (a stop between step_000000 and step_000001): SFT lines stay, the
        // step-0 evaluation is written again.
        assert!(kept(&l("sft", 5), 0, 4, 2));
        assert!(!kept(&l("eval", 0), 0, 4, 2));
        // At step 2 of 4: the mid-run evaluation at 2 stays (a missing one is written again).
        assert!(kept(&l("eval", 2), 2, 4, 2) && kept(&l("grpo", 1), 2, 4, 2));
        assert!(!kept(&l("grpo", 2), 2, 4, 2));
        // Without mid-run evaluations, an evaluation at 2 was the end of a 2-step run: dropped.
        assert!(!kept(&l("eval", 2), 2, 4, 0));
        // At the end: the final evaluation is written again.
        assert!(!kept(&l("eval", 4), 4, 4, 2) && kept(&l("eval", 0), 4, 4, 2));
    }
}
