//! `cargo xtask eval`: a checkpoint on held-out testbed problems (or a run config's task): pass@1 / pass@k and mean
//! tokens by level, and the compression rate against a base model when one is given. Prints a
//! markdown table; with --json the last line is one JSON object.

use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use terse_train::eval::{evaluate, EvalReport};
use terse_train::RunConfig;

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (HF layout with tokenizer.json), e.g. runs/default/step_000060.
    #[arg(long)]
    model: PathBuf,
    /// A base checkpoint to compare against (compression rate = tokens / base tokens).
    #[arg(long)]
    base: Option<PathBuf>,
    /// Testbed levels, comma separated.
    #[arg(long, default_value = "1,2,3,4,5,6", value_delimiter = ',')]
    levels: Vec<usize>,
    /// Held-out problems per level.
    #[arg(long, default_value_t = 32)]
    per_level: usize,
    /// Samples per problem (pass@k uses k = samples).
    #[arg(long, default_value_t = 4)]
    samples: usize,
    #[arg(long, default_value_t = 112)]
    max_new_tokens: usize,
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long)]
    json: bool,
    /// A run config whose [data], [eval] and [grpo] sampling settings to use instead of the
    /// testbed flags above (e.g. a K&K or math dataset).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Write eval_accuracy.png and eval_tokens.png (by level, model vs base) into this folder.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Print the first completion of up to 3 problems per level (to stderr).
    #[arg(long)]
    show: bool,
}

fn run_eval(a: &Args, model_dir: &Path) -> Result<EvalReport> {
    let mut cfg = match &a.config {
        Some(p) => RunConfig::from_file(p)?,
        None => {
            let mut cfg = RunConfig::default();
            cfg.run.seed = a.seed;
            cfg.run.device = a.device.clone();
            cfg.data.levels = a.levels.clone();
            cfg.eval.per_level = a.per_level;
            cfg.eval.samples = a.samples;
            cfg.grpo.max_new_tokens = a.max_new_tokens;
            cfg.grpo.sampling.temperature = a.temperature;
            cfg
        }
    };
    cfg.model.path = model_dir.to_path_buf();
    cfg.model.init = terse_train::config::Init::Checkpoint;
    cfg.sft.steps = 0;
    cfg.validate()?;
    let task = terse_train::task::Task::new(&cfg.data, model_dir, cfg.run.seed)?;
    let (dev, dtype) = terse_model::device::select(&a.device)?;
    let model = terse_model::Qwen3::load(model_dir, &dev, dtype)?;
    let tok = terse_train::run::load_tokenizer(model_dir)?;
    evaluate(&cfg, &task, &model, &tok)
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let r = run_eval(a, &a.model)?;
    let base = a.base.as_ref().map(|b| run_eval(a, b)).transpose()?;
    if a.show {
        for l in &r.by_level {
            for (text, ok) in &l.examples {
                eprintln!(
                    "level {} [{}] {text}",
                    l.level,
                    if *ok { "correct" } else { "wrong" }
                );
            }
        }
    }
    let k = a.samples;
    println!(
        "| level | pass@1 | pass@{k} | tokens |{}",
        if base.is_some() {
            " base pass@1 | base tokens | CR |"
        } else {
            ""
        }
    );
    println!(
        "|---|---|---|---|{}",
        if base.is_some() { "---|---|---|" } else { "" }
    );
    for (i, l) in r.by_level.iter().enumerate() {
        let extra = base.as_ref().map_or(String::new(), |b| {
            let bl = &b.by_level[i];
            format!(
                " {:.3} | {:.1} | {:.1}% |",
                bl.pass1,
                bl.len_mean,
                100.0 * terse_reward::metrics::compression_rate(l.len_mean, bl.len_mean)
            )
        });
        println!(
            "| {} | {:.3} | {:.3} | {:.1} |{extra}",
            l.level, l.pass1, l.pass_k, l.len_mean
        );
    }
    let overall_cr = base
        .as_ref()
        .map(|b| terse_reward::metrics::compression_rate(r.len_mean, b.len_mean));
    println!(
        "| all | {:.3} | - | {:.1} |{}",
        r.accuracy,
        r.len_mean,
        base.as_ref().map_or(String::new(), |b| format!(
            " {:.3} | {:.1} | {:.1}% |",
            b.accuracy,
            b.len_mean,
            100.0 * overall_cr.unwrap_or(0.0)
        ))
    );
    if let Some(dir) = &a.plots {
        std::fs::create_dir_all(dir)?;
        let mut reports = vec![("model".to_string(), &r)];
        if let Some(b) = &base {
            reports.push(("base".to_string(), b));
        }
        for p in terse_train::plot::plot_eval(dir, &reports)? {
            eprintln!("wrote {}", p.display());
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::json!({"model": r, "base": base, "compression_rate": overall_cr})
        );
    }
    Ok(ExitCode::SUCCESS)
}
