//! What `cargo xtask kernel-model` knows of the kernels' source that the SASS does not say, one
//! file per kernel source (flash_tc.rs, flash_fa2.rs, flash_fa2_bwd.rs, and fa2.rs for the tile
//! copy of kernels/fa2.cuh they share): the kernels and their main loops, the trip counts of the
//! inner loops nvcc leaves as loops (by the source line of their back-edge and its call sites),
//! the optional blocks, and the 32 lanes' shared-memory addresses of each access by source line.
//! The addresses are computed from the kernels' index expressions (the comments name them): the
//! CPU shim cannot see plain `__shared__` accesses without changing the kernels. The lines are
//! found by the `// model: TAG` comments on them (marks.rs), not by number, so an edit that
//! moves them changes nothing here; each file's test checks its tags sit on the statements
//! they name.

pub mod fa2;
mod flash_fa2;
mod flash_fa2_bwd;
mod flash_tc;
pub mod marks;

use anyhow::{Context, Result};
use marks::Marks;
use std::ops::RangeInclusive;
use std::path::Path;

/// An instruction's inlined source position, innermost first: (file name, line).
pub type Chain = [(String, u32)];

/// The lines of `file` (a path suffix) in `chain`, innermost first.
pub fn lines_in(chain: &Chain, file: &str) -> Vec<u32> {
    chain
        .iter()
        .filter(|(f, _)| f.ends_with(file))
        .map(|&(_, l)| l)
        .collect()
}

/// Which pass of attention a kernel computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Forward,
    Dq,
    Dkdv,
}

/// The source iterations of an inner loop and how nvcc compiled it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trips {
    /// Source iterations each warp of the block issues (one entry: every warp alike).
    pub per_warp: Vec<f64>,
    /// Stores (shared, global or cp.async) one source iteration makes: the SASS loop's stores
    /// over this are the source iterations one SASS iteration does (its unroll factor).
    pub stores: f64,
    /// For a loop nvcc unrolls with its remainder peeled in front (`n % unroll` iterations as
    /// straight code, then `n / unroll` unrolled iterations): the file and lines of the source
    /// loop's body, which mark the peeled copies among the enclosing loop's instructions.
    pub peel: Option<(&'static str, RangeInclusive<u32>)>,
}

impl Trips {
    /// The same `n` iterations in every warp, one store each, no peel.
    pub fn uniform(n: f64) -> Trips {
        Trips {
            per_warp: vec![n],
            stores: 1.0,
            peel: None,
        }
    }

    /// `for (e = threadIdx.x; e < n; e += 32 * warps)`: warp w issues an iteration while its
    /// first lane's e is below n.
    pub fn strided(n: u64, warps: u64) -> Vec<f64> {
        (0..warps)
            .map(|w| {
                let first = 32 * w;
                if n > first {
                    (n - first).div_ceil(32 * warps) as f64
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// Source iterations per warp, averaged over the block's warps.
    pub fn mean(&self) -> f64 {
        self.per_warp.iter().sum::<f64>() / self.per_warp.len().max(1) as f64
    }
}

/// One kernel source's knowledge, at one head size.
pub trait Profile {
    /// The kernel source (a file name under kernels/) whose lines name the loops.
    fn file(&self) -> &'static str;
    /// The table's tag for a loop counted with its optional blocks.
    fn optional_tag(&self) -> &'static str {
        "+opt"
    }
    /// Whether an instruction at `chain` is in a block that runs only on some iterations.
    fn is_optional(&self, chain: &Chain) -> bool;
    /// Whether a generic LD/ST at `chain` reaches shared memory.
    fn generic_is_shared(&self, chain: &Chain) -> bool;
    /// The iterations of the inner loop whose back-edge is at `back`.
    fn trips(&self, back: &Chain) -> Option<Trips>;
    /// The lane address patterns of the shared-memory accesses at `chain` (several when the
    /// SASS cannot tell accesses apart: the model averages them); empty when unknown.
    fn site(&self, chain: &Chain, store: bool, width: u32) -> Vec<Vec<u64>>;
}

/// One kernel to model: its entry point and the loop that does the work.
pub struct Kernel {
    pub name: String,
    /// The kernels it is compared with: "flash_tc" or "FA2".
    pub family: &'static str,
    pub role: Role,
    pub d: u64,
    /// The source line of the main loop's `for` (its tag's).
    pub main_line: u32,
    /// Query x key entries one warp covers per main-loop iteration.
    pub area: f64,
    /// The launch geometry, for the table's heading.
    pub geometry: String,
    pub profile: Box<dyn Profile>,
}

/// One kernel source file and its kernels at head sizes 64 and 128.
pub struct Source {
    pub file: &'static str,
    pub kernels: Vec<Kernel>,
}

/// The three sources under `dir` (kernels/, whose tags place the profiles' lines):
/// flash_tc.cu (`warps` x 16 rows, `keys`-key tiles), and FlashAttention-2's flash_fa2.cu and
/// flash_fa2_bwd.cu (FA2_WARPS = `warps`) with their header fa2.cuh.
pub fn sources(dir: &Path, warps: u64, keys: u64) -> Result<Vec<Source>> {
    let read = |file: &'static str| -> Result<(&'static str, String)> {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok((file, text))
    };
    let marks = |file: &'static str| -> Result<Marks> {
        let (file, text) = read(file)?;
        Marks::parse(file, &text)
    };
    let fa2 = fa2::Fa2::new(&read(fa2::FILE)?.1)?;
    Ok(vec![
        Source {
            file: "flash_tc.cu",
            kernels: flash_tc::kernels(&marks("flash_tc.cu")?, warps, keys)?,
        },
        Source {
            file: "flash_fa2.cu",
            kernels: flash_fa2::kernels(&marks("flash_fa2.cu")?, &fa2, warps)?,
        },
        Source {
            file: "flash_fa2_bwd.cu",
            kernels: flash_fa2_bwd::kernels(&marks("flash_fa2_bwd.cu")?, &fa2, warps)?,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_loops_count_each_warps_iterations() {
        // 64 rows x 8 chunks over 128 threads: 4 each; 32 queries: warp 0 only.
        assert_eq!(Trips::strided(512, 4), vec![4.0; 4]);
        assert_eq!(Trips::strided(32, 4), vec![1.0, 0.0, 0.0, 0.0]);
        assert_eq!(Trips::strided(16, 4), vec![1.0, 0.0, 0.0, 0.0]);
        let t = Trips {
            per_warp: Trips::strided(32, 4),
            ..Trips::uniform(0.0)
        };
        assert_eq!(t.mean(), 0.25);
        let chain = [
            ("fa2.cuh".to_string(), 29),
            ("flash_fa2.cu".to_string(), 89),
        ];
        assert_eq!(lines_in(&chain, "flash_fa2.cu"), vec![89]);
    }

    #[test]
    fn every_source_has_both_head_sizes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
        let s = sources(&dir, 4, 32).expect("the kernel sources' tags");
        let names: Vec<&str> = s.iter().map(|s| s.file).collect();
        assert_eq!(names, ["flash_tc.cu", "flash_fa2.cu", "flash_fa2_bwd.cu"]);
        for src in &s {
            for k in &src.kernels {
                assert_eq!(k.profile.file(), src.file);
                assert!(k.name.ends_with(&format!("_d{}", k.d)));
            }
            assert!(src.kernels.iter().any(|k| k.d == 64));
            assert!(src.kernels.iter().any(|k| k.d == 128));
        }
    }
}
