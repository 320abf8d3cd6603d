//! The performance model of `cargo xtask kernel-model`: per-iteration counts of a loop from its
//! SASS (inner loops times their trip counts, optional blocks apart), shared-memory wavefronts
//! from the profile's lane patterns, and the bound and share of peak on an H200 they imply. An
//! estimate: a throughput roofline over the SM's issue slots, shared-memory wavefronts, tensor
//! cores and DRAM, assuming enough warps to hide latency; real kernels do no better.

use super::banks;
use super::profile::Profile;
use super::sass::{class, hmma_flops, is_store, width, Class, Function, Loop};
use serde_json::json;

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
}

/// Counts of one iteration of `l` in `f`.
pub fn count(f: &Function, l: &Loop, all: &[Loop], p: &Profile) -> LoopCounts {
    let children = Function::children(l, all);
    let mut out = LoopCounts::default();
    for i in f.body(l) {
        if children.iter().any(|c| c.contains(i.addr)) {
            continue;
        }
        let lines = i.lines_in(p.file);
        let bucket = if p.is_optional(&lines) {
            &mut out.optional
        } else {
            &mut out.base
        };
        bucket.issued += 1.0;
        let line = lines.first().copied().unwrap_or(0);
        let w = width(&i.op);
        let shared = |b: &mut Counts, patterns: Vec<Vec<u64>>| {
            b.shared += 1.0;
            if patterns.is_empty() {
                b.wavefronts += 1.0;
                b.unmodelled += 1.0;
            } else {
                let sum: u32 = patterns.iter().map(|a| banks::wavefronts(a, w)).sum();
                b.wavefronts += f64::from(sum) / patterns.len() as f64;
            }
        };
        match class(&i.op) {
            Class::Hmma => {
                bucket.hmma += 1.0;
                bucket.flops += hmma_flops(&i.op);
            }
            Class::Shared => shared(bucket, p.site(line, is_store(&i.op), w)),
            Class::Generic if p.generic_is_shared(&i.chain) => {
                shared(bucket, p.site(line, is_store(&i.op), w))
            }
            Class::Generic | Class::Global => {
                bucket.global += 1.0;
                bucket.global_bytes += 32.0 * f64::from(w);
            }
            Class::Movm => bucket.movm += 1.0,
            Class::Convert => bucket.convert += 1.0,
            Class::Other => {}
        }
    }
    for c in &children {
        let inner = count(f, c, all, p);
        let back = f
            .back_edge(c)
            .map(|b| b.lines_in(p.file))
            .unwrap_or_default();
        // Source iterations per SASS iteration: the stores in the body (each source iteration
        // of the kernels' copy and scale loops stores one element), at least 1.
        let unroll = f
            .body(c)
            .filter(|i| {
                !Function::children(c, all)
                    .iter()
                    .any(|g| g.contains(i.addr))
                    && matches!(class(&i.op), Class::Shared | Class::Generic | Class::Global)
                    && is_store(&i.op)
            })
            .count()
            .max(1) as f64;
        let trips = match p.trips(&back) {
            Some(t) => t / unroll,
            None => {
                out.unknown_trips += 1;
                1.0
            }
        };
        let whole = inner.base.plus(&inner.optional);
        if p.is_optional(&back) {
            out.optional.add(&whole, trips);
        } else {
            out.base.add(&inner.base, trips);
            out.optional.add(&inner.optional, trips);
        }
        out.unknown_trips += inner.unknown_trips;
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
    pub fn json(&self) -> serde_json::Value {
        json!({"cycles": {"issue": self.issue, "shared": self.shared, "tensor": self.tensor,
               "dram": self.dram}, "bound": self.name, "estimated_share_of_peak": self.share})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
