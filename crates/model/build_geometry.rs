//! The kernels' launch geometry, read from src/kernels/geometry.rs without building the crate:
//! the `-D` definitions kernels/common.cuh requires. Shared by this crate's build.rs (nvcc) and
//! crates/simt's (the CPU shim), so the kernels see the constants the Rust launches use.

/// (macro, value) for every constant kernels/common.cuh requires.
pub fn kernel_defines(geometry_rs: &str) -> Vec<(String, u64)> {
    let names = [
        ("TERSE_RMSNORM_BLOCK", "RMSNORM_BLOCK"),
        ("TERSE_LOGPROB_BLOCK", "LOGPROB_BLOCK"),
        ("TERSE_SAMPLE_BLOCK", "SAMPLE_BLOCK"),
        ("TERSE_DECODE_WARPS", "DECODE_WARPS"),
        ("TERSE_DECODE_MAX_HEAD_DIM", "DECODE_MAX_HEAD_DIM"),
        ("TERSE_FLASH_WARPS", "FLASH_WARPS"),
        ("TERSE_FLASH_TC_WARPS", "FLASH_TC_WARPS"),
        ("TERSE_FLASH_TC_KEYS", "FLASH_TC_KEYS"),
    ];
    names
        .iter()
        .map(|(macro_name, konst)| {
            let line = geometry_rs
                .lines()
                .find(|l| l.starts_with(&format!("pub const {konst}:")))
                .unwrap_or_else(|| panic!("kernels/geometry.rs has no `{konst}`"));
            let value = line
                .rsplit('=')
                .next()
                .and_then(|v| v.trim().trim_end_matches(';').parse().ok())
                .unwrap_or_else(|| panic!("kernels/geometry.rs: `{line}` is not a number"));
            (macro_name.to_string(), value)
        })
        .collect()
}
