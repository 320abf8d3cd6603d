//! The profile of kernels/flash_fa2_bwd.cu (FlashAttention-2's backward) for `cargo xtask
//! kernel-model`: the deterministic dQ kernel (one warp: 16 query rows x FA2_KEYS keys per
//! main-loop iteration, in two 32-key halves nvcc leaves as a loop) and the dK/dV kernel (one
//! warp: 16 keys x QT queries per step), its optional `if (dq_atomic)` block (dS^T through
//! shared memory, dQ by f32 atomics), the copy loops nvcc leaves (load_rows, fa2.rs, and
//! load_queries's per-query loop), and the lanes' shared addresses per source line. Lines are
//! flash_fa2_bwd.cu's, checked by the test below.

use super::super::banks::{c_fragment, contiguous, quad_columns};
use super::fa2::{self, ldsm_cols_major, ldsm_rows_major, row_bytes};
use super::{lines_in, Chain, Kernel, Role, Trips};

const FILE: &str = "flash_fa2_bwd.cu";
/// The main loops' `for`: dQ's over 64-key tiles, dK/dV's over query steps.
const DQ_MAIN: u32 = 96;
const DKDV_MAIN: u32 = 235;
/// The `if (dq_atomic)` block's body.
const ATOMIC: std::ops::RangeInclusive<u32> = 299..=331;
/// load_queries's per-query loop (:165) and its body.
const QUERIES: std::ops::RangeInclusive<u32> = 165..=170;

/// Queries per dK/dV step (FA2_BWD_QT_D64, FA2_BWD_QT_D128).
pub fn queries(d: u64) -> u64 {
    if d == 64 {
        32
    } else {
        16
    }
}

/// flash_fa2_bwd.cu's dQ and dK/dV kernels at head sizes 64 and 128, blocks of `warps` warps.
pub fn kernels(warps: u64) -> Vec<Kernel> {
    let mut out = vec![];
    for d in [64, 128] {
        let qt = queries(d);
        for (role, stem, main_line, area, geometry) in [
            (
                Role::Dq,
                "dq",
                DQ_MAIN,
                16 * fa2::KEYS,
                format!("{warps} warps, {} keys", fa2::KEYS),
            ),
            (
                Role::Dkdv,
                "dkdv",
                DKDV_MAIN,
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
                profile: Box::new(Backward { d, warps }),
            });
        }
    }
    out
}

/// Both backward kernels at one head size.
struct Backward {
    d: u64,
    warps: u64,
}

impl super::Profile for Backward {
    fn file(&self) -> &'static str {
        FILE
    }
    fn optional_tag(&self) -> &'static str {
        "+atomic"
    }
    fn is_optional(&self, chain: &Chain) -> bool {
        lines_in(chain, FILE)
            .first()
            .is_some_and(|l| ATOMIC.contains(l))
    }
    fn generic_is_shared(&self, _chain: &Chain) -> bool {
        false // the kernels' shared accesses are ldmatrix, cp.async and plain arrays
    }
    fn trips(&self, back: &Chain) -> Option<Trips> {
        let (d, warps, qt) = (self.d, self.warps, queries(self.d));
        if fa2::is_kv_copy(back) {
            // dQ: K and V tiles.
            return Some(fa2::load_rows_trips(d, fa2::KEYS, warps));
        }
        if let Some(call) = fa2::load_rows_call(back, FILE) {
            let rows = match call {
                // dK/dV: the block's K and V (FA2_ROWS), and Q and dO by load_queries.
                196 | 197 => 16 * warps,
                163 | 164 => qt,
                _ => return None,
            };
            return Some(fa2::load_rows_trips(d, rows, warps));
        }
        match lines_in(back, FILE).first()? {
            // dQ's two 32-key halves of a tile.
            101 => Some(Trips::uniform((fa2::KEYS / 32) as f64)),
            // load_queries's lse, delta and starts: QT queries over the block's threads.
            165 => Some(Trips {
                per_warp: Trips::strided(qt, warps),
                stores: 3.0,
                peel: Some((FILE, QUERIES)),
            }),
            _ => None,
        }
    }
    fn site(&self, chain: &Chain, store: bool, width: u32) -> Vec<Vec<u64>> {
        if fa2::in_load_rows(chain) {
            return fa2::copy_site(self.d);
        }
        let (stride, qt) = (row_bytes(self.d), queries(self.d));
        // Elements of a bf16 pair or float pair one lane moves as separate accesses.
        let odd: &[u64] = if width <= 2 || (width == 4 && !store) {
            &[0, 1]
        } else {
            &[0]
        };
        match (lines_in(chain, FILE).first().copied().unwrap_or(0), store) {
            // B fragments of K and V (dQ) and of Q and dO (dK/dV) by their rows.
            (112 | 115 | 263 | 266, false) => vec![ldsm_rows_major(stride)],
            // .trans B fragments of K (dQ), dO and Q (dK/dV); the A fragments of K and V.
            (136 | 137 | 228 | 229 | 290 | 293, false) => vec![ldsm_cols_major(stride)],
            // The atomic pass: dS^T's A fragments (rows 16 kk + 8 (mi >> 1), rows (QT + 8) * 2
            // bytes apart) and K's .trans B fragments; nvcc mixes the two lines' attribution.
            (315 | 316 | 319 | 320, false) => vec![
                ldsm_rows_major((qt + fa2::PAD) * 2),
                ldsm_cols_major(stride),
            ],
            // dss[(16 w + g + 8 h) * LDS + 8 n + 2 t + (i & 1)] = bf16.
            (303 | 304, true) => odd
                .iter()
                .map(|&o| c_fragment((qt + fa2::PAD) * 2, 2, o))
                .collect(),
            // ls[e], ds[e], ss[e], e = threadIdx.x.
            (167..=169, true) => vec![contiguous(4)],
            // lt[c], sst[c], dt[c], c = 8 n + 2 t + (i & 1): a column's lanes share one word.
            (275 | 277, false) => odd.iter().map(|&o| quad_columns(4, o)).collect(),
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Profile;
    use super::*;

    /// The line numbers above still point at the loops and accesses they describe.
    #[test]
    fn the_profiles_lines_match_flash_fa2_bwd_cu() {
        let src = include_str!("../../../../kernels/flash_fa2_bwd.cu");
        let line = |n: u32| src.lines().nth(n as usize - 1).unwrap_or_default();
        for (n, text) in [
            (37, "#define FA2_BWD_QT_D64 32"),
            (38, "#define FA2_BWD_QT_D128 16"),
            (DQ_MAIN, "for (int it = 0; it < keys.tiles; it++)"),
            (101, "for (int half = 0; half < FA2_KEYS / HK; half++)"),
            (112, "ldmatrix_x4(bk, kt + at)"),
            (115, "ldmatrix_x4(bv, vt + at)"),
            (
                136,
                "ldmatrix_x4_trans(bk, kt + (kb + kk * 16 + 8 * (mi & 1) + r) * LD",
            ),
            (137, "8 * (mi >> 1)"),
            (163, "load_rows<D, QT>(qs, q, i0, t)"),
            (164, "load_rows<D, QT>(gs, dout, i0, t)"),
            (
                *QUERIES.start(),
                "for (int e = threadIdx.x; e < QT; e += FA2_THREADS)",
            ),
            (167, "ls[e] = "),
            (168, "ds[e] = "),
            (169, "ss[e] = "),
            (*QUERIES.end(), "}"),
            (196, "load_rows<D, FA2_ROWS>(kvs, k"),
            (197, "load_rows<D, FA2_ROWS>(kvs + FA2_ROWS * LD, v"),
            (213, "load_queries<D, QT>(qs, gs, ls, ds, ss"),
            (
                227,
                "int at = (w * 16 + 8 * (mi & 1) + r) * LD + f * 16 + 8 * (mi >> 1)",
            ),
            (228, "ldmatrix_x4(kf[f], kvs + at)"),
            (229, "ldmatrix_x4(vf[f], kvs + FA2_ROWS * LD + at)"),
            (DKDV_MAIN, "for (int s = 0; s < steps; s++)"),
            (240, "load_queries<D, QT>(qs + o * QTILE"),
            (
                261,
                "int at = (n * 8 + 8 * (mi >> 1) + r) * LD + f * 16 + 8 * (mi & 1)",
            ),
            (263, "ldmatrix_x4(bq, qt + at)"),
            (266, "ldmatrix_x4(bo, gt + at)"),
            (
                275,
                "j >= sst[c] && j <= i0 + c ? __expf(sc[n][i] * scale - lt[c])",
            ),
            (277, "dp[n][i] = p * (dp[n][i] - dt[c]) * scale"),
            (
                288,
                "int at = (kk * 16 + 8 * (mi & 1) + r) * LD + n * 8 + 8 * (mi >> 1)",
            ),
            (290, "ldmatrix_x4_trans(bo, gt + at)"),
            (293, "ldmatrix_x4_trans(bq, qt + at)"),
            (298, "if (dq_atomic) {"),
            (
                303,
                "dss[(w * 16 + gq + 8 * (i >> 1)) * LDS + n * 8 + 2 * tq + (i & 1)] =",
            ),
            (
                315,
                "ldmatrix_x4_trans(sa, dss + (kk * 16 + 8 * (mi >> 1) + r) * LDS + m * 16 +",
            ),
            (316, "8 * (mi & 1)"),
            (
                319,
                "ldmatrix_x4_trans(bk, kvs + (kk * 16 + 8 * (mi & 1) + r) * LD +",
            ),
            (320, "w * (D / FA2_WARPS) + n * 8 + 8 * (mi >> 1)"),
            (
                329,
                "if (qi < t) atomicAdd(dqh + (size_t)qi * D + col, acc[n][i])",
            ),
            (*ATOMIC.end(), "}"),
            (332, "}"),
            (333, "__syncthreads();  // stage sb (and dS^T) are free"),
        ] {
            assert!(line(n).contains(text), "{FILE}:{n} is `{}`", line(n).trim());
        }
    }

    #[test]
    fn trips_follow_the_call_site_and_the_atomic_block_is_optional() {
        let s = |f: &str, l: u32| (f.to_string(), l);
        let p = Backward { d: 64, warps: 4 };
        let rows = |call: u32| {
            p.trips(&[s("fa2.cuh", 26), s(FILE, call), s(FILE, 361)])
                .map(|t| t.per_warp)
        };
        // K/V tiles (64 x 64 / 8 over 128 threads: 4), the block's K (4), Q by step (32 x 8: 2).
        let kv = [
            s("fa2.cuh", 26),
            s("fa2.cuh", 50),
            s("fa2.cuh", 66),
            s(FILE, 98),
        ];
        assert_eq!(p.trips(&kv).map(|t| t.per_warp), Some(vec![4.0; 4]));
        assert_eq!(rows(196), Some(vec![4.0; 4]));
        let q = p.trips(&[s("fa2.cuh", 26), s(FILE, 163), s(FILE, 240), s(FILE, 361)]);
        assert_eq!(q.map(|t| t.per_warp), Some(vec![2.0; 4]));
        let lq = p.trips(&[s(FILE, 165), s(FILE, 240), s(FILE, 361)]);
        assert_eq!(lq.map(|t| (t.mean(), t.stores)), Some((0.25, 3.0)));
        assert_eq!(
            p.trips(&[s(FILE, 101), s(FILE, 361)]).map(|t| t.mean()),
            Some(2.0)
        );
        assert_eq!(p.trips(&[s(FILE, 202), s(FILE, 361)]), None);
        assert!(p.is_optional(&[s("mma.cuh", 45), s(FILE, 315), s(FILE, 361)]));
        assert!(!p.is_optional(&[s(FILE, 298), s(FILE, 361)]));
        assert!(!p.is_optional(&[s(FILE, 333), s(FILE, 361)]));
        assert_eq!(p.site(&[s(FILE, 319)], false, 16).len(), 2);
    }
}
