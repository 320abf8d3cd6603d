//! Where a run ran: `<run>/machine.json` beside config.toml, written when the run is created:
//! the CPU model, the SIMD level the CPU kernels dispatch to (and the features behind it), the
//! GPU of a CUDA run (name, driver, CUDA version, as nvidia-smi reports them) and the commit
//! the trainer was built from. Results are bitwise reproducible per machine type (CPU model,
//! SIMD level, GPU name), not across types: a start on another type says so in one line.
//! Written by `terse_model::disk::atomic_write`.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The file, beside config.toml.
pub(crate) const MACHINE: &str = "machine.json";

/// The commit of this build (build.rs; "unknown" outside a git checkout).
pub(crate) const COMMIT: &str = env!("TERSE_COMMIT");

/// A machine as a run records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Machine {
    /// /proc/cpuinfo's model name.
    pub cpu: String,
    /// The SIMD level the CPU kernels dispatch to: "avx512", "avx2" or "portable" (the
    /// detection of terse_model's decode kernels, capped by `TERSE_CPU_ISA`).
    pub simd: String,
    /// The x86 features that choice reads, those the CPU has.
    pub cpu_features: Vec<String>,
    /// A CUDA run's GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Gpu>,
    pub commit: String,
}

/// A CUDA device as nvidia-smi reports it ("unknown" where it cannot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Gpu {
    pub name: String,
    pub driver: String,
    pub cuda: String,
}

impl Machine {
    /// This machine, for a run on `device` ("cpu", "cuda", "cuda:N").
    pub fn this(device: &str) -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let simd = terse_model::device::simd_level();
        let gpu = device.starts_with("cuda").then(|| {
            let ordinal = device.strip_prefix("cuda:").unwrap_or("0");
            gpu(ordinal)
        });
        Self {
            cpu,
            simd: simd.into(),
            cpu_features: cpu_features(),
            gpu,
            commit: COMMIT.into(),
        }
    }

    /// What results depend on: the CPU model, the SIMD level and the GPU's name.
    fn kind(&self) -> String {
        let gpu = self
            .gpu
            .as_ref()
            .map_or(String::new(), |g| format!(", GPU {}", g.name));
        format!("{} ({}){gpu}", self.cpu, self.simd)
    }

    /// A run created elsewhere: one line when `dir`'s machine.json names another machine type
    /// (results are reproducible bit for bit per type only); nothing for a run without one.
    pub fn compare(&self, dir: &Path) -> Result<Option<String>> {
        let path = dir.join(MACHINE);
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let then: Machine =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        Ok((then.kind() != self.kind()).then(|| {
            format!(
                "{}: this run was created on {}, this start runs on {}: results are bitwise reproducible per machine type, not across types",
                path.display(),
                then.kind(),
                self.kind()
            )
        }))
    }

    /// Writes `dir`'s machine.json (a new run).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("serialising the machine")? + "\n";
        Ok(terse_model::disk::atomic_write(
            &dir.join(MACHINE),
            text.as_bytes(),
        )?)
    }
}

/// The x86 features the CPU kernels' dispatch reads, those this CPU has.
fn cpu_features() -> Vec<String> {
    #[cfg(target_arch = "x86_64")]
    {
        let detected = [
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512dq", std::arch::is_x86_feature_detected!("avx512dq")),
        ];
        detected
            .iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f.to_string())
            .collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec![]
    }
}

/// GPU `ordinal`'s name and driver, and the CUDA version, from nvidia-smi ("unknown" each
/// where it is missing or says nothing, as under the emulated device).
fn gpu(ordinal: &str) -> Gpu {
    let smi = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("nvidia-smi")
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let query = smi(&[
        "--query-gpu=name,driver_version",
        "--format=csv,noheader",
        "-i",
        ordinal,
    ]);
    let (name, driver) = query
        .as_deref()
        .and_then(|q| q.lines().next())
        .and_then(|l| l.split_once(','))
        .map_or(("unknown".into(), "unknown".into()), |(n, d)| {
            (n.trim().to_string(), d.trim().to_string())
        });
    let cuda = smi(&[])
        .and_then(|t| {
            t.split("CUDA Version:")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into());
    Gpu { name, driver, cuda }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
