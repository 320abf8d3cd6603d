//! The profile of kernels/flash_fa2.cu (FlashAttention-2's forward) for `cargo xtask
//! kernel-model`: the kernels and their main loop (one warp: 16 query rows x FA2_KEYS keys per
//! iteration), the copy loops nvcc leaves (load_rows, fa2.rs), and the lanes' shared addresses
//! of the ldmatrix reads of K and V (padded rows). No optional block: the rescale of O is
//! unconditional. Lines are flash_fa2.cu's, checked by the test below.

use super::fa2::{self, ldsm_cols_major, ldsm_rows_major, row_bytes};
use super::{lines_in, Chain, Kernel, Role, Trips};

const FILE: &str = "flash_fa2.cu";
/// The main loop's `for` (one 64-key tile a step).
const MAIN: u32 = 76;

/// flash_fa2.cu's forward at head sizes 64 and 128, blocks of `warps` warps.
pub fn kernels(warps: u64) -> Vec<Kernel> {
    [64, 128]
        .into_iter()
        .map(|d| Kernel {
            name: format!("flash_fa2_fwd_d{d}"),
            family: "FA2",
            role: Role::Forward,
            d,
            main_line: MAIN,
            area: (16 * fa2::KEYS) as f64,
            geometry: format!("{warps} warps, {} keys", fa2::KEYS),
            profile: Box::new(Forward { d, warps }),
        })
        .collect()
}

/// The forward at one head size.
struct Forward {
    d: u64,
    warps: u64,
}

impl super::Profile for Forward {
    fn file(&self) -> &'static str {
        FILE
    }
    fn is_optional(&self, _chain: &Chain) -> bool {
        false
    }
    fn generic_is_shared(&self, _chain: &Chain) -> bool {
        false // the kernel's shared accesses are ldmatrix and cp.async
    }
    fn trips(&self, back: &Chain) -> Option<Trips> {
        // K and V tiles, before the loop and prefetched in it (fa2.cuh's pipeline): FA2_KEYS
        // rows; the forward has no other copy.
        fa2::is_kv_copy(back).then(|| fa2::load_rows_trips(self.d, fa2::KEYS, self.warps))
    }
    fn site(&self, chain: &Chain, store: bool, _width: u32) -> Vec<Vec<u64>> {
        if fa2::in_load_rows(chain) {
            return fa2::copy_site(self.d);
        }
        let stride = row_bytes(self.d);
        match (lines_in(chain, FILE).first().copied().unwrap_or(0), store) {
            // K's B fragments: keys n0 + 8 (mi >> 1) + r, dims 16 f + 8 (mi & 1).
            (90, false) => vec![ldsm_rows_major(stride)],
            // V's by .trans: keys 16 kk + 8 (mi & 1) + r, dims 8 n + 8 (mi >> 1).
            (133 | 134, false) => vec![ldsm_cols_major(stride)],
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
    fn the_profiles_lines_match_flash_fa2_cu() {
        let src = include_str!("../../../../kernels/flash_fa2.cu");
        let line = |n: usize| src.lines().nth(n - 1).unwrap_or_default();
        for (n, text) in [
            (75, "fa2_kv_load<D>(ks, vs, kh, vh, keys.first, t)"),
            (MAIN as usize, "for (int it = 0; it < keys.tiles; it++)"),
            (78, "fa2_kv_ready<D>(ks, vs, kh, vh, keys, it, t)"),
            (
                90,
                "ldmatrix_x4(bk, kt + (n * 8 + 8 * (mi >> 1) + r) * LD + f * 16 + 8 * (mi & 1))",
            ),
            (133, "ldmatrix_x4_trans(bv,"),
            (
                134,
                "vt + (kk * 16 + 8 * (mi & 1) + r) * LD + n * 8 + 8 * (mi >> 1)",
            ),
        ] {
            assert!(
                line(n).contains(text),
                "flash_fa2.cu:{n} is `{}`",
                line(n).trim()
            );
        }
    }

    #[test]
    fn copies_and_fragments_are_found_by_line() {
        let s = |f: &str, l: u32| (f.to_string(), l);
        let p = Forward { d: 128, warps: 4 };
        let back = [
            s("fa2.cuh", 26),
            s("fa2.cuh", 51),
            s("fa2.cuh", 66),
            s(FILE, 78),
        ];
        let t = p.trips(&back).map(|t| t.per_warp);
        assert_eq!(t, Some(vec![8.0; 4]));
        assert_eq!(p.trips(&[s(FILE, MAIN), s(FILE, 167)]), None);
        let ldsm = [s("mma.cuh", 39), s(FILE, 90), s(FILE, 167)];
        assert_eq!(p.site(&ldsm, false, 16).len(), 1);
        assert!(p.site(&[s(FILE, 152)], true, 4).is_empty());
    }
}
