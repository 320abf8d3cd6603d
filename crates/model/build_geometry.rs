//! The kernels' launch geometry, read from src/kernels/geometry.rs without building the crate:
//! every `pub const NAME: TYPE = VALUE;` there becomes the nvcc definition `TERSE_NAME=VALUE`,
//! plus `TERSE_GEOMETRY`, which kernels/common.cuh requires (a compile without these fails
//! there). Shared by this crate's build.rs (nvcc), crates/simt's (the CPU shim) and xtask's
//! emulated device and kernel model, so the kernels see the constants the Rust launches use and
//! no file repeats their names. (scripts/ptxas-check.sh applies the same rule with sed.)

/// The definition kernels/common.cuh checks for: the geometry came from geometry.rs.
pub const GEOMETRY_GUARD: &str = "TERSE_GEOMETRY";

/// (macro, value) for every constant of geometry.rs, in its order, then the guard (value 1).
pub fn kernel_defines(geometry_rs: &str) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = geometry_rs
        .lines()
        .filter(|l| l.starts_with("pub const "))
        .map(|line| {
            let parsed = line
                .strip_prefix("pub const ")
                .and_then(|rest| rest.split_once(':'))
                .and_then(|(name, rest)| {
                    let value = rest.split_once('=')?.1.trim().strip_suffix(';')?;
                    Some((name.trim(), value.trim().parse::<u64>().ok()?))
                });
            match parsed {
                Some((name, value)) => (format!("TERSE_{name}"), value),
                None => panic!(
                    "kernels/geometry.rs: `{line}` is not `pub const NAME: TYPE = NUMBER;` \
                     (every constant there is passed to nvcc)"
                ),
            }
        })
        .collect();
    out.push((GEOMETRY_GUARD.to_string(), 1));
    out
}
