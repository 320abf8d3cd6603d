//! Shared-memory bank conflicts for `cargo xtask kernel-model`: the wavefronts one warp-wide
//! shared-memory instruction takes, from the byte addresses its 32 lanes request, and the lane
//! address patterns of the access shapes the kernels use (WMMA fragments, row-per-lane-pair
//! scans, contiguous copies, mma C-fragment stores; FA2's ldmatrix rows and cp.async row copies
//! are profile/fa2.rs's, by its tiles' layout).
//!
//! The rule (CUDA C++ Programming Guide, "Shared Memory" in the compute capability 5.x+
//! sections: 32 banks, successive 32-bit words in successive banks, one word per bank per
//! cycle; lanes reading the same word get it broadcast): an access takes as many wavefronts as
//! the most distinct 4-byte words any one bank is asked for. A request of 8 or 16 bytes per lane
//! spans 2 or 4 words, so it takes at least 2 or 4 wavefronts, as on the hardware. A request of
//! 16 bytes per lane (LDS.128, LDGSTS.128, ldmatrix) is served a quarter-warp at a time (8 lanes,
//! 128 bytes; ldmatrix.x4: one 8 x 8 matrix per phase), so its wavefronts are the sum of the
//! four quarter-warps' (CUDA C++ Best Practices Guide, shared memory; the PTX ISA's ldmatrix).

use std::collections::{BTreeSet, HashMap};

/// Banks of shared memory, each 4 bytes wide.
pub const BANKS: u64 = 32;

/// Wavefronts of one warp-wide access: lane l reads or writes `width` bytes at `addrs[l]`.
pub fn wavefronts(addrs: &[u64], width: u32) -> u32 {
    if width >= 16 {
        return addrs.chunks(8).map(|q| phase(q, width)).sum();
    }
    phase(addrs, width)
}

/// Wavefronts of the lanes served together: the most distinct words one bank is asked for.
fn phase(addrs: &[u64], width: u32) -> u32 {
    let mut words: HashMap<u64, BTreeSet<u64>> = HashMap::new();
    for &a in addrs {
        let last = a + u64::from(width.max(1)) - 1;
        for word in a / 4..=last / 4 {
            words.entry(word % BANKS).or_default().insert(word);
        }
    }
    words.values().map(|w| w.len() as u32).max().unwrap_or(0)
}

/// Lane l's byte offset in a WMMA bf16 fragment load of the `(rb, cb)` 8 x 8 block, as sm_80+
/// compiles `load_matrix_sync` of a 16 x 16 bf16 tile: four 32-bit loads per lane, one per 8 x 8
/// block, lane l reading row rb + l / 4, elements cb + 2 (l % 4) and the next (the mma.m16n8k16
/// fragment layout of the PTX ISA; transposed operands are loaded the same way and fixed with
/// MOVM). `ldm` is the leading dimension in elements. Every block has the same bank pattern
/// (the blocks differ by a whole number of rows or 16 bytes), so block (0, 0) stands for all.
pub fn wmma_bf16(ldm: u64) -> Vec<u64> {
    (0..32).map(|l| ((l / 4) * ldm + 2 * (l % 4)) * 2).collect()
}

/// Lane l's byte offset in a WMMA f32 accumulator store or load (m16n8 halves: lane l holds
/// row l / 4 (and + 8), columns 2 (l % 4) and the next, moved as one 64-bit access).
pub fn wmma_f32(ldm: u64) -> Vec<u64> {
    (0..32).map(|l| ((l / 4) * ldm + 2 * (l % 4)) * 4).collect()
}

/// Lanes 2r and 2r + 1 own row r, each half of its `cols` columns (the kernels' row-wise
/// softmax scans): lane l's offset for its column `c` of the half, elements of `elem` bytes in
/// rows of `stride` elements.
pub fn row_pairs(stride: u64, cols: u64, c: u64, elem: u64) -> Vec<u64> {
    (0..32)
        .map(|l| ((l / 2) * stride + (l % 2) * (cols / 2) + c) * elem)
        .collect()
}

/// Consecutive lanes on consecutive elements (`e = threadIdx.x; e += blockDim`).
pub fn contiguous(elem: u64) -> Vec<u64> {
    (0..32).map(|l| l * elem).collect()
}

/// Every lane of a row pair on one element of a per-row array (`m_s[w][row]`).
pub fn per_row(elem: u64) -> Vec<u64> {
    (0..32).map(|l| (l / 2) * elem).collect()
}

/// An mma C fragment written to a row-major tile (lane l: row l / 4, element 2 (l % 4) + odd of
/// `elem` bytes; rows `stride` bytes apart).
pub fn c_fragment(stride: u64, elem: u64, odd: u64) -> Vec<u64> {
    (0..32)
        .map(|l| (l / 4) * stride + (2 * (l % 4) + odd) * elem)
        .collect()
}

/// Per-column values read by C-fragment lanes (`lt[c]`, c = 2 (l % 4) + odd): the 8 lanes of a
/// column share (broadcast) one element of `elem` bytes.
pub fn quad_columns(elem: u64, odd: u64) -> Vec<u64> {
    (0..32).map(|l| (2 * (l % 4) + odd) * elem).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_patterns_give_their_wavefronts() {
        // Stride 1 word: every bank once.
        let unit: Vec<u64> = (0..32).map(|l| l * 4).collect();
        assert_eq!(wavefronts(&unit, 4), 1);
        // Stride 32 words: every lane in bank 0.
        let column: Vec<u64> = (0..32).map(|l| l * 128).collect();
        assert_eq!(wavefronts(&column, 4), 32);
        // Broadcast: one word for all.
        assert_eq!(wavefronts(&[256; 32], 4), 1);
        // Stride 2 words: 2-way.
        let two: Vec<u64> = (0..32).map(|l| l * 8).collect();
        assert_eq!(wavefronts(&two, 4), 2);
        // 16 bytes per lane, contiguous: 4 wavefronts (128 words over 32 banks).
        let wide: Vec<u64> = (0..32).map(|l| l * 16).collect();
        assert_eq!(wavefronts(&wide, 16), 4);
        // bf16 neighbours share a word: 32 lanes, 16 words, 1 wavefront.
        assert_eq!(wavefronts(&contiguous(2), 2), 1);
        assert_eq!(wavefronts(&per_row(4), 4), 1);
    }

    #[test]
    fn the_reviews_flash_conflicts_come_out() {
        // Padded K/V rows (D + 8 bf16 = 36 words): conflict-free fragment loads.
        assert_eq!(wavefronts(&wmma_bf16(64 + 8), 4), 1);
        assert_eq!(wavefronts(&wmma_bf16(128 + 8), 4), 1);
        // Unpadded (dK/dV's K and V tiles): the 8 rows of a block share banks, 8-way.
        assert_eq!(wavefronts(&wmma_bf16(64), 4), 8);
        assert_eq!(wavefronts(&wmma_bf16(128), 4), 8);
        // The S read-back (16 x 32 f32, a row per lane pair): 16-way.
        assert_eq!(wavefronts(&row_pairs(32, 32, 0, 4), 4), 16);
        // The P write (16 x 32 bf16): 8-way.
        assert_eq!(wavefronts(&row_pairs(32, 32, 0, 2), 2), 8);
    }
}
