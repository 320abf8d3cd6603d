//! `cargo xtask ...`: terse's command line. Parses arguments, calls the libraries, prints.
//! The only crate besides the trainer that touches the filesystem or the terminal.

mod bench;
mod bench_collective;
mod bench_decode;
mod bench_memory;
mod bench_rollout;
mod bench_step;
mod bench_train;
mod bench_verify;
mod cells;
mod check_model;
mod eval;
mod fake_gpu;
mod gpu;
// gpu-check's `grpo_step` (the `cuda` build); its test runs a tiny shape on the CPU in every build.
mod gpu_grpo;
// gpu-check (the `cuda` build) reads it; its test runs in every build.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod gpu_peers;
// Run by the CUDA build's gpu-check; its driver is tested on every build.
#[cfg(feature = "cuda")]
mod gpu_bench;
#[cfg(feature = "cuda")]
mod gpu_decode_long;
#[cfg(feature = "cuda")]
mod gpu_long;
#[cfg(feature = "cuda")]
mod gpu_nccl;
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod gpu_plan;
#[cfg(feature = "cuda")]
mod gpu_profile;
mod kernel_model;
mod launch;
mod mem;
mod methods;
mod process;
mod report_v4;
mod report_v5;
mod repro;
mod repro_v5;
mod summary;
mod supervise;

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
    /// Train with a TOML run config (default: configs/default.toml, the CPU testbed);
    /// `--nproc N` runs N data-parallel processes on this machine.
    Train {
        /// Run config.
        #[arg(long, default_value = "configs/default.toml")]
        config: String,
        #[command(flatten)]
        ranks: launch::RankArgs,
    },
    /// SFT warm-up only: train on the testbed teacher's traces and save `<run dir>/sft`, a
    /// model directory GRPO runs can start from (model.init = "checkpoint", sft.steps = 0).
    Sft {
        /// Run config (its [run], [model], [data], [sft] sections are used).
        #[arg(long, default_value = "configs/default.toml")]
        config: String,
    },
    /// Evaluate a checkpoint on held-out testbed problems (pass@1/pass@k, tokens, compression
    /// rate against --base), by level.
    Eval(eval::Args),
    /// The reproduction study: every length method x 5 seeds on the CPU testbed from one SFT
    /// checkpoint; writes docs/results.md and the curves.
    Repro(repro::Args),
    /// Install nvcc 13.0 and the CUDA libraries from PyPI wheels into DIR (default
    /// ~/.cache/cuda-13.0) and print the exports a `cuda` build needs.
    CudaToolchain {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Build a release xtask with `cuda` on, stripped (target/gpu/xtask) and compressed
    /// (target/gpu/xtask.xz) to copy to a GPU machine; needs no GPU.
    BuildGpu {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Run the unchanged `cuda` binary on the CPU: builds it and the emulated CUDA device
    /// (fake_gpu/: driver, runtime, cuBLAS, cuRAND and NCCL libraries of the project's own, the
    /// kernels' CPU builds), then runs `xtask <args after -->` on it (docs/gpu.md).
    FakeGpu(fake_gpu::Args),
    /// Write docs/config.md from the config types (a test checks it is current).
    ConfigDocs,
    /// Build the GPU binary (as build-gpu) and print how to run the device check
    /// (scripts/gpu-check.sh) on a GPU machine, and where its report lands.
    GpuSession {
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// The wall-clock limit to plan for; gpu-check's own limit is 60 s less.
        #[arg(long, default_value_t = 480)]
        timeout_s: u64,
    },
    /// On a GPU machine: parity of every CUDA kernel against its CPU reference (f32, bf16, a
    /// whole model), then decode, training and log-prob benchmarks, NCCL and HF generate; a
    /// row out of tolerance is recorded, a step that errs or panics is recorded and a probe of
    /// the context (alloc, copy, sync) decides: only an unusable context stops the check;
    /// writes one JSON report, rewritten after each step.
    GpuCheck {
        #[arg(long, default_value = "gpu-check.json")]
        out: std::path::PathBuf,
        /// Print the parity groups in the order they run, and stop (needs no GPU).
        #[arg(long)]
        list: bool,
        /// Leave out a step: its key or a prefix (`parity`, `parity flash`, `hf_generate`);
        /// repeatable. TERSE_FLASH_TC=0 keeps the tensor-core flash kernels out of every step.
        #[arg(long)]
        skip: Vec<String>,
        /// Seconds the plan may take: a step whose estimate would pass it is skipped.
        #[arg(long, default_value_t = gpu_plan::DEFAULT_LIMIT_S)]
        limit_s: f64,
    },
    /// Compare a checkpoint in HF layout against a reference file written by transformers.
    CheckModel(check_model::Args),
    /// A LoRA run's checkpoint as OUT/merged (the base with the adapters merged, HF layout,
    /// which transformers loads) and OUT/adapter (PEFT's adapter_config.json +
    /// adapter_model.safetensors).
    Export {
        /// The checkpoint (a `step_NNNNNN` directory of a LoRA run).
        #[arg(long)]
        checkpoint: std::path::PathBuf,
        /// The base model the run adapted (its `model.path`).
        #[arg(long)]
        base: std::path::PathBuf,
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Draw a run's metrics.jsonl as PNG curves (length, accuracy, reward, γ_ℓ).
    Plot {
        /// metrics.jsonl of a run.
        metrics: std::path::PathBuf,
        /// Where the PNGs go (default: next to metrics.jsonl).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Write the CPU testbed's tokenizer.json and config.json (models/testbed by default).
    MakeTestbed {
        #[arg(long, default_value = "models/testbed")]
        out: std::path::PathBuf,
    },
    /// The memory plan of a run: every component, whether it fits, the largest micro-batch.
    Plan {
        /// Run config.
        #[arg(long, default_value = "configs/default.toml")]
        config: String,
        /// Memory per GPU in GB (GiB); without it, the plan only adds up.
        #[arg(long)]
        gpu_mem: Option<f64>,
        /// GPUs the run shards its optimizer state over (ZeRO-2).
        #[arg(long, default_value_t = 1)]
        gpus: usize,
        /// Prompt tokens to plan the rollout cache for.
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
    },
    /// CARE's premise read from the testbed teacher a config's SFT checkpoint imitates, before
    /// any run: per level the teacher's pass@1 and length and CARE's direction d of groups of
    /// its traces, and the d = -1 / d = +1 groups per step (docs/v4/plan.md section 7b).
    TeacherPremise {
        /// Run config (its [data] testbed keys, levels, seed and prompts per step).
        #[arg(long)]
        config: String,
        /// Group size (default: the config's grpo.group_size).
        #[arg(long)]
        group: Option<usize>,
        /// Steps to draw (default: the config's grpo.steps).
        #[arg(long)]
        steps: Option<usize>,
        /// The GRPO seed whose training prompts are drawn (default: the config's run.seed; a
        /// v4 study's runs use 100-108).
        #[arg(long)]
        seed: Option<u64>,
        /// Read this many GRPO seeds from --seed on, pooled, and print each seed's margin and
        /// their spread (a one-seed read's margin is partly which prompts that seed draws).
        #[arg(long, default_value_t = 1)]
        seeds: u64,
    },
    /// A performance model of kernels/flash_tc.cu read from its sm_90 SASS: per loop
    /// iteration, instructions, HMMA, shared-memory wavefronts, global accesses; the bound and
    /// the estimated share of the H200's bf16 peak (needs nvcc and nvdisasm: installs them).
    KernelModel {
        /// Check the timing model against the committed H200 measurement
        /// (docs/gpu/measured/2026-12-04/): measured, predicted and error per kernel; fails
        /// when one is past 20 %. Needs no nvcc.
        #[arg(long)]
        check_measured: bool,
    },
    /// Benchmarks; `bench model` measures the training forward/backward and the log-prob path.
    Bench {
        #[command(subcommand)]
        what: bench::What,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Warnings show unless RUST_LOG says otherwise (a config difference noted, a context
        // overflow allowed, ...).
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .from_env_lossy(),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().cmd {
        Cmd::Train { config, ranks } => train(&config, &ranks),
        Cmd::Sft { config } => sft(&config),
        Cmd::CheckModel(args) => check_model::run(&args),
        Cmd::Export {
            checkpoint,
            base,
            out,
        } => terse_train::export_lora(&checkpoint, &base, &out).map(|(m, a)| {
            println!("merged: {}\nadapter: {}", m.display(), a.display());
            ExitCode::SUCCESS
        }),
        Cmd::Repro(args) if args.testbed == methods::Testbed::V5 => repro_v5::run(&args),
        Cmd::Repro(args) => repro::run(&args),
        Cmd::CudaToolchain { dir } => gpu::cuda_toolchain(dir),
        Cmd::BuildGpu { dir } => gpu::build_gpu(dir),
        Cmd::GpuCheck { list: true, .. } => gpu::list_groups(),
        Cmd::GpuCheck {
            out, skip, limit_s, ..
        } => gpu::gpu_check(&out, skip, limit_s),
        Cmd::GpuSession { dir, timeout_s } => gpu::gpu_session(dir, timeout_s),
        Cmd::FakeGpu(args) => fake_gpu::run(args),
        Cmd::ConfigDocs => config_docs(),
        Cmd::Eval(args) => eval::run(&args),
        Cmd::Bench { what } => bench::run(&what),
        Cmd::KernelModel { check_measured } => kernel_model::run(check_measured),
        Cmd::Plan {
            config,
            gpu_mem,
            gpus,
            prompt_tokens,
        } => plan(&config, gpu_mem, gpus, prompt_tokens),
        Cmd::TeacherPremise {
            config,
            group,
            steps,
            seed,
            seeds,
        } => teacher_premise(&config, group, steps, seed, seeds),
        Cmd::MakeTestbed { out } => make_testbed(&out),
        Cmd::Plot { metrics, out } => plot(&metrics, out),
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

/// Runs (or resumes) a training run and prints the summary table.
fn plan(
    config: &str,
    gpu_mem: Option<f64>,
    gpus: usize,
    prompt_tokens: usize,
) -> anyhow::Result<ExitCode> {
    use terse_train::planning::{model_shape, plan, Target};
    let cfg = terse_train::RunConfig::from_file(std::path::Path::new(config))?;
    let shape = model_shape(&cfg)?;
    let target = Target {
        cuda: cfg.run.device.starts_with("cuda"),
        device_bytes: gpu_mem.map(|g| (g * (1u64 << 30) as f64) as u64),
        device_total: gpu_mem.map(|g| (g * (1u64 << 30) as f64) as u64),
        gpus,
        prompt_tokens,
    };
    let p = plan(&cfg, &shape, target);
    println!(
        "memory plan of {config} ({} parameters, {} on {}, {gpus} GPU(s)):",
        shape.num_parameters(),
        if target.cuda { "bf16" } else { "f32" },
        cfg.run.device
    );
    print!("{}", p.table());
    if target.cuda {
        let a = terse_train::planning::Assumptions::default();
        let t = terse_train::planning::estimate(&cfg, &shape, gpus, prompt_tokens, &a);
        print!("{}", t.table(&a));
    }
    Ok(if p.fits() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn train(config: &str, ranks: &launch::RankArgs) -> anyhow::Result<ExitCode> {
    if ranks.rank.is_some() {
        return match launch::rank(config, ranks)? {
            Some(s) => print_summary(&s, ranks.eval_again),
            None => Ok(ExitCode::SUCCESS),
        };
    }
    let topo = launch::Topology::resolve(ranks, &|k| std::env::var(k).ok())?;
    if topo.world() > 1 {
        return launch::launch(config, ranks, &topo);
    }
    let cfg = launch::load_config(config, ranks)?;
    let summary = ranks
        .restart(terse_train::GrpoTrainer::builder(cfg))
        .run()?
        .ok_or_else(|| anyhow::anyhow!("a run without a collective is rank 0 and has a summary"))?;
    print_summary(&summary, ranks.eval_again)
}

/// The table `train` prints: pass@1, tokens and re-checks by level, before and after; first,
/// for a run that had finished, a line saying so (`again`: `--eval-again` evaluated it).
fn print_summary(s: &terse_train::RunSummary, again: bool) -> anyhow::Result<ExitCode> {
    if s.already_finished && again {
        println!(
            "run {} is finished: evaluated again, its line appended to metrics.jsonl marked \"again\"",
            s.dir.display()
        );
    } else if s.already_finished {
        println!(
            "run {} is finished: nothing changed; the summary is its metrics.jsonl's (--eval-again evaluates it again)",
            s.dir.display()
        );
    }
    println!("\nrun: {}", s.dir.display());
    println!(
        "| level | pass@1 before | pass@1 after | tokens before | tokens after | re-checks before | re-checks after |"
    );
    println!("|---|---|---|---|---|---|---|");
    let fmt =
        |x: Option<f64>, digits: usize| x.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    for (i, a) in s.after.by_level.iter().enumerate() {
        let b = s.before.as_ref().map(|b| &b.by_level[i]);
        println!(
            "| {} | {} | {:.3} | {} | {:.1} | {} | {:.2} |",
            a.level,
            fmt(b.map(|b| b.pass1), 3),
            a.pass1,
            fmt(b.map(|b| b.len_mean), 1),
            a.len_mean,
            fmt(b.map(|b| b.reflections_mean), 2),
            a.reflections_mean
        );
    }
    let mean_refl = |r: &terse_train::evals::EvalReport| {
        r.by_level.iter().map(|l| l.reflections_mean).sum::<f64>() / r.by_level.len().max(1) as f64
    };
    println!(
        "| all | {} | {:.3} | {} | {:.1} | {} | {:.2} |",
        fmt(s.before.as_ref().map(|b| b.accuracy), 3),
        s.after.accuracy,
        fmt(s.before.as_ref().map(|b| b.len_mean), 1),
        s.after.len_mean,
        fmt(s.before.as_ref().map(mean_refl), 2),
        mean_refl(&s.after)
    );
    println!(
        "\nrollout length: first step {:.1}, last step {:.1}, averaged by steps {:.1}",
        s.len_first, s.len_last, s.len_avg_by_steps
    );
    println!(
        "mean reward: first step {:.3}, last step {:.3}",
        s.reward_first, s.reward_last
    );
    Ok(ExitCode::SUCCESS)
}
/// Runs the SFT warm-up alone and says where the model went.
fn sft(config: &str) -> anyhow::Result<ExitCode> {
    let cfg = terse_train::RunConfig::from_file(std::path::Path::new(config))?;
    let out = terse_train::sft_only(&cfg)?;
    println!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}

/// Prints CARE's premise as the testbed teacher of `config` has it (study::teacher_premise).
fn teacher_premise(
    config: &str,
    group: Option<usize>,
    steps: Option<usize>,
    seed: Option<u64>,
    seeds: u64,
) -> anyhow::Result<ExitCode> {
    use terse_study::teacher_premise as tp;
    let cfg = terse_train::RunConfig::from_file(std::path::Path::new(config))?;
    if cfg.data.task != terse_train::config::TaskKind::Testbed {
        anyhow::bail!("{config}: data.task must be \"testbed\" for a teacher read");
    }
    if seeds == 0 {
        anyhow::bail!("--seeds 0: a read needs at least one seed");
    }
    let group = group.unwrap_or(cfg.grpo.group_size);
    let steps = steps.unwrap_or(cfg.grpo.steps as usize);
    let seed = seed.unwrap_or(cfg.run.seed);
    let end = seed.checked_add(seeds).ok_or_else(|| {
        anyhow::anyhow!("--seed {seed} --seeds {seeds}: the last seed overflows u64")
    })?;
    let reads: Vec<tp::TeacherPremise> = (seed..end)
        .map(|s| tp::teacher_premise(&cfg, group, steps, s))
        .collect();
    print!(
        "{}{}",
        tp::render(&tp::pool(&reads)),
        tp::render_spread(&reads)
    );
    Ok(ExitCode::SUCCESS)
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
        terse_model::disk::atomic_write(&path, text.as_bytes())?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Draws a run's curves next to its metrics (or into `out`).
fn plot(metrics: &std::path::Path, out: Option<std::path::PathBuf>) -> anyhow::Result<ExitCode> {
    let dir = out.unwrap_or_else(|| {
        metrics
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default()
    });
    for p in terse_train::records::plot_run(metrics, &dir)? {
        println!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// docs/config.md from crates/train/src/config/ (run from the repository root).
fn config_docs() -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .with_context(|| format!("reading {p} (run from the repository root)"))
    };
    let mut sections = String::new();
    for p in terse_train::config::docs::SECTION_SOURCES {
        sections.push_str(&read(p)?);
    }
    let text =
        terse_train::config::docs::markdown(&read("crates/train/src/config/mod.rs")?, &sections);
    std::fs::write("docs/config.md", text).context("writing docs/config.md")?;
    println!("wrote docs/config.md");
    Ok(ExitCode::SUCCESS)
}
