//! The GPU path's three commands: `cuda-toolchain` (nvcc 13.0 and the CUDA libraries from PyPI
//! wheels into a cache directory, via scripts/cuda-toolchain.sh), `build-gpu` (a stripped,
//! xz-compressed release xtask with `cuda` on, small enough to copy to a GPU machine) and
//! `gpu-check` (run there: kernel parity against the CPU references, then benchmarks, one JSON
//! report).

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
    let out = Command::new("bash")
        .args(["-c", &script])
        .output()
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
    if packed > 64.0 {
        bail!(
            "{} is {packed:.1} MiB, over the 64 MiB a device run can carry",
            xz.display()
        );
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
    let checks = terse_model::parity::check(&dev)?;
    let mut ok = true;
    let rows: Vec<Value> = checks
        .iter()
        .map(|(name, d, tol)| {
            ok &= d <= tol;
            println!(
                "parity {name}: max diff {d:.2e} (tolerance {tol:.0e}) {}",
                if d <= tol { "ok" } else { "FAIL" }
            );
            json!({"op": name, "max_diff": d, "tolerance": tol, "ok": d <= tol})
        })
        .collect();
    report.insert("parity".into(), Value::Array(rows));
    report.insert("decode".into(), crate::gpu_bench::decode(&dev)?);
    report.insert("hf_generate".into(), crate::gpu_bench::hf_generate());
    report.insert("fwd_bwd".into(), crate::gpu_bench::fwd_bwd(&dev)?);
    report.insert("logprob".into(), crate::gpu_bench::logprob(&dev)?);
    let text = serde_json::to_string_pretty(&Value::Object(report.clone()))?;
    std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    println!("{}", serde_json::to_string(&Value::Object(report))?);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
