//! The profile of kernels/flash_tc.cu for `cargo xtask kernel-model`: what its source says that
//! the SASS does not: the kernels and their main loops, the trip counts of the inner loops (by the source line
//! of their back-edge and its call site), the optional blocks (the forward's rescale), and the
//! 32 lanes' shared-memory addresses of each access, by source line. The addresses are computed
//! from the kernel's index expressions (the comments name them): the CPU shim cannot see plain
//! `__shared__` array accesses without changing the kernels, and its WMMA emulation gives every
//! lane the whole fragment, so its addresses are not the device's. Line numbers are flash_tc.cu's
//! today; a test of this file checks them against the source, so an edit that moves them fails.

use super::super::banks::{contiguous, per_row, row_pairs, wmma_bf16, wmma_f32};
use super::{lines_in, Chain, Kernel, Role, Trips};

/// flash_tc.cu at one head size and launch geometry.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    pub file: &'static str,
    pub d: u64,
    pub warps: u64,
    pub keys: u64,
}

/// The kernels of flash_tc.cu at head sizes 64 and 128.
pub fn kernels(warps: u64, keys: u64) -> Vec<Kernel> {
    let mut out = vec![];
    for d in [64, 128] {
        for (role, stem, main_line, area) in [
            (Role::Forward, "fwd", 141, 16 * keys),
            (Role::Dq, "bwd_dq", 229, 16 * keys),
            (Role::Dkdv, "bwd_dkdv", 314, 16 * 16),
        ] {
            out.push(Kernel {
                name: format!("flash_tc_{stem}_d{d}"),
                family: "flash_tc",
                role,
                d,
                main_line,
                area: area as f64,
                geometry: format!("{warps} warps, {keys} keys"),
                profile: Box::new(Profile::new(d, warps, keys)),
            });
        }
    }
    out
}

impl Profile {
    pub fn new(d: u64, warps: u64, keys: u64) -> Profile {
        Profile {
            file: "flash_tc.cu",
            d,
            warps,
            keys,
        }
    }

    /// Padded row length of the staged tiles (`LD = D + PAD`, PAD = 8).
    fn ld(&self) -> u64 {
        self.d + 8
    }

    /// Instructions of the forward's rescale (`scale_rows` called at :176) run only when some
    /// row of the warp has a new maximum.
    pub fn is_optional(&self, lines: &[u32]) -> bool {
        lines.contains(&176)
    }

    /// A generic LD/ST is a shared-memory access when it is a WMMA load or store (code of
    /// mma.hpp): every WMMA pointer in flash_tc.cu is a shared tile.
    pub fn generic_is_shared(&self, chain: &[(String, u32)]) -> bool {
        chain.first().is_some_and(|(f, _)| f == "mma.hpp")
    }

    /// Source iterations of the inner loop whose back-edge has source lines `lines` (innermost
    /// first), per thread.
    pub fn trips(&self, lines: &[u32]) -> Option<f64> {
        let threads = 32 * self.warps;
        let n = match lines {
            // stage(): n rows x D elements over the block's threads; n by the call site.
            [55, call, ..] => {
                let rows = match call {
                    124 | 215 | 216 | 299 | 300 => 16 * self.warps,
                    142 | 143 | 230 | 231 => self.keys,
                    315 | 316 => 16,
                    _ => return None,
                };
                (rows * self.d).div_ceil(threads)
            }
            // scale_rows / write_rows: 256 elements over 32 lanes.
            [86, ..] | [99, ..] => 8,
            [70, ..] => self.keys / 16,
            [73, ..] | [127, ..] | [130, ..] => self.d / 16,
            [150, ..] | [159, ..] | [237, ..] | [258, ..] => self.keys / 2,
            [336, ..] | [364, ..] => 8,
            _ => return None,
        };
        Some(n as f64)
    }

    /// The lane address patterns of the shared-memory accesses at `line` (several when one line
    /// makes accesses the SASS cannot tell apart: the model averages them); empty when unknown.
    pub fn site(&self, line: u32, store: bool, _width: u32) -> Vec<Vec<u64>> {
        let (ld, k) = (self.ld(), self.keys);
        let one = |p: Vec<u64>| vec![p];
        match (line, store) {
            // stage(): dst[(e / D) * LD + e % D], e = threadIdx.x + i * TC_THREADS.
            (57, true) => one(contiguous(2)),
            // WMMA loads of the padded K/V/Q/dO tiles (leading dimension LD).
            (75 | 128 | 183 | 220 | 249 | 250 | 268 | 330 | 347 | 357 | 372, false) => {
                one(wmma_bf16(ld))
            }
            // dK/dV's unpadded K and V tiles (leading dimension D).
            (329 | 356, false) => one(wmma_bf16(self.d)),
            // P / dS tiles as matrix_a: 16 x TC_KEYS (forward, dQ) or 16 x 16 (dK/dV).
            (179 | 265, false) => one(wmma_bf16(k)),
            (344 | 369, false) => one(wmma_bf16(16)),
            // Accumulator stores / loads: S and dP (row stride TC_KEYS), 16 x 16 buffers.
            (78 | 253, true) => one(wmma_f32(k)),
            (84 | 97 | 333 | 361, true) | (88, false) => one(wmma_f32(16)),
            // buf[e] (and scale[e / 16], 2 words: 1 wavefront) with e = lane + 32 i.
            (86 | 101, _) => one(contiguous(4)),
            // sbuf[w][row][col], col = half * HALF + c: the row scans of S and dP.
            (152 | 239, false) | (260, false) => one(row_pairs(k, k, 0, 4)),
            // pbuf[w][row][col] = bf16: the P and dS writes.
            (162 | 260, true) => one(row_pairs(k, k, 0, 2)),
            // dK/dV's 16 x 16 scans read sbuf[w][kr][col] and lse_t[col] / delta_t[col] (lanes
            // of one half read one word: 1 wavefront), one of each per column.
            (338 | 366, false) => vec![row_pairs(16, 16, 0, 4), row_pairs(0, 16, 0, 4)],
            (339 | 366, true) => one(row_pairs(16, 16, 0, 2)),
            // lse_t[threadIdx.x], delta_t[threadIdx.x].
            (319 | 320, true) => one(contiguous(4)),
            // m_s, l_s, c_s, one[]: one float per row pair.
            (133 | 134 | 149 | 166 | 167 | 168 | 189 | 195 | 227 | 307, _) => one(per_row(4)),
            _ => vec![],
        }
    }
}

impl super::Profile for Profile {
    fn file(&self) -> &'static str {
        self.file
    }
    fn is_optional(&self, chain: &Chain) -> bool {
        Profile::is_optional(self, &lines_in(chain, self.file))
    }
    fn generic_is_shared(&self, chain: &Chain) -> bool {
        Profile::generic_is_shared(self, chain)
    }
    fn trips(&self, back: &Chain) -> Option<Trips> {
        Profile::trips(self, &lines_in(back, self.file)).map(Trips::uniform)
    }
    fn site(&self, chain: &Chain, store: bool, width: u32) -> Vec<Vec<u64>> {
        let line = lines_in(chain, self.file).first().copied().unwrap_or(0);
        Profile::site(self, line, store, width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line numbers above still point at the accesses and loops they describe.
    #[test]
    fn the_profiles_lines_match_flash_tc_cu() {
        let src = include_str!("../../../../kernels/flash_tc.cu");
        let line = |n: usize| src.lines().nth(n - 1).unwrap_or_default();
        for (n, text) in [
            (55, "for (int e = threadIdx.x; e < n * D; e += TC_THREADS)"),
            (57, "dst[(e / D) * LD + e % D]"),
            (75, "load_matrix_sync(bf, b + (n * 16) * LD + f * 16, LD)"),
            (78, "store_matrix_sync(out + n * 16, sf, TC_KEYS"),
            (
                86,
                "for (int e = lane; e < 256; e += 32) buf[e] *= scale[e / 16]",
            ),
            (
                141,
                "for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last; k0 += TC_KEYS)",
            ),
            (152, "sbuf[w][row][col] * scale"),
            (162, "pbuf[w][row][half * HALF + c]"),
            (176, "scale_rows(of[f], obuf[w], c_s[w], lane)"),
            (
                179,
                "load_matrix_sync(pf[kk], &pbuf[w][0][kk * 16], TC_KEYS)",
            ),
            (183, "load_matrix_sync(vf, &kv[1][kk * 16][f * 16], LD)"),
            (
                229,
                "for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last; k0 += TC_KEYS)",
            ),
            (253, "store_matrix_sync(&sbuf[w][0][n * 16], df, TC_KEYS"),
            (
                260,
                "pbuf[w][row][col] = __float2bfloat16(p[c] * (sbuf[w][row][col]",
            ),
            (314, "for (int i0 = (kb0 / 16) * 16; i0 < end; i0 += 16)"),
            (329, "load_matrix_sync(kf, &ks[w * 16][f * 16], D)"),
            (338, "sbuf[w][kr][col] * scale - lse_t[col]"),
            (356, "load_matrix_sync(vf, &vs[w * 16][f * 16], D)"),
            (366, "(sbuf[w][kr][col] - delta_t[col])"),
        ] {
            assert!(
                line(n).contains(text),
                "flash_tc.cu:{n} is `{}`",
                line(n).trim()
            );
        }
    }

    #[test]
    fn trips_follow_the_call_site() {
        let p = Profile::new(128, 4, 32);
        // K and V tiles: 32 rows x 128 over 128 threads; the Q tile: 64 rows.
        assert_eq!(p.trips(&[55, 142, 405]), Some(32.0));
        assert_eq!(p.trips(&[55, 124, 405]), Some(64.0));
        assert_eq!(p.trips(&[55, 315, 405]), Some(16.0));
        assert_eq!(p.trips(&[86, 176, 405]), Some(8.0));
        assert_eq!(p.trips(&[310, 405]), None);
        assert!(p.is_optional(&[86, 176, 405]) && !p.is_optional(&[86, 405]));
    }
}
