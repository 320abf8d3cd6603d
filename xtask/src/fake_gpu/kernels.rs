//! The kernels' CPU builds for terse's emulated CUDA device (fake_gpu/): every PTX module the
//! `cuda` binary loads (candle-kernels' affine ... unary, terse's kernels/*.cu) compiled
//! unchanged as host C++ under the SIMT shim's headers (kernels/shim/, fake_gpu/include/) into
//! `libterse_fake_<module>.so`, with a trampoline per `extern "C"` kernel that unpacks
//! cuLaunchKernel's kernelParams into the kernel's parameters, listed in the library's
//! `terse_fake_kernels` table (the contract in fake_gpu/fake_gpu.h). The driver
//! (fake_gpu/modules.cpp) finds a PTX module's `.entry` names in these tables and launches them
//! through the runtime in libcuda.so.1 (fake_gpu/fibers.cpp).
//!
//! The signatures are read from the preprocessed sources (candle's kernels are stamped out by
//! macros), as crates/simt/build.rs does for the shim. `extern __shared__` arrays (dynamic shared
//! memory) are rewritten, on the same line, to a pointer from the runtime. Builds are
//! incremental (a stamp per library: the hash of every input) and run two compilers at a time.
//! The modules only the kernels' test loads (fake_gpu/tests/kernels_test.cpp) go to a `test/`
//! subdirectory, out of the driver's sight.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[path = "../../../crates/model/build_geometry.rs"]
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

/// Bumped when the generated code or the way it is compiled changes, so stamps go stale.
const GENERATOR_VERSION: &str = "terse-fake-kernels 1";

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
    let libs = build_modules(&root, out_dir, &modules)?;
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
    build_modules(&root, &out_dir.join("test"), &tests)?;
    Ok(libs)
}

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root)
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "g++".into())
}

/// terse's kernels/*.cu, with the launch geometry the Rust side uses (crates/model's
/// kernel_checks.rs, as crates/model/build.rs passes it to nvcc).
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

fn terse_defines(root: &Path) -> Result<Vec<(String, u64)>> {
    let checks = root.join("crates/model/src/kernel_checks.rs");
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
fn build_modules(root: &Path, out_dir: &Path, modules: &[Module]) -> Result<Vec<PathBuf>> {
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
             xtask/src/fake_gpu/kernels.rs)",
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

/// The generated C++ of a module: its source, a trampoline per kernel, and the table.
fn trampolines(source: &Path, input: &Path, kernels: &[Entry]) -> String {
    let mut s = format!(
        "// Generated by xtask/src/fake_gpu/kernels.rs from {}: the CPU build of its kernels for\n\
         // terse's emulated CUDA device, a trampoline per kernel that unpacks cuLaunchKernel's\n\
         // kernelParams, and the table fake_gpu/modules.cpp looks the kernels up in.\n\
         #include \"fake_gpu.h\"\n\
         #include \"{}\"\n\nnamespace {{\n",
        source.display(),
        input.display()
    );
    for k in kernels {
        let args: Vec<String> = k
            .params
            .iter()
            .enumerate()
            .map(|(i, t)| format!("*({t}*)p[{i}]"))
            .collect();
        let p = if k.params.is_empty() {
            "void**"
        } else {
            "void** p"
        };
        s.push_str(&format!(
            "void terse_tramp_{n}({p}) {{ {n}({}); }}\n",
            args.join(", "),
            n = k.name
        ));
    }
    s.push_str("const terse_fake_kernel terse_fake_table[] = {\n");
    for k in kernels {
        s.push_str(&format!("    {{\"{n}\", terse_tramp_{n}}},\n", n = k.name));
    }
    s.push_str(
        "};\n}  // namespace\n\n\
         extern \"C\" __attribute__((visibility(\"default\"))) const terse_fake_kernel* \
         terse_fake_kernels(size_t* count) {\n\
         \x20   *count = sizeof(terse_fake_table) / sizeof(terse_fake_table[0]);\n\
         \x20   return terse_fake_table;\n}\n",
    );
    s
}

/// `extern __shared__ T name[];` (dynamic shared memory, an incomplete static array under the
/// shim) becomes `T *name = terse_shim::dynamic_shared();` on the same line. None when the
/// source has none.
fn rewrite_dynamic_shared(text: &str) -> Result<Option<String>, String> {
    let mark = "extern __shared__";
    if !text.contains(mark) {
        return Ok(None);
    }
    let mut out = String::with_capacity(text.len() + 64);
    let mut rest = text;
    while let Some(at) = rest.find(mark) {
        let line_start = rest[..at].rfind('\n').map_or(0, |i| i + 1);
        if rest[line_start..at].contains("//") {
            // In a comment: kept as it is.
            out.push_str(&rest[..at + mark.len()]);
            rest = &rest[at + mark.len()..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + mark.len()..];
        let end = after
            .find(';')
            .ok_or_else(|| "an `extern __shared__` declaration without `;`".to_string())?;
        let decl = after[..end].trim();
        let line = text[..text.len() - rest.len() + at].matches('\n').count() + 1;
        let bad = || {
            format!("line {line}: cannot rewrite `extern __shared__ {decl};` (expected `T name[]`)")
        };
        let head = match (decl.strip_suffix(']'), decl.rfind('[')) {
            (Some(inner), Some(open)) if inner[open + 1..].trim().is_empty() => {
                decl[..open].trim_end()
            }
            _ => return Err(bad()),
        };
        let name_start = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (spec, name) = head.split_at(name_start);
        if name.is_empty() || spec.trim().is_empty() || decl.contains('\n') {
            return Err(bad());
        }
        out.push_str(&format!(
            "{} *{name} = terse_shim::dynamic_shared()",
            spec.trim_end()
        ));
        rest = &after[end..];
    }
    out.push_str(rest);
    Ok(Some(out))
}

/// One `extern "C"` kernel as the preprocessor left it.
#[derive(Debug, PartialEq)]
struct Entry {
    name: String,
    /// Parameter types without their names (`const size_t*`, `__nv_bfloat16`...).
    params: Vec<String>,
}

/// The `extern "C" TERSE_KERNEL void name(params)` of the preprocessed text, in order, once
/// each (a declaration and its definition are one kernel). Kernels that are not `extern "C"`
/// (templates) are not entry points of the PTX and are skipped.
fn entries(pre: &str) -> Result<Vec<Entry>> {
    let mark = "TERSE_KERNEL";
    let mut out: Vec<Entry> = vec![];
    let mut from = 0;
    while let Some(at) = pre[from..].find(mark).map(|i| i + from) {
        from = at + mark.len();
        let before = pre[..at].trim_end();
        let after = pre[from..].trim_start();
        if !before.ends_with("extern \"C\"") && !before.ends_with("extern \"C\" static") {
            continue;
        }
        let Some(after) = after.strip_prefix("void") else {
            bail!("a kernel that does not return void: {}", snippet(after));
        };
        let open = after
            .find('(')
            .ok_or_else(|| anyhow!("a kernel without a parameter list: {}", snippet(after)))?;
        let name = after[..open].trim().to_string();
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_') {
            bail!(
                "a kernel name that is not an identifier: {}",
                snippet(after)
            );
        }
        let mut depth = 0usize;
        let mut close = None;
        for (i, c) in after[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close.ok_or_else(|| anyhow!("kernel {name}: unbalanced parentheses"))?;
        let params =
            parameters(&after[open + 1..close]).with_context(|| format!("kernel {name}"))?;
        match out.iter().find(|e| e.name == name) {
            Some(e) if e.params != params => {
                bail!("kernel {name} is declared with two parameter lists")
            }
            Some(_) => {}
            None => out.push(Entry { name, params }),
        }
    }
    Ok(out)
}

fn snippet(s: &str) -> String {
    s.chars().take(80).collect::<String>().replace('\n', " ")
}

/// The types of a parameter list, split at its top-level commas.
fn parameters(list: &str) -> Result<Vec<String>> {
    let list = list.trim();
    if list.is_empty() || list == "void" {
        return Ok(vec![]);
    }
    let mut parts = vec![];
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' | '[' | '<' => depth += 1,
            ')' | ']' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts.into_iter().map(parameter_type).collect()
}

/// Words that end a type, never name a parameter.
const TYPE_WORDS: &[&str] = &[
    "void", "bool", "char", "short", "int", "long", "float", "double", "signed", "unsigned",
];
const QUALIFIERS: &[&str] = &[
    "const",
    "volatile",
    "__restrict__",
    "__restrict",
    "restrict",
];

/// One parameter's type: its name dropped, an array made a pointer, restrict dropped,
/// spelled `const float*`.
fn parameter_type(p: &str) -> Result<String> {
    if p.contains('(') || p.contains('=') {
        bail!(
            "parameter `{}`: function pointers and defaults are not supported",
            p.trim()
        );
    }
    // Tokens: identifiers and single punctuation characters.
    let mut tokens: Vec<String> = vec![];
    let mut word = String::new();
    for c in p.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            tokens.push(c.to_string());
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    // An array parameter is a pointer.
    let mut pointer_from_array = false;
    if let Some(open) = tokens.iter().position(|t| t == "[") {
        if tokens.last().map(String::as_str) != Some("]") {
            bail!("parameter `{}`: cannot read its array declarator", p.trim());
        }
        tokens.truncate(open);
        pointer_from_array = true;
    }
    tokens.retain(|t| !matches!(t.as_str(), "__restrict__" | "__restrict" | "restrict"));
    let is_ident = |t: &str| {
        t.chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    };
    // The last word is the name when a type word comes before it.
    if let Some(last) = tokens.last() {
        let typed_before = tokens[..tokens.len() - 1]
            .iter()
            .any(|t| is_ident(t) && !QUALIFIERS.contains(&t.as_str()));
        if is_ident(last) && !TYPE_WORDS.contains(&last.as_str()) && typed_before {
            tokens.pop();
        }
    }
    if tokens.is_empty() {
        bail!("parameter `{}` has no type", p.trim());
    }
    let mut ty = String::new();
    for t in &tokens {
        if (t == "*" || t == "&") || ty.is_empty() {
            ty.push_str(t);
        } else {
            ty.push(' ');
            ty.push_str(t);
        }
    }
    if pointer_from_array {
        ty.push('*');
    }
    Ok(ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str, params: &[&str]) -> Entry {
        Entry {
            name: name.into(),
            params: params.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn signatures_are_read_from_the_preprocessed_text() {
        let pre = r#"
template <typename T> static TERSE_KERNEL void templated(const T* x, int n) {}
extern "C" TERSE_KERNEL void affine_f32( const size_t numel, const size_t num_dims,
    const size_t *info, const float *inp, float *out, const float mul, const float add ) { }
extern "C" TERSE_KERNEL void fill_bf16(__nv_bfloat16 *buf, __nv_bfloat16 value, const size_t numel) { fill_with(buf, value, numel); }
extern "C" TERSE_KERNEL void q(const void * vx, half * y, const int k);
extern "C" TERSE_KERNEL void q(const void * vx, half * y, const int k) { }
extern "C" TERSE_KERNEL void odd(unsigned int, const size_t, float x[4], const float * const p, int64_t idx) {}
extern "C" TERSE_KERNEL void none(void) {}
extern "C" TERSE_KERNEL void empty() {}
"#;
        let got = entries(pre).expect("parse");
        assert_eq!(
            got,
            vec![
                e(
                    "affine_f32",
                    &[
                        "const size_t",
                        "const size_t",
                        "const size_t*",
                        "const float*",
                        "float*",
                        "const float",
                        "const float"
                    ]
                ),
                e(
                    "fill_bf16",
                    &["__nv_bfloat16*", "__nv_bfloat16", "const size_t"]
                ),
                e("q", &["const void*", "half*", "const int"]),
                e(
                    "odd",
                    &[
                        "unsigned int",
                        "const size_t",
                        "float*",
                        "const float* const",
                        "int64_t"
                    ]
                ),
                e("none", &[]),
                e("empty", &[]),
            ]
        );
    }

    #[test]
    fn a_kernel_redeclared_differently_or_not_void_is_refused() {
        let twice = "extern \"C\" TERSE_KERNEL void k(int a);\nextern \"C\" TERSE_KERNEL void k(float a) {}";
        assert!(entries(twice).is_err());
        assert!(entries("extern \"C\" TERSE_KERNEL int k(int a) {}").is_err());
        assert!(entries("extern \"C\" TERSE_KERNEL void k(void (*f)(int)) {}").is_err());
    }

    #[test]
    fn dynamic_shared_memory_is_rewritten_on_its_line() {
        let src = "a\n    extern __shared__ int dst_row[];\nb extern __shared__ __align__(16) float2 s [ ] ;\n";
        let out = rewrite_dynamic_shared(src).expect("rewrite").expect("some");
        assert_eq!(
            out,
            "a\n    int *dst_row = terse_shim::dynamic_shared();\nb __align__(16) float2 *s = terse_shim::dynamic_shared();\n"
        );
        assert_eq!(rewrite_dynamic_shared("no shared here").expect("ok"), None);
        let commented = "// extern __shared__ memory\nextern __shared__ char s[];";
        assert_eq!(
            rewrite_dynamic_shared(commented)
                .expect("rewrite")
                .expect("some"),
            "// extern __shared__ memory\nchar *s = terse_shim::dynamic_shared();"
        );
        let e = rewrite_dynamic_shared("a\nb\n  extern __shared__ int x[4];").expect_err("sized");
        assert!(e.starts_with("line 3:"), "{e}");
    }

    #[test]
    fn trampolines_unpack_every_parameter() {
        let k = [e("k", &["const size_t", "const float*"]), e("z", &[])];
        let s = trampolines(Path::new("/s/k.cu"), Path::new("/s/k.cu"), &k);
        assert!(
            s.contains(
                "void terse_tramp_k(void** p) { k(*(const size_t*)p[0], *(const float**)p[1]); }"
            ),
            "{s}"
        );
        assert!(s.contains("void terse_tramp_z(void**) { z(); }"), "{s}");
        assert!(s.contains("{\"k\", terse_tramp_k},"), "{s}");
    }
}
