//! The launch geometry the kernels are compiled for (block sizes, the largest head size): the
//! launch descriptions read these constants, and build.rs (and crates/simt's and the fake GPU's
//! builds) read this file as text and pass each to nvcc as a `-D` macro, so both sides share one
//! place. kernels/common.cuh refuses to compile without each.

/// Threads per block of `rmsnorm_{fwd,bwd}_*` (one block per row; a multiple of 32).
pub const RMSNORM_BLOCK: u32 = 256;

/// Threads per block of `logprob_{fwd,bwd}_f32` (one block per row; a multiple of 32).
pub const LOGPROB_BLOCK: u32 = 512;

/// Threads per block of `sample_f32` (one block per row; a multiple of 16 x 16: the radix
/// descent's bins are summed by 16 groups of SAMPLE_BLOCK / 16 threads).
pub const SAMPLE_BLOCK: u32 = 256;

/// Warps per block of `decode_attention_*` (one block per (row, query head)).
pub const DECODE_WARPS: u32 = 4;

/// The largest head size `decode_attention_*` keeps accumulators for (each lane D / 32).
pub const DECODE_MAX_HEAD_DIM: usize = 256;

/// Warps per block of `flash_*` (one warp per query or key row; head sizes up to
/// `DECODE_MAX_HEAD_DIM`).
pub const FLASH_WARPS: u32 = 4;

/// Warps per block of the tensor-core `flash_tc_*` kernels: each owns 16 rows (query rows in
/// the forward and dQ, key rows in dK/dV), so a block covers 16 x FLASH_TC_WARPS rows.
pub const FLASH_TC_WARPS: u32 = 4;

/// Keys per inner tile of `flash_tc_fwd_*` and `flash_tc_bwd_dq_*` (a multiple of 16).
#[cfg_attr(not(test), allow(dead_code))] // only nvcc needs it, through build.rs
pub const FLASH_TC_KEYS: u32 = 32;

/// The `-D` macros build.rs gives nvcc; kernels/common.cuh refuses to compile without each.
/// (build.rs reads the constants as text; this list is what the test below holds it to.)
#[cfg(test)]
pub fn nvcc_defines() -> Vec<(&'static str, u64)> {
    vec![
        ("TERSE_RMSNORM_BLOCK", u64::from(RMSNORM_BLOCK)),
        ("TERSE_LOGPROB_BLOCK", u64::from(LOGPROB_BLOCK)),
        ("TERSE_SAMPLE_BLOCK", u64::from(SAMPLE_BLOCK)),
        ("TERSE_DECODE_WARPS", u64::from(DECODE_WARPS)),
        ("TERSE_DECODE_MAX_HEAD_DIM", DECODE_MAX_HEAD_DIM as u64),
        ("TERSE_FLASH_WARPS", u64::from(FLASH_WARPS)),
        ("TERSE_FLASH_TC_WARPS", u64::from(FLASH_TC_WARPS)),
        ("TERSE_FLASH_TC_KEYS", u64::from(FLASH_TC_KEYS)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The geometry the kernels are compiled for comes from here: every macro kernels/common.cuh
    /// requires is one build.rs passes, and no kernel hard-codes a block size of its own.
    #[test]
    fn kernel_block_sizes_come_from_one_place() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let common = std::fs::read_to_string(dir.join("common.cuh")).expect("common.cuh");
        let defined: Vec<&str> = nvcc_defines().iter().map(|(k, _)| *k).collect();
        let required: Vec<&str> = common
            .lines()
            .filter_map(|l| l.trim().strip_prefix("#ifndef TERSE_"))
            .map(|rest| rest.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(
            required.len(),
            defined.len(),
            "common.cuh requires {required:?}"
        );
        for r in &required {
            assert!(
                defined.contains(&format!("TERSE_{r}").as_str()),
                "{r} not passed to nvcc"
            );
        }
        for (k, v) in nvcc_defines() {
            assert!(
                v > 0 && (k.ends_with("DIM") || v % 32 == 0 || k.ends_with("WARPS")),
                "{k} = {v}"
            );
        }
        for f in [
            "rmsnorm.cu",
            "logprob.cu",
            "kv_cache.cu",
            "flash_attn.cu",
            "paged_attention.cu",
            "sample.cu",
        ] {
            let src = std::fs::read_to_string(dir.join(f)).expect("kernel");
            for l in src
                .lines()
                .filter(|l| l.trim_start().starts_with("#define"))
            {
                let value = l.split_whitespace().nth(2).unwrap_or("");
                assert!(
                    value.parse::<u64>().is_err(),
                    "{f}: `{l}` hard-codes a launch constant; take it from common.cuh"
                );
            }
        }
    }
}
