//! `cargo xtask eval`: a checkpoint on held-out testbed problems (or a run config's task):
//! pass@1 / pass@k and mean tokens by level, the efficiency metrics, and against a base model the
//! compression rate, AES and pass@k retention; optionally under a sampling protocol (`--protocol
//! r1`) and at token budgets. The work is terse_train::evals::run; this file turns the
//! flags into its config and options and prints eval_table's markdown (and --json's object).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use terse_train::evals::AesWeights;
use terse_train::evals::{EvalOptions, Protocol};
use terse_train::RunConfig;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (HF layout with tokenizer.json), e.g. runs/default/step_000060.
    #[arg(long)]
    model: PathBuf,
    /// A base checkpoint to compare against (compression rate = tokens / base tokens, AES,
    /// pass@k retention).
    #[arg(long)]
    base: Option<PathBuf>,
    /// Testbed levels, comma separated.
    #[arg(long, default_value = "1,2,3,4,5,6", value_delimiter = ',')]
    levels: Vec<usize>,
    /// Held-out problems per level.
    #[arg(long, default_value_t = 32)]
    per_level: usize,
    /// Samples per problem (pass@k uses k = samples; the n of avg@n).
    #[arg(long, default_value_t = 4)]
    samples: usize,
    #[arg(long, default_value_t = 112)]
    max_new_tokens: usize,
    /// Sampling temperature (default 1.0, or the protocol's); given, it overrides the protocol.
    #[arg(long)]
    temperature: Option<f64>,
    /// Nucleus top-p (default 1.0, or the protocol's); given, it overrides the protocol.
    #[arg(long)]
    top_p: Option<f64>,
    /// A sampling protocol: `r1` (DeepSeek-R1's: temperature 0.6, top-p 0.95, --samples per
    /// problem, avg@n), printed in the report header.
    #[arg(long)]
    protocol: Option<Protocol>,
    /// Token budgets, comma separated: sampling stops at the largest; at each budget a
    /// completion still running is cut, an answer is forced and scored (eval_budgets.png).
    #[arg(long, value_delimiter = ',')]
    budgets: Vec<usize>,
    /// AES weight of the relative length saving ΔL.
    #[arg(long, default_value_t = 1.0)]
    aes_alpha: f64,
    /// AES weight of a relative accuracy gain.
    #[arg(long, default_value_t = 3.0)]
    aes_beta_plus: f64,
    /// AES weight of a relative accuracy drop (subtracted).
    #[arg(long, default_value_t = 5.0)]
    aes_beta_minus: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the checkpoints run: "cpu" or "cuda[:N]" (default: the config's `run.device`, or
    /// "cpu" without --config).
    #[arg(long)]
    device: Option<String>,
    #[arg(long)]
    json: bool,
    /// A run config whose [data], [eval] and [grpo] sampling settings to use instead of the
    /// testbed flags above (e.g. configs/eval/math500.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Write eval_accuracy.png and eval_tokens.png (by level, model vs base), and with
    /// --budgets eval_budgets.png (accuracy against the budget), into this folder.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Print the first completion of up to 3 problems per level (to stderr).
    #[arg(long)]
    show: bool,
}

/// The run config the flags (or --config) describe.
fn config(a: &Args) -> Result<RunConfig> {
    let mut cfg = match &a.config {
        Some(p) => RunConfig::from_file(p)?,
        None => {
            let mut cfg = RunConfig::default();
            cfg.run.seed = a.seed;
            cfg.data.levels = a.levels.clone();
            cfg.eval.per_level = a.per_level;
            cfg.eval.samples = a.samples;
            cfg.grpo.max_new_tokens = a.max_new_tokens;
            cfg
        }
    };
    if let Some(d) = &a.device {
        cfg.run.device = d.clone();
    }
    Ok(cfg)
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let opts = EvalOptions {
        protocol: a.protocol,
        temperature: a.temperature,
        top_p: a.top_p,
        budgets: a.budgets.clone(),
        aes: AesWeights {
            alpha: a.aes_alpha,
            beta_plus: a.aes_beta_plus,
            beta_minus: a.aes_beta_minus,
        },
        plots: a.plots.clone(),
    };
    let o = terse_train::evals::run(&config(a)?, &a.model, a.base.as_deref(), &opts)?;
    if a.show {
        for l in &o.model.report.by_level {
            for (text, ok) in &l.examples {
                eprintln!(
                    "level {} [{}] {text}",
                    l.level,
                    if *ok { "correct" } else { "wrong" }
                );
            }
        }
    }
    print!("{}", terse_train::evals::markdown(&o));
    for p in &o.plots {
        eprintln!("wrote {}", p.display());
    }
    if a.json {
        println!("{}", terse_train::evals::json(&o));
    }
    Ok(ExitCode::SUCCESS)
}
