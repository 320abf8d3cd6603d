//! The kernels' CPU builds for terse's emulated CUDA device (fake_gpu/): every PTX module the
//! `cuda` binary loads (candle-kernels' affine ... unary, terse's kernels/*.cu) compiled
//! unchanged as host C++ under the SIMT shim's headers (kernels/shim/, fake_gpu/include/) into
//! `libterse_fake_<module>.so`, with a trampoline per `extern "C"` kernel that unpacks
//! cuLaunchKernel's kernelParams into the kernel's parameters, listed in the library's
//! `terse_fake_kernels` table (the contract in fake_gpu/fake_gpu.h). The driver
//! (fake_gpu/modules.cpp) finds a PTX module's `.entry` names in these tables and launches them
//! through the runtime in libcuda.so.1 (fake_gpu/fibers/).
//!
//! The signatures are read from the preprocessed sources (candle's kernels are stamped out by
//! macros), as crates/simt/build.rs does for the shim. `extern __shared__` arrays (dynamic shared
//! memory) are rewritten, on the same line, to a pointer from the runtime. Builds are
//! incremental (a stamp per library: the hash of every input) and run two compilers at a time.
//! The modules only the kernels' test loads (fake_gpu/tests/kernels_test.cpp) go to a test/
//! subdirectory of the output, out of the driver's sight.
//!
//! This file finds the modules (candle-kernels' sources through `cargo metadata`, terse's
//! kernels/*.cu with their launch geometry) and is the entry point; compile.rs preprocesses and
//! compiles each one under its stamp; signatures.rs reads the kernels' signatures, rewrites
//! dynamic shared memory and writes the trampolines and the table.

mod compile;
mod signatures;

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../../../crates/model/build_geometry.rs"]
mod geometry;

/// candle-kernels' PTX modules (its `kernels::AFFINE` ... `kernels::UNARY`).
const CANDLE_MODULES: &[&str] = &[
    "affine",
    "binary",
    "cast",
    "conv",
    "fill",
    "indexing",
    "quantized",
    "reduce",
    "sort",
    "ternary",
    "unary",
];

/// Modules with no CPU build, and why. Their kernels are absent from every table, so the driver
/// reports "kernel X of module M has no CPU build" when one is launched. Empty: all build.
pub(super) const EXCLUDED: &[(&str, &str)] = &[];

/// One module: a .cu source and how to compile it.
struct Module {
    name: String,
    source: PathBuf,
    /// `c++17` for candle's (as nvcc compiled them), `c++20` for terse's (as the shim does).
    std: &'static str,
    defines: Vec<(String, String)>,
    /// The headers next to the source (included with quotes), part of the stamp.
    local_headers: Vec<PathBuf>,
}

/// Builds every module's library into `out_dir` (generated sources under `out_dir/src/`) and
/// returns the libraries' paths, candle's modules first, then terse's. A module that fails to
/// build is an error unless it is listed in [`EXCLUDED`]. Also builds, into `out_dir/test/`
/// (where the driver does not look), the modules only fake_gpu/tests/kernels_test.cpp loads:
/// crates/simt/faulty.cu's broken kernels and fake_gpu/tests/test_kernels.cu.
pub(super) fn build(out_dir: &Path) -> Result<Vec<PathBuf>> {
    // Generated sources #include their rewritten .cu by path: make it absolute.
    let out_dir = &std::path::absolute(out_dir)
        .with_context(|| format!("resolving {}", out_dir.display()))?;
    let root = repo_root();
    let candle = candle_kernels_src(&root)?;
    let mut modules = vec![];
    for name in CANDLE_MODULES {
        if EXCLUDED.iter().any(|(m, _)| m == name) {
            continue;
        }
        modules.push(Module {
            name: (*name).to_string(),
            source: candle.join(format!("{name}.cu")),
            std: "c++17",
            defines: vec![],
            local_headers: headers_in(&candle)?,
        });
    }
    let defines: Vec<(String, String)> = terse_defines(&root)?
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    modules.extend(terse_modules(&root, &defines)?);
    let libs = compile::build_modules(&root, out_dir, &modules)?;
    let tests = [
        ("faulty", root.join("crates/simt/faulty.cu")),
        ("test_kernels", root.join("fake_gpu/tests/test_kernels.cu")),
    ]
    .map(|(name, source)| Module {
        name: name.into(),
        source,
        std: "c++20",
        defines: defines.clone(),
        local_headers: vec![],
    });
    compile::build_modules(&root, &out_dir.join("test"), &tests)?;
    Ok(libs)
}

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

/// terse's kernels/*.cu, with the launch geometry the Rust side uses (crates/model's
/// kernels/geometry.rs, as crates/model/build.rs passes it to nvcc).
fn terse_modules(root: &Path, defines: &[(String, String)]) -> Result<Vec<Module>> {
    let dir = root.join("kernels");
    let local_headers = headers_in(&dir)?;
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    sources.retain(|p| p.extension().is_some_and(|e| e == "cu"));
    sources.sort();
    let mut out = vec![];
    for source in sources {
        let name = stem(&source)?;
        if CANDLE_MODULES.contains(&name.as_str()) {
            bail!("kernels/{name}.cu has the name of a candle-kernels module");
        }
        out.push(Module {
            name,
            source,
            std: "c++20",
            defines: defines.to_vec(),
            local_headers: local_headers.clone(),
        });
    }
    Ok(out)
}

pub(crate) fn terse_defines(root: &Path) -> Result<Vec<(String, u64)>> {
    let checks = root.join("crates/model/src/kernels/geometry.rs");
    let text = std::fs::read_to_string(&checks)
        .with_context(|| format!("reading {}", checks.display()))?;
    Ok(geometry::kernel_defines(&text))
}

fn stem(p: &Path) -> Result<String> {
    p.file_stem()
        .and_then(|s| s.to_str())
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{}: not a UTF-8 file name", p.display()))
}

/// The .cuh / .h files of a source directory, sorted.
fn headers_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    out.retain(|p| p.extension().is_some_and(|e| e == "cuh" || e == "h"));
    out.sort();
    Ok(out)
}

/// candle-kernels' src/ directory, from `cargo metadata` (the version the `cuda` build uses).
fn candle_kernels_src(root: &Path) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let info = Command::new(&rustc)
        .arg("-vV")
        .output()
        .with_context(|| format!("running {rustc} -vV"))?;
    let host = String::from_utf8_lossy(&info.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| anyhow!("{rustc} -vV names no host"))?;
    let out = Command::new(&cargo)
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--features",
            "xtask/cuda",
        ])
        .args(["--filter-platform", &host])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing cargo metadata's output")?;
    let found: Vec<&str> = meta["packages"]
        .as_array()
        .ok_or_else(|| anyhow!("cargo metadata lists no packages"))?
        .iter()
        .filter(|p| p["name"] == "candle-kernels")
        .filter_map(|p| p["manifest_path"].as_str())
        .collect();
    match found.as_slice() {
        [one] => Ok(Path::new(one)
            .parent()
            .ok_or_else(|| anyhow!("{one}: no parent directory"))?
            .join("src")),
        [] => bail!("cargo metadata lists no candle-kernels (the `cuda` build's dependency)"),
        many => bail!("cargo metadata lists several candle-kernels: {many:?}"),
    }
}
