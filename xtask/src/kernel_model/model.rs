//! The performance model of `cargo xtask kernel-model`: per-iteration counts of a loop from its
//! SASS (inner loops times their trip counts, a remainder nvcc peels in front of an unrolled
//! inner loop weighted by the iterations it runs, optional blocks apart), shared-memory wavefronts
//! from the profile's lane patterns, and the bound and share of peak on an H200 they imply. An
//! estimate: a throughput roofline over the SM's issue slots, shared-memory wavefronts, tensor
//! cores and DRAM, assuming enough warps to hide latency; real kernels do no better.

use super::banks;
use super::profile::{Chain, Profile, Trips};
use super::sass::{class, hmma_flops, is_store, width, Class, Function, Instr, Loop};
use serde_json::json;
use std::collections::{HashMap, HashSet};

/// H200 SXM. Sources: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200: 4.8 TB/s HBM3e,
/// 1,979 TFLOP/s bf16 *with sparsity*, so 989 dense); NVIDIA H100 Tensor Core GPU Architecture
/// whitepaper (the same GH100 SM: 132 SMs on SXM5, 4 warp schedulers per SM each issuing one
/// warp-instruction per clock, 4 tensor cores per SM, 4096 dense bf16 FLOP per SM per clock,
/// which with 132 SMs and the 1,830 MHz tensor boost clock gives the 989.4 TFLOP/s; checked
/// against forums.developer.nvidia.com/t/how-to-calculate-the-tensor-core-fp16-performance-of-h100
/// and glennklockwood.com/garden/processors/h100); CUDA C++ Programming Guide, shared memory:
/// 32 banks of 4 bytes, one wavefront (128 B) per clock per SM.
pub struct Gpu {
    pub sms: f64,
    pub clock_hz: f64,
    pub issue_per_clock: f64,
    pub wavefronts_per_clock: f64,
    pub flop_per_clock: f64,
    pub dram_bytes_per_s: f64,
}

pub const H200: Gpu = Gpu {
    sms: 132.0,
    clock_hz: 1.83e9,
    issue_per_clock: 4.0,
    wavefronts_per_clock: 1.0,
    flop_per_clock: 4096.0,
    dram_bytes_per_s: 4.8e12,
};

impl Gpu {
    /// Dense bf16 peak, FLOP/s.
    pub fn peak(&self) -> f64 {
        self.sms * self.flop_per_clock * self.clock_hz
    }
}

/// What one warp executes in one iteration of a loop.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub issued: f64,
    pub hmma: f64,
    pub flops: f64,
    pub shared: f64,
    pub wavefronts: f64,
    /// Shared-memory instructions no lane pattern describes, counted as 1 wavefront each.
    pub unmodelled: f64,
    pub global: f64,
    /// Bytes the global accesses request (32 lanes x width): DRAM traffic with no cache reuse.
    pub global_bytes: f64,
    pub movm: f64,
    pub convert: f64,
}

impl Counts {
    fn add(&mut self, o: &Counts, times: f64) {
        self.issued += o.issued * times;
        self.hmma += o.hmma * times;
        self.flops += o.flops * times;
        self.shared += o.shared * times;
        self.wavefronts += o.wavefronts * times;
        self.unmodelled += o.unmodelled * times;
        self.global += o.global * times;
        self.global_bytes += o.global_bytes * times;
        self.movm += o.movm * times;
        self.convert += o.convert * times;
    }

    pub fn scaled(&self, k: f64) -> Counts {
        let mut c = Counts::default();
        c.add(self, k);
        c
    }

    pub fn plus(&self, o: &Counts) -> Counts {
        let mut c = *self;
        c.add(o, 1.0);
        c
    }

    pub fn json(&self) -> serde_json::Value {
        json!({"instructions": self.issued, "hmma": self.hmma, "shared": self.shared,
               "wavefronts": self.wavefronts, "unmodelled_shared": self.unmodelled,
               "global": self.global, "global_bytes": self.global_bytes, "movm": self.movm,
               "conversions": self.convert})
    }
}

/// A loop's counts: the common path, and the optional blocks (the profile's, e.g. the
/// forward's rescale) that run only on some iterations.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopCounts {
    pub base: Counts,
    pub optional: Counts,
    /// Inner loops whose trip count the profile does not know (counted once).
    pub unknown_trips: usize,
    /// Peeled remainders found (and weighted by the iterations they run), and those the
    /// profile expects but the SASS does not show as such (its straight code then counts once,
    /// the loop its mean source iterations over the unroll factor).
    pub peeled: usize,
    pub peels_missed: usize,
}

/// What one executed instruction costs. Never-executed ones (`@!PT`, nvcc's padding around
/// LDGSTS) take an issue slot only. LDGSTS (cp.async) is a shared store and a global read.
fn instruction(i: &Instr, p: &dyn Profile) -> Counts {
    let mut c = Counts {
        issued: 1.0,
        ..Counts::default()
    };
    if i.never() {
        return c;
    }
    let w = width(&i.op);
    let shared = |c: &mut Counts| {
        c.shared += 1.0;
        let patterns = p.site(&i.chain, is_store(&i.op), w);
        if patterns.is_empty() {
            c.wavefronts += 1.0;
            c.unmodelled += 1.0;
        } else {
            let sum: u32 = patterns.iter().map(|a| banks::wavefronts(a, w)).sum();
            c.wavefronts += f64::from(sum) / patterns.len() as f64;
        }
    };
    let global = |c: &mut Counts| {
        c.global += 1.0;
        c.global_bytes += 32.0 * f64::from(w);
    };
    match class(&i.op) {
        Class::Hmma => {
            c.hmma += 1.0;
            c.flops += hmma_flops(&i.op);
        }
        Class::Shared => {
            shared(&mut c);
            if i.op.starts_with("LDGSTS") {
                global(&mut c);
            }
        }
        Class::Generic if p.generic_is_shared(&i.chain) => shared(&mut c),
        Class::Generic | Class::Global => global(&mut c),
        Class::Movm => c.movm += 1.0,
        Class::Convert => c.convert += 1.0,
        Class::Other => {}
    }
    c
}

/// Whether `i` stores (shared, global or cp.async): what the unroll factor is counted in.
fn stores(i: &Instr) -> bool {
    !i.never()
        && matches!(class(&i.op), Class::Shared | Class::Generic | Class::Global)
        && is_store(&i.op)
}

/// The instructions of `l` outside its inner loops.
fn direct<'a>(f: &'a Function, l: &Loop, all: &[Loop]) -> Vec<&'a Instr> {
    let children = Function::children(l, all);
    f.body(l)
        .filter(|i| !children.iter().any(|c| c.contains(i.addr)))
        .collect()
}

/// The remainder nvcc peels in front of the unrolled inner loop whose back-edge is at `back`,
/// among the instructions `own` of the enclosing loop: the code from the conditional branch
/// that skips it to that branch's target, which holds the source loop's stores (known by their
/// call chain and the profile's body lines) and no other memory access. Its addresses and the
/// source iterations it holds.
fn peel(f: &Function, own: &[&Instr], back: &Chain, t: &Trips) -> Option<(Vec<u32>, f64)> {
    let (file, lines) = t.peel.as_ref()?;
    let n = back.len();
    let ours = |i: &Instr| {
        let c = &i.chain;
        n > 0
            && c.len() >= n
            && c[c.len() - n + 1..] == back[1..]
            && c[c.len() - n].0 == *file
            && lines.contains(&c[c.len() - n].1)
    };
    let copies: Vec<u32> = own
        .iter()
        .filter(|i| stores(i) && ours(i))
        .map(|i| i.addr)
        .collect();
    let (first, last) = (*copies.iter().min()?, *copies.iter().max()?);
    let (from, to) = own
        .iter()
        .filter(|i| i.addr < first && i.conditional_branch())
        .filter_map(|i| f.target_addr(i).map(|t| (i.addr, t)))
        .filter(|&(_, t)| t > last)
        .max_by_key(|&(a, _)| a)?;
    let region: Vec<&&Instr> = own
        .iter()
        .filter(|i| i.addr > from && i.addr < to)
        .collect();
    let memory = |i: &Instr| matches!(class(&i.op), Class::Shared | Class::Generic | Class::Global);
    if region.iter().any(|i| !i.never() && memory(i) && !ours(i)) {
        return None;
    }
    let iterations = copies.len() as f64 / t.stores;
    Some((region.iter().map(|i| i.addr).collect(), iterations))
}

/// Counts of one iteration of `l` in `f`, its optional code (optional.rs) apart.
pub fn count(f: &Function, l: &Loop, all: &[Loop], p: &dyn Profile) -> LoopCounts {
    count_with(f, l, all, p, &super::optional::optional(f, l, p))
}

/// `count` with the addresses of the optional code of the outermost loop counted.
fn count_with(
    f: &Function,
    l: &Loop,
    all: &[Loop],
    p: &dyn Profile,
    optional: &HashSet<u32>,
) -> LoopCounts {
    let children = Function::children(l, all);
    let own = direct(f, l, all);
    let mut out = LoopCounts::default();
    // Each inner loop's SASS iterations (None: unknown), and the weights of peeled remainders'
    // instructions (the iterations they run over the iterations they hold).
    let mut weights: HashMap<u32, f64> = HashMap::new();
    let mut iterations = vec![];
    for c in &children {
        let back = f.back_edge(c).map(|b| b.chain.clone()).unwrap_or_default();
        let t = p.trips(&back);
        iterations.push(t.map(|t| {
            // Source iterations per SASS iteration: the loop's stores over a source
            // iteration's, at least 1.
            let n = direct(f, c, all).into_iter().filter(|i| stores(i)).count();
            let unroll = (n as f64 / t.stores).round().max(1.0);
            let found = peel(f, &own, &back, &t);
            if t.peel.is_some() {
                if found.is_some() {
                    out.peeled += 1;
                } else {
                    out.peels_missed += 1;
                }
            }
            match found {
                Some((region, held)) => {
                    let rest = t.per_warp.iter().map(|n| n % unroll).sum::<f64>();
                    let ran = rest / t.per_warp.len() as f64;
                    for a in region {
                        weights.insert(a, ran / held);
                    }
                    let whole = t.per_warp.iter().map(|n| (n / unroll).floor()).sum::<f64>();
                    whole / t.per_warp.len() as f64
                }
                None => t.mean() / unroll,
            }
        }));
    }
    for i in own {
        let bucket = if optional.contains(&i.addr) {
            &mut out.optional
        } else {
            &mut out.base
        };
        bucket.add(
            &instruction(i, p),
            weights.get(&i.addr).copied().unwrap_or(1.0),
        );
    }
    for (c, trips) in children.iter().zip(iterations) {
        let inner = count_with(f, c, all, p, optional);
        let trips = trips.unwrap_or_else(|| {
            out.unknown_trips += 1;
            1.0
        });
        let whole = inner.base.plus(&inner.optional);
        if optional.contains(&c.back) {
            out.optional.add(&whole, trips);
        } else {
            out.base.add(&inner.base, trips);
            out.optional.add(&inner.optional, trips);
        }
        out.unknown_trips += inner.unknown_trips;
        out.peeled += inner.peeled;
        out.peels_missed += inner.peels_missed;
    }
    out
}

/// The cycles (SM clocks) one warp-iteration's work takes on each unit, the bound and the
/// estimated share of the dense bf16 peak.
#[derive(Debug, Clone)]
pub struct Bound {
    pub issue: f64,
    pub shared: f64,
    pub tensor: f64,
    pub dram: f64,
    pub name: &'static str,
    pub share: f64,
}

pub fn bound(c: &Counts, g: &Gpu) -> Bound {
    let issue = c.issued / g.issue_per_clock;
    let shared = c.wavefronts / g.wavefronts_per_clock;
    let tensor = c.flops / g.flop_per_clock;
    let dram = c.global_bytes / (g.dram_bytes_per_s / g.sms / g.clock_hz);
    let units = [
        ("issue", issue),
        ("shared memory", shared),
        ("tensor", tensor),
        ("DRAM", dram),
    ];
    let (name, worst) = units
        .iter()
        .copied()
        .fold(("tensor", 0.0), |m, u| if u.1 > m.1 { u } else { m });
    Bound {
        issue,
        shared,
        tensor,
        dram,
        name,
        share: if worst > 0.0 { tensor / worst } else { 0.0 },
    }
}

impl Bound {
    /// The share of peak each unit alone would allow (tensor cycles over its cycles, at most 1).
    pub fn caps(&self) -> [(&'static str, f64); 3] {
        let cap = |c: f64| {
            if c > self.tensor {
                self.tensor / c
            } else {
                1.0
            }
        };
        [
            ("issue", cap(self.issue)),
            ("shared", cap(self.shared)),
            ("DRAM", cap(self.dram)),
        ]
    }

    pub fn json(&self) -> serde_json::Value {
        json!({"cycles": {"issue": self.issue, "shared": self.shared, "tensor": self.tensor,
               "dram": self.dram}, "bound": self.name, "estimated_share_of_peak": self.share})
    }
}

#[cfg(test)]
mod tests {
    use super::super::sass;
    use super::*;

    /// An outer loop (k.cu:10) around a copy loop (c.cuh:26, called at k.cu:11) that nvcc
    /// unrolled 3 times with up to 2 remainder iterations peeled in front, as it compiles FA2's
    /// load_rows; one never-executed `@!PT LDS` among them.
    const PEELED: &str = r#"
.text.k:
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
	//## File "/k/k.cu", line 10
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
	//## File "/k/c.cuh", line 26 inlined at "/k/k.cu", line 11
	//## File "/k/k.cu", line 11
        /*0020*/              @!P0 BRA `(.L_x_1) ;
	//## File "/k/c.cuh", line 29 inlined at "/k/k.cu", line 11
	//## File "/k/k.cu", line 11
        /*0030*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
        /*0060*/              @!PT LDS RZ, [RZ] ;
        /*0070*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
.L_x_1:
        /*0080*/                   BSYNC B1 ;
.L_x_2:
        /*0090*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*00a0*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*00b0*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
	//## File "/k/c.cuh", line 26 inlined at "/k/k.cu", line 11
	//## File "/k/k.cu", line 11
        /*00c0*/              @P2 BRA `(.L_x_2) ;
	//## File "/k/k.cu", line 10
        /*00d0*/              @P3 BRA `(.L_x_0) ;
        /*00e0*/                   EXIT ;
"#;

    /// Two warps: 5 and 3 copies each (one unrolled iteration each, remainders 2 and 0).
    struct Copies;

    impl Profile for Copies {
        fn file(&self) -> &'static str {
            "k.cu"
        }
        fn is_optional(&self, _: &Chain) -> bool {
            false
        }
        fn generic_is_shared(&self, _: &Chain) -> bool {
            false
        }
        fn trips(&self, back: &Chain) -> Option<Trips> {
            (back.first()? == &("c.cuh".to_string(), 26)).then(|| Trips {
                per_warp: vec![5.0, 3.0],
                stores: 1.0,
                peel: Some(("c.cuh", 24..=31)),
            })
        }
        fn site(&self, _: &Chain, _: bool, _: u32) -> Vec<Vec<u64>> {
            vec![banks::contiguous(16)]
        }
    }

    #[test]
    fn a_peeled_remainder_counts_the_iterations_it_runs() -> anyhow::Result<()> {
        let fs = sass::parse(PEELED)?;
        let f = &fs[0];
        let loops = f.loops();
        assert_eq!(loops.len(), 2);
        let c = count(f, &loops[1], &loops, &Copies);
        assert_eq!((c.peeled, c.peels_missed, c.unknown_trips), (1, 0, 0));
        // Copies: 1 unrolled iteration of 3, and the peel's 2 run on average 1 of 2 times: 4,
        // the mean of 5 and 3. Instructions: HMMA, the guard, BSYNC and the back-edge once,
        // the peel's 5 (the @!PT LDS issues but does not access memory) half, the loop's 4 once.
        assert_eq!(c.base.shared, 4.0);
        assert_eq!(c.base.wavefronts, 16.0);
        assert_eq!(c.base.global_bytes, 4.0 * 32.0 * 16.0);
        assert_eq!(c.base.issued, 4.0 + 2.5 + 4.0);
        assert_eq!((c.base.hmma, c.base.unmodelled), (1.0, 0.0));
        Ok(())
    }

    #[test]
    fn the_constants_give_the_published_peak() {
        let tflops = H200.peak() / 1e12;
        assert!((tflops - 989.4).abs() < 0.5, "{tflops}");
    }

    #[test]
    fn the_slowest_unit_bounds_the_share() {
        // 64 HMMA (64 SM clocks of tensor work) and 2,255 instructions (564 clocks of issue).
        let c = Counts {
            issued: 2255.0,
            hmma: 64.0,
            flops: 64.0 * 4096.0,
            wavefronts: 300.0,
            ..Counts::default()
        };
        let b = bound(&c, &H200);
        assert_eq!(b.name, "issue");
        assert!((b.share - 64.0 / (2255.0 / 4.0)).abs() < 1e-9);
        let s = Counts {
            wavefronts: 1000.0,
            ..c
        };
        assert_eq!(bound(&s, &H200).name, "shared memory");
        let t = Counts {
            issued: 10.0,
            wavefronts: 1.0,
            ..c
        };
        let b = bound(&t, &H200);
        assert_eq!((b.name, b.share), ("tensor", 1.0));
    }
}
