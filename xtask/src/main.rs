//! `cargo xtask ...`: terse's command line. Parses arguments, calls the libraries, prints.
//! The only crate besides the trainer that touches the filesystem or the terminal.

mod bench;
mod check_model;
mod mem;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[global_allocator]
static ALLOC: mem::Counting = mem::Counting;

#[derive(Parser)]
#[command(name = "xtask", about = "terse: length-aware GRPO for Qwen3, in Rust")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train with a TOML run config (default: configs/default.toml, the CPU testbed).
    Train {
        /// Run config.
        #[arg(long, default_value = "configs/default.toml")]
        config: String,
    },
    /// Compare a checkpoint in HF layout against a reference file written by transformers.
    CheckModel(check_model::Args),
    /// Write the CPU testbed's tokenizer.json and config.json (models/testbed by default).
    MakeTestbed {
        #[arg(long, default_value = "models/testbed")]
        out: std::path::PathBuf,
    },
    /// Benchmarks; `bench model` measures the training forward/backward and the log-prob path.
    Bench {
        #[command(subcommand)]
        what: bench::What,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().cmd {
        Cmd::Train { config } => train(&config),
        Cmd::CheckModel(args) => check_model::run(&args),
        Cmd::Bench { what } => bench::run(&what),
        Cmd::MakeTestbed { out } => make_testbed(&out),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One line: the whole context chain joined by ": ", without the backtrace candle
            // appends to its errors when RUST_BACKTRACE is set.
            let msg = format!("{e:#}");
            eprintln!("error: {}", msg.lines().next().unwrap_or_default());
            ExitCode::FAILURE
        }
    }
}

/// Until the GRPO trainer lands, `train` says exactly what exists and what does not; it never
/// pretends to train.
fn train(config: &str) -> anyhow::Result<ExitCode> {
    eprintln!(
        "terse train ({config}): the trainer is not built yet.\n\
         Built so far: the Qwen3 model crate (HF checkpoints in/out, training forward with fused\n\
         log-probs, KV-cache inference), `cargo xtask check-model` and `cargo xtask bench model`.\n\
         Not built yet: rollout sampler, length-aware rewards, optimizer, tasks/testbed, GRPO loop."
    );
    Ok(ExitCode::from(2))
}

/// Writes the testbed model recipe; the committed files in models/testbed are its output.
fn make_testbed(out: &std::path::Path) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use terse_tasks::testbed::{model_config_json, tokenizer_json};
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (name, text) in [
        ("tokenizer.json", tokenizer_json()),
        ("config.json", model_config_json()),
    ] {
        let path = out.join(name);
        terse_model::checkpoint::atomic_write(&path, text.as_bytes())?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
