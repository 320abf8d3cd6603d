//! kernels/fa2.cuh for `cargo xtask kernel-model`: the tile geometry FlashAttention-2's forward
//! and backward share (FA2_KEYS-key tiles, rows of D bf16 with XOR-swizzled 16-byte chunks,
//! `fa2_at`; dS^T's rows padded by FA2_PAD) and its tile copy
//! `load_rows<D, ROWS>` (16-byte cp.async copies, `LDGSTS` in the SASS): the trip count of its
//! copy loop, which nvcc unrolls 4 times with the remainder peeled in front, whether a copy is
//! the K/V pipeline's (`fa2_kv_load`, FA2_KEYS rows, in the forward and the dQ kernel), and its
//! lanes' shared-memory destinations. Lines are fa2.cuh's `// model:` tags (marks.rs).

use super::marks::Marks;
use super::{Chain, Role, Trips};
use anyhow::Result;
use std::ops::RangeInclusive;

/// The header's file name in the SASS line info.
pub const FILE: &str = "fa2.cuh";
/// Keys per tile (`FA2_KEYS`).
pub const KEYS: u64 = 64;
/// Padding of each row of the dK/dV kernel's dS^T, bf16 elements (`FA2_PAD`).
pub const PAD: u64 = 8;

/// A shared tile's layout: rows `stride` bytes apart (dS^T's padded rows), or the swizzled rows
/// of `d` bf16 that fa2.cuh's `fa2_at` addresses (row r's 16-byte chunk c at chunk c ^ (r % 8)).
#[derive(Debug, Clone, Copy)]
pub enum Tile {
    Padded(u64),
    Swizzled(u64),
}

impl Tile {
    /// The byte offset of row `r`'s 16-byte chunk `c`.
    pub fn at(self, r: u64, c: u64) -> u64 {
        match self {
            Tile::Padded(stride) => r * stride + c * 16,
            Tile::Swizzled(d) => r * d * 2 + (c ^ (r % 8)) * 16,
        }
    }
}

/// The K, V, Q and dO tiles of head size `d`.
pub fn tile(d: u64) -> Tile {
    Tile::Swizzled(d)
}

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
/// stages of Q and dO (`[2][QT][D]`), dS^T (`[FA2_ROWS][QT + FA2_PAD]`) and per stage the QT
/// queries' lse, delta and start (4 bytes each).
pub fn shared_bytes(role: Role, d: u64) -> u64 {
    let row = d * 2;
    match role {
        Role::Forward | Role::Dq => 4 * KEYS * row,
        Role::Dkdv => {
            let qt = bwd_queries(d);
            2 * KEYS * row + 4 * qt * row + KEYS * (qt + PAD) * 2 + 3 * 2 * qt * 4
        }
    }
}

pub fn copy_site(d: u64) -> Vec<Vec<u64>> {
    let chunks = d / 8;
    vec![(0..32)
        .map(|l| tile(d).at(l / chunks, l % chunks))
        .collect()]
}

/// ldmatrix.x4 (plain or .trans: the addresses are the same): lane 8i + r gives the 16-byte row
/// r of matrix i, which starts at tile row `rows[i]` and 16-byte chunk `chunks[i]`. Another
/// n-tile or k-step moves the rows by multiples of 8 and the chunks by a constant, which keeps
/// the conflicts of either layout, so offset 0 stands for all.
fn ldsm(t: Tile, rows: [u64; 4], chunks: [u64; 4]) -> Vec<u64> {
    (0..32)
        .map(|l: u64| t.at(rows[l as usize / 8] + l % 8, chunks[l as usize / 8]))
        .collect()
}

/// ldmatrix.x4 whose matrix i is rows 8 (i >> 1), columns 8 (i & 1) of the tile (B fragments of
/// S = Q K^T: keys by row, dims by column).
pub fn ldsm_rows_major(t: Tile) -> Vec<u64> {
    ldsm(t, [0, 0, 8, 8], [0, 1, 0, 1])
}

/// ldmatrix.x4 whose matrix i is rows 8 (i & 1), columns 8 (i >> 1) (the .trans B fragments of
/// O += P V and the A fragments of K and V).
pub fn ldsm_cols_major(t: Tile) -> Vec<u64> {
    ldsm(t, [0, 8, 0, 8], [0, 0, 1, 1])
}

#[cfg(test)]
mod tests {
    use super::super::marks::assert_tags;
    use super::*;

    #[test]
    fn shared_memory_is_what_the_launches_asked_for() {
        // Nsight Compute on the H200 (docs/gpu/measured/2026-12-04/ncu_flash.csv) saw 69,632 B
        // for the forward and dQ and 55,680 B for dK/dV at D = 128 with rows padded by 16
        // bytes; swizzled, each K, V, Q and dO row is 16 bytes shorter.
        assert_eq!(shared_bytes(Role::Forward, 128), 69_632 - 4 * 64 * 16);
        assert_eq!(shared_bytes(Role::Dq, 128), 65_536);
        assert_eq!(
            shared_bytes(Role::Dkdv, 128),
            55_680 - (2 * 64 + 4 * 16) * 16
        );
        assert_eq!(shared_bytes(Role::Dkdv, 64), 38_656);
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
            "return row * D + ((chunk ^ r) << 3);",
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
                ("copy", 1, "cp_async16(dst + fa2_at<D>(r, c, r & 7)"),
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

    /// The swizzle puts every access shape of the FA2 tiles at its fewest wavefronts: the 8 rows
    /// of an ldmatrix matrix in 8 bank groups (4 wavefronts for .x4) and a quarter-warp's
    /// copy in one row's aligned 128 bytes; the same rows unpadded and unswizzled are 8-way.
    #[test]
    fn swizzled_tiles_are_conflict_free_where_plain_rows_are_not() {
        use super::super::super::banks::wavefronts;
        for d in [64, 128] {
            let t = tile(d);
            assert_eq!(wavefronts(&ldsm_rows_major(t), 16), 4);
            assert_eq!(wavefronts(&ldsm_cols_major(t), 16), 4);
            assert_eq!(wavefronts(&copy_site(d)[0], 16), 4);
            // Each quarter-warp's copy stays inside one aligned 128-byte line.
            for q in copy_site(d)[0].chunks(8) {
                assert!(q.iter().all(|a| a / 128 == q[0] / 128), "{q:?}");
            }
            let plain = Tile::Padded(d * 2);
            assert_eq!(wavefronts(&ldsm_rows_major(plain), 16), 32);
            // A chunk is stored once: the swizzle is a permutation of each row's chunks.
            let mut seen: Vec<u64> = (0..64)
                .flat_map(|r| (0..d / 8).map(move |c| t.at(r, c)))
                .collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len() as u64, 64 * d / 8);
            assert!(seen.iter().all(|&a| a < 64 * d * 2));
        }
        // dS^T's padded rows, as before.
        assert_eq!(
            wavefronts(&ldsm_rows_major(Tile::Padded((16 + PAD) * 2)), 16),
            4
        );
    }

    /// The padded layouts: dS^T's rows (and the K/V rows before the swizzle, (D + 8) * 2 bytes
    /// = 9 or 17 16-byte units) put 8 rows in 8 bank groups; unpadded rows are 8-way; dS^T's
    /// bf16-pair stores and the per-column reads stay at 1.
    #[test]
    fn padded_tiles_are_conflict_free_where_plain_rows_are_not() {
        use super::super::super::banks::{c_fragment, quad_columns, wavefronts};
        for ldsm in [ldsm_rows_major, ldsm_cols_major] {
            for stride in [(64 + 8) * 2, (128 + 8) * 2, (32 + 8) * 2, (16 + 8) * 2] {
                assert_eq!(wavefronts(&ldsm(Tile::Padded(stride)), 16), 4);
            }
            for stride in [64 * 2, 128 * 2] {
                assert_eq!(wavefronts(&ldsm(Tile::Padded(stride)), 16), 32);
            }
        }
        let copy = |stride: u64, chunks: u64| -> Vec<u64> {
            (0..32)
                .map(|l| Tile::Padded(stride).at(l / chunks, l % chunks))
                .collect()
        };
        // By banks alone the padded copies took the minimum 4 (Nsight Compute counted them
        // excessive on the H200: rows off a 128-byte boundary; the swizzle keeps them on one).
        assert_eq!(wavefronts(&copy((64 + 8) * 2, 8), 16), 4);
        assert_eq!(wavefronts(&copy((128 + 8) * 2, 16), 16), 4);
        assert_eq!(wavefronts(&c_fragment((32 + 8) * 2, 2, 0), 4), 1);
        assert_eq!(wavefronts(&c_fragment((16 + 8) * 2, 2, 0), 4), 1);
        assert_eq!(wavefronts(&c_fragment(32 * 2, 2, 0), 4), 4);
        assert_eq!(wavefronts(&quad_columns(4, 0), 8), 1);
        assert_eq!(wavefronts(&quad_columns(4, 1), 4), 1);
    }
}
