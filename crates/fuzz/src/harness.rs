//! The parent side: runs each target in child processes (the bin re-executed with `--child`),
//! reads their protocol (child.rs), and turns a panic, an oversized allocation, a hang or a
//! dead child into a finding whose input it regenerates from (seed, target, index) and saves
//! to the findings folder. After a crash it starts a new child at the next input, so one bug
//! does not hide the rest of the run; after `max_findings` it stops the target.

use crate::child::TAG;
use crate::corpus::{finding_name, save_finding, Kind};
use crate::mutate::Mutator;
use crate::targets::Target;
use anyhow::{Context, Result};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How a run is configured (the bin's flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub inputs: u64,
    pub seed: u64,
    pub hang_ms: u64,
    pub mem_gb: f64,
    pub findings: PathBuf,
    pub max_findings: usize,
}

/// One finding: what, on which input, and where the input was saved.
#[derive(Debug, Clone)]
pub struct Finding {
    pub target: String,
    pub kind: Kind,
    pub index: u64,
    pub detail: String,
    pub saved: PathBuf,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FINDING {}: {} on input {}: {} (input saved to {})",
            self.target,
            self.kind.label(),
            self.index,
            self.detail,
            self.saved.display()
        )
    }
}

/// What a target's run came to.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: String,
    /// Inputs that ran to their end or to a finding.
    pub inputs: u64,
    pub elapsed: Duration,
    pub findings: Vec<Finding>,
    /// Set when the target stopped at `max_findings`.
    pub stopped_early: bool,
    /// The slowest input that ran to its end, and its index: the margin under `--hang-ms`.
    pub slowest: (Duration, u64),
}

/// Runs `targets` with `jobs` at a time, printing each target's line (and its findings) as it
/// ends; the reports come back in the targets' order.
pub fn run_all(targets: &[Target], opts: &Options, jobs: usize) -> Result<Vec<Report>> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<Result<Report>>>> =
        std::sync::Mutex::new(targets.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(targets.len()) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(t) = targets.get(k) else {
                    return;
                };
                let r = run_target(&exe, t, opts);
                if let Ok(r) = &r {
                    print_report(r, opts.inputs);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[k] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("a target did not run"))))
        .collect()
}

fn print_report(r: &Report, asked: u64) {
    let stop = if r.stopped_early {
        format!(" (stopped at {} of {asked} inputs)", r.inputs)
    } else {
        String::new()
    };
    // Only children that ran to their end report their slowest input.
    let slowest = match r.slowest {
        (t, _) if t.is_zero() => String::new(),
        (t, i) => format!(" (slowest {:.3} s, input {i})", t.as_secs_f64()),
    };
    println!(
        "{}: {} inputs in {:.1} s{slowest}, {} findings{stop}",
        r.target,
        r.inputs,
        r.elapsed.as_secs_f64(),
        r.findings.len()
    );
    for f in &r.findings {
        println!("{f}");
    }
}

/// Events of one child, as the reader thread passes them on.
enum Event {
    Line(String),
    Eof,
}

/// Runs `t` for `opts.inputs` inputs through children of `exe`.
pub fn run_target(exe: &Path, t: &Target, opts: &Options) -> Result<Report> {
    let started = Instant::now();
    let corpus = t.corpus()?;
    let dictionary = t.dictionary(&corpus);
    let mutator = Mutator {
        corpus: &corpus,
        dictionary: &dictionary,
        max_len: t.max_len,
    };
    let mut report = Report {
        target: t.name.to_string(),
        inputs: 0,
        elapsed: Duration::ZERO,
        findings: vec![],
        stopped_early: false,
        slowest: (Duration::ZERO, 0),
    };
    let mut next = 0;
    while next < opts.inputs {
        let budget = opts.max_findings.saturating_sub(report.findings.len());
        let out = run_child(exe, t.name, next, opts, budget)?;
        for (kind, index, detail) in out.findings {
            let input = mutator.input(t.name, opts.seed, index);
            let name = finding_name(kind, opts.seed, index, &input.name);
            let saved = save_finding(&opts.findings.join(t.name), &name, &input.bytes)?;
            report.findings.push(Finding {
                target: t.name.to_string(),
                kind,
                index,
                detail,
                saved,
            });
        }
        next = out.resume_at;
        report.inputs = next;
        report.slowest = report.slowest.max(out.slowest);
        if report.findings.len() >= opts.max_findings && next < opts.inputs {
            report.stopped_early = true;
            break;
        }
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// What one child did: its findings, the input the next child starts at, and its slowest
/// input (reported when it ran to the end).
struct ChildOutcome {
    findings: Vec<(Kind, u64, String)>,
    resume_at: u64,
    slowest: (Duration, u64),
}

/// One child from input `start` on; it is stopped once it has reported `budget` findings.
fn run_child(
    exe: &Path,
    target: &str,
    start: u64,
    opts: &Options,
    budget: usize,
) -> Result<ChildOutcome> {
    let mut child = Command::new(exe)
        .args(["--child", "--target", target])
        .args(["--start", &start.to_string()])
        .args(["--inputs", &opts.inputs.to_string()])
        .args(["--seed", &opts.seed.to_string()])
        .args(["--hang-ms", &opts.hang_ms.to_string()])
        .args(["--mem-gb", &opts.mem_gb.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    // Removed when this call returns: a child that died could not remove it itself.
    let _scratch = RemoveOnDrop(crate::child::scratch_path(target, child.id()));
    let stdout = child.stdout.take().context("child stdout")?;
    let mut stderr = child.stderr.take().context("child stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(Event::Line(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::Eof);
    });
    // Drained on its own thread so a chatty child never blocks on a full pipe; kept to name
    // an abort's cause.
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // The watchdog aborts a hung input itself; this is the backstop for a child so stuck that
    // its watchdog cannot run.
    let silence = Duration::from_millis(opts.hang_ms * 4) + Duration::from_secs(20);
    let mut findings = vec![];
    let mut current: Option<u64> = None;
    let mut hang: Option<(u64, String)> = None;
    let mut done = None;
    let mut killed = false;
    loop {
        match rx.recv_timeout(silence) {
            Ok(Event::Line(l)) => {
                let Some(rest) = l.strip_prefix(TAG) else {
                    continue;
                };
                let mut parts = rest.splitn(3, ' ');
                let (word, idx, tail) = (parts.next(), parts.next(), parts.next());
                let idx = idx.and_then(|s| s.parse::<u64>().ok());
                match (word, idx) {
                    (Some("start"), Some(i)) => current = Some(i),
                    (Some("panic"), Some(i)) => {
                        findings.push((Kind::Panic, i, tail.unwrap_or("").to_string()))
                    }
                    (Some("oom"), Some(i)) => findings.push((
                        Kind::Oom,
                        i,
                        format!(
                            "an allocation of {} bytes over the limit",
                            tail.unwrap_or("?")
                        ),
                    )),
                    (Some("hang"), Some(i)) => {
                        hang = Some((i, format!("ran over {} ms", tail.unwrap_or("?"))))
                    }
                    (Some("done"), _) => {
                        let mut t = tail.unwrap_or("").split(' ').map(|x| x.parse::<u64>());
                        if let (Some(Ok(us)), Some(Ok(at))) = (t.next(), t.next()) {
                            done = Some((Duration::from_micros(us), at));
                        }
                    }
                    _ => {}
                }
                if findings.len() >= budget {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Ok(ChildOutcome {
                        findings,
                        resume_at: current.map_or(start, |i| i + 1),
                        slowest: (Duration::ZERO, start),
                    });
                }
            }
            Ok(Event::Eof) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                killed = true;
                break;
            }
        }
    }
    let status = child.wait().context("waiting for the child")?;
    let stderr = err_reader.join().unwrap_or_default();
    if let (Some(slowest), true) = (done, status.success()) {
        return Ok(ChildOutcome {
            findings,
            resume_at: opts.inputs,
            slowest,
        });
    }
    let Some(i) = hang.as_ref().map(|h| h.0).or(current) else {
        anyhow::bail!(
            "{target}: the child failed before its first input ({status}): {}",
            last_lines(&stderr, 5)
        );
    };
    let (kind, detail) = match hang {
        Some((_, d)) => (Kind::Hang, d),
        None if killed => (Kind::Hang, format!("no output for {} s", silence.as_secs())),
        None => classify(&status, &stderr),
    };
    findings.push((kind, i, detail));
    Ok(ChildOutcome {
        findings,
        resume_at: i + 1,
        slowest: (Duration::ZERO, start),
    })
}

/// A folder removed when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why a child died, from its exit status and what it printed: the runtime's line for a stack
/// overflow or a refused allocation (a backtrace may follow it), else the last lines.
fn classify(status: &std::process::ExitStatus, stderr: &str) -> (Kind, String) {
    let line = |marker: &str| stderr.lines().find(|l| l.contains(marker)).map(str::trim);
    if let Some(l) = line("has overflowed its stack") {
        (Kind::StackOverflow, l.to_string())
    } else if let Some(l) = line("memory allocation of") {
        (Kind::Oom, l.to_string())
    } else {
        (Kind::Abort, format!("{status}; {}", last_lines(stderr, 3)))
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
