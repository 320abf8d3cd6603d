//! The profile of kernels/flash_fa2_bwd.cu (FlashAttention-2's backward) for `cargo xtask
//! kernel-model`: the deterministic dQ kernel (one warp: 16 query rows x FA2_KEYS keys per
//! main-loop iteration, in two 32-key halves nvcc leaves as a loop) and the dK/dV kernel (one
//! warp: 16 keys x QT queries per step), its optional `if (dq_atomic)` block (dS^T through
//! shared memory, dQ by f32 atomics), the copy loops nvcc leaves (load_rows, fa2.rs, and
//! load_queries's per-query loop), and the lanes' shared addresses per source line. Lines are
//! flash_fa2_bwd.cu's `// model:` tags (marks.rs), checked by the test below.

use super::super::banks::{c_fragment, contiguous, quad_columns};
use super::fa2::{self, ldsm_cols_major, ldsm_rows_major, tile, Fa2, Tile};
use super::marks::Marks;
use super::{lines_in, Chain, Kernel, Role, Trips};
use anyhow::Result;
use std::ops::RangeInclusive;

const FILE: &str = "flash_fa2_bwd.cu";

/// Queries per dK/dV step (FA2_BWD_QT_D64, FA2_BWD_QT_D128).
pub fn queries(d: u64) -> u64 {
    if d == 64 {
        32
    } else {
        16
    }
}

/// flash_fa2_bwd.cu's dQ and dK/dV kernels at head sizes 64 and 128, blocks of `warps` warps,
/// from the kernel's and fa2.cuh's tags.
pub fn kernels(marks: &Marks, fa2: &Fa2, warps: u64) -> Result<Vec<Kernel>> {
    // The main loops' `for`: dQ's over 64-key tiles, dK/dV's over query steps.
    let (dq_main, dkdv_main) = (marks.line("dq-main")?, marks.line("dkdv-main")?);
    let regions = Regions {
        atomic: marks.region("atomic")?,
        masks: [marks.region("dq-mask")?, marks.region("dkdv-mask")?],
        queries: marks.region("queries")?,
    };
    let mut out = vec![];
    for d in [64, 128] {
        let qt = queries(d);
        for (role, stem, main_line, area, geometry) in [
            (
                Role::Dq,
                "dq",
                dq_main,
                16 * fa2::KEYS,
                format!("{warps} warps, {} keys", fa2::KEYS),
            ),
            (
                Role::Dkdv,
                "dkdv",
                dkdv_main,
                16 * qt,
                format!("{warps} warps x 16 keys, {qt} queries a step"),
            ),
        ] {
            out.push(Kernel {
                name: format!("flash_fa2_bwd_{stem}_d{d}"),
                family: "FA2",
                role,
                d,
                main_line,
                area: area as f64,
                geometry,
                profile: Box::new(Backward {
                    d,
                    warps,
                    marks: marks.clone(),
                    fa2: fa2.clone(),
                    regions: regions.clone(),
                }),
            });
        }
    }
    Ok(out)
}

/// The kernel's blocks, by their `begin`/`end` tags.
#[derive(Debug, Clone)]
struct Regions {
    /// The `if (dq_atomic)` block's body.
    atomic: RangeInclusive<u32>,
    /// The key masks of the dQ and dK/dV loops, which run only on the tiles and query steps
    /// that cut a warp's rows or keys (the diagonal under a causal mask).
    masks: [RangeInclusive<u32>; 2],
    /// load_queries's per-query loop and its body.
    queries: RangeInclusive<u32>,
}

/// Both backward kernels at one head size.
struct Backward {
    d: u64,
    warps: u64,
    marks: Marks,
    fa2: Fa2,
    regions: Regions,
}

impl Backward {
    /// The tag of the first line of this file in `chain`.
    fn tag(&self, chain: &Chain) -> Option<&str> {
        self.marks.tag(*lines_in(chain, FILE).first()?)
    }
}

impl super::Profile for Backward {
    fn file(&self) -> &'static str {
        FILE
    }
    fn optional_tag(&self) -> &'static str {
        "+mask/atomic"
    }
    fn is_optional(&self, chain: &Chain) -> bool {
        let r = &self.regions;
        lines_in(chain, FILE)
            .first()
            .is_some_and(|l| r.atomic.contains(l) || r.masks.iter().any(|m| m.contains(l)))
    }
    fn generic_is_shared(&self, _chain: &Chain) -> bool {
        false // the kernels' shared accesses are ldmatrix, cp.async and plain arrays
    }
    fn trips(&self, back: &Chain) -> Option<Trips> {
        let (d, warps, qt) = (self.d, self.warps, queries(self.d));
        if self.fa2.is_kv_copy(back) {
            // dQ: K and V tiles.
            return Some(self.fa2.load_rows_trips(d, fa2::KEYS, warps));
        }
        if let Some(call) = self.fa2.load_rows_call(back, FILE) {
            let rows = match self.marks.tag(call)? {
                // dK/dV: the block's K and V (FA2_ROWS), and Q and dO by load_queries.
                "block-rows" => 16 * warps,
                "query-rows" => qt,
                _ => return None,
            };
            return Some(self.fa2.load_rows_trips(d, rows, warps));
        }
        match self.tag(back)? {
            // dQ's two 32-key halves of a tile.
            "dq-halves" => Some(Trips::uniform((fa2::KEYS / 32) as f64)),
            // load_queries's lse, delta and starts: QT queries over the block's threads.
            "queries-loop" => Some(Trips {
                per_warp: Trips::strided(qt, warps),
                stores: 3.0,
                peel: Some((FILE, self.regions.queries.clone())),
            }),
            _ => None,
        }
    }
    fn site(&self, chain: &Chain, store: bool, width: u32) -> Vec<Vec<u64>> {
        if self.fa2.in_load_rows(chain) {
            return fa2::copy_site(self.d);
        }
        let (stride, qt) = (tile(self.d), queries(self.d));
        // Elements of a bf16 pair or float pair one lane moves as separate accesses.
        let odd: &[u64] = if width <= 2 || (width == 4 && !store) {
            &[0, 1]
        } else {
            &[0]
        };
        let Some(tag) = self.tag(chain) else {
            return vec![];
        };
        match (tag, store) {
            // B fragments of K and V (dQ) and of Q and dO (dK/dV) by their rows.
            ("rows-frag", false) => vec![ldsm_rows_major(stride)],
            // .trans B fragments of K (dQ), dO and Q (dK/dV); the A fragments of K and V.
            ("cols-frag", false) => vec![ldsm_cols_major(stride)],
            // The atomic pass: dS^T's A fragments (rows 16 kk + 8 (mi >> 1), rows (QT + 8) * 2
            // bytes apart) and K's .trans B fragments; nvcc mixes the two lines' attribution.
            ("atomic-frag", false) => vec![
                ldsm_rows_major(Tile::Padded((qt + fa2::PAD) * 2)),
                ldsm_cols_major(stride),
            ],
            // dss[(16 w + g + 8 h) * LDS + 8 n + 2 t + (i & 1)] = bf16.
            ("dss-store", true) => odd
                .iter()
                .map(|&o| c_fragment((qt + fa2::PAD) * 2, 2, o))
                .collect(),
            // ls[e], ds[e], ss[e], e = threadIdx.x.
            ("query-store", true) => vec![contiguous(4)],
            // lt[c], sst[c], dt[c], c = 8 n + 2 t + (i & 1): a column's lanes share one word.
            ("column-read", false) => odd.iter().map(|&o| quad_columns(4, o)).collect(),
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::marks::assert_tags;
    use super::*;

    const SRC: &str = include_str!("../../../../kernels/flash_fa2_bwd.cu");
    const FA2_SRC: &str = include_str!("../../../../kernels/fa2.cuh");

    /// The tags sit on the loops and accesses they name, and the query tiles match the kernel's.
    #[test]
    fn the_profiles_tags_match_flash_fa2_bwd_cu() {
        for d in [64, 128] {
            let define = format!("#define FA2_BWD_QT_D{d} {}\n", queries(d));
            assert!(SRC.contains(&define), "{FILE} has no `{}`", define.trim());
        }
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        let line = |n: u32| SRC.lines().nth(n as usize - 1).unwrap_or_default();
        assert_tags(
            &m,
            SRC,
            &[
                ("dq-main", 1, "for (int it = 0; it < keys.tiles; it++)"),
                (
                    "dq-halves",
                    1,
                    "for (int half = 0; half < FA2_KEYS / HK; half++)",
                ),
                ("rows-frag", 4, "fa2_ldsm<D, false>(b"),
                ("cols-frag", 5, "fa2_ldsm<D, "),
                ("query-rows", 2, "load_rows<D, QT>("),
                (
                    "queries-loop",
                    1,
                    "for (int e = threadIdx.x; e < QT; e += FA2_THREADS)",
                ),
                ("begin queries", 1, "for (int e = threadIdx.x; e < QT"),
                ("query-store", 3, "s[e] = "),
                ("end queries", 1, "}"),
                ("block-rows", 2, "load_rows<D, FA2_ROWS>(kvs"),
                ("dkdv-main", 1, "for (int s = 0; s < steps; s++)"),
                ("column-read", 2, "[c]"),
                ("atomic-if", 1, "if (!TOKENS && dq_atomic) {"),
                ("begin atomic", 1, "// dS^T into shared memory"),
                (
                    "dss-store",
                    2,
                    "dss[(w * 16 + gq + 8 * (i >> 1)) * LDS + n * 8 + 2 * tq + (i & 1)] =",
                ),
                ("atomic-frag", 3, "kk * 16"),
                ("end atomic", 1, "}"),
                (
                    "after-atomic",
                    1,
                    "__syncthreads();  // stage sb (and dS^T) are free",
                ),
            ],
        );
        let frags = m.lines("atomic-frag");
        assert!(line(frags[0]).contains("ldmatrix_x4_trans(sa, dss + "));
        assert!(line(frags[2]).contains("fa2_ldsm<D, true>(bk, kw, "));
        assert_eq!(
            m.line("atomic-if").expect("the kernel sources' tags") + 1,
            *m.region("atomic")
                .expect("the kernel sources' tags")
                .start()
        );
    }

    #[test]
    fn trips_follow_the_call_site_and_the_atomic_block_is_optional() {
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        let fm = Marks::parse(fa2::FILE, FA2_SRC).expect("the kernel sources' tags");
        let p = kernels(&m, &Fa2::new(FA2_SRC).expect("the kernel sources' tags"), 4)
            .expect("the kernel sources' tags")
            .remove(0)
            .profile;
        let at = |tag: &str| m.lines(tag)[0];
        let s = |f: &str, l: u32| (f.to_string(), l);
        let copy = s(
            fa2::FILE,
            fm.line("copy-loop").expect("the kernel sources' tags"),
        );
        let rows = |call: u32| {
            p.trips(&[copy.clone(), s(FILE, call), s(FILE, 361)])
                .map(|t| t.per_warp)
        };
        // K/V tiles (64 x 64 / 8 over 128 threads: 4), the block's K (4), Q by step (32 x 8: 2).
        let kv = [
            copy.clone(),
            s(fa2::FILE, fm.lines("kv-load")[0]),
            s(fa2::FILE, 66),
            s(FILE, 98),
        ];
        assert_eq!(p.trips(&kv).map(|t| t.per_warp), Some(vec![4.0; 4]));
        assert_eq!(rows(at("block-rows")), Some(vec![4.0; 4]));
        let q = p.trips(&[copy, s(FILE, at("query-rows")), s(FILE, 240), s(FILE, 361)]);
        assert_eq!(q.map(|t| t.per_warp), Some(vec![2.0; 4]));
        let lq = p.trips(&[s(FILE, at("queries-loop")), s(FILE, 240), s(FILE, 361)]);
        assert_eq!(lq.map(|t| (t.mean(), t.stores)), Some((0.25, 3.0)));
        assert_eq!(
            p.trips(&[s(FILE, at("dq-halves")), s(FILE, 361)])
                .map(|t| t.mean()),
            Some(2.0)
        );
        assert_eq!(p.trips(&[s(FILE, 202), s(FILE, 361)]), None);
        let frag = at("atomic-frag");
        assert!(p.is_optional(&[s("mma.cuh", 45), s(FILE, frag), s(FILE, 361)]));
        assert!(!p.is_optional(&[s(FILE, at("atomic-if")), s(FILE, 361)]));
        assert!(!p.is_optional(&[s(FILE, at("after-atomic")), s(FILE, 361)]));
        assert_eq!(
            p.site(&[s(FILE, m.lines("atomic-frag")[2])], false, 16)
                .len(),
            2
        );
    }
}
