//! Compiling the kernels' CPU builds (xtask/src/fake_gpu/kernels/, called by its mod.rs): each
//! module's source, its dynamic shared memory rewritten (signatures.rs), preprocessed for its
//! kernels' signatures, then compiled with the generated trampolines into
//! `libterse_fake_<module>.so` under the SIMT shim's and fake_gpu/include's headers. A stamp per
//! library (the FNV-1a hash of the compiler's version, the flags and every input) skips a module
//! whose library is current; two compilers run at a time.

use super::signatures::{entries, rewrite_dynamic_shared, trampolines};
use super::Module;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Bumped when the generated code or the way it is compiled changes, so stamps go stale.
const GENERATOR_VERSION: &str = "terse-fake-kernels 2";

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".into())
}

/// Every regular file under `dir`, sorted.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

fn run(cmd: &mut Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let cut: String = err.chars().take(6000).collect();
        bail!("{what} failed ({}):\n{cut}", out.status);
    }
    Ok(out.stdout)
}

/// Builds `modules` into `out_dir`, two at a time, largest source first; returns the libraries
/// in the order of `modules`.
pub(super) fn build_modules(
    root: &Path,
    out_dir: &Path,
    modules: &[Module],
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir.join("src"))
        .with_context(|| format!("creating {}", out_dir.display()))?;
    let version = run(
        Command::new(cxx()).arg("--version"),
        "asking the compiler's version",
    )?;
    // The headers every module compiles against.
    let mut common = vec![root.join("fake_gpu/fake_gpu.h")];
    files_under(&root.join("fake_gpu/include"), &mut common)?;
    files_under(&root.join("kernels/shim"), &mut common)?;
    common.retain(|p| p.extension().is_none_or(|e| e != "cpp"));
    let mut order: Vec<usize> = (0..modules.len()).collect();
    let size = |m: &Module| std::fs::metadata(&m.source).map(|s| s.len()).unwrap_or(0);
    order.sort_by_key(|&i| std::cmp::Reverse(size(&modules[i])));
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = order.get(k) else { break };
                let m = &modules[i];
                if let Err(e) = build_module(root, out_dir, m, &common, &version) {
                    if let Ok(mut errs) = errors.lock() {
                        errs.push(format!("module {}: {e:#}", m.name));
                    }
                }
            });
        }
    });
    let errors = errors
        .into_inner()
        .map_err(|_| anyhow!("a build thread panicked"))?;
    if !errors.is_empty() {
        // The compiler's messages span lines; the error itself is printed as one.
        for e in &errors {
            eprintln!("{e}");
        }
        bail!(
            "building the kernels' CPU builds failed for {} module(s) (above; a module that \
             cannot be built must be listed, with the reason, in EXCLUDED in \
             xtask/src/fake_gpu/kernels/)",
            errors.len()
        );
    }
    Ok(modules.iter().map(|m| library(out_dir, &m.name)).collect())
}

fn library(out_dir: &Path, module: &str) -> PathBuf {
    out_dir.join(format!("libterse_fake_{module}.so"))
}

/// The compiler flags of a module, without the input and the output.
fn flags(root: &Path, m: &Module, preprocess: bool) -> Vec<String> {
    let p = |x: PathBuf| x.to_string_lossy().into_owned();
    let mut f: Vec<String> = vec![format!("-std={}", m.std), "-x".into(), "c++".into()];
    if preprocess {
        f.extend(["-E", "-P", "-DTERSE_KERNEL_MARK"].map(String::from));
    } else {
        f.extend(
            [
                "-O2",
                "-fPIC",
                "-shared",
                // The sources reinterpret bf16 arrays as float4 and back.
                "-fno-strict-aliasing",
                // Signed overflow wraps on the device.
                "-fwrapv",
                // Each f32 operation rounded on its own (no contraction into fma).
                "-ffp-contract=off",
                "-fno-math-errno",
                "-fvisibility=hidden",
                "-fvisibility-inlines-hidden",
                "-w",
            ]
            .map(String::from),
        );
    }
    for (k, v) in &m.defines {
        f.push(format!("-D{k}={v}"));
    }
    for dir in [
        "fake_gpu/include",
        "kernels/shim/include",
        "kernels/shim",
        "fake_gpu",
    ] {
        f.push("-I".into());
        f.push(p(root.join(dir)));
    }
    if let Some(dir) = m.source.parent() {
        f.push("-I".into());
        f.push(p(dir.to_path_buf()));
    }
    f.push("-include".into());
    f.push(p(root.join("fake_gpu/include/terse_fake_cuda.h")));
    f
}

fn build_module(
    root: &Path,
    out_dir: &Path,
    m: &Module,
    common: &[PathBuf],
    version: &[u8],
) -> Result<()> {
    let lib = library(out_dir, &m.name);
    let stamp_path = out_dir.join(format!("libterse_fake_{}.so.stamp", m.name));
    let compile_flags = flags(root, m, false);
    // The stamp: everything the library is made from.
    let mut h = Fnv::new();
    h.add(GENERATOR_VERSION.as_bytes());
    h.add(version);
    for f in compile_flags.iter().chain(&flags(root, m, true)) {
        h.add(f.as_bytes());
    }
    for file in std::iter::once(&m.source)
        .chain(&m.local_headers)
        .chain(common)
    {
        h.add(file.to_string_lossy().as_bytes());
        h.add(&std::fs::read(file).with_context(|| format!("reading {}", file.display()))?);
    }
    let stamp = format!("{:016x}\n", h.0);
    if lib.exists() && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        return Ok(());
    }

    eprintln!(
        "fake-gpu: compiling the CPU build of {}",
        m.source.display()
    );
    let text = std::fs::read_to_string(&m.source)
        .with_context(|| format!("reading {}", m.source.display()))?;
    let src_dir = out_dir.join("src");
    let input =
        match rewrite_dynamic_shared(&text).map_err(|e| anyhow!("{}: {e}", m.source.display()))? {
            Some(rewritten) => {
                let path = src_dir.join(format!("{}.cu", m.name));
                let body = format!("#line 1 \"{}\"\n{rewritten}", m.source.display());
                write_if_changed(&path, &body)?;
                path
            }
            None => m.source.clone(),
        };
    let pre = run(
        Command::new(cxx()).args(flags(root, m, true)).arg(&input),
        "preprocessing",
    )?;
    let kernels = entries(&String::from_utf8_lossy(&pre))?;
    if kernels.is_empty() {
        bail!("{} has no extern \"C\" kernel", m.source.display());
    }
    let cpp = src_dir.join(format!("{}.cpp", m.name));
    write_if_changed(&cpp, &trampolines(&m.source, &input, &kernels))?;
    let tmp = out_dir.join(format!("libterse_fake_{}.so.tmp", m.name));
    run(
        Command::new(cxx())
            .args(&compile_flags)
            .arg(&cpp)
            .arg(format!("-Wl,-soname,libterse_fake_{}.so", m.name))
            .arg("-o")
            .arg(&tmp),
        "compiling",
    )?;
    std::fs::rename(&tmp, &lib).with_context(|| format!("writing {}", lib.display()))?;
    std::fs::write(&stamp_path, stamp)
        .with_context(|| format!("writing {}", stamp_path.display()))?;
    Ok(())
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// 64-bit FNV-1a, for the stamps (stable across Rust versions, unlike std's hasher).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn add(&mut self, bytes: &[u8]) {
        // The length first, so consecutive fields cannot run into each other.
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
