//! `cargo run -p terse-fuzz -- [--target NAME]... [--inputs 10000] [--seed N] [--hang-ms 1000]
//! [--mem-gb 1]`: every parser's fuzz target (or the named ones) for a bounded number of inputs,
//! each in child processes of this same binary (`--child`); one line per target with its
//! time, one line per finding naming the saved input; exit 1 on any finding. `--replay FILE`
//! runs a saved input in this process, `--dump N` saves input N; `--list` prints the targets;
//! `--write-seeds DIR` writes the generated part of the corpus.

use anyhow::{Context, Result};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use terse_fuzz::{child, corpus, harness, seeds, targets, Input};

// Counts live bytes so a child can refuse an allocation over --mem-gb (limits.rs).
#[global_allocator]
static ALLOC: terse_fuzz::limits::Counting = terse_fuzz::limits::Counting;

#[derive(Parser, Debug)]
#[command(
    name = "terse-fuzz",
    about = "Fuzz terse's parsers (stable toolchain, seeded)."
)]
struct Args {
    /// A target to run (repeatable); default: every parser's target.
    #[arg(long = "target")]
    targets: Vec<String>,
    /// Inputs per target (the unchanged seeds first, then mutants).
    #[arg(long, default_value_t = 10_000)]
    inputs: u64,
    /// The mutator's seed: input i of a target is a function of (seed, target, i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One input running longer than this is a hang.
    #[arg(long, default_value_t = 1000)]
    hang_ms: u64,
    /// Live heap above this many GiB is a finding (the allocation is refused).
    #[arg(long, default_value_t = 1.0)]
    mem_gb: f64,
    /// Where findings' inputs are saved (one folder per target).
    #[arg(long)]
    findings: Option<PathBuf>,
    /// A target stops after this many findings.
    #[arg(long, default_value_t = 20)]
    max_findings: usize,
    /// Targets run at once (each in its own child process); default: the CPU count.
    #[arg(long)]
    jobs: Option<usize>,
    /// Run one saved input of the (one) --target in this process and report.
    #[arg(long)]
    replay: Option<PathBuf>,
    /// Save input N of the (one) --target to the findings folder and print its path (a slow
    /// input to replay, say).
    #[arg(long)]
    dump: Option<u64>,
    /// List the targets and the entry points they call.
    #[arg(long)]
    list: bool,
    /// Write the generated seeds (a tiny run's files, K&K pairs) into this folder.
    #[arg(long)]
    write_seeds: Option<PathBuf>,
    #[arg(long, hide = true)]
    child: bool,
    #[arg(long, hide = true, default_value_t = 0)]
    start: u64,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("terse-fuzz: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn named(name: &str) -> Result<targets::Target> {
    targets::find(name).with_context(|| {
        let names: Vec<_> = targets::all().iter().map(|t| t.name).collect();
        format!("no target `{name}` (targets: {})", names.join(", "))
    })
}

fn run(a: Args) -> Result<ExitCode> {
    if a.list {
        for t in targets::all() {
            let kind = if t.planted { " (planted)" } else { "" };
            println!(
                "{}{kind}: {}",
                t.name,
                t.about.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = &a.write_seeds {
        seeds::write_seeds(dir)?;
        println!("seeds written to {}", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let chosen: Vec<targets::Target> = if a.targets.is_empty() {
        targets::all().into_iter().filter(|t| !t.planted).collect()
    } else {
        a.targets.iter().map(|n| named(n)).collect::<Result<_>>()?
    };
    if a.child {
        let [t] = chosen.as_slice() else {
            anyhow::bail!("--child runs exactly one --target");
        };
        let plan = child::Plan {
            seed: a.seed,
            start: a.start,
            end: a.inputs,
            hang: Duration::from_millis(a.hang_ms),
            mem_bytes: (a.mem_gb * (1u64 << 30) as f64) as usize,
        };
        child::run(t, &plan)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(file) = &a.replay {
        let [t] = chosen.as_slice() else {
            anyhow::bail!("--replay runs exactly one --target");
        };
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let input = Input {
            name: corpus::input_name(file),
            bytes,
        };
        child::replay(t, &input)?;
        return Ok(ExitCode::SUCCESS);
    }
    let findings = a.findings.unwrap_or_else(|| {
        corpus::workspace_root()
            .join("target")
            .join("fuzz-findings")
    });
    if let Some(i) = a.dump {
        let [t] = chosen.as_slice() else {
            anyhow::bail!("--dump takes exactly one --target");
        };
        let corpus = t.corpus()?;
        let dictionary = t.dictionary(&corpus);
        let m = terse_fuzz::mutate::Mutator {
            corpus: &corpus,
            dictionary: &dictionary,
            max_len: t.max_len,
        };
        let input = m.input(t.name, a.seed, i);
        let name = format!("input-s{}-i{i}--{}", a.seed, input.name);
        let path = corpus::save_finding(&findings.join(t.name), &name, &input.bytes)?;
        println!("{}", path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let opts = harness::Options {
        inputs: a.inputs,
        seed: a.seed,
        hang_ms: a.hang_ms,
        mem_gb: a.mem_gb,
        findings,
        max_findings: a.max_findings,
    };
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let reports = harness::run_all(&chosen, &opts, jobs.max(1))?;
    let findings: usize = reports.iter().map(|r| r.findings.len()).sum();
    let secs: f64 = reports.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    println!(
        "terse-fuzz: {} targets, {findings} findings ({secs:.1} s of target time, seed {})",
        reports.len(),
        opts.seed
    );
    Ok(if findings == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
