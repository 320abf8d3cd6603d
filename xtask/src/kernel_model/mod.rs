//! `cargo xtask kernel-model`: a performance model of the tensor-core flash attention kernels
//! (kernels/flash_tc.cu, and FlashAttention-2's flash_fa2.cu and flash_fa2_bwd.cu) read from
//! their compiled code. Compiles each source for sm_90 with the project's nvcc
//! (scripts/cuda-toolchain.sh), disassembles it with nvdisasm, counts what one warp executes per
//! loop iteration (sass.rs, model.rs), the shared-memory wavefronts of each access (banks.rs,
//! with the lane addresses of profile/), and prints per kernel the bound and the estimated share
//! of the H200's dense bf16 peak, with a summary per family and a JSON copy under target/.
//! The FA2 kernels' inputs to the timing model (timing.rs: the main loop's counts, the warp's
//! dependency latency from latency.rs, registers, shared memory) go to
//! target/kernel-model/model-inputs.json; `--check-measured` (measured.rs) checks the timing model
//! against the committed H200 measurement.

mod banks;
mod latency;
mod measured;
mod model;
mod optional;
mod profile;
mod sass;
mod timing;

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

/// The SASS of kernels/`file` for sm_90, with inlined line info and control bits (the cubin
/// under `out`), and each function's registers as ptxas reports them.
fn disassemble(
    root: &Path,
    defines: &[(String, u64)],
    out: &Path,
    file: &str,
) -> Result<(String, Vec<(String, u64)>)> {
    let (nvcc, nvdisasm) = tools(root)?;
    let cubin = out.join(Path::new(file).with_extension("cubin"));
    let mut cmd = Command::new(&nvcc);
    cmd.args([
        "-arch=sm_90",
        "-cubin",
        "-O3",
        "-std=c++17",
        "-lineinfo",
        "--resource-usage",
    ]);
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
    let registers = ptxas_registers(&format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    ));
    let o = Command::new(&nvdisasm)
        .args(["-c", "-gi", "-hex"])
        .arg(&cubin)
        .output()
        .with_context(|| format!("running {}", nvdisasm.display()))?;
    if !o.status.success() {
        bail!("nvdisasm failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let sass =
        String::from_utf8(o.stdout).context("nvdisasm printed something that is not UTF-8")?;
    Ok((sass, registers))
}

/// (function, registers) from ptxas's `--resource-usage` lines: `Function properties for F`
/// followed by `Used N registers`.
fn ptxas_registers(text: &str) -> Vec<(String, u64)> {
    let mut out = vec![];
    let mut function = None;
    for line in text.lines() {
        if let Some(f) = line.split("Function properties for ").nth(1) {
            function = Some(f.trim().to_string());
        } else if let (Some(f), Some(n)) = (
            function.as_ref(),
            line.split("Used ")
                .nth(1)
                .and_then(|r| r.split(" registers").next())
                .and_then(|n| n.trim().parse().ok()),
        ) {
            out.push((f.clone(), n));
            function = None;
        }
    }
    out
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

pub fn run(check_measured: bool) -> Result<ExitCode> {
    let root = std::env::current_dir()?;
    if check_measured {
        return check_measured_run(&root);
    }
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
    let mut inputs = vec![];
    for s in &sources {
        let (text, registers) = disassemble(&root, &defines, &out, s.file)?;
        let functions = sass::parse(&text)?;
        for k in &s.kernels {
            let (rows, main) = kernel(k, &functions, &g)?;
            records.push(json!({"kernel": k.name, "file": s.file, "family": k.family,
                "d": k.d, "main_loop_line": k.main_line, "loops": rows}));
            if k.family == "FA2" {
                inputs.push(timing_inputs(k, &functions, &main, &registers, warps)?);
            }
            mains.extend(main);
        }
    }
    predictions(&inputs);
    let path = out.join("model-inputs.json");
    let doc = json!({"produced_by": "cargo xtask kernel-model (xtask/src/kernel_model/)",
        "shape": {"hq": 16, "hkv": 8},
        "kernels": inputs.iter().map(measured::Inputs::json).collect::<Vec<_>>()});
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    println!("written: {}", path.display());
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

/// `cargo xtask kernel-model --check-measured`: the timing model against the committed
/// measurement, failing when a kernel is past 20 %.
fn check_measured_run(root: &Path) -> Result<ExitCode> {
    let dir = root.join(measured::DIR);
    let k = timing::H200_FIT;
    println!(
        "kernel-model --check-measured: {} (Nsight Compute durations; inputs from the SASS of \
         the measured kernels: model-inputs.json). Fitted: contention {} cycles^2 over the \
         warps' latency, block {} \
         cycles, launch {:.1} us; mma.sync at {:.2} of the dense rate; L2 {:.1} TB/s",
        measured::DIR,
        k.contention,
        k.block_cycles,
        k.launch_s * 1e6,
        k.mma_rate,
        k.l2_bytes_per_s / 1e12
    );
    let rows = measured::check(&dir, &model::H200, &k, &timing::SM90)?;
    if measured::print(&rows) {
        println!("every kernel within 20 %");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("a kernel is past 20 %: the model does not reproduce the measurement");
        Ok(ExitCode::FAILURE)
    }
}

/// The timing model's inputs of FA2 kernel `k`: its main loop's counts (without the optional
/// blocks), a lone warp's cycles per instruction over that loop, its registers (ptxas) and
/// shared memory (its layout, fa2.rs).
fn timing_inputs(
    k: &Kernel,
    functions: &[sass::Function],
    mains: &[Main],
    registers: &[(String, u64)],
    warps: u64,
) -> Result<measured::Inputs> {
    let f = functions
        .iter()
        .find(|f| f.name == k.name)
        .with_context(|| format!("no function {} in the SASS", k.name))?;
    let main = mains
        .iter()
        .find(|m| m.base)
        .with_context(|| format!("{}: no main loop", k.name))?;
    let l = f
        .loops()
        .into_iter()
        .find(|l| {
            f.back_edge(l)
                .and_then(|b| b.lines_in(k.profile.file()).first().copied())
                == Some(k.main_line)
        })
        .with_context(|| format!("{}: no main loop", k.name))?;
    let p = k.profile.as_ref();
    let mma = model::H200.flop_per_clock / timing::SM90.schedulers * timing::H200_FIT.mma_rate;
    let optional = optional::optional(f, &l, p);
    let latency = latency::cycles_per_instruction(
        f,
        &l,
        &|i| optional.contains(&i.addr),
        &latency::HOPPER,
        sass::hmma_flops("HMMA.16816") / mma,
    )
    .with_context(|| format!("{}: the SASS has no control bits", k.name))?;
    let registers = registers
        .iter()
        .find(|(n, _)| *n == k.name)
        .map(|&(_, r)| r)
        .with_context(|| format!("ptxas reported no registers for {}", k.name))?;
    Ok(measured::Inputs {
        name: k.name.clone(),
        role: k.role,
        d: k.d,
        warps,
        registers,
        shared: profile::fa2::shared_bytes(k.role, k.d),
        area: k.area,
        step: timing::Step {
            counts: main.counts,
            latency,
        },
    })
}

/// Prints the timing model's predictions for the FA2 kernels at gpu-check's shapes (causal,
/// Hq 16, Hkv 8: the forward at T = 8192, the three kernels at T = 4096): each launch's time,
/// the forward's TFLOP/s as gpu-check counts them (4 Hq D T^2 / 2, over the dense peak) and the
/// three kernels' sum per head size.
fn predictions(inputs: &[measured::Inputs]) {
    println!("\npredicted (timing model, H200; causal, Hq 16, Hkv 8):");
    let mut sums: Vec<(u64, u64, f64)> = vec![];
    for i in inputs {
        for t in [4096, 8192] {
            let s = measured::Shape { t, hq: 16, hkv: 8 };
            let p = timing::predict(
                &measured::launch(i, s),
                &i.step,
                &model::H200,
                &timing::H200_FIT,
                &timing::SM90,
            );
            let rate = if i.role == Role::Forward {
                let flops = 4.0 * (s.hq * i.d) as f64 * (t * t) as f64 / 2.0 / p.seconds;
                format!(
                    ", {:.0} TFLOP/s = {:.1} % of peak",
                    flops / 1e12,
                    100.0 * flops / model::H200.peak()
                )
            } else {
                String::new()
            };
            println!(
                "  {:<26} T = {t:>5}: {:>8.1} us{rate}  ({} blocks/SM by {}, {:.2} waves, latency {:.2} cycles/instr)",
                i.name,
                p.seconds * 1e6,
                p.blocks_per_sm,
                p.limit,
                p.waves,
                i.step.latency
            );
            match sums.iter_mut().find(|(d, tt, _)| *d == i.d && *tt == t) {
                Some(sum) => sum.2 += p.seconds,
                None => sums.push((i.d, t, p.seconds)),
            }
        }
    }
    for (d, t, seconds) in sums {
        println!(
            "  D = {d:>3}, T = {t:>5}: forward + dQ + dK/dV kernels {:.1} us",
            seconds * 1e6
        );
    }
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
         attention area; the forward's optional block is flash_tc's rescale, FA2's key mask; \
         atomic dQ and mask = dK/dV with its optional blocks alone):"
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
                lines.push(("forward with its optional block", m.counts));
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
                lines.push(("backward, atomic dQ and mask", m.counts));
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
