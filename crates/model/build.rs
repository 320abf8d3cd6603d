//! With the `cuda` feature, compiles kernels/*.cu to PTX (nvcc via cudaforge, as candle-kernels
//! does) into $OUT_DIR/ptx.rs, one `pub const NAME: &str` per file. Without it, does nothing:
//! the default build needs no CUDA toolkit.

#[cfg(feature = "cuda")]
#[path = "build_geometry.rs"]
mod geometry;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    {
        println!("cargo::rerun-if-changed=../../kernels");
        let out =
            std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ptx.rs");
        println!("cargo::rerun-if-changed=src/kernels/geometry.rs");
        let mut builder = cudaforge::KernelBuilder::new()
            .source_dir("../../kernels")
            .arg("-O3")
            .arg("-std=c++17");
        // The launch geometry, from the constants the Rust launches use (one place).
        for (name, value) in geometry::kernel_defines(include_str!("src/kernels/geometry.rs")) {
            builder = builder.arg(&format!("-D{name}={value}"));
        }
        let ptx = builder
            .build_ptx()
            .unwrap_or_else(|e| panic!("compiling kernels/*.cu: {e}"));
        ptx.write(&out)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}
