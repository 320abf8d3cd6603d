//! `cargo xtask fake-gpu --fault-campaign CONFIG [--cases K]`: device faults injected by the
//! emulated device (fake_gpu/faults.cpp), each checked to lose nothing. The uninterrupted run
//! of CONFIG first (f32 compute, one rank, then two), counting its allocations, launches and
//! copies; then per case a run with one fault (the Nth allocation out of memory, the Nth launch
//! failing stickily, the Nth copy failing, or rank 1 of 2 killed inside step 2's checkpoint),
//! which must exit non-zero with a last line naming the step, the phase and the cause, leave no
//! partial checkpoint, and whose resume without the fault must write the metrics (but their
//! times) and the final weights of the uninterrupted run, byte for byte.

use super::compare::{read_metrics, resume_violations, variant};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A run of the `cuda` binary on the emulated device: the config and the extra environment.
pub(super) type Launch<'a> = &'a dyn Fn(&Path, usize, &[(&str, String)]) -> Result<Command>;

/// One injected fault.
#[derive(Debug, Clone, PartialEq)]
enum Fault {
    /// TERSE_FAKE_GPU_FAULT=kind:n (alloc, launch, copy).
    Nth(&'static str, u64),
    /// Rank 1 of 2 dies inside step `0`'s checkpoint.
    KillRank(u64),
}

impl Fault {
    fn env(&self) -> (&'static str, String) {
        match self {
            Fault::Nth(k, n) => ("TERSE_FAKE_GPU_FAULT", format!("{k}:{n}")),
            Fault::KillRank(s) => ("TERSE_FAKE_GPU_KILL_RANK", format!("1@{s}:checkpoint")),
        }
    }
    fn ranks(&self) -> usize {
        match self {
            Fault::Nth(..) => 1,
            Fault::KillRank(_) => 2,
        }
    }
    /// What the last line must say besides the step and phase.
    fn cause(&self) -> &'static [&'static str] {
        match self {
            Fault::Nth("alloc", _) => &["CUDA_ERROR_OUT_OF_MEMORY", "the memory plan predicted"],
            Fault::Nth("launch", _) => &["CUDA_ERROR_LAUNCH_FAILED"],
            Fault::Nth(..) => &["CUDA_ERROR_UNKNOWN"],
            Fault::KillRank(_) => &["rank 1 of 2 failed (signal: 9", "(checkpoint)"],
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, v) = self.env();
        write!(f, "{k}={v}")
    }
}

/// What a case came to.
struct Outcome {
    line: String,
    lost_nothing: bool,
    problems: Vec<String>,
}

/// The phases a line may name (crates/train/src/run/phase.rs).
const PHASES: [&str; 6] = ["start", "rollout", "score", "train", "checkpoint", "eval"];

/// Runs the campaign: `cases` = 0 is CI's set (each kind once, at an N in the middle of the
/// run, and the killed rank); more samples that many Ns over the three counted kinds, spread
/// evenly, plus the killed rank. Prints one line per case and the counts.
pub(super) fn campaign(config: &Path, dir: &Path, cases: usize, launch: Launch) -> Result<()> {
    let t0 = Instant::now();
    let counts = dir.join("counts.txt");
    let reference = run_clean(config, dir, "reference", 1, launch, Some(&counts))?;
    let totals = read_counts(&counts)?;
    println!(
        "   uninterrupted: {} allocations, {} launches, {} copies",
        totals[0], totals[1], totals[2]
    );
    let reference_2 = run_clean(config, dir, "reference-2ranks", 2, launch, None)?;
    let mut faults = vec![];
    let kinds = ["alloc", "launch", "copy"];
    if cases == 0 {
        for (k, total) in kinds.iter().zip(totals) {
            faults.push(Fault::Nth(k, total / 2 + 1));
        }
    } else {
        // Spread evenly over the three kinds' whole runs (start, rollouts, updates,
        // checkpoints, evaluations), from a fixed seed so a campaign can be repeated.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for i in 0..cases {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = i % 3;
            faults.push(Fault::Nth(kinds[k], 1 + x % totals[k].max(1)));
        }
    }
    faults.push(Fault::KillRank(2));
    let mut kept = 0;
    let mut bad = vec![];
    let mut by_phase = std::collections::BTreeMap::<String, usize>::new();
    for (i, f) in faults.iter().enumerate() {
        let whole = if f.ranks() == 2 {
            &reference_2
        } else {
            &reference
        };
        let o = one_case(config, dir, f, launch, whole)?;
        let phase = PHASES
            .iter()
            .find(|p| o.line.contains(&format!("({p})")))
            .map_or("none", |p| *p);
        *by_phase.entry(phase.to_string()).or_default() += 1;
        println!(
            "   {}/{} {f}: {} | {}",
            i + 1,
            faults.len(),
            if o.lost_nothing {
                "lost nothing"
            } else {
                "LOST"
            },
            o.line
        );
        if o.lost_nothing {
            kept += 1;
        } else {
            bad.push(format!("{f}: {}", o.problems.join("; ")));
        }
    }
    println!(
        "fake-gpu --fault-campaign: {kept} of {} cases lost nothing (phases hit: {by_phase:?}) in {:.0} s",
        faults.len(),
        t0.elapsed().as_secs_f64()
    );
    if !bad.is_empty() {
        bail!("device faults that lost something:\n{}", bad.join("\n"));
    }
    Ok(())
}

/// Allocation, launch and copy counts of the uninterrupted run (faults.cpp writes them).
fn read_counts(path: &Path) -> Result<[u64; 3]> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = [0u64; 3];
    for (i, key) in ["alloc", "launch", "copy"].iter().enumerate() {
        out[i] = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .with_context(|| format!("{}: no `{key} N` line", path.display()))?;
    }
    Ok(out)
}

/// What a finished run leaves: its metrics and its final weights.
struct Finished {
    metrics: Vec<serde_json::Value>,
    weights: Vec<u8>,
}

fn run_clean(
    config: &Path,
    dir: &Path,
    label: &str,
    ranks: usize,
    launch: Launch,
    counts: Option<&Path>,
) -> Result<Finished> {
    let (file, metrics) = variant(config, dir, device(ranks), "f32", label, "never")?;
    println!("== fake-gpu --fault-campaign: the uninterrupted run, {ranks} rank(s)");
    let env: Vec<(&str, String)> = counts
        .map(|c| ("TERSE_FAKE_GPU_COUNTS_OUT", c.display().to_string()))
        .into_iter()
        .collect();
    let out = launch(&file, ranks, &env)?
        .output()
        .context("running the uninterrupted run")?;
    if !out.status.success() {
        bail!(
            "the uninterrupted run failed ({}): {}",
            out.status,
            last_line(&out.stderr)
        );
    }
    outcome_of(&metrics)
}

fn outcome_of(metrics: &Path) -> Result<Finished> {
    let run = metrics.parent().context("a run directory")?;
    let last = newest_checkpoint(run)?.context("the run left no checkpoint")?;
    Ok(Finished {
        metrics: read_metrics(metrics)?,
        weights: std::fs::read(last.join("model.safetensors"))
            .with_context(|| format!("reading {}", last.display()))?,
    })
}

fn newest_checkpoint(run: &Path) -> Result<Option<PathBuf>> {
    let mut steps: Vec<PathBuf> = std::fs::read_dir(run)
        .with_context(|| format!("listing {}", run.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("step_") && !n.ends_with(".tmp"))
        })
        .collect();
    steps.sort();
    Ok(steps.pop())
}

/// One rank on `cuda:0`; with more, rank r on `cuda:r`.
fn device(ranks: usize) -> &'static str {
    if ranks > 1 {
        "cuda"
    } else {
        "cuda:0"
    }
}

fn last_line(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .to_string()
}

/// One fault: the faulty run, the checks of its line and its run directory, the resume.
fn one_case(
    config: &Path,
    dir: &Path,
    f: &Fault,
    launch: Launch,
    whole: &Finished,
) -> Result<Outcome> {
    let ranks = f.ranks();
    let (file, metrics) = variant(config, dir, device(ranks), "f32", "case", "never")?;
    let run = metrics.parent().context("a run directory")?.to_path_buf();
    let out = launch(&file, ranks, &[f.env()])?
        .output()
        .with_context(|| format!("running with {f}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let line = last_line(&out.stderr);
    let mut problems = vec![];
    if out.status.success() {
        // The fault was absorbed (nothing failed): the run must still be the uninterrupted one.
        problems.extend(compare(whole, &outcome_of(&metrics)?));
        return Ok(Outcome {
            line: "(exited 0: the fault changed nothing)".into(),
            lost_nothing: problems.is_empty(),
            problems,
        });
    }
    problems.extend(check_line(&line, &stderr, f));
    problems.extend(partial_checkpoints(&run)?);
    let (file, metrics) = variant(config, dir, device(ranks), "f32", "case", "auto")?;
    let resumed = launch(&file, ranks, &[])?
        .output()
        .context("resuming without the fault")?;
    if !resumed.status.success() {
        problems.push(format!(
            "the resume failed ({}): {}",
            resumed.status,
            last_line(&resumed.stderr)
        ));
    } else {
        problems.extend(compare(whole, &outcome_of(&metrics)?));
    }
    Ok(Outcome {
        line,
        lost_nothing: problems.is_empty(),
        problems,
    })
}

/// The last line names a step, a phase and the cause; nothing panicked.
fn check_line(line: &str, stderr: &str, f: &Fault) -> Vec<String> {
    let mut out = vec![];
    let step_phase = PHASES.iter().any(|p| {
        line.match_indices(&format!(" ({p})")).any(|(i, _)| {
            line[..i]
                .rsplit("step ")
                .next()
                .is_some_and(|n| n.parse::<u64>().is_ok())
        })
    });
    if !line.starts_with("error: ") || !step_phase {
        out.push(format!("the last line names no step and phase: {line}"));
    }
    for c in f.cause() {
        if !line.contains(c) {
            out.push(format!("the last line does not say `{c}`: {line}"));
        }
    }
    if stderr.contains("panicked") {
        out.push("a panic on stderr".into());
    }
    out
}

/// A `.tmp` directory or a step directory without DONE left in the run directory.
fn partial_checkpoints(run: &Path) -> Result<Vec<String>> {
    let mut out = vec![];
    for e in std::fs::read_dir(run).with_context(|| format!("listing {}", run.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("step_") && (name.ends_with(".tmp") || !p.join("DONE").is_file()) {
            out.push(format!("a partial checkpoint is left: {}", p.display()));
        }
    }
    Ok(out)
}

/// Metrics (but their times) and final weights equal to the uninterrupted run's.
fn compare(whole: &Finished, resumed: &Finished) -> Vec<String> {
    let mut out = resume_violations(&whole.metrics, &resumed.metrics);
    if whole.weights != resumed.weights {
        out.push("the final weights differ from the uninterrupted run's".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line check wants a step, a phase and the kind's cause, and no panic.
    #[test]
    fn a_line_names_step_phase_and_cause() {
        let oom = Fault::Nth("alloc", 7);
        let good = "error: the GPU ran out of memory (the memory plan predicted 0.1 GiB; ...): step 2 (train): DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")";
        assert!(check_line(good, good, &oom).is_empty());
        let no_step = "error: DriverError(CUDA_ERROR_OUT_OF_MEMORY) the memory plan predicted";
        assert_eq!(check_line(no_step, no_step, &oom).len(), 1);
        let launch = Fault::Nth("launch", 3);
        let v = check_line(good, "thread 'main' panicked", &launch);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(oom.env().1, "alloc:7");
        assert_eq!(Fault::KillRank(2).env().1, "1@2:checkpoint");
    }
}
