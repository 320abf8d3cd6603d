//! metrics.jsonl: one JSON object per step, appended (one write call, fsynced) as the run goes,
//! through `terse_model::disk` (the I/O layer the crash-consistency test records). Resuming keeps
//! exactly the lines the resumed process will not write again (rewritten by
//! `disk::atomic_write`), so a resumed file equals an uninterrupted one.
//! Wall-clock figures live under the "time" key, the only part that differs between runs.

use anyhow::{Context, Result};
use serde_json::Value;
use std::path::Path;
use terse_model::disk::Appender;

pub struct MetricsWriter {
    file: Appender,
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
            } if path.is_file() => whole_lines(
                &std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?,
            )
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
        terse_model::disk::atomic_write(path, text.as_bytes())?;
        Ok((Self::append(path)?, evals))
    }

    /// The file as it is, opened for appending (and synced: what an earlier process appended
    /// is on disk before this one adds to it).
    fn append(path: &Path) -> Result<Self> {
        let mut file = Appender::open(path, false)?;
        file.sync()?;
        Ok(Self { file })
    }

    /// Appends one line in one write call and syncs it: a line is on disk or absent, never cut.
    pub fn write(&mut self, line: &crate::report::MetricsLine) -> Result<()> {
        let text = line_text(line)?;
        self.file.append(text.as_bytes())?;
        Ok(self.file.sync()?)
    }
}

/// The lines of a metrics file that were written whole: a last line without its newline is a
/// write a crash cut (even one that happens to parse), and counts as not written.
pub(crate) fn whole_lines(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
}

/// The line and its newline, one buffer for one write call (`writeln!` on a `File` issues a
/// write per formatted piece: ~200 for a GRPO line).
fn line_text(line: &impl serde::Serialize) -> Result<String> {
    let mut text = serde_json::to_string(line).context("a metrics line as JSON")?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15 item 11: a metrics line reaches the file in one write call, then one fsync
    /// (as `terse_model::disk` records them).
    #[test]
    fn item11_a_line_is_one_write() {
        let dir =
            std::env::temp_dir().join(format!("terse-metrics-one-write-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("metrics.jsonl");
        let (mut w, _) = MetricsWriter::open(&path, Start::Fresh).expect("open");
        let line = crate::report::MetricsLine::Sft(crate::report::SftReport {
            step: 3,
            loss: 0.5,
            ..Default::default()
        });
        let ((), ops) = terse_model::disk::record(|| w.write(&line).expect("write"));
        let text = format!("{}\n", serde_json::to_string(&line).expect("json"));
        use terse_model::disk::Op;
        assert_eq!(
            ops,
            [
                Op::Write {
                    path: path.clone(),
                    offset: 0,
                    bytes: text.clone().into_bytes()
                },
                Op::Fsync(path.clone())
            ]
        );
        assert_eq!(std::fs::read_to_string(&path).expect("read"), text);
        std::fs::remove_dir_all(&dir).expect("clean");
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
