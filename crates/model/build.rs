//! With the `cuda` feature, compiles kernels/*.cu to PTX (nvcc via cudaforge, as candle-kernels
//! does) into $OUT_DIR/ptx.rs: one `pub const NAME: &str` per file, then `MODULES`, the table of
//! (file stem, PTX) that `kernels::launching::module_ptx` looks modules up in, so a new kernels/
//! file needs no list updated. Without the feature, does nothing: the default build needs no
//! CUDA toolkit.

#[cfg(feature = "cuda")]
#[path = "build_geometry.rs"]
mod geometry;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=build_geometry.rs");
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
        let consts = std::fs::read_to_string(&out)
            .unwrap_or_else(|e| panic!("reading {}: {e}", out.display()));
        let table = module_table(&consts);
        std::fs::write(&out, consts + &table)
            .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    }
}

/// `MODULES`, from cudaforge's lines
/// `pub const NAME: &str = include_str!(concat!(env!("OUT_DIR"), "/stem.ptx"));`.
#[cfg(feature = "cuda")]
fn module_table(consts: &str) -> String {
    let mut table = String::from(
        "\n/// (kernels/ file stem, its PTX) for every compiled file (build.rs).\n\
         pub const MODULES: &[(&str, &str)] = &[\n",
    );
    for line in consts.lines().filter(|l| l.starts_with("pub const ")) {
        let name = line["pub const ".len()..].split(':').next();
        let stem = line
            .rsplit_once("\"/")
            .and_then(|(_, rest)| rest.split_once(".ptx\""))
            .map(|(stem, _)| stem);
        match (name, stem) {
            (Some(name), Some(stem)) => table.push_str(&format!("    (\"{stem}\", {name}),\n")),
            _ => panic!("build.rs: cannot read cudaforge's PTX line `{line}`"),
        }
    }
    table.push_str("];\n");
    table
}
