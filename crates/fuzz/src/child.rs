//! The child process: runs one target over a range of inputs under the limits of limits.rs,
//! telling the parent on stdout which input it starts before running it, so whatever kills
//! the process (an abort, a stack overflow, the watchdog) leaves the culprit's index behind.
//! Protocol, one line each: `@fuzz start <i>`, `@fuzz panic <i> <message>`, `@fuzz oom <i>
//! <bytes>`, `@fuzz hang <i> <ms>` (the watchdog, just before it aborts), `@fuzz done <n>
//! <slowest input's µs> <its index>`.

use crate::corpus::Input;
use crate::limits;
use crate::mutate::Mutator;
use crate::targets::{Ctx, Target};
use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// The prefix of protocol lines (anything else a library prints is ignored).
pub const TAG: &str = "@fuzz ";

/// What one child runs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    /// Inputs `start..end`.
    pub start: u64,
    pub end: u64,
    pub hang: Duration,
    pub mem_bytes: usize,
}

/// Stack size of the thread the target runs on: Linux's default main-thread stack, where
/// `xtask train` parses and scores. Fixed, so a stack overflow does not depend on `ulimit -s`.
const STACK: usize = 8 << 20;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The parent reads this pipe; if it is gone there is nobody to tell.
    let _ = writeln!(out, "{TAG}{line}");
    let _ = out.flush();
}

fn report_hang(index: u64, ran: Duration) {
    say(&format!("hang {index} {}", ran.as_millis()));
}

/// The scratch folder of process `pid` running `target`: on tmpfs when there is one (the
/// checkpoint and metrics targets fsync). The child removes it when it ends, the parent when
/// the child died.
pub fn scratch_path(target: &str, pid: u32) -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    let root = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    root.join(format!("terse-fuzz-{target}-{pid}"))
}

fn scratch_dir(target: &str) -> Result<PathBuf> {
    let dir = scratch_path(target, std::process::id());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Runs `t` over the plan's inputs; returns when every input ran (findings were reported on
/// the way), or never (the process aborts on a hang, an abort or a stack overflow).
pub fn run(t: &Target, plan: &Plan) -> Result<()> {
    let corpus = t.corpus()?;
    let dictionary = t.dictionary(&corpus);
    let scratch = scratch_dir(t.name)?;
    let ctx = Ctx {
        scratch: scratch.clone(),
        corpus_dir: t.corpus_dir(),
    };
    limits::quiet_panics();
    limits::set_memory_limit(limits::live_bytes().saturating_add(plan.mem_bytes));
    limits::start_watchdog(plan.hang, report_hang);
    let run = t.run;
    let name = t.name;
    let plan = plan.clone();
    let max_len = t.max_len;
    let worker = std::thread::Builder::new()
        .name(format!("fuzz-{name}"))
        .stack_size(STACK)
        .spawn(move || {
            let m = Mutator {
                corpus: &corpus,
                dictionary: &dictionary,
                max_len,
            };
            let mut slowest = (Duration::ZERO, plan.start);
            for i in plan.start..plan.end {
                let input = m.input(name, plan.seed, i);
                let took = one(run, &input, &ctx, i);
                slowest = slowest.max((took, i));
            }
            let (took, at) = slowest;
            say(&format!(
                "done {} {} {at}",
                plan.end - plan.start,
                took.as_micros()
            ));
        })
        .context("starting the target's thread")?;
    let joined = worker.join();
    let _ = std::fs::remove_dir_all(&scratch);
    joined.map_err(|_| anyhow::anyhow!("the target's thread panicked outside an input"))
}

/// One input: announced, timed by the watchdog, panics caught and reported, a refused
/// allocation reported even when the parser survived it. Returns how long it ran.
fn one(run: fn(&Input, &Ctx), input: &Input, ctx: &Ctx, i: u64) -> Duration {
    say(&format!("start {i}"));
    limits::begin_input(i);
    let started = std::time::Instant::now();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(input, ctx)));
    let took = started.elapsed();
    limits::end_input();
    if r.is_err() {
        let msg = limits::take_panic().replace(['\n', '\r'], " ");
        say(&format!("panic {i} {msg}"));
    }
    if let Some(bytes) = limits::take_refused() {
        say(&format!("oom {i} {bytes}"));
    }
    took
}

/// Runs one saved input in this process (`--replay`): the panic surfaces as it is, with its
/// backtrace, for debugging a finding.
pub fn replay(t: &Target, input: &Input) -> Result<()> {
    let scratch = scratch_dir(t.name)?;
    let ctx = Ctx {
        scratch: scratch.clone(),
        corpus_dir: t.corpus_dir(),
    };
    let started = std::time::Instant::now();
    (t.run)(input, &ctx);
    eprintln!(
        "{}: {} ({} bytes) ran in {:.3} s without a crash",
        t.name,
        input.name,
        input.bytes.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
