//! The dependency latency of one warp in `cargo xtask kernel-model`: replays a main loop's SASS
//! (sass.rs, with the control bits of `nvdisasm -hex`) as a lone warp issues it, each
//! instruction after its predecessor's encoded stall (the fixed-latency dependencies ptxas
//! resolved) and after the scoreboards it waits on (the variable-latency results: shared loads,
//! MUFU, shuffles, global loads), with mma.sync's issue rate on the tensor pipe. Its cycles per
//! instruction is what timing.rs calls the warp's latency: how often one warp alone can issue.

use super::sass::{class, Class, Function, Instr, Loop};

/// Latencies of the variable-latency results, SM cycles. Published microbenchmarks of the
/// Hopper SM (Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
/// arXiv 2402.13499: shared memory about 30 cycles, the SFU about 20), the L2 latency of a
/// loaded H100 (an L2 hit is about 260 cycles near and 480 far; 500 under load). None is fitted
/// to the 2026-12-04 measurement.
#[derive(Debug, Clone, Copy)]
pub struct Latencies {
    /// LDS, LDSM, ATOMS.
    pub shared: f64,
    /// MUFU (exp2, reciprocal), conversions through the XU, SHFL, S2R.
    pub special: f64,
    /// LDG, LD and other global results.
    pub global: f64,
    /// Until a store or copy has read its source registers (its read scoreboard).
    pub operand_read: f64,
}

pub const HOPPER: Latencies = Latencies {
    shared: 30.0,
    special: 20.0,
    global: 500.0,
    operand_read: 6.0,
};

/// The latency of `i`'s result when it sets a write scoreboard.
fn result_latency(i: &Instr, l: &Latencies) -> f64 {
    match class(&i.op) {
        Class::Shared => l.shared,
        Class::Global => l.global,
        Class::Generic => l.global,
        _ => l.special,
    }
}

/// One warp's cycles per issued instruction over `body` (in address order, every instruction
/// once, the optional ones excluded by `skip`), in steady state: the third of three passes, so
/// the scoreboards and the tensor pipe carry over the back-edge. `mma_cycles`: the cycles one
/// HMMA holds the sub-partition's tensor pipe. None when the SASS carries no control bits.
pub fn cycles_per_instruction(
    f: &Function,
    l: &Loop,
    skip: &dyn Fn(&Instr) -> bool,
    lat: &Latencies,
    mma_cycles: f64,
) -> Option<f64> {
    let body: Vec<&Instr> = f.body(l).filter(|i| !skip(i)).collect();
    if body.is_empty() || body.iter().any(|i| i.control.is_none()) {
        return None;
    }
    let mut boards = [0.0f64; 6];
    let (mut now, mut tensor_free) = (0.0f64, f64::MIN);
    let mut last = 0.0;
    for _ in 0..3 {
        let start = now;
        for i in &body {
            let c = i.control?;
            let mut at = now;
            for (k, ready) in boards.iter().enumerate() {
                if c.wait >> k & 1 == 1 {
                    at = at.max(*ready);
                }
            }
            if class(&i.op) == Class::Hmma && !i.never() {
                at = at.max(tensor_free);
                tensor_free = at + mma_cycles;
            }
            if let Some(b) = c.write {
                boards[usize::from(b)] = at + result_latency(i, lat);
            }
            if let Some(b) = c.read {
                boards[usize::from(b)] = boards[usize::from(b)].max(at + lat.operand_read);
            }
            now = at + f64::from(c.stall.max(1));
        }
        last = now - start;
    }
    Some(last / body.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::super::sass;
    use super::*;

    /// A loop of 4 instructions: an LDS setting scoreboard 0 (stall 1), an IADD3 (stall 4),
    /// an FFMA waiting on scoreboard 0 (stall 2) and the back-edge (stall 5). High words:
    /// stall in bits 41-44, write scoreboard in 46-48 (7: none), read in 49-51, wait mask 52-57.
    const LOOP: &str = "
.text.k:
.L_x_0:
        /*0000*/                   LDS R0, [R1] ;        /* 0x0000000001007984 */
                                                        /* 0x000e020000000800 */
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;  /* 0x0000000102027810 */
                                                        /* 0x000fc80007ffe0ff */
        /*0020*/                   FFMA R3, R0, R0, R3 ;  /* 0x0000000000037223 */
                                                        /* 0x001fc40000000003 */
        /*0030*/              @P0 BRA `(.L_x_0) ;         /* 0xfffffffc00000947 */
                                                        /* 0x000fea000383ffff */
";

    #[test]
    fn the_replay_waits_for_the_scoreboard_and_the_stalls() -> anyhow::Result<()> {
        let fs = sass::parse(LOOP)?;
        let f = &fs[0];
        let c: Vec<_> = f.instrs.iter().map(|i| i.control.expect("-hex")).collect();
        assert_eq!(
            (c[0].stall, c[0].write, c[0].read, c[0].wait),
            (1, Some(0), None, 0)
        );
        assert_eq!(
            (c[1].stall, c[1].write, c[2].wait, c[3].stall),
            (4, None, 1, 5)
        );
        let l = f.loops()[0];
        let no = |_: &Instr| false;
        let lat = Latencies {
            shared: 30.0,
            ..HOPPER
        };
        // LDS at 0, IADD3 at 1, FFMA waits for the load until 30, the branch at 32, the next
        // LDS at 37: 37 cycles for 4 instructions.
        let cpi = cycles_per_instruction(f, &l, &no, &lat, 6.0).expect("control bits");
        assert!((cpi - 37.0 / 4.0).abs() < 1e-9, "{cpi}");
        // A faster shared memory leaves the encoded stalls: 1 + 4 + 2 + 5 = 12.
        let fast = Latencies { shared: 1.0, ..lat };
        let cpi = cycles_per_instruction(f, &l, &no, &fast, 6.0).expect("control bits");
        assert!((cpi - 3.0).abs() < 1e-9, "{cpi}");
        Ok(())
    }
}
