//! The time of a kernel launch in `cargo xtask kernel-model`: from one warp-iteration's counts
//! (model.rs), the warp's latency (latency.rs) and the kernel's registers and shared memory, the
//! blocks an SM holds (occupancy), the cycles one main-loop iteration takes with that many warps
//! per scheduler, and the launch played block by block over the SMs, heaviest first as the
//! kernels order them, so the last wave's tail shows. What `--check-measured` (measured.rs)
//! compares with Nsight Compute's durations.

use super::model::{Counts, Gpu};

/// The SM's limits (CUDA C++ Programming Guide, compute capability 9.0: 64K 32-bit registers,
/// allocated per warp in units of 256; 228 KiB of shared memory of which a block may use 227,
/// 1 KiB per block reserved by the driver; 64 warps and 32 blocks).
pub struct Sm {
    pub registers: u64,
    pub register_unit: u64,
    pub shared_bytes: u64,
    pub shared_reserved: u64,
    pub warps: u64,
    pub blocks: u64,
    pub schedulers: f64,
}

pub const SM90: Sm = Sm {
    registers: 65536,
    register_unit: 256,
    shared_bytes: 233_472,
    shared_reserved: 1024,
    warps: 64,
    blocks: 32,
    schedulers: 4.0,
};

/// What a launch's model needs beyond the warp-iteration's counts. `fitted` says which of them
/// were fitted to the 2026-12-04 H200 measurement (docs/gpu/measured/2026-12-04/): the next
/// measurement tests them.
#[derive(Debug, Clone, Copy)]
pub struct Constants {
    /// mma.sync's rate over the dense tensor rate (Nsight Compute's counts on Hopper: about two
    /// thirds; only wgmma reaches the full rate). Measured by ncu, not fitted.
    pub mma_rate: f64,
    /// L2 bandwidth, bytes per second: ncu's 43.7 % of the L2 peak at the forward's 2.98 TB/s
    /// of cp.async traffic gives 6.8 TB/s. Measured by ncu, not fitted.
    pub l2_bytes_per_s: f64,
    /// FITTED, cycles squared: what one instruction of another warp on the same scheduler
    /// delays a warp is this over the warps' latency alone, on top of the warp's own latency.
    /// The warps collide only when both want the issue slot and the half-rate ALU and FMA pipes
    /// they share in the same cycles, and a warp whose dependencies let it issue once every `L`
    /// cycles wants them a 1 / `L` share of the time. Nsight Compute agrees: the dK/dV kernel
    /// (`L` 5.6) has 0.37 of its 1.83 warps per scheduler eligible and its cycles per
    /// instruction go from 5.39 at one warp to 5.86 at 1.83; the forward (`L` 2.2) has 0.73 of
    /// 1.96 eligible. Chosen as the smallest worst error over the seven measured launches.
    pub contention: f64,
    /// FITTED: the cycles of a block's start and end outside its main loop (loading Q or K/V
    /// and the first tiles from L2, the epilogue's stores), which no second warp hides.
    pub block_cycles: f64,
    /// FITTED: a launch's fixed cost in seconds as Nsight Compute times it (front end, the
    /// first blocks' dispatch, the drain).
    pub launch_s: f64,
}

pub const H200_FIT: Constants = Constants {
    mma_rate: 2.0 / 3.0,
    l2_bytes_per_s: 6.8e12,
    contention: 4.7,
    block_cycles: 6000.0,
    launch_s: 4.0e-6,
};

/// Blocks of `warps` warps, `registers` per thread and `shared` bytes one SM holds, and what
/// limits it.
pub fn blocks_per_sm(sm: &Sm, warps: u64, registers: u64, shared: u64) -> (u64, &'static str) {
    let per_warp = (registers * 32).div_ceil(sm.register_unit) * sm.register_unit;
    let limits = [
        ("registers", sm.registers / per_warp.max(1) / warps),
        (
            "shared memory",
            sm.shared_bytes / (shared + sm.shared_reserved),
        ),
        ("warps", sm.warps / warps),
        ("blocks", sm.blocks),
    ];
    limits
        .iter()
        .copied()
        .min_by_key(|&(_, n)| n)
        .map(|(why, n)| (n, why))
        .unwrap_or((0, "none"))
}

/// One main-loop iteration: what a warp issues, its latency and its cycles with `w` warps per
/// scheduler (each warp doing one iteration): the longest of the warps' own latency with the
/// others' contention, the issue slot, the tensor pipe at mma.sync's rate, shared memory's
/// wavefronts and L2's bytes (both per SM, for the 4 schedulers' warps).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub counts: Counts,
    /// One warp's cycles per instruction alone (latency.rs).
    pub latency: f64,
}

impl Step {
    pub fn cycles(&self, w: f64, g: &Gpu, k: &Constants, sm: &Sm) -> f64 {
        let c = &self.counts;
        let others = (w - 1.0).max(0.0) * k.contention / self.latency;
        let latency = c.issued * (self.latency + others);
        let issue = w * c.issued;
        let tensor = w * c.flops / (g.flop_per_clock / sm.schedulers * k.mma_rate);
        let shared = w * sm.schedulers * c.wavefronts / g.wavefronts_per_clock;
        let l2 = w * sm.schedulers * c.global_bytes / (k.l2_bytes_per_s / g.sms / g.clock_hz);
        [latency, issue, tensor, shared, l2]
            .into_iter()
            .fold(0.0, f64::max)
    }
}

/// A launch: its blocks' main-loop iterations in the order they are dispatched, and the bytes
/// it must move from DRAM (each tensor once: tile reuse is L2's).
pub struct Launch {
    pub iterations: Vec<f64>,
    pub warps: u64,
    pub registers: u64,
    pub shared: u64,
    pub dram_bytes: f64,
}

/// The predicted time of `launch` and how it was reached.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub seconds: f64,
    pub blocks_per_sm: u64,
    pub limit: &'static str,
    pub waves: f64,
}

/// Plays `launch` over the SMs: the first blocks fill each SM in turn, then each block goes to
/// the SM that frees a slot first; an SM with `b` resident blocks runs each at `step.cycles(b)`
/// per iteration (one warp per scheduler per block, 4-warp blocks), plus `block_cycles`.
pub fn predict(launch: &Launch, step: &Step, g: &Gpu, k: &Constants, sm: &Sm) -> Prediction {
    let (per_sm, limit) = blocks_per_sm(sm, launch.warps, launch.registers, launch.shared);
    let per_sm = per_sm.max(1) as usize;
    let sms = g.sms as usize;
    // Warps per scheduler per resident block.
    let wpb = launch.warps as f64 / sm.schedulers;
    // Each SM's resident blocks: remaining work as (fixed cycles, iterations).
    let mut resident: Vec<Vec<(f64, f64)>> = vec![vec![]; sms];
    let mut clock = vec![0.0f64; sms];
    let mut next = 0;
    for _ in 0..per_sm {
        for r in resident.iter_mut() {
            if let Some(&n) = launch.iterations.get(next) {
                r.push((k.block_cycles, n));
                next += 1;
            }
        }
    }
    let mut end = 0.0f64;
    loop {
        // The SM whose next block finishes first, and when.
        let mut best: Option<(usize, usize, f64)> = None;
        for (s, r) in resident.iter().enumerate() {
            let per = step.cycles(wpb * r.len() as f64, g, k, sm);
            for (b, &(fixed, n)) in r.iter().enumerate() {
                let t = clock[s] + fixed + n * per;
                if best.is_none_or(|(_, _, bt)| t < bt) {
                    best = Some((s, b, t));
                }
            }
        }
        let Some((s, b, t)) = best else { break };
        // Advance SM s to t: every resident block progresses at its rate.
        let per = step.cycles(wpb * resident[s].len() as f64, g, k, sm);
        let dt = t - clock[s];
        for blk in resident[s].iter_mut() {
            let fixed = blk.0.min(dt);
            blk.0 -= fixed;
            blk.1 = (blk.1 - (dt - fixed) / per).max(0.0);
        }
        resident[s].remove(b);
        clock[s] = t;
        end = end.max(t);
        if let Some(&n) = launch.iterations.get(next) {
            resident[s].push((k.block_cycles, n));
            next += 1;
        }
    }
    let compute = end / g.clock_hz;
    let dram = launch.dram_bytes / g.dram_bytes_per_s;
    Prediction {
        seconds: compute.max(dram) + k.launch_s,
        blocks_per_sm: per_sm as u64,
        limit,
        waves: launch.iterations.len() as f64 / (sms * per_sm) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::H200;
    use super::*;

    #[test]
    fn occupancy_follows_registers_and_shared_memory() {
        // The measured forward: 213 registers and 69,632 B give 2 blocks of 4 warps (ncu: 2 by
        // registers, 2 by shared memory at its 164 KiB carve-out); dK/dV's 255 and 55,680 B, 2.
        assert_eq!(blocks_per_sm(&SM90, 4, 213, 69_632), (2, "registers"));
        assert_eq!(blocks_per_sm(&SM90, 4, 255, 55_680).0, 2);
        assert_eq!(blocks_per_sm(&SM90, 4, 128, 0), (4, "registers"));
        assert_eq!(blocks_per_sm(&SM90, 4, 64, 100_000), (2, "shared memory"));
    }

    fn step() -> Step {
        Step {
            counts: Counts {
                issued: 1000.0,
                flops: 100.0 * 4096.0,
                ..Counts::default()
            },
            latency: 3.0,
        }
    }

    #[test]
    fn a_half_wave_takes_as_long_as_its_heaviest_block() {
        let k = Constants {
            block_cycles: 0.0,
            launch_s: 0.0,
            ..H200_FIT
        };
        // 66 blocks of 10 iterations on 132 SMs: one block each, latency-bound.
        let launch = Launch {
            iterations: vec![10.0; 66],
            warps: 4,
            registers: 128,
            shared: 0,
            dram_bytes: 0.0,
        };
        let p = predict(&launch, &step(), &H200, &k, &SM90);
        assert!(
            (p.seconds * H200.clock_hz - 10.0 * 3000.0).abs() < 1e-3,
            "{p:?}"
        );
        // A heavy first block (40 iterations, alone on its SM) sets the end.
        let mut heavy = launch.iterations.clone();
        heavy[0] = 40.0;
        let p = predict(
            &Launch {
                iterations: heavy,
                ..launch
            },
            &step(),
            &H200,
            &k,
            &SM90,
        );
        assert!(
            (p.seconds * H200.clock_hz - 40.0 * 3000.0).abs() < 1e-3,
            "{p:?}"
        );
    }

    #[test]
    fn more_warps_per_scheduler_share_its_issue() {
        let s = step();
        let (g, k) = (&H200, &H200_FIT);
        assert_eq!(s.cycles(1.0, g, k, &SM90), 3000.0);
        assert_eq!(
            s.cycles(2.0, g, k, &SM90),
            1000.0 * (3.0 + k.contention / 3.0)
        );
        // 8 warps: latency 3 + 7 x 4.7 / 3 = 13.97 a warp (13,967) over the issue slot (8,000).
        assert!((s.cycles(8.0, g, k, &SM90) - 1000.0 * (3.0 + 7.0 * 4.7 / 3.0)).abs() < 1e-6);
        // A warp that issues once in 30 cycles wants the shared slot and pipes a tenth as often
        // as one at 3: another such warp costs it 4.7 / 30 a cycle an instruction, and 40 of
        // them are bound by the issue slot (40,000) before their latency (36,110).
        let slow = Step { latency: 30.0, ..s };
        assert!((slow.cycles(2.0, g, k, &SM90) - 1000.0 * (30.0 + 4.7 / 30.0)).abs() < 1e-6);
        assert_eq!(slow.cycles(40.0, g, k, &SM90), 40_000.0);
        // A tensor-heavy step: 1000 HMMA at 6 cycles each on the pipe.
        let t = Step {
            counts: Counts {
                flops: 1000.0 * 4096.0,
                ..s.counts
            },
            ..s
        };
        assert!((t.cycles(1.0, g, k, &SM90) - 6000.0).abs() < 1e-6);
    }
}
