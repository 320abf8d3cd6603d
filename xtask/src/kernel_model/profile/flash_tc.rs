//! The profile of kernels/flash_tc.cu for `cargo xtask kernel-model`: what its source says that
//! the SASS does not: the kernels and their main loops, the trip counts of the inner loops (by
//! the source line of their back-edge and its call site), the optional blocks (the forward's
//! rescale), and the 32 lanes' shared-memory addresses of each access, by source line. The
//! addresses are computed from the kernel's index expressions (the comments name them): the CPU
//! shim cannot see plain `__shared__` array accesses without changing the kernels, and its WMMA
//! emulation gives every lane the whole fragment, so its addresses are not the device's. Lines
//! are found by flash_tc.cu's `// model:` tags (marks.rs); a test of this file checks each tag
//! sits on the statement it names.

use super::super::banks::{contiguous, per_row, row_pairs, wmma_bf16, wmma_f32};
use super::marks::Marks;
use super::{lines_in, Chain, Kernel, Role, Trips};
use anyhow::Result;

/// flash_tc.cu at one head size and launch geometry.
#[derive(Debug, Clone)]
pub struct Profile {
    pub file: &'static str,
    pub d: u64,
    pub warps: u64,
    pub keys: u64,
    marks: Marks,
}

/// The kernels of flash_tc.cu at head sizes 64 and 128, from its tags.
pub fn kernels(marks: &Marks, warps: u64, keys: u64) -> Result<Vec<Kernel>> {
    let mut out = vec![];
    for d in [64, 128] {
        for (role, stem, main, area) in [
            (Role::Forward, "fwd", "fwd-main", 16 * keys),
            (Role::Dq, "bwd_dq", "dq-main", 16 * keys),
            (Role::Dkdv, "bwd_dkdv", "dkdv-main", 16 * 16),
        ] {
            out.push(Kernel {
                name: format!("flash_tc_{stem}_d{d}"),
                family: "flash_tc",
                role,
                d,
                main_line: marks.line(main)?,
                area: area as f64,
                geometry: format!("{warps} warps, {keys} keys"),
                profile: Box::new(Profile::new(marks.clone(), d, warps, keys)),
            });
        }
    }
    Ok(out)
}

impl Profile {
    pub fn new(marks: Marks, d: u64, warps: u64, keys: u64) -> Profile {
        Profile {
            file: "flash_tc.cu",
            d,
            warps,
            keys,
            marks,
        }
    }

    /// Padded row length of the staged tiles (`LD = D + PAD`, PAD = 8).
    fn ld(&self) -> u64 {
        self.d + 8
    }

    /// Instructions of the forward's rescale (the `scale_rows` call, `rescale`) run only when
    /// some row of the warp has a new maximum.
    pub fn is_optional(&self, lines: &[u32]) -> bool {
        lines.iter().any(|&l| self.marks.is(l, "rescale"))
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
        let tag = |i: usize| lines.get(i).and_then(|&l| self.marks.tag(l));
        let n = match tag(0)? {
            // stage(): n rows x D elements over the block's threads; n by the call site.
            "stage-loop" => {
                let rows = match tag(1)? {
                    "stage-rows" => 16 * self.warps,
                    "stage-keys" => self.keys,
                    "stage-16" => 16,
                    _ => return None,
                };
                (rows * self.d).div_ceil(threads)
            }
            // scale_rows / write_rows: 256 elements over 32 lanes.
            "buf-scale" | "buf-loop" => 8,
            "key-tiles" => self.keys / 16,
            "dim-tiles" => self.d / 16,
            "half-row" => self.keys / 2,
            "col-loop" => 8,
            _ => return None,
        };
        Some(n as f64)
    }

    /// The lane address patterns of the shared-memory accesses at `line` (several when one line
    /// makes accesses the SASS cannot tell apart: the model averages them); empty when unknown.
    pub fn site(&self, line: u32, store: bool, _width: u32) -> Vec<Vec<u64>> {
        let (ld, k) = (self.ld(), self.keys);
        let one = |p: Vec<u64>| vec![p];
        let Some(tag) = self.marks.tag(line) else {
            return vec![];
        };
        match (tag, store) {
            // stage(): dst[(e / D) * LD + e % D], e = threadIdx.x + i * TC_THREADS.
            ("stage-store", true) => one(contiguous(2)),
            // WMMA loads of the padded K/V/Q/dO tiles (leading dimension LD).
            ("wmma-ld", false) => one(wmma_bf16(ld)),
            // dK/dV's unpadded K and V tiles (leading dimension D).
            ("wmma-d", false) => one(wmma_bf16(self.d)),
            // P / dS tiles as matrix_a: 16 x TC_KEYS (forward, dQ) or 16 x 16 (dK/dV).
            ("wmma-p-keys", false) => one(wmma_bf16(k)),
            ("wmma-p-16", false) => one(wmma_bf16(16)),
            // Accumulator stores / loads: S and dP (row stride TC_KEYS), 16 x 16 buffers.
            ("wmma-keys", true) => one(wmma_f32(k)),
            ("wmma-16-st", true) | ("wmma-16-ld", false) => one(wmma_f32(16)),
            // buf[e] (and scale[e / 16], 2 words: 1 wavefront) with e = lane + 32 i.
            ("buf-scale" | "buf-write", _) => one(contiguous(4)),
            // sbuf[w][row][col], col = half * HALF + c: the row scans of S and dP.
            ("s-read" | "ds-rw", false) => one(row_pairs(k, k, 0, 4)),
            // pbuf[w][row][col] = bf16: the P and dS writes.
            ("p-write" | "ds-rw", true) => one(row_pairs(k, k, 0, 2)),
            // dK/dV's 16 x 16 scans read sbuf[w][kr][col] and lse_t[col] / delta_t[col] (lanes
            // of one half read one word: 1 wavefront), one of each per column.
            ("scan-read" | "scan-rw", false) => {
                vec![row_pairs(16, 16, 0, 4), row_pairs(0, 16, 0, 4)]
            }
            ("scan-write" | "scan-rw", true) => one(row_pairs(16, 16, 0, 2)),
            // lse_t[threadIdx.x], delta_t[threadIdx.x].
            ("col-store", true) => one(contiguous(4)),
            // m_s, l_s, c_s, one[]: one float per row pair.
            ("row-state", _) => one(per_row(4)),
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
    use super::super::marks::assert_tags;
    use super::*;

    const SRC: &str = include_str!("../../../../kernels/flash_tc.cu");

    /// Every line of each tag holds the statement the tag names (how many lines, and a piece of
    /// each), so a tag moved to the wrong line fails here.
    #[test]
    fn the_profiles_tags_match_flash_tc_cu() {
        let m = Marks::parse("flash_tc.cu", SRC).expect("the kernel sources' tags");
        let line = |n: u32| SRC.lines().nth(n as usize - 1).unwrap_or_default();
        assert_tags(
            &m,
            SRC,
            &[
                (
                    "stage-loop",
                    1,
                    "for (int e = threadIdx.x; e < n * D; e += TC_THREADS)",
                ),
                ("stage-store", 1, "dst[(e / D) * LD + e % D]"),
                ("stage-rows", 5, ", TC_ROWS, t)"),
                ("stage-keys", 4, ", k0, TC_KEYS, t)"),
                ("stage-16", 2, ", i0, 16, t)"),
                ("key-tiles", 1, "for (int n = 0; n < TC_KEYS / 16; n++)"),
                ("dim-tiles", 3, "for (int f = 0; f < NF; f++)"),
                ("half-row", 4, "for (int c = 0; c < HALF; c++)"),
                ("col-loop", 2, "for (int c = 0; c < 8; c++)"),
                (
                    "fwd-main",
                    1,
                    "for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last",
                ),
                (
                    "dq-main",
                    1,
                    "for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last",
                ),
                (
                    "dkdv-main",
                    1,
                    "for (int i0 = (kb0 / 16) * 16; i0 < end; i0 += 16)",
                ),
                ("rescale", 1, "scale_rows(of[f], obuf[w], c_s[w], lane)"),
                ("wmma-ld", 11, ", LD);"),
                ("wmma-d", 2, "[f * 16], D);"),
                ("wmma-p-keys", 2, "&pbuf[w][0][kk * 16], TC_KEYS)"),
                ("wmma-p-16", 2, "&pbuf[w][0][0], 16)"),
                ("wmma-keys", 2, "store_matrix_sync("),
                ("wmma-16-st", 4, "store_matrix_sync("),
                ("wmma-16-ld", 1, "load_matrix_sync(f, buf, 16,"),
                ("buf-scale", 1, "buf[e] *= scale[e / 16]"),
                ("buf-loop", 1, "for (int e = lane; e < 256; e += 32)"),
                ("buf-write", 1, "= buf[e] * scale[e / 16]"),
                ("s-read", 2, "sbuf[w][row][col] * scale"),
                ("p-write", 1, "pbuf[w][row][half * HALF + c]"),
                (
                    "ds-rw",
                    1,
                    "pbuf[w][row][col] = __float2bfloat16(p[c] * (sbuf[w][row][col]",
                ),
                ("scan-read", 1, "sbuf[w][kr][col] * scale - lse_t[col]"),
                ("scan-write", 1, "pbuf[w][kr][col] = __float2bfloat16(p[c])"),
                ("scan-rw", 1, "(sbuf[w][kr][col] - delta_t[col])"),
                ("col-store", 2, "_t[threadIdx.x] = "),
                ("row-state", 10, "[w]["),
            ],
        );
        let wmma_keys = m.lines("wmma-keys");
        assert!(wmma_keys.iter().all(|&n| line(n).contains("TC_KEYS")));
    }

    #[test]
    fn trips_follow_the_call_site() {
        let m = Marks::parse("flash_tc.cu", SRC).expect("the kernel sources' tags");
        let p = Profile::new(m.clone(), 128, 4, 32);
        let at = |tag: &str| m.lines(tag)[0];
        let (stage, entry) = (at("stage-loop"), 405);
        // K and V tiles: 32 rows x 128 over 128 threads; the Q tile: 64 rows.
        assert_eq!(p.trips(&[stage, at("stage-keys"), entry]), Some(32.0));
        assert_eq!(p.trips(&[stage, at("stage-rows"), entry]), Some(64.0));
        assert_eq!(p.trips(&[stage, at("stage-16"), entry]), Some(16.0));
        let scale = at("buf-scale");
        assert_eq!(p.trips(&[scale, at("rescale"), entry]), Some(8.0));
        assert_eq!(p.trips(&[at("dkdv-main") - 4, entry]), None);
        assert!(p.is_optional(&[scale, at("rescale"), entry]) && !p.is_optional(&[scale, entry]));
    }
}
