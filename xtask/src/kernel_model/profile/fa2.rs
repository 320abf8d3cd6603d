//! kernels/fa2.cuh for `cargo xtask kernel-model`: the tile geometry FlashAttention-2's forward
//! and backward share (FA2_KEYS-key tiles, rows padded by FA2_PAD bf16) and its tile copy
//! `load_rows<D, ROWS>` (16-byte cp.async copies, `LDGSTS` in the SASS): the trip count of its
//! copy loop, which nvcc unrolls 4 times with the remainder peeled in front, whether a copy is
//! the K/V pipeline's (`fa2_kv_load`, FA2_KEYS rows, in the forward and the dQ kernel), and its
//! lanes' shared-memory destinations. Lines are fa2.cuh's `// model:` tags (marks.rs).

use super::super::banks::{copy_rows, ldmatrix_rows};
use super::marks::Marks;
use super::{Chain, Role, Trips};
use anyhow::Result;
use std::ops::RangeInclusive;

/// The header's file name in the SASS line info.
pub const FILE: &str = "fa2.cuh";
/// Keys per tile (`FA2_KEYS`).
pub const KEYS: u64 = 64;
/// Padding of each shared row, bf16 elements (`FA2_PAD`).
pub const PAD: u64 = 8;

/// fa2.cuh's tagged lines.
#[derive(Debug, Clone)]
pub struct Fa2 {
    /// load_rows's body (`begin/end load-rows`).
    load_rows: RangeInclusive<u32>,
    /// Its copy loop's `for` (`copy-loop`).
    copy_loop: u32,
    /// fa2_kv_load's two load_rows calls, K then V (`kv-load`).
    kv_loads: Vec<u32>,
}

impl Fa2 {
    /// From the header's source.
    pub fn new(text: &str) -> Result<Fa2> {
        let m = Marks::parse(FILE, text)?;
        Ok(Fa2 {
            load_rows: m.region("load-rows")?,
            copy_loop: m.line("copy-loop")?,
            kv_loads: m.lines("kv-load"),
        })
    }

    /// Whether an instruction at `chain` is load_rows's code.
    pub fn in_load_rows(&self, chain: &Chain) -> bool {
        chain
            .iter()
            .any(|(f, l)| f == FILE && self.load_rows.contains(l))
    }

    /// If `back` is the back-edge of load_rows's copy loop: its call site, the first line of
    /// `file` in the chain.
    pub fn load_rows_call(&self, back: &Chain, file: &str) -> Option<u32> {
        match back.first() {
            Some((f, l)) if f == FILE && *l == self.copy_loop => {
                super::lines_in(back, file).first().copied()
            }
            _ => None,
        }
    }

    /// Whether `back` is the back-edge of load_rows's copy loop called by the K/V pipeline
    /// (fa2_kv_load, wherever the kernel calls it from): FA2_KEYS rows.
    pub fn is_kv_copy(&self, back: &Chain) -> bool {
        matches!(back.first(), Some((f, l)) if f == FILE && *l == self.copy_loop)
            && matches!(back.get(1), Some((f, l)) if f == FILE && self.kv_loads.contains(l))
    }

    /// The copy loop of load_rows<D, ROWS> in a block of `warps` warps: `ROWS * D / 8` chunks
    /// over the block's threads, one LDGSTS each.
    pub fn load_rows_trips(&self, d: u64, rows: u64, warps: u64) -> Trips {
        Trips {
            per_warp: Trips::strided(rows * d / 8, warps),
            stores: 1.0,
            peel: Some((FILE, self.load_rows.clone())),
        }
    }
}

/// Bytes between the rows of a padded tile of head size `d`.
pub fn row_bytes(d: u64) -> u64 {
    (d + PAD) * 2
}

/// The LDGSTS destinations: chunk e % (D / 8) of row e / (D / 8), e = threadIdx.x + i * threads.
/// The backward's queries per dK/dV step (`bwd_queries<D>()` in flash_fa2_bwd.cu).
pub fn bwd_queries(d: u64) -> u64 {
    if d == 64 {
        32
    } else {
        16
    }
}

/// A block's dynamic shared memory, bytes, from the kernels' layouts: the forward and dQ hold
/// two stages of K and V tiles (`[2][FA2_KEYS][LD]` each); dK/dV holds the block's K and V, two
/// stages of Q and dO (`[2][QT][LD]`), dS^T (`[FA2_ROWS][QT + FA2_PAD]`) and per stage the QT
/// queries' lse, delta and start (4 bytes each).
pub fn shared_bytes(role: Role, d: u64) -> u64 {
    let row = row_bytes(d);
    match role {
        Role::Forward | Role::Dq => 4 * KEYS * row,
        Role::Dkdv => {
            let qt = bwd_queries(d);
            2 * KEYS * row + 4 * qt * row + KEYS * (qt + PAD) * 2 + 3 * 2 * qt * 4
        }
    }
}

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
    use super::super::marks::assert_tags;
    use super::*;

    #[test]
    fn shared_memory_is_what_the_launches_asked_for() {
        // Nsight Compute on the H200 (docs/gpu/measured/2026-12-04/ncu_flash.csv): 69,632 B
        // for the forward and dQ, 55,680 B for dK/dV, at D = 128.
        assert_eq!(shared_bytes(Role::Forward, 128), 69_632);
        assert_eq!(shared_bytes(Role::Dq, 128), 69_632);
        assert_eq!(shared_bytes(Role::Dkdv, 128), 55_680);
        let src = include_str!("../../../../kernels/flash_fa2_bwd.cu");
        assert!(src.contains(&format!("#define FA2_BWD_QT_D128 {}", bwd_queries(128))));
        assert!(src.contains(&format!("#define FA2_BWD_QT_D64 {}", bwd_queries(64))));
    }

    const SRC: &str = include_str!("../../../../kernels/fa2.cuh");

    /// The tags sit on the lines they name, and the constants above match the header's.
    #[test]
    fn the_profiles_tags_match_fa2_cuh() {
        for define in [
            "#define FA2_WARPS TERSE_FLASH_TC_WARPS\n",
            &format!("#define FA2_KEYS {KEYS}\n"),
            &format!("#define FA2_PAD {PAD}\n"),
        ] {
            assert!(SRC.contains(define), "fa2.cuh has no `{}`", define.trim());
        }
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        assert_tags(
            &m,
            SRC,
            &[
                (
                    "begin load-rows",
                    1,
                    "__device__ __forceinline__ void load_rows(",
                ),
                (
                    "copy-loop",
                    1,
                    "for (int e = threadIdx.x; e < ROWS * CHUNKS; e += FA2_THREADS)",
                ),
                ("copy", 1, "cp_async16(dst + r * LD + c * 8"),
                ("end load-rows", 1, "}"),
                ("kv-load", 2, "load_rows<D, FA2_KEYS>("),
            ],
        );
    }

    #[test]
    fn the_copy_loop_is_found_by_its_call_site() {
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        let fa2 = Fa2::new(SRC).expect("the kernel sources' tags");
        let s = |f: &str, l: u32| (f.to_string(), l);
        let (copy_loop, copy) = (
            m.line("copy-loop").expect("the kernel sources' tags"),
            m.line("copy").expect("the kernel sources' tags"),
        );
        let kv = m.lines("kv-load");
        let back = [
            s(FILE, copy_loop),
            s("flash_fa2.cu", 89),
            s("flash_fa2.cu", 187),
        ];
        assert_eq!(fa2.load_rows_call(&back, "flash_fa2.cu"), Some(89));
        assert_eq!(fa2.load_rows_call(&back[1..], "flash_fa2.cu"), None);
        assert!(!fa2.is_kv_copy(&back));
        // The pipeline's prefetch: load_rows <- fa2_kv_load <- fa2_kv_ready <- the kernel.
        let prefetch = [
            s(FILE, copy_loop),
            s(FILE, kv[1]),
            s(FILE, 66),
            s("flash_fa2.cu", 78),
        ];
        assert!(fa2.is_kv_copy(&prefetch) && !fa2.is_kv_copy(&prefetch[1..]));
        let cp = [s("mma.cuh", 67), s(FILE, copy), s("flash_fa2.cu", 89)];
        assert!(fa2.in_load_rows(&cp) && !fa2.in_load_rows(&back[1..]));
        // 64 keys x 128 dims: 1,024 chunks, 8 per thread; 32 query rows x 64: 2.
        assert_eq!(fa2.load_rows_trips(128, 64, 4).per_warp, vec![8.0; 4]);
        assert_eq!(fa2.load_rows_trips(64, 32, 4).per_warp, vec![2.0; 4]);
    }
}
