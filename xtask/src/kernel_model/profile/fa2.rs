//! kernels/fa2.cuh for `cargo xtask kernel-model`: the tile geometry FlashAttention-2's forward
//! and backward share (FA2_KEYS-key tiles, rows padded by FA2_PAD bf16) and its tile copy
//! `load_rows<D, ROWS>` (16-byte cp.async copies, `LDGSTS` in the SASS): the trip count of its
//! copy loop, which nvcc unrolls 4 times with the remainder peeled in front, whether a copy is
//! the K/V pipeline's (`fa2_kv_load`, FA2_KEYS rows, in the forward and the dQ kernel), and its
//! lanes' shared-memory destinations. Lines are fa2.cuh's, checked by the test below.

use super::super::banks::{copy_rows, ldmatrix_rows};
use super::{Chain, Trips};

/// The header's file name in the SASS line info.
pub const FILE: &str = "fa2.cuh";
/// Keys per tile (`FA2_KEYS`).
pub const KEYS: u64 = 64;
/// Padding of each shared row, bf16 elements (`FA2_PAD`).
pub const PAD: u64 = 8;
/// load_rows's lines (its body, the copy loop's `for` at :26).
const LOAD_ROWS: std::ops::RangeInclusive<u32> = 24..=31;
const COPY_LOOP: u32 = 26;
/// fa2_kv_load's two load_rows calls (K, then V).
const KV_LOADS: [u32; 2] = [50, 51];

/// Bytes between the rows of a padded tile of head size `d`.
pub fn row_bytes(d: u64) -> u64 {
    (d + PAD) * 2
}

/// Whether an instruction at `chain` is load_rows's code.
pub fn in_load_rows(chain: &Chain) -> bool {
    chain
        .iter()
        .any(|(f, l)| f == FILE && LOAD_ROWS.contains(l))
}

/// If `back` is the back-edge of load_rows's copy loop: its call site, the first line of `file`
/// in the chain.
pub fn load_rows_call(back: &Chain, file: &str) -> Option<u32> {
    match back.first() {
        Some((f, COPY_LOOP)) if f == FILE => super::lines_in(back, file).first().copied(),
        _ => None,
    }
}

/// Whether `back` is the back-edge of load_rows's copy loop called by the K/V pipeline
/// (fa2_kv_load, wherever the kernel calls it from): FA2_KEYS rows.
pub fn is_kv_copy(back: &Chain) -> bool {
    matches!(back.first(), Some((f, COPY_LOOP)) if f == FILE)
        && matches!(back.get(1), Some((f, l)) if f == FILE && KV_LOADS.contains(l))
}

/// The copy loop of load_rows<D, ROWS> in a block of `warps` warps: `ROWS * D / 8` chunks over
/// the block's threads, one LDGSTS each.
pub fn load_rows_trips(d: u64, rows: u64, warps: u64) -> Trips {
    Trips {
        per_warp: Trips::strided(rows * d / 8, warps),
        stores: 1.0,
        peel: Some((FILE, LOAD_ROWS)),
    }
}

/// The LDGSTS destinations: chunk e % (D / 8) of row e / (D / 8), e = threadIdx.x + i * threads.
pub fn copy_site(d: u64) -> Vec<Vec<u64>> {
    vec![copy_rows(row_bytes(d), d / 8)]
}

/// ldmatrix.x4 whose matrix i is rows 8 (i >> 1), columns 8 (i & 1) of the tile (B fragments of
/// S = Q K^T: keys by row, dims by column).
pub fn ldsm_rows_major(stride: u64) -> Vec<u64> {
    ldmatrix_rows(stride, [0, 0, 8, 8], [0, 16, 0, 16])
}

/// ldmatrix.x4 whose matrix i is rows 8 (i & 1), columns 8 (i >> 1) (the .trans B fragments of
/// O += P V and the A fragments of K and V).
pub fn ldsm_cols_major(stride: u64) -> Vec<u64> {
    ldmatrix_rows(stride, [0, 8, 0, 8], [0, 0, 16, 16])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line numbers and constants above still match fa2.cuh.
    #[test]
    fn the_profiles_lines_match_fa2_cuh() {
        let src = include_str!("../../../../kernels/fa2.cuh");
        let line = |n: usize| src.lines().nth(n - 1).unwrap_or_default();
        for (n, text) in [
            (9, "#define FA2_WARPS TERSE_FLASH_TC_WARPS"),
            (13, "#define FA2_KEYS 64"),
            (15, "#define FA2_PAD 8"),
            (24, "__device__ __forceinline__ void load_rows("),
            (
                26,
                "for (int e = threadIdx.x; e < ROWS * CHUNKS; e += FA2_THREADS)",
            ),
            (29, "cp_async16(dst + r * LD + c * 8"),
            (31, "}"),
            (50, "load_rows<D, FA2_KEYS>(ks, kh, k0, t)"),
            (51, "load_rows<D, FA2_KEYS>(vs, vh, k0, t)"),
        ] {
            assert!(
                line(n).contains(text),
                "fa2.cuh:{n} is `{}`",
                line(n).trim()
            );
        }
    }

    #[test]
    fn the_copy_loop_is_found_by_its_call_site() {
        let s = |f: &str, l: u32| (f.to_string(), l);
        let back = [
            s("fa2.cuh", 26),
            s("flash_fa2.cu", 89),
            s("flash_fa2.cu", 187),
        ];
        assert_eq!(load_rows_call(&back, "flash_fa2.cu"), Some(89));
        assert_eq!(load_rows_call(&back[1..], "flash_fa2.cu"), None);
        assert!(!is_kv_copy(&back));
        // The pipeline's prefetch: load_rows <- fa2_kv_load <- fa2_kv_ready <- the kernel.
        let kv = [
            s("fa2.cuh", 26),
            s("fa2.cuh", 51),
            s("fa2.cuh", 66),
            s("flash_fa2.cu", 78),
        ];
        assert!(is_kv_copy(&kv) && !is_kv_copy(&kv[1..]));
        let cp = [s("mma.cuh", 67), s("fa2.cuh", 29), s("flash_fa2.cu", 89)];
        assert!(in_load_rows(&cp) && !in_load_rows(&back[1..]));
        // 64 keys x 128 dims: 1,024 chunks, 8 per thread; 32 query rows x 64: 2.
        assert_eq!(load_rows_trips(128, 64, 4).per_warp, vec![8.0; 4]);
        assert_eq!(load_rows_trips(64, 32, 4).per_warp, vec![2.0; 4]);
    }
}
