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
fn toolchain_env(dir: &Path) -> Result<Vec<(String, String)>> {
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

fn default_dir() -> PathBuf {
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

pub fn build_gpu(dir: Option<PathBuf>) -> Result<ExitCode> {
    let env = toolchain_env(&dir.unwrap_or_else(default_dir))?;
    let target = PathBuf::from("target/gpu");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "xtask", "--features", "cuda"])
        .env("CARGO_TARGET_DIR", &target)
        .envs(env)
        .status()
        .context("running cargo build --features cuda")?;
    if !status.success() {
        bail!("cargo build --features cuda failed ({status})");
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
pub fn gpu_check(_out: &Path) -> Result<ExitCode> {
    bail!("gpu-check needs a build with `--features cuda` (cargo xtask build-gpu)")
}

#[cfg(feature = "cuda")]
pub fn gpu_check(out: &Path) -> Result<ExitCode> {
    use serde_json::{json, Value};
    let (dev, _) = terse_model::device::select("cuda")?;
    let mut report = serde_json::Map::new();
    let write = |report: &serde_json::Map<String, Value>| -> Result<()> {
        let text = serde_json::to_string_pretty(&Value::Object(report.clone()))?;
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))
    };
    // Parity group by group; the report is rewritten after each, so a crash or a timeout
    // leaves every finished row on disk. The first failing row stops the run.
    let mut rows: Vec<Value> = vec![];
    for (group, run) in terse_model::testing::parity::groups() {
        println!("parity group {group} ...");
        let result = run(&dev);
        let failed = match result {
            Ok(got) => {
                let mut failed = None;
                for r in got {
                    println!(
                        "parity {}: max diff {:.2e} (tolerance {:.0e}) {}",
                        r.name,
                        r.max_diff,
                        r.tolerance,
                        if r.ok() { "ok" } else { "FAIL" }
                    );
                    rows.push(json!({"group": group, "op": r.name, "max_diff": r.max_diff,
                        "tolerance": r.tolerance, "ok": r.ok()}));
                    if !r.ok() && failed.is_none() {
                        failed = Some(r.name.clone());
                    }
                }
                failed
            }
            Err(e) => {
                rows.push(json!({"group": group, "error": format!("{e}")}));
                Some(format!("{group}: {e}"))
            }
        };
        report.insert("parity".into(), Value::Array(rows.clone()));
        write(&report)?;
        if let Some(name) = failed {
            report.insert("stopped_at".into(), json!(name));
            write(&report)?;
            println!("{}", serde_json::to_string(&Value::Object(report))?);
            bail!(
                "gpu-check: parity row `{name}` failed; the rows so far are in {}",
                out.display()
            );
        }
    }
    report.insert("decode".into(), crate::gpu_bench::decode(&dev)?);
    write(&report)?;
    report.insert("hf_generate".into(), crate::gpu_bench::hf_generate());
    write(&report)?;
    report.insert("fwd_bwd".into(), crate::gpu_bench::fwd_bwd(&dev)?);
    write(&report)?;
    report.insert("flash_kernel".into(), crate::gpu_long::flash_kernel(&dev)?);
    write(&report)?;
    report.insert("long_context".into(), crate::gpu_long::long_context(&dev)?);
    write(&report)?;
    report.insert("logprob".into(), crate::gpu_bench::logprob(&dev)?);
    write(&report)?;
    // The NCCL backend at world size 1, last: its first run must not cost the rows above if
    // it hangs in initialisation (a failure is a row, not the end of the check).
    let nccl = crate::gpu_nccl::nccl(&dev).unwrap_or_else(|e| json!({"error": format!("{e:#}")}));
    report.insert("nccl".into(), nccl);
    write(&report)?;
    println!("{}", serde_json::to_string(&Value::Object(report))?);
    Ok(ExitCode::SUCCESS)
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
