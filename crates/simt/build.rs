//! Compiles kernels/*.cu unchanged as host C++ under the SIMT shim (kernels/shim/), with a
//! trampoline per kernel entry point that unpacks an argument array (as cuLaunchKernel's
//! kernelParams) into the kernel's parameters, and writes $OUT_DIR/kernels.rs: every entry
//! point's name, parameter types and trampoline. The signatures are read from the preprocessed
//! sources, so the kernels' macros (one body per dtype) need no second description.
//!
//! `TERSE_SIMT_SANITIZE=thread` or `=address` builds the shim and the kernels with
//! ThreadSanitizer or AddressSanitizer (.ci/run's sanitizer job).

use std::path::PathBuf;
use std::process::Command;

#[path = "../model/build_geometry.rs"]
mod geometry;

/// crates/simt's own test kernels, beside kernels/*.cu (src/lib_tests/coverage.rs names them too).
const FIXTURES: [&str; 2] = ["faulty.cu", "fragments.cu"];

/// One kernel entry point as the preprocessor left it.
struct Entry {
    name: String,
    /// Parameter types, spelled as in the source (`const float*`, `int`, ...).
    params: Vec<String>,
}

/// `extern "C" TERSE_KERNEL void name(params)` in the preprocessed text.
fn entries(pre: &str) -> Vec<Entry> {
    let mut out = vec![];
    let mark = "TERSE_KERNEL void ";
    let mut rest = pre;
    while let Some(at) = rest.find(mark) {
        rest = &rest[at + mark.len()..];
        let open = rest.find('(').expect("a kernel's parameter list");
        let close = rest.find(')').expect("a kernel's parameter list ends");
        let name = rest[..open].trim().to_string();
        let params = rest[open + 1..close]
            .split(',')
            .map(|p| {
                // Drop the parameter name: the type is everything before the last word.
                let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                let cut = p
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .expect("a parameter with a type");
                p[..=cut].trim().replace(" *", "*")
            })
            .collect();
        out.push(Entry { name, params });
    }
    out
}

/// The Rust `Param` variant of a C parameter type.
fn param(ty: &str) -> &'static str {
    match ty {
        "const float*" => "Param::Ptr(Elem::F32, false)",
        "float*" => "Param::Ptr(Elem::F32, true)",
        "const __nv_bfloat16*" | "const bf16*" => "Param::Ptr(Elem::Bf16, false)",
        "__nv_bfloat16*" | "bf16*" => "Param::Ptr(Elem::Bf16, true)",
        "const __half*" => "Param::Ptr(Elem::F16, false)",
        "__half*" => "Param::Ptr(Elem::F16, true)",
        "const uint32_t*" | "const unsigned*" => "Param::Ptr(Elem::U32, false)",
        "uint32_t*" | "unsigned*" => "Param::Ptr(Elem::U32, true)",
        "const uint8_t*" => "Param::Ptr(Elem::U8, false)",
        "uint8_t*" => "Param::Ptr(Elem::U8, true)",
        "const uint64_t*" => "Param::Ptr(Elem::U64, false)",
        // An f64 buffer travels as its bits (`Buf::U64`), 8 bytes an element either way.
        "double*" => "Param::Ptr(Elem::U64, true)",
        "const int*" => "Param::Ptr(Elem::I32, false)",
        "int*" => "Param::Ptr(Elem::I32, true)",
        "int" => "Param::I32",
        "unsigned" | "uint32_t" => "Param::U32",
        "float" => "Param::F32",
        "size_t" => "Param::U64",
        other => panic!("kernel parameter type `{other}` has no shim argument kind; add it"),
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("../..")
        .canonicalize()
        .expect("repository root");
    let kernels = root.join("kernels");
    let shim = kernels.join("shim");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo::rerun-if-changed={}", kernels.display());
    println!("cargo::rerun-if-changed={}", shim.display());
    println!("cargo::rerun-if-env-changed=TERSE_SIMT_SANITIZE");
    let checks = root.join("crates/model/src/kernels/geometry.rs");
    println!("cargo::rerun-if-changed={}", checks.display());
    let defines =
        geometry::kernel_defines(&std::fs::read_to_string(&checks).expect("kernels/geometry.rs"));

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("kernels/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    sources.sort();
    // The shim's own fixtures: kernels that break the rules on purpose (faulty.cu) and probes
    // of kernels/mma.cuh's fragment mapping (fragments.cu).
    for fixture in FIXTURES {
        let path =
            PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join(fixture);
        println!("cargo::rerun-if-changed={}", path.display());
        sources.push(path);
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let include = shim.join("include");
    let header = shim.join("cuda_shim.h");
    let mut generated = vec![];
    let mut table = String::new();
    for cu in &sources {
        let stem = cu
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("name")
            .to_string();
        let mut cmd = Command::new(&cxx);
        cmd.args(["-E", "-P", "-std=c++20", "-x", "c++", "-DTERSE_KERNEL_MARK"])
            .arg("-I")
            .arg(&include)
            .arg("-include")
            .arg(&header);
        for (k, v) in &defines {
            cmd.arg(format!("-D{k}={v}"));
        }
        let pre = cmd.arg(cu).output().expect("running the C++ preprocessor");
        assert!(
            pre.status.success(),
            "preprocessing {}: {}",
            cu.display(),
            String::from_utf8_lossy(&pre.stderr)
        );
        let found = entries(&String::from_utf8_lossy(&pre.stdout));
        assert!(!found.is_empty(), "{} has no kernel", cu.display());
        let mut cpp = format!("#include \"{}\"\n", cu.display());
        for e in &found {
            let args: Vec<String> = e
                .params
                .iter()
                .enumerate()
                .map(|(i, t)| format!("*({t}*)a[{i}]"))
                .collect();
            cpp.push_str(&format!(
                "extern \"C\" void terse_tramp_{n}(void** a) {{ {n}({}); }}\n",
                args.join(", "),
                n = e.name
            ));
            let params: Vec<&str> = e.params.iter().map(|t| param(t)).collect();
            table.push_str(&format!(
                "    Kernel {{ name: \"{n}\", file: \"{stem}.cu\", params: &[{}], body: terse_tramp_{n} }},\n",
                params.join(", "),
                n = e.name
            ));
        }
        let gen = out.join(format!("shim_{stem}.cpp"));
        std::fs::write(&gen, cpp).expect("writing a trampoline file");
        generated.push(gen);
    }

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .include(&include)
        .flag("-include")
        .flag(header.to_str().expect("utf-8 path"))
        .flag("-pthread")
        .flag("-fno-fast-math")
        .opt_level(1)
        .warnings(false)
        .file(shim.join("cuda_shim.cpp"))
        .files(&generated);
    for (k, v) in &defines {
        build.define(k, Some(v.to_string().as_str()));
    }
    match std::env::var("TERSE_SIMT_SANITIZE").ok().as_deref() {
        None | Some("") => {}
        Some(s @ ("thread" | "address")) => {
            build
                .flag(format!("-fsanitize={s}"))
                .flag("-g")
                .flag("-fno-omit-frame-pointer");
            // gcc's runtime, linked into whatever links this crate (its test binary).
            let lib = if s == "thread" { "tsan" } else { "asan" };
            println!("cargo::rustc-link-lib=dylib={lib}");
        }
        Some(other) => panic!("TERSE_SIMT_SANITIZE={other}: expected thread or address"),
    }
    build.compile("terse_simt");
    println!("cargo::rustc-link-lib=stdc++");

    let decls: String = table
        .lines()
        .map(|l| {
            let n = l
                .split("body: ")
                .nth(1)
                .expect("body")
                .trim_end_matches(" },");
            format!("    fn {n}(args: *mut *mut core::ffi::c_void);\n")
        })
        .collect();
    let rs = format!(
        "// Generated by build.rs from the preprocessed kernels/*.cu.\n\
         unsafe extern \"C\" {{\n{decls}}}\n\n\
         /// Every kernel entry point of kernels/*.cu.\n\
         pub static KERNELS: &[Kernel] = &[\n{table}];\n"
    );
    std::fs::write(out.join("kernels.rs"), rs).expect("writing kernels.rs");
}
