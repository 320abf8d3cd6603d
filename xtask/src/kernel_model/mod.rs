//! `cargo xtask kernel-model`: a performance model of the tensor-core flash attention
//! (kernels/flash_tc.cu) read from its compiled code. Compiles the kernels for sm_90 with the
//! project's nvcc (scripts/cuda-toolchain.sh), disassembles them with nvdisasm, counts what one
//! warp executes per loop iteration (sass.rs, model.rs), the shared-memory wavefronts of each
//! access (banks.rs, with the lane addresses of profile.rs), and prints per kernel the bound and
//! the estimated share of the H200's dense bf16 peak, with a JSON copy under target/.

mod banks;
mod model;
mod profile;
mod sass;

use anyhow::{bail, Context, Result};
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

/// The SASS of kernels/flash_tc.cu for sm_90, with inlined line info.
fn disassemble(root: &Path, defines: &[(String, u64)], out: &Path) -> Result<String> {
    let (nvcc, nvdisasm) = tools(root)?;
    let cubin = out.join("flash_tc.cubin");
    let mut cmd = Command::new(&nvcc);
    cmd.args(["-arch=sm_90", "-cubin", "-O3", "-std=c++17", "-lineinfo"]);
    for (k, v) in defines {
        cmd.arg(format!("-D{k}={v}"));
    }
    let o = cmd
        .arg("-o")
        .arg(&cubin)
        .arg(root.join("kernels/flash_tc.cu"))
        .output()
        .with_context(|| format!("running {}", nvcc.display()))?;
    if !o.status.success() {
        bail!(
            "nvcc failed on kernels/flash_tc.cu: {}",
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

pub fn run() -> Result<ExitCode> {
    let root = std::env::current_dir()?;
    let defines = kernel_defines(&root)?;
    let (warps, keys) = (
        define(&defines, "TERSE_FLASH_TC_WARPS")?,
        define(&defines, "TERSE_FLASH_TC_KEYS")?,
    );
    let out = root.join("target/kernel-model");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let functions = sass::parse(&disassemble(&root, &defines, &out)?)?;
    let g = model::H200;
    println!(
        "kernel-model: kernels/flash_tc.cu on an H200 (ESTIMATE: a throughput roofline from the \
         sm_90 SASS, per warp; {:.0} TFLOP/s dense bf16 peak = {} SMs x {} FLOP/clock x {:.2} GHz; \
         {} issue/clock, {} shared wavefront (128 B)/clock per SM; {:.1} TB/s DRAM)",
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
    for k in profile::kernels(keys) {
        let p = profile::Profile::new(k.d, warps, keys);
        let f = functions
            .iter()
            .find(|f| f.name == k.name)
            .with_context(|| format!("no function {} in the SASS of flash_tc.cu", k.name))?;
        let loops = f.loops();
        println!("\n{} (D = {}, {} warps, {} keys)", k.name, k.d, warps, keys);
        println!(
            "  {:<16} {:>8} {:>6} {:>7} {:>7} {:>7} {:>5} {:>5} {:>14} {:>7}",
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
        for l in &loops {
            let lines: Vec<u32> = f
                .body(l)
                .filter_map(|i| i.lines_in(p.file).first().copied())
                .collect();
            let back_line = f
                .back_edge(l)
                .and_then(|b| b.lines_in(p.file).first().copied())
                .unwrap_or(0);
            let (lo, hi) = (
                lines.iter().min().copied().unwrap_or(0),
                lines.iter().max().copied().unwrap_or(0),
            );
            let c = model::count(f, l, &loops, &p);
            let mut variants = vec![("", c.base)];
            if c.optional.issued > 0.0 {
                variants.push((" +opt", c.base.plus(&c.optional)));
            }
            for (tag, counts) in variants {
                let b = model::bound(&counts, &g);
                let name = format!(":{back_line} ({lo}-{hi}){tag}");
                // The table shows the loops that do tensor work; the JSON has every loop.
                if counts.hmma > 0.0 {
                    println!(
                    "  {:<16} {:>8.0} {:>6.0} {:>7.0} {:>7.0} {:>7.0} {:>5.0} {:>5.0} {:>14} {:>7.1}",
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
                    "per_iteration": counts.json(), "model": b.json()}));
                if back_line == k.main_line {
                    mains.push((k.clone(), tag.is_empty(), counts));
                }
            }
        }
        records.push(
            json!({"kernel": k.name, "d": k.d, "main_loop_line": k.main_line,
            "loops": rows}),
        );
    }
    println!("\nestimated share of the dense bf16 peak (main loops; backward = dQ + dK/dV per unit of attention area):");
    let mut summary = vec![];
    for d in [64, 128] {
        let per_area = |role: profile::Role, base: bool| {
            mains
                .iter()
                .find(|(k, b, _)| k.d == d && k.role == role && *b == base)
                .or_else(|| {
                    mains
                        .iter()
                        .find(|(k, b, _)| k.d == d && k.role == role && *b)
                })
                .map(|(k, _, c)| (k.area, *c))
        };
        for (what, base) in [("forward", true), ("forward with rescale", false)] {
            let Some((_, c)) = per_area(profile::Role::Forward, base) else {
                bail!("no main loop of the forward at D = {d} in the SASS");
            };
            let b = model::bound(&c, &g);
            println!(
                "  D = {d:>3} {what:<22} {:>5.1} %  (bound: {})",
                100.0 * b.share,
                b.name
            );
            summary.push(json!({"d": d, "pass": what, "model": b.json()}));
        }
        let (Some((aq, q)), Some((ak, kv))) = (
            per_area(profile::Role::Dq, true),
            per_area(profile::Role::Dkdv, true),
        ) else {
            bail!("no main loop of the backward at D = {d} in the SASS");
        };
        // One unit of area: dQ's iteration covers aq entries, dK/dV's ak.
        let c = q.scaled(1.0 / aq).plus(&kv.scaled(1.0 / ak));
        let b = model::bound(&c, &g);
        println!(
            "  D = {d:>3} {:<22} {:>5.1} %  (bound: {})",
            "backward",
            100.0 * b.share,
            b.name
        );
        summary.push(json!({"d": d, "pass": "backward", "model": b.json()}));
    }
    let path = out.join("flash_tc.json");
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
