//! `cargo xtask fake-gpu`: builds the emulated CUDA device (fake_gpu/: libcuda.so.1,
//! libcudart.so.13, libcublas.so.13, libcurand.so.10, libnccl.so.2 of the project's own) and the
//! kernels' CPU builds, then runs the unchanged `cuda` binary on them with those libraries first
//! on LD_LIBRARY_PATH (docs/gpu.md says what this checks and what it cannot).

mod compare;
mod faults;
pub(crate) mod kernels;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Where the libraries and the kernels' CPU builds go.
const OUT: &str = "target/fake-gpu";

/// How the emulated device behaves (TERSE_FAKE_GPU_* in the process it runs under).
#[derive(clap::Args, Default)]
struct Switches {
    /// Streams complete their work only at a synchronisation point, so a host read that lacks
    /// its sync sees stale memory.
    #[arg(long)]
    late: bool,
    /// Fresh device allocations read as zeros instead of NaN.
    #[arg(long)]
    zero_fill: bool,
    /// One line per driver call and launch on stderr.
    #[arg(long)]
    trace: bool,
    /// Inject a device fault (fake_gpu/faults.cpp): `alloc:N` (the Nth allocation fails out of
    /// memory), `launch:N` (the Nth kernel launch fails, and every later call with it: a sticky
    /// error) or `copy:N` (the Nth copy fails); N counts from 1 at the process's start.
    #[arg(long, value_name = "KIND:N")]
    fault: Option<String>,
    /// Kill a rank (SIGKILL) inside a phase: `R@S:PHASE`, such as `1@2:checkpoint` (rank 1 dies
    /// at its first device call inside step 2's checkpoint).
    #[arg(long, value_name = "R@S:PHASE")]
    kill_rank: Option<String>,
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    switches: Switches,
    /// Build and run the emulation's own tests (GEMM against a reference, cuRAND, NCCL across
    /// processes, kernels through the SIMT runtime) instead of the binary.
    #[arg(long)]
    self_test: bool,
    /// Run this training config on the CPU, then on the emulated `cuda:0` in f32 and in bf16
    /// compute, and hold each device run's metrics to the CPU's (compare.rs's tolerances).
    /// With it: a kill -9 of the f32 run after its first checkpoint, and a resume that must
    /// equal the uninterrupted run.
    #[arg(long, value_name = "CONFIG")]
    compare: Option<PathBuf>,
    /// Run each config on the CPU and on the emulated `cuda:0` in f32 compute only, held to the
    /// CPU run (one short config per feature: configs/fake_gpu/).
    #[arg(long, value_name = "CONFIG", num_args = 1..)]
    compare_f32: Vec<PathBuf>,
    /// Inject device faults into this config's run (f32 compute) and check that each loses
    /// nothing: one line naming the step, phase and cause, no partial checkpoint, and a resume
    /// equal to the uninterrupted run in metrics and final weights (faults.rs).
    #[arg(long, value_name = "CONFIG")]
    fault_campaign: Option<PathBuf>,
    /// With --fault-campaign: the number of sampled allocation, launch and copy faults (0:
    /// each kind once, CI's set); the killed rank is always one more case.
    #[arg(long, default_value_t = 0)]
    cases: usize,
    /// The CUDA toolchain directory (default ~/.cache/cuda-13.0, installed on first use).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The `cuda` binary's arguments (after `--`).
    #[arg(last = true)]
    args: Vec<String>,
}

/// One shared library of the emulation: its soname, sources and extra link flags.
struct Lib {
    soname: &'static str,
    sources: &'static [&'static str],
    links: &'static [&'static str],
}

const LIBS: &[Lib] = &[
    Lib {
        soname: "libcuda.so.1",
        sources: &[
            "diagnostics.cpp",
            "faults.cpp",
            "memory.cpp",
            "streams.cpp",
            "modules.cpp",
            "driver.cpp",
            "fibers/launch.cpp",
            "fibers/scheduler.cpp",
            "fibers/context.cpp",
        ],
        links: &["-ldl", "-pthread"],
    },
    Lib {
        soname: "libcudart.so.13",
        sources: &["runtime.cpp"],
        links: &["-l:libcuda.so.1"],
    },
    Lib {
        soname: "libcublas.so.13",
        sources: &["cublas/api.cpp", "cublas/kernel.cpp"],
        links: &["-l:libcuda.so.1", "-pthread"],
    },
    Lib {
        soname: "libcurand.so.10",
        sources: &["curand.cpp"],
        links: &["-l:libcuda.so.1"],
    },
    Lib {
        soname: "libnccl.so.2",
        sources: &[
            "nccl/api.cpp",
            "nccl/segment.cpp",
            "nccl/waits.cpp",
            "nccl/collectives.cpp",
            "nccl/reduce.cpp",
        ],
        links: &["-l:libcuda.so.1", "-lrt", "-pthread"],
    },
    Lib {
        soname: "libnvToolsExt.so.1",
        sources: &["nvtx.cpp"],
        links: &["-l:libcuda.so.1"],
    },
];

/// The emulation's own test programs: source, and the libraries each links.
const TESTS: &[(&str, &[&str])] = &[
    ("driver_test.cpp", &["-l:libcuda.so.1"]),
    ("gemm_test.cpp", &["-l:libcublas.so.13", "-l:libcuda.so.1"]),
    (
        "curand_test.cpp",
        &["-l:libcurand.so.10", "-l:libcuda.so.1"],
    ),
    (
        "nccl_test.cpp",
        &["-l:libnccl.so.2", "-l:libcuda.so.1", "-lrt", "-pthread"],
    ),
    ("kernels_test.cpp", &["-l:libcuda.so.1", "-ldl"]),
    ("flash_fa2_test.cpp", &["-l:libcuda.so.1", "-ldl"]),
    (
        "faults_test.cpp",
        &["-l:libnvToolsExt.so.1", "-l:libcuda.so.1"],
    ),
];

pub fn run(args: Args) -> Result<ExitCode> {
    let env = crate::gpu::toolchain_env(&args.dir.clone().unwrap_or_else(crate::gpu::default_dir))?;
    let cuda = env
        .iter()
        .find(|(k, _)| k == "CUDA_HOME")
        .map(|(_, v)| PathBuf::from(v))
        .unwrap_or_else(|| args.dir.clone().unwrap_or_else(crate::gpu::default_dir));
    let include = cuda.join("include");
    let out = PathBuf::from(OUT);
    let lib_dir = out.join("lib");
    build_libs(&lib_dir, &include)?;
    let kernels_dir = out.join("kernels");
    kernels::build(&kernels_dir)?;
    if args.self_test {
        return self_test(&out, &lib_dir, &kernels_dir, &include);
    }
    let bin = crate::gpu::build_cuda_binary(&env)?;
    if args.compare.is_some() || !args.compare_f32.is_empty() {
        return compare_runs(&bin, &lib_dir, &kernels_dir, &args);
    }
    if let Some(config) = &args.fault_campaign {
        let launch = |file: &Path, ranks: usize, env: &[(&str, String)]| -> Result<Command> {
            let mut cmd = Command::new(&bin);
            cmd.arg("train").arg("--config").arg(file);
            if ranks > 1 {
                cmd.arg("--nproc").arg(ranks.to_string());
            }
            device_env(&mut cmd, &lib_dir, &kernels_dir, &args.switches)?;
            cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
            Ok(cmd)
        };
        let dir = PathBuf::from(OUT).join("faults");
        faults::campaign(config, &dir, args.cases, &launch)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut cmd = Command::new(&bin);
    cmd.args(&args.args);
    device_env(&mut cmd, &lib_dir, &kernels_dir, &args.switches)?;
    let status = cmd
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(c.clamp(1, 255) as u8),
        None => bail!("{} was killed by a signal ({status})", bin.display()),
    })
}

/// `--compare` and `--compare-f32`: the CPU run, then the device runs, each checked against it.
fn compare_runs(bin: &Path, lib_dir: &Path, kernels_dir: &Path, args: &Args) -> Result<ExitCode> {
    let dir = PathBuf::from(OUT).join("compare");
    let command = |file: &Path, ranks: usize| -> Result<Command> {
        let mut cmd = Command::new(bin);
        cmd.arg("train").arg("--config").arg(file);
        if ranks > 1 {
            cmd.arg("--nproc").arg(ranks.to_string());
        }
        device_env(&mut cmd, lib_dir, kernels_dir, &args.switches)?;
        Ok(cmd)
    };
    let train = |config: &Path, device: &str, compute: &str, ranks: usize| {
        let label = format!("{ranks}ranks");
        let (file, metrics) = compare::variant(config, &dir, device, compute, &label, "never")?;
        println!(
            "== fake-gpu --compare: {device}, {compute} compute, {ranks} rank(s) ({})",
            file.display()
        );
        let t0 = std::time::Instant::now();
        let status = command(&file, ranks)?
            .status()
            .with_context(|| format!("running {}", bin.display()))?;
        if !status.success() {
            bail!(
                "training {} on {device} ({compute}) failed ({status})",
                config.display()
            );
        }
        println!("   {:.0} s", t0.elapsed().as_secs_f64());
        compare::read_metrics(&metrics)
    };
    let mut bad = vec![];
    let mut table = vec![
        "| config | compute | loss (max rel) | grad_norm | entropy | rollouts | logp gap (max) |"
            .to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    let name = |c: &Path| {
        c.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    if let Some(config) = &args.compare {
        let cpu = train(config, "cpu", "auto", 1)?;
        let mut f32_run = vec![];
        for tol in &compare::TOLERANCES {
            let dev = train(config, "cuda:0", tol.compute, 1)?;
            table.push(format!(
                "| {} {}",
                name(config),
                compare::summary(&cpu, &dev, tol)
            ));
            bad.extend(compare::violations(&cpu, &dev, tol));
            if tol.compute == "f32" {
                f32_run = dev;
            }
        }
        // "cuda": rank r takes cuda:r, as on a GPU node.
        let two = train(config, "cuda", "f32", 2)?;
        bad.extend(compare::rank_violations(&f32_run, &two));
        bad.extend(resume_check(config, &dir, &command, &f32_run)?);
    }
    for config in &args.compare_f32 {
        let cpu = train(config, "cpu", "auto", 1)?;
        let dev = train(config, "cuda:0", "f32", 1)?;
        table.push(format!(
            "| {} {}",
            name(config),
            compare::summary(&cpu, &dev, &compare::TOLERANCES[0])
        ));
        bad.extend(compare::violations(&cpu, &dev, &compare::TOLERANCES[0]));
    }
    println!("{}", table.join("\n"));
    compare::check(&bad)?;
    println!("fake-gpu --compare: every device run agrees with the CPU within its tolerances");
    Ok(ExitCode::SUCCESS)
}

/// The f32 device run again, killed (SIGKILL) once its first checkpoint is on disk, then
/// resumed onto the device: its metrics must equal `whole`'s.
fn resume_check(
    config: &Path,
    dir: &Path,
    command: &dyn Fn(&Path, usize) -> Result<Command>,
    whole: &[serde_json::Value],
) -> Result<Vec<String>> {
    let (file, metrics) = compare::variant(config, dir, "cuda:0", "f32", "resumed", "never")?;
    let run_dir = metrics.parent().context("a run directory")?.to_path_buf();
    println!(
        "== fake-gpu --compare: kill -9 after the first checkpoint, then resume ({})",
        file.display()
    );
    let mut child = command(&file, 1)?
        .spawn()
        .context("starting the run to kill")?;
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the run to kill ended by itself first ({status})");
        }
        if has_checkpoint(&run_dir) {
            break;
        }
        if t0.elapsed() > std::time::Duration::from_secs(600) {
            let _ = child.kill();
            bail!("no checkpoint in {} after 600 s", run_dir.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().context("kill -9")?;
    child.wait()?;
    let (file, metrics) = compare::variant(config, dir, "cuda:0", "f32", "resumed", "auto")?;
    let status = command(&file, 1)?.status().context("resuming")?;
    if !status.success() {
        bail!("the resumed run failed ({status})");
    }
    Ok(compare::resume_violations(
        whole,
        &compare::read_metrics(&metrics)?,
    ))
}

/// Whether a GRPO checkpoint after step 0 is there (checkpoint.rs renames a complete one into
/// place, so its directory existing means it is whole).
fn has_checkpoint(run_dir: &Path) -> bool {
    std::fs::read_dir(run_dir)
        .map(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                e.file_name().to_string_lossy().starts_with("step_00000")
                    && e.file_name() != "step_000000"
            })
        })
        .unwrap_or(false)
}

/// The environment that puts the emulated device under a process.
fn device_env(
    cmd: &mut Command,
    lib_dir: &Path,
    kernels_dir: &Path,
    switches: &Switches,
) -> Result<()> {
    let abs = |p: &Path| -> Result<PathBuf> {
        p.canonicalize()
            .with_context(|| format!("resolving {}", p.display()))
    };
    let mut path = abs(lib_dir)?.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", path)
        .env("TERSE_FAKE_GPU_KERNELS", abs(kernels_dir)?);
    if switches.late {
        cmd.env("TERSE_FAKE_GPU_LATE", "1");
    }
    if switches.zero_fill {
        cmd.env("TERSE_FAKE_GPU_FILL", "zero");
    }
    if switches.trace {
        cmd.env("TERSE_FAKE_GPU_TRACE", "1");
    }
    if let Some(f) = &switches.fault {
        cmd.env("TERSE_FAKE_GPU_FAULT", f);
    }
    if let Some(k) = &switches.kill_rank {
        cmd.env("TERSE_FAKE_GPU_KILL_RANK", k);
    }
    Ok(())
}

/// Compiles `sources` (under fake_gpu/) into `out` unless a stamp of their contents and the
/// command line says it is current.
fn compile(out: &Path, sources: &[PathBuf], flags: &[String]) -> Result<()> {
    let mut key = flags.join(" ");
    for s in sources {
        key.push_str(
            &std::fs::read_to_string(s).with_context(|| format!("reading {}", s.display()))?,
        );
    }
    let mut deps = headers(Path::new("fake_gpu"), false)?;
    // A self-test program also depends on the headers its scenarios are split into
    // (fake_gpu/tests/*/), which the libraries' stamps leave out.
    if sources.iter().any(|s| s.starts_with("fake_gpu/tests")) {
        deps.extend(headers(Path::new("fake_gpu/tests"), true)?);
    }
    for h in deps {
        key.push_str(
            &std::fs::read_to_string(&h).with_context(|| format!("reading {}", h.display()))?,
        );
    }
    let stamp = out.with_extension("stamp");
    let digest = format!("{:016x}", fnv(key.as_bytes()));
    if out.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(digest.as_str()) {
        return Ok(());
    }
    let status = Command::new("g++")
        .args(["-std=c++17", "-O2", "-g1", "-Wall", "-fPIC"])
        .args(sources)
        .args(flags)
        .arg("-o")
        .arg(out)
        .status()
        .context("running g++ (the emulated device is C++)")?;
    if !status.success() {
        bail!("g++ failed building {} ({status})", out.display());
    }
    std::fs::write(&stamp, digest).with_context(|| format!("writing {}", stamp.display()))
}

/// Every header under `dir` (fake_gpu/'s own and its libraries' private ones; the self-tests'
/// only with `tests`), sorted, so a change to any of them rebuilds what includes it.
fn headers(dir: &Path, tests: bool) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() && (tests || p.file_name().is_some_and(|n| n != "tests")) {
            out.extend(headers(&p, tests)?);
        } else if p.extension().is_some_and(|x| x == "h") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// FNV-1a: a stable digest for the build stamps (no dependency for a cache key).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn build_libs(lib_dir: &Path, include: &Path) -> Result<()> {
    std::fs::create_dir_all(lib_dir).with_context(|| format!("creating {}", lib_dir.display()))?;
    for lib in LIBS {
        let sources: Vec<PathBuf> = lib
            .sources
            .iter()
            .map(|s| Path::new("fake_gpu").join(s))
            .collect();
        let mut flags = vec![
            "-shared".to_string(),
            "-Ifake_gpu".to_string(),
            format!("-I{}", include.display()),
            format!("-Wl,-soname,{}", lib.soname),
            format!("-L{}", lib_dir.display()),
            "-Wl,-rpath,$ORIGIN".to_string(),
        ];
        let script = Path::new("fake_gpu/versions").join(format!("{}.map", lib.soname));
        if script.exists() {
            flags.push(format!("-Wl,--version-script={}", script.display()));
        }
        flags.extend(lib.links.iter().map(|l| l.to_string()));
        compile(&lib_dir.join(lib.soname), &sources, &flags)?;
    }
    Ok(())
}

fn self_test(out: &Path, lib_dir: &Path, kernels_dir: &Path, include: &Path) -> Result<ExitCode> {
    let bin_dir = out.join("tests");
    std::fs::create_dir_all(&bin_dir).with_context(|| format!("creating {}", bin_dir.display()))?;
    let mut failed = vec![];
    for (src, links) in TESTS {
        let exe = bin_dir.join(src.trim_end_matches(".cpp"));
        let mut flags = vec![
            "-Ifake_gpu".to_string(),
            format!("-I{}", include.display()),
            format!("-L{}", lib_dir.display()),
        ];
        flags.extend(links.iter().map(|l| l.to_string()));
        compile(&exe, &[Path::new("fake_gpu/tests").join(src)], &flags)?;
        let mut cmd = Command::new(&exe);
        cmd.arg(kernels_dir);
        device_env(&mut cmd, lib_dir, kernels_dir, &Switches::default())?;
        println!("== fake-gpu self-test: {src}");
        let status = cmd
            .status()
            .with_context(|| format!("running {}", exe.display()))?;
        if !status.success() {
            failed.push(format!("{src} ({status})"));
        }
    }
    if failed.is_empty() {
        println!("fake-gpu self-test: {} programs passed", TESTS.len());
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("fake-gpu self-test failed: {}", failed.join(", "))
    }
}
