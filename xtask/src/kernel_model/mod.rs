//! `cargo xtask kernel-model`: a performance model of the tensor-core flash attention kernels
//! (kernels/flash_tc.cu, and FlashAttention-2's flash_fa2.cu and flash_fa2_bwd.cu) read from
//! their compiled code. Compiles each source for sm_90 with the project's nvcc
//! (scripts/cuda-toolchain.sh), disassembles it with nvdisasm, counts what one warp executes per
//! loop iteration (sass.rs, model.rs), the shared-memory wavefronts of each access (banks.rs,
//! with the lane addresses of profile/), and prints per kernel the bound and the estimated share
//! of the H200's dense bf16 peak, with a summary per family and a JSON copy under target/.

mod banks;
mod model;
mod profile;
mod sass;

use anyhow::{bail, Context, Result};
use profile::{Kernel, Role};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// The `-D` launch-geometry definitions the kernels are compiled with: the constants the Rust
/// launches use (crates/model's kernels/geometry.rs), read by the one function that knows where
/// they live (the emulated device's kernel build shares it).
fn kernel_defines(root: &Path) -> Result<Vec<(String, u64)>> {
    super::fake_gpu::kernels::terse_defines(root)
}

/// nvcc and nvdisasm of the project's toolchain (installed when missing, compiler only).
fn tools(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let dir = super::gpu::default_dir();
    let st = Command::new("bash")
        .arg(root.join("scripts/cuda-toolchain.sh"))
        .arg("--compiler-only")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .status()
        .context("running scripts/cuda-toolchain.sh")?;
    if !st.success() {
        bail!(
            "scripts/cuda-toolchain.sh --compiler-only {} failed",
            dir.display()
        );
    }
    Ok((dir.join("bin/nvcc"), dir.join("bin/nvdisasm")))
}

/// The SASS of kernels/`file` for sm_90, with inlined line info (the cubin under `out`).
fn disassemble(root: &Path, defines: &[(String, u64)], out: &Path, file: &str) -> Result<String> {
    let (nvcc, nvdisasm) = tools(root)?;
    let cubin = out.join(Path::new(file).with_extension("cubin"));
    let mut cmd = Command::new(&nvcc);
    cmd.args(["-arch=sm_90", "-cubin", "-O3", "-std=c++17", "-lineinfo"]);
    for (k, v) in defines {
        cmd.arg(format!("-D{k}={v}"));
    }
    let o = cmd
        .arg("-o")
        .arg(&cubin)
        .arg(root.join("kernels").join(file))
        .output()
        .with_context(|| format!("running {}", nvcc.display()))?;
    if !o.status.success() {
        bail!(
            "nvcc failed on kernels/{file}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = Command::new(&nvdisasm)
        .args(["-c", "-gi"])
        .arg(&cubin)
        .output()
        .with_context(|| format!("running {}", nvdisasm.display()))?;
    if !o.status.success() {
        bail!("nvdisasm failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    String::from_utf8(o.stdout).context("nvdisasm printed something that is not UTF-8")
}

fn define(defines: &[(String, u64)], name: &str) -> Result<u64> {
    defines
        .iter()
        .find(|(k, _)| k == name)
        .map(|&(_, v)| v)
        .with_context(|| format!("no {name} among the kernels' launch constants"))
}

/// A main loop's counts per warp-iteration: `base` without the optional blocks.
struct Main {
    family: &'static str,
    role: Role,
    d: u64,
    area: f64,
    base: bool,
    counts: model::Counts,
}

pub fn run() -> Result<ExitCode> {
    let root = std::env::current_dir()?;
    let defines = kernel_defines(&root)?;
    let (warps, keys) = (
        define(&defines, "TERSE_FLASH_TC_WARPS")?,
        define(&defines, "TERSE_FLASH_TC_KEYS")?,
    );
    let out = root.join("target/kernel-model");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let sources = profile::sources(&root.join("kernels"), warps, keys)?;
    let g = model::H200;
    let files: Vec<String> = sources
        .iter()
        .map(|s| format!("kernels/{}", s.file))
        .collect();
    println!(
        "kernel-model: {} on an H200 (ESTIMATE: a throughput roofline from the sm_90 SASS, per \
         warp; {:.0} TFLOP/s dense bf16 peak = {} SMs x {} FLOP/clock x {:.2} GHz; {} \
         issue/clock, {} shared wavefront (128 B)/clock per SM; {:.1} TB/s DRAM)",
        files.join(", "),
        g.peak() / 1e12,
        g.sms,
        g.flop_per_clock,
        g.clock_hz / 1e9,
        g.issue_per_clock,
        g.wavefronts_per_clock,
        g.dram_bytes_per_s / 1e12
    );
    let mut records = vec![];
    let mut mains = vec![];
    for s in &sources {
        let functions = sass::parse(&disassemble(&root, &defines, &out, s.file)?)?;
        for k in &s.kernels {
            let (rows, main) = kernel(k, &functions, &g)?;
            records.push(json!({"kernel": k.name, "file": s.file, "family": k.family,
                "d": k.d, "main_loop_line": k.main_line, "loops": rows}));
            mains.extend(main);
        }
    }
    let summary = summary(&mains, &g)?;
    let path = out.join("flash.json");
    let doc = json!({"estimate": true, "gpu": {"name": "H200 SXM", "sms": g.sms,
        "clock_hz": g.clock_hz, "issue_per_clock": g.issue_per_clock,
        "wavefronts_per_clock": g.wavefronts_per_clock, "flop_per_clock": g.flop_per_clock,
        "dram_bytes_per_s": g.dram_bytes_per_s, "peak_flops": g.peak()},
        "kernels": records, "summary": summary});
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("\nwritten: {}", path.display());
    Ok(ExitCode::SUCCESS)
}

/// Prints kernel `k`'s table (the loops that do tensor work) and returns every loop's JSON and
/// the main loop's counts (without and with its optional blocks).
fn kernel(
    k: &Kernel,
    functions: &[sass::Function],
    g: &model::Gpu,
) -> Result<(Vec<serde_json::Value>, Vec<Main>)> {
    let p = k.profile.as_ref();
    let f = functions
        .iter()
        .find(|f| f.name == k.name)
        .with_context(|| format!("no function {} in the SASS of {}", k.name, p.file()))?;
    let loops = f.loops();
    println!("\n{} (D = {}, {})", k.name, k.d, k.geometry);
    println!(
        "  {:<24} {:>8} {:>6} {:>7} {:>7} {:>7} {:>5} {:>5} {:>14} {:>7}",
        "loop (lines)",
        "instr",
        "HMMA",
        "shared",
        "wavefr",
        "global",
        "MOVM",
        "cvt",
        "bound",
        "est %"
    );
    let mut rows = vec![];
    let mut mains = vec![];
    for l in &loops {
        let lines: Vec<u32> = f
            .body(l)
            .filter_map(|i| i.lines_in(p.file()).first().copied())
            .collect();
        let back_line = f
            .back_edge(l)
            .and_then(|b| b.lines_in(p.file()).first().copied())
            .unwrap_or(0);
        let (lo, hi) = (
            lines.iter().min().copied().unwrap_or(0),
            lines.iter().max().copied().unwrap_or(0),
        );
        let c = model::count(f, l, &loops, p);
        let mut variants = vec![("".to_string(), c.base)];
        if c.optional.issued > 0.0 {
            variants.push((format!(" {}", p.optional_tag()), c.base.plus(&c.optional)));
        }
        for (tag, counts) in variants {
            let b = model::bound(&counts, g);
            let name = format!(":{back_line} ({lo}-{hi}){tag}");
            // The table shows the loops that do tensor work; the JSON has every loop.
            if counts.hmma > 0.0 {
                println!(
                    "  {:<24} {:>8.0} {:>6.0} {:>7.0} {:>7.0} {:>7.0} {:>5.0} {:>5.0} {:>14} {:>7.1}",
                    name,
                    counts.issued,
                    counts.hmma,
                    counts.shared,
                    counts.wavefronts,
                    counts.global,
                    counts.movm,
                    counts.convert,
                    b.name,
                    100.0 * b.share
                );
            }
            rows.push(json!({"loop": name, "line": back_line, "lines": [lo, hi],
                "optional_included": !tag.is_empty(), "unknown_trip_counts": c.unknown_trips,
                "peeled_remainders": c.peeled, "peeled_remainders_not_found": c.peels_missed,
                "per_iteration": counts.json(), "model": b.json()}));
            if back_line == k.main_line {
                mains.push(Main {
                    family: k.family,
                    role: k.role,
                    d: k.d,
                    area: k.area,
                    base: tag.is_empty(),
                    counts,
                });
            }
        }
    }
    Ok((rows, mains))
}

/// Prints and returns the estimates per head size and family: the forward (and with its
/// optional rescale, if any), the backward with deterministic dQ (dQ + dK/dV main loops per
/// unit of attention area) and, where dK/dV has an optional atomic dQ block, that kernel alone.
fn summary(mains: &[Main], g: &model::Gpu) -> Result<Vec<serde_json::Value>> {
    println!(
        "\nestimated share of the dense bf16 peak (main loops; backward = dQ + dK/dV per unit of \
         attention area; atomic dQ = dK/dV with its atomic block alone):"
    );
    let mut out = vec![];
    for d in [64, 128] {
        for family in ["flash_tc", "FA2"] {
            let find = |role: Role, base: bool| {
                mains
                    .iter()
                    .find(|m| m.family == family && m.d == d && m.role == role && m.base == base)
            };
            let mut lines = vec![];
            let Some(fwd) = find(Role::Forward, true) else {
                bail!("no main loop of the {family} forward at D = {d} in the SASS");
            };
            lines.push(("forward", fwd.counts));
            if let Some(m) = find(Role::Forward, false) {
                lines.push(("forward with rescale", m.counts));
            }
            let (Some(q), Some(kv)) = (find(Role::Dq, true), find(Role::Dkdv, true)) else {
                bail!("no main loop of the {family} backward at D = {d} in the SASS");
            };
            // One unit of area: dQ's iteration covers q.area entries, dK/dV's kv.area.
            let both = q
                .counts
                .scaled(1.0 / q.area)
                .plus(&kv.counts.scaled(1.0 / kv.area));
            lines.push(("backward", both));
            if let Some(m) = find(Role::Dkdv, false) {
                lines.push(("backward, atomic dQ", m.counts));
            }
            for (what, c) in lines {
                let b = model::bound(&c, g);
                let caps: Vec<String> = b
                    .caps()
                    .iter()
                    .map(|(unit, cap)| format!("{unit} {:.1} %", 100.0 * cap))
                    .collect();
                println!(
                    "  D = {d:>3} {family:<8} {what:<22} {:>5.1} %  (bound: {}; alone: {})",
                    100.0 * b.share,
                    b.name,
                    caps.join(", ")
                );
                out.push(json!({"d": d, "family": family, "pass": what, "model": b.json()}));
            }
        }
    }
    Ok(out)
}
