//! The GPU path's three commands: `cuda-toolchain` (nvcc 13.0 and the CUDA libraries from PyPI
//! wheels into a cache directory, via scripts/cuda-toolchain.sh), `build-gpu` (a stripped,
//! xz-compressed release xtask with `cuda` on, small enough to copy to a GPU machine) and
//! `gpu-check` (run there: kernel parity against the CPU references, benchmarks, then the
//! NCCL backend (gpu_nccl.rs), one JSON report).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The toolchain's environment: runs the setup script (idempotent), lets bash evaluate its
/// exports, and returns the variables that changed.
pub(crate) fn toolchain_env(dir: &Path) -> Result<Vec<(String, String)>> {
    let script = format!(
        "set -e; exports=\"$(bash scripts/cuda-toolchain.sh '{}')\"; eval \"$exports\"; env -0",
        dir.display()
    );
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &script]);
    // The first run downloads ~650 MB of wheels; a stalled download must not hang forever.
    let out = crate::process::output_with_timeout(cmd, std::time::Duration::from_secs(1800))
        .context("running scripts/cuda-toolchain.sh (run from the repository root)")?;
    if !out.status.success() {
        bail!(
            "scripts/cuda-toolchain.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| k.starts_with("CUDA") || *k == "PATH")
        .filter(|(k, v)| std::env::var(k).ok().as_deref() != Some(*v))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

pub(crate) fn default_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".cache/cuda-13.0")
}

pub fn cuda_toolchain(dir: Option<PathBuf>) -> Result<ExitCode> {
    let dir = dir.unwrap_or_else(default_dir);
    for (k, v) in toolchain_env(&dir)? {
        println!("export {k}=\"{v}\"");
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the `cuda` build goes (its own target directory: the features differ from the CPU
/// build's, and sharing one would rebuild candle at every switch).
pub(crate) const GPU_TARGET: &str = "target/gpu";

/// `cargo build --release -p xtask --features cuda` into [`GPU_TARGET`]; returns the binary.
pub(crate) fn build_cuda_binary(env: &[(String, String)]) -> Result<PathBuf> {
    let target = PathBuf::from(GPU_TARGET);
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "xtask", "--features", "cuda"])
        .env("CARGO_TARGET_DIR", &target)
        .envs(env.iter().cloned())
        .status()
        .context("running cargo build --features cuda")?;
    if !status.success() {
        bail!("cargo build --features cuda failed ({status})");
    }
    Ok(target.join("release/xtask"))
}

pub fn build_gpu(dir: Option<PathBuf>) -> Result<ExitCode> {
    let env = toolchain_env(&dir.unwrap_or_else(default_dir))?;
    let target = PathBuf::from(GPU_TARGET);
    build_cuda_binary(&env)?;
    // ptxas's register and local-memory report of every kernel for sm_90 (printed by the
    // script, kept in target/gpu/ptxas.txt): a spill fails.
    let report = target.join("ptxas.txt");
    let status = Command::new("bash")
        .args(["scripts/ptxas-check.sh", "--out"])
        .arg(&report)
        .envs(env.clone())
        .status()
        .context("running scripts/ptxas-check.sh")?;
    if !status.success() {
        bail!(
            "a kernel spills to local memory on sm_90 (the table above, {})",
            report.display()
        );
    }
    // Strip a copy (the symbols are most of the size), then compress it.
    let built = target.join("release/xtask");
    let bin = target.join("xtask");
    std::fs::copy(&built, &bin).with_context(|| format!("copying {}", built.display()))?;
    let status = Command::new("strip")
        .arg(&bin)
        .status()
        .context("running strip")?;
    if !status.success() {
        bail!("strip {} failed ({status})", bin.display());
    }
    let xz = target.join("xtask.xz");
    let out = std::fs::File::create(&xz).with_context(|| format!("creating {}", xz.display()))?;
    let status = Command::new("xz")
        .args(["-T2", "-6", "-c"])
        .arg(&bin)
        .stdout(out)
        .status()
        .context("running xz")?;
    if !status.success() {
        bail!("xz failed ({status})");
    }
    let mib = |p: &Path| -> Result<f64> { Ok(std::fs::metadata(p)?.len() as f64 / 1048576.0) };
    let (raw, packed) = (mib(&bin)?, mib(&xz)?);
    println!(
        "{}: {raw:.1} MiB; {}: {packed:.1} MiB",
        bin.display(),
        xz.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The parity groups gpu-check runs, in order.
pub fn list_groups() -> Result<ExitCode> {
    for (i, (name, _)) in terse_model::testing::parity::groups().iter().enumerate() {
        println!("{:>2}. {name}", i + 1);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "cuda"))]
pub fn gpu_check(_out: &Path, _skip: Vec<String>, _limit_s: f64) -> Result<ExitCode> {
    bail!("gpu-check needs a build with `--features cuda` (cargo xtask build-gpu)")
}

#[cfg(feature = "cuda")]
pub fn gpu_check(out: &Path, skip: Vec<String>, limit_s: f64) -> Result<ExitCode> {
    use crate::gpu_plan::{parity_rows, run, Options, Step, BENCH_STEPS, PARITY_EXPECT_S};
    use serde_json::Value;
    let (dev, _) = terse_model::device::select("cuda")?;
    // The random Qwen3-0.6B the benchmarks share, built once (and only when a step needs it).
    let model = std::cell::RefCell::new(None);
    let with_model = |f: &dyn Fn(&mut terse_model::Qwen3) -> Result<Value>| -> Result<Value> {
        let mut slot = model.borrow_mut();
        if slot.is_none() {
            let cfg = terse_model::Config::qwen3_0_6b();
            *slot = Some(terse_model::Qwen3::random(
                cfg,
                0,
                &dev,
                candle_core::DType::BF16,
            )?);
        }
        f(slot.as_mut().context("the shared model")?)
    };
    let with_model = &with_model;
    let mut steps = vec![];
    // Parity first, the path a training run executes before the rest (parity.rs's order).
    for (group, f) in terse_model::testing::parity::groups() {
        let dev = &dev;
        steps.push(Step::new(
            &format!("parity {group}"),
            PARITY_EXPECT_S,
            move || Ok(parity_rows(group, &f(dev)?)),
        ));
    }
    let d = &dev;
    // On the emulated device (`cargo xtask fake-gpu`) a time says nothing about a GPU: the
    // benchmark rows say so and report none; the NCCL row still runs its exact checks and its
    // 2 training steps, and decode_long its agreement check at a small shape, with their
    // timings removed.
    let emulated = std::env::var_os("TERSE_FAKE_GPU_KERNELS").is_some();
    for (key, expect_s) in BENCH_STEPS {
        // The long-context decode row runs scaled down there (its own small model): its
        // agreement check between the two kernels is exact work, its times are nulled.
        if emulated && key == "decode_long" {
            steps.push(Step::new(key, expect_s, move || {
                let m = crate::gpu_decode_long::emulated_model(d)?;
                Ok(emulated_row(Some(crate::gpu_decode_long::decode_long(
                    d, &m, true,
                )?)))
            }));
            continue;
        }
        // The profile runs scaled down there too, so that CI runs its CUDA events.
        if emulated && key == "profile" {
            steps.push(Step::new(key, expect_s, move || {
                Ok(emulated_row(Some(crate::gpu_profile::emulated(d)?)))
            }));
            continue;
        }
        if emulated && key != "nccl" {
            steps.push(Step::new(key, expect_s, move || Ok(emulated_row(None))));
            continue;
        }
        if emulated {
            steps.push(Step::new(key, expect_s, move || {
                Ok(emulated_row(Some(crate::gpu_nccl::nccl(d)?)))
            }));
            continue;
        }
        steps.push(Step::new(key, expect_s, move || match key {
            "decode" => with_model(&|m| crate::gpu_bench::decode(d, m)),
            "decode_long" => with_model(&|m| crate::gpu_decode_long::decode_long(d, m, false)),
            "fwd_bwd" => with_model(&|m| crate::gpu_bench::fwd_bwd(d, m)),
            "flash_kernel" => crate::gpu_long::flash_kernel(d),
            "attention_paths" => crate::gpu_long::attention_paths(d),
            "long_context" => with_model(&|m| crate::gpu_long::long_context(d, m)),
            "profile" => with_model(&|m| crate::gpu_profile::profile(d, m)),
            "logprob" => crate::gpu_bench::logprob(d),
            "nccl" => crate::gpu_nccl::nccl(d),
            "hf_generate" => Ok(crate::gpu_bench::hf_generate()),
            "torch_peers" => Ok(crate::gpu_bench::torch_peers()),
            "grpo_step" => crate::gpu_grpo::grpo_step(d),
            other => anyhow::bail!("gpu-check: no step named {other}"),
        }));
    }
    // After a step's error: can the context still allocate, copy and synchronise?
    let probe = move || -> Result<()> {
        let t = candle_core::Tensor::arange(0f32, 256f32, d)?;
        let back = (t + 1.0)?.to_vec1::<f32>()?;
        d.synchronize()?;
        anyhow::ensure!(back[255] == 256.0, "the probe read back {}", back[255]);
        Ok(())
    };
    let opts = Options {
        skip,
        limit_s,
        probe: Box::new(probe),
    };
    let write = |report: &serde_json::Map<String, Value>| -> Result<()> {
        let text = serde_json::to_string_pretty(&Value::Object(report.clone()))?;
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
    };
    let mut report = run(steps, opts, write)?;
    // terse against torch, from the rows of this run (null where a side is missing).
    let peers = crate::gpu_peers::peer_ratios(&report);
    println!("terse over torch: {peers}");
    report.insert("peers".into(), peers);
    write(&report)?;
    let misses: Vec<&str> = report
        .values()
        .filter_map(Value::as_array)
        .flatten()
        .filter(|r| r["ok"] == false)
        .filter_map(|r| r["op"].as_str())
        .collect();
    println!("{}", serde_json::to_string(&Value::Object(report.clone()))?);
    if let Some(at) = report.get("stopped_at") {
        bail!(
            "gpu-check: the context was unusable after {at} (the probe failed); the rows so far are in {}",
            out.display()
        );
    }
    if !misses.is_empty() {
        bail!(
            "gpu-check: parity rows out of tolerance: {}",
            misses.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A benchmark row on the emulated device: `"emulated": true` and no time (a row that ran keeps
/// its checks, its timings and rates set to null).
#[cfg(feature = "cuda")]
fn emulated_row(ran: Option<serde_json::Value>) -> serde_json::Value {
    use serde_json::Value;
    let mut row = match ran {
        Some(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    for (k, v) in row.iter_mut() {
        if k.ends_with("_ms")
            || k.ends_with("_s")
            || k.contains("gbs")
            || k.contains("per_s")
            || k.contains("_over_")
        {
            *v = Value::Null;
        }
    }
    row.insert("emulated".into(), Value::Bool(true));
    row.insert("time".into(), Value::Null);
    Value::Object(row)
}

/// Builds the GPU binary here, then prints how to run the device check on a GPU machine,
/// whatever the way there (ssh and scp, srun, a container): what to copy, the command, and
/// where the report lands.
pub fn gpu_session(dir: Option<PathBuf>, timeout_s: u64) -> Result<ExitCode> {
    build_gpu(dir)?;
    let limit = timeout_s.saturating_sub(60).max(60);
    println!(
        "On the GPU machine, from a checkout of this repository (or a directory holding
scripts/gpu-check.sh and target/gpu/xtask.xz):

  1. copy target/gpu/xtask.xz there, e.g.
       scp target/gpu/xtask.xz HOST:terse/target/gpu/
  2. run the check, with the report going to DIR:
       bash scripts/gpu-check.sh --out DIR --timeout {limit}
     (under SLURM: srun --gpus=1 bash scripts/gpu-check.sh --out DIR --timeout {limit})
  3. after a kernel fault, rerun with --retry: CUDA_LAUNCH_BLOCKING=1 names the failing launch.

The report is DIR/gpu-check.json, rewritten after every group, so a run cut short keeps what
it finished; DIR/gpu-check.log has the output, DIR/gpu.txt the GPU and driver."
    );
    Ok(ExitCode::SUCCESS)
}
