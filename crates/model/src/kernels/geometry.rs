//! The launch geometry the kernels are compiled for (block sizes, the largest head size): the
//! launch descriptions read these constants, and every kernel build (build.rs, crates/simt's,
//! xtask's emulated device and kernel model, scripts/ptxas-check.sh) reads this file as text and
//! passes each `pub const NAME` to nvcc as `-DTERSE_NAME` (crates/model/build_geometry.rs), so
//! both sides share one place and a new constant needs no other list. kernels/common.cuh refuses
//! a compile without them.

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
#[allow(dead_code)] // only nvcc needs it, through build.rs
pub const FLASH_TC_KEYS: u32 = 32;

/// Threads per block of `adamw_*` (the multi-tensor optimizer step; a multiple of 32).
pub const ADAMW_BLOCK: u32 = 256;

/// Elements of one tensor each block of `adamw_*` updates (a multiple of `ADAMW_BLOCK`): a
/// tensor of n elements takes ceil(n / ADAMW_CHUNK) blocks.
pub const ADAMW_CHUNK: u32 = 4096;

#[cfg(test)]
#[path = "../../build_geometry.rs"]
mod build_geometry;

#[cfg(test)]
mod tests {
    use crate::kernels::geometry::build_geometry::{kernel_defines, GEOMETRY_GUARD};
    use crate::kernels::geometry::SAMPLE_BLOCK;
    use std::path::Path;

    /// The `TERSE_*` names in `text` outside `//` comments.
    fn terse_names(text: &str) -> Vec<String> {
        let mut out = vec![];
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            let mut rest = code;
            while let Some(at) = rest.find("TERSE_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                if end > "TERSE_".len() {
                    out.push(tail[..end].to_string());
                }
                rest = &tail[end..];
            }
        }
        out
    }

    /// Every constant of this file is passed to nvcc under its own name, with its value: the
    /// rule build.rs, crates/simt, xtask and scripts/ptxas-check.sh follow.
    #[test]
    fn every_constant_is_a_kernel_define() {
        let defines = kernel_defines(include_str!("geometry.rs"));
        let consts = include_str!("geometry.rs")
            .lines()
            .filter(|l| l.starts_with("pub const "))
            .count();
        assert_eq!(defines.len(), consts + 1, "{defines:?}");
        assert!(defines.contains(&("TERSE_SAMPLE_BLOCK".into(), u64::from(SAMPLE_BLOCK))));
        assert!(defines.contains(&(GEOMETRY_GUARD.into(), 1)));
        for (k, v) in defines.iter().filter(|(k, _)| k != GEOMETRY_GUARD) {
            assert!(
                *v > 0 && (k.ends_with("DIM") || v % 32 == 0 || k.ends_with("WARPS")),
                "{k} = {v}"
            );
        }
        let parsed = kernel_defines("//! doc\npub const A_B: u32 = 7;\nconst HIDDEN: u32 = 1;\n");
        assert_eq!(
            parsed,
            [("TERSE_A_B".into(), 7), (GEOMETRY_GUARD.into(), 1)]
        );
        let bad = std::panic::catch_unwind(|| kernel_defines("pub const X: u32 = 2 * 16;"));
        assert!(bad.is_err(), "an expression is not read as a number");
    }

    /// The geometry the kernels are compiled for comes from here: common.cuh refuses a compile
    /// without it, every launch constant a kernel names is one of this file's, and no kernel
    /// hard-codes a block size of its own.
    #[test]
    fn kernel_block_sizes_come_from_one_place() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let common = std::fs::read_to_string(dir.join("common.cuh")).expect("common.cuh");
        assert!(common.contains(&format!("#ifndef {GEOMETRY_GUARD}")));
        let defines = kernel_defines(include_str!("geometry.rs"));
        // Names the kernels and their headers define themselves (the shim's markers).
        let mut own: Vec<String> = vec![];
        let mut texts = vec![];
        for dir in [dir.clone(), dir.join("shim")] {
            for e in std::fs::read_dir(&dir).expect("kernels/") {
                let p = e.expect("entry").path();
                let source = p
                    .extension()
                    .is_some_and(|x| ["cu", "cuh", "h", "cpp"].iter().any(|e| x == *e));
                if source {
                    let text = std::fs::read_to_string(&p).expect("kernel source");
                    for l in text.lines() {
                        if let Some(rest) = l.trim().strip_prefix("#define ") {
                            own.extend(terse_names(rest.split(['(', ' ']).next().unwrap_or("")));
                        }
                        // Tested for, not required: the shim's switches.
                        if let Some(rest) = l.trim().strip_prefix("#ifdef ") {
                            own.extend(terse_names(rest));
                        }
                        if let Some(rest) = l.trim().strip_prefix("#ifndef ") {
                            own.extend(terse_names(rest));
                        }
                    }
                    let name = p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or("")
                        .to_string();
                    texts.push((name, text));
                }
            }
        }
        // The kernels and their headers (the shim's own markers are its business).
        for (f, text) in texts
            .iter()
            .filter(|(f, _)| f.ends_with(".cu") || f.ends_with(".cuh"))
        {
            for name in terse_names(text) {
                assert!(
                    defines.iter().any(|(k, _)| *k == name) || own.contains(&name),
                    "kernels/{f} uses {name}, which is neither a constant of \
                     crates/model/src/kernels/geometry.rs nor #defined in kernels/"
                );
            }
            // A launch-geometry name (threads or warps per block) with a number of its own.
            for l in text.lines() {
                let mut words = l.split_whitespace();
                let (Some("#define"), Some(name), Some(value)) =
                    (words.next(), words.next(), words.next())
                else {
                    continue;
                };
                let geometry = ["BLOCK", "WARPS", "THREADS"]
                    .iter()
                    .any(|g| name == *g || name.ends_with(&format!("_{g}")));
                assert!(
                    !geometry || value.parse::<u64>().is_err(),
                    "{f}: `{l}` hard-codes a launch constant; take it from geometry.rs"
                );
            }
        }
    }
}
