//! The profile of kernels/flash_fa2.cu (FlashAttention-2's forward) for `cargo xtask
//! kernel-model`: the kernels and their main loop (one warp: 16 query rows x FA2_KEYS keys per
//! iteration), the copy loops nvcc leaves (load_rows, fa2.rs), and the lanes' shared addresses
//! of the ldmatrix reads of K and V (padded rows). One optional block: the key mask, which a
//! causal row block runs on its diagonal tile only (one tile in 64 at T = 8192), so the main
//! loop is timed without it. Lines are flash_fa2.cu's `// model:` tags (marks.rs), checked by
//! the test below.

use super::fa2::{self, ldsm_cols_major, ldsm_rows_major, tile, Fa2};
use super::marks::Marks;
use super::{lines_in, Chain, Kernel, Role, Trips};
use anyhow::Result;

const FILE: &str = "flash_fa2.cu";

/// flash_fa2.cu's forward at head sizes 64 and 128, blocks of `warps` warps, from the kernel's
/// and fa2.cuh's tags.
pub fn kernels(marks: &Marks, fa2: &Fa2, warps: u64) -> Result<Vec<Kernel>> {
    // The main loop's `for` (one 64-key tile a step).
    let main = marks.line("main")?;
    Ok([64, 128]
        .into_iter()
        .map(|d| Kernel {
            name: format!("flash_fa2_fwd_d{d}"),
            family: "FA2",
            role: Role::Forward,
            d,
            main_line: main,
            area: (16 * fa2::KEYS) as f64,
            geometry: format!("{warps} warps, {} keys", fa2::KEYS),
            profile: Box::new(Forward {
                d,
                warps,
                marks: marks.clone(),
                fa2: fa2.clone(),
            }),
        })
        .collect())
}

/// The forward at one head size.
struct Forward {
    d: u64,
    warps: u64,
    marks: Marks,
    fa2: Fa2,
}

impl super::Profile for Forward {
    fn file(&self) -> &'static str {
        FILE
    }
    fn optional_tag(&self) -> &'static str {
        "+mask"
    }
    fn is_optional(&self, chain: &Chain) -> bool {
        let Ok(mask) = self.marks.region("mask") else {
            return false;
        };
        lines_in(chain, FILE)
            .first()
            .is_some_and(|l| mask.contains(l))
    }
    fn generic_is_shared(&self, _chain: &Chain) -> bool {
        false // the kernel's shared accesses are ldmatrix and cp.async
    }
    fn trips(&self, back: &Chain) -> Option<Trips> {
        // K and V tiles, before the loop and prefetched in it (fa2.cuh's pipeline): FA2_KEYS
        // rows; the forward has no other copy.
        self.fa2
            .is_kv_copy(back)
            .then(|| self.fa2.load_rows_trips(self.d, fa2::KEYS, self.warps))
    }
    fn site(&self, chain: &Chain, store: bool, _width: u32) -> Vec<Vec<u64>> {
        if self.fa2.in_load_rows(chain) {
            return fa2::copy_site(self.d);
        }
        let stride = tile(self.d);
        let line = lines_in(chain, FILE).first().copied().unwrap_or(0);
        match (self.marks.tag(line), store) {
            // K's B fragments: keys n0 + 8 (mi >> 1) + r, dims 16 f + 8 (mi & 1).
            (Some("k-frag"), false) => vec![ldsm_rows_major(stride)],
            // V's by .trans: keys 16 kk + 8 (mi & 1) + r, dims 8 n + 8 (mi >> 1).
            (Some("v-frag"), false) => vec![ldsm_cols_major(stride)],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::marks::assert_tags;
    use super::super::Profile;
    use super::*;

    const SRC: &str = include_str!("../../../../kernels/flash_fa2.cu");

    /// The tags sit on the loops and accesses they name.
    #[test]
    fn the_profiles_tags_match_flash_fa2_cu() {
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        assert_tags(
            &m,
            SRC,
            &[
                ("main", 1, "for (int it = 0; it < keys.tiles; it++)"),
                (
                    "kv-ready",
                    1,
                    "fa2_kv_ready<D>(ks, vs, kh, vh, keys, it, t, ldk)",
                ),
                ("k-frag", 1, "fa2_ldsm<D, false>(bk, kl, n * 8, 2 * f)"),
                ("v-frag", 1, "fa2_ldsm<D, true>(bv, vl, kk * 16, n)"),
            ],
        );
    }

    #[test]
    fn copies_and_fragments_are_found_by_tag() {
        let m = Marks::parse(FILE, SRC).expect("the kernel sources' tags");
        let fa2_src = include_str!("../../../../kernels/fa2.cuh");
        let (fm, fa2) = (
            Marks::parse(fa2::FILE, fa2_src).expect("the kernel sources' tags"),
            Fa2::new(fa2_src).expect("the kernel sources' tags"),
        );
        let s = |f: &str, l: u32| (f.to_string(), l);
        let p = Forward {
            d: 128,
            warps: 4,
            marks: m.clone(),
            fa2,
        };
        let (main, ready) = (
            m.line("main").expect("the kernel sources' tags"),
            m.line("kv-ready").expect("the kernel sources' tags"),
        );
        let back = [
            s(
                fa2::FILE,
                fm.line("copy-loop").expect("the kernel sources' tags"),
            ),
            s(fa2::FILE, fm.lines("kv-load")[1]),
            s(fa2::FILE, 66),
            s(FILE, ready),
        ];
        let t = p.trips(&back).map(|t| t.per_warp);
        assert_eq!(t, Some(vec![8.0; 4]));
        assert_eq!(p.trips(&[s(FILE, main), s(FILE, 167)]), None);
        let ldsm = [
            s("mma.cuh", 39),
            s(FILE, m.line("k-frag").expect("the kernel sources' tags")),
            s(FILE, 167),
        ];
        assert_eq!(p.site(&ldsm, false, 16).len(), 1);
        assert!(p.site(&[s(FILE, 152)], true, 4).is_empty());
        // The key mask is the optional block; the max over the tile after it is not.
        let mask = m.region("mask").expect("the kernel sources' tags");
        assert!(p.is_optional(&[s(FILE, *mask.start() + 3)]));
        assert!(!p.is_optional(&[s(FILE, *mask.end() + 3)]));
    }
}
