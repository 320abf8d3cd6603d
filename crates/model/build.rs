//! With the `cuda` feature, compiles kernels/*.cu to PTX (nvcc via cudaforge, as candle-kernels
//! does) into $OUT_DIR/ptx.rs, one `pub const NAME: &str` per file. Without it, does nothing:
//! the default build needs no CUDA toolkit.

/// The constants of src/kernel_checks.rs, read without building the crate.
#[cfg(feature = "cuda")]
mod geometry {
    pub fn nvcc_defines() -> Vec<(String, u64)> {
        let src = include_str!("src/kernel_checks.rs");
        let names = [
            ("TERSE_RMSNORM_BLOCK", "RMSNORM_BLOCK"),
            ("TERSE_LOGPROB_BLOCK", "LOGPROB_BLOCK"),
            ("TERSE_DECODE_WARPS", "DECODE_WARPS"),
            ("TERSE_DECODE_MAX_HEAD_DIM", "DECODE_MAX_HEAD_DIM"),
            ("TERSE_FLASH_WARPS", "FLASH_WARPS"),
        ];
        names
            .iter()
            .map(|(macro_name, konst)| {
                let line = src
                    .lines()
                    .find(|l| l.starts_with(&format!("pub const {konst}:")))
                    .unwrap_or_else(|| panic!("kernel_checks.rs has no `{konst}`"));
                let value = line
                    .rsplit('=')
                    .next()
                    .and_then(|v| v.trim().trim_end_matches(';').parse().ok())
                    .unwrap_or_else(|| panic!("kernel_checks.rs: `{line}` is not a number"));
                (macro_name.to_string(), value)
            })
            .collect()
    }
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    {
        println!("cargo::rerun-if-changed=../../kernels");
        let out =
            std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ptx.rs");
        println!("cargo::rerun-if-changed=src/kernel_checks.rs");
        let mut builder = cudaforge::KernelBuilder::new()
            .source_dir("../../kernels")
            .arg("-O3")
            .arg("-std=c++17");
        // The launch geometry, from the constants the Rust launches use (one place).
        for (name, value) in geometry::nvcc_defines() {
            builder = builder.arg(&format!("-D{name}={value}"));
        }
        let ptx = builder
            .build_ptx()
            .unwrap_or_else(|e| panic!("compiling kernels/*.cu: {e}"));
        ptx.write(&out)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
