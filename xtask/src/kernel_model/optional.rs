//! Which instructions of a loop run only with its optional blocks (flash_tc's rescale, the dK/dV
//! pass's atomic dQ), for `cargo xtask kernel-model`'s counts (model.rs) and its latency replay
//! (latency.rs). The profile (profile/) names an optional block by its source lines, but what
//! decides whether an instruction runs is the SASS's control flow: nvcc moves code of other lines
//! into the block it guards. At 255 registers it recomputes the prologue's lane and address
//! arithmetic inside the dK/dV kernel's `if (dq_atomic)` block rather than keep it in registers
//! across the loop: 71 instructions that carry the prologue's lines and run only when the block
//! does. Counted by their lines they made the main loop 538 instructions a warp-iteration;
//! Nsight Compute's executed instructions give 469 (docs/gpu/measured/2026-12-04/).

use super::profile::Profile;
use super::sass::{class, Class, Function, Instr, Loop};
use std::collections::HashSet;

/// The addresses of `l`'s optional code: the instructions the profile attributes to an optional
/// block, and every instruction of each range a conditional forward branch skips when that range
/// holds optional code, no HMMA or memory access of the common path, and no branch into it from
/// outside (so it runs only when the branch falls through into the optional block).
pub fn optional(f: &Function, l: &Loop, p: &dyn Profile) -> HashSet<u32> {
    let body: Vec<&Instr> = f.body(l).collect();
    let marked: HashSet<u32> = body
        .iter()
        .filter(|i| p.is_optional(&i.chain))
        .map(|i| i.addr)
        .collect();
    let mut out = marked.clone();
    if marked.is_empty() {
        return out;
    }
    let work = |i: &Instr| {
        !i.never()
            && matches!(
                class(&i.op),
                Class::Hmma | Class::Shared | Class::Generic | Class::Global
            )
    };
    let jumps_in = |from: u32, to: u32| {
        f.instrs.iter().any(|j| {
            j.op.starts_with("BRA")
                && !(from..to).contains(&j.addr)
                && f.target_addr(j).is_some_and(|t| t > from && t < to)
        })
    };
    for b in body.iter().filter(|i| i.conditional_branch()) {
        let Some(to) = f.target_addr(b).filter(|&t| t > b.addr) else {
            continue;
        };
        let range: Vec<&&Instr> = body
            .iter()
            .filter(|i| i.addr > b.addr && i.addr < to)
            .collect();
        let holds_optional = range.iter().any(|i| marked.contains(&i.addr));
        let holds_common_work = range.iter().any(|i| !marked.contains(&i.addr) && work(i));
        if holds_optional && !holds_common_work && !jumps_in(b.addr, to) {
            out.extend(range.iter().map(|i| i.addr));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::profile::{Chain, Trips};
    use super::super::sass;
    use super::*;

    /// A loop (k.cu:10) whose `if (flag)` block (k.cu:20-22) holds an STS, an HMMA and an IMAD
    /// nvcc moved in from line 5, and a branch (k.cu:12) over common work that is not optional.
    const GUARDED: &str = r#"
.text.k:
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
	//## File "/k/k.cu", line 12
        /*0010*/              @P1 BRA `(.L_x_1) ;
        /*0020*/                   LDS R2, [R3] ;
.L_x_1:
	//## File "/k/k.cu", line 10
        /*0030*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0040*/              @!P0 BRA `(.L_x_2) ;
	//## File "/k/k.cu", line 5
        /*0050*/                   IMAD R1, R1, 0x2, RZ ;
	//## File "/k/k.cu", line 21
        /*0060*/                   STS [R1], R4 ;
        /*0070*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
.L_x_2:
	//## File "/k/k.cu", line 10
        /*0080*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0090*/              @P3 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
"#;

    struct Flag;

    impl Profile for Flag {
        fn file(&self) -> &'static str {
            "k.cu"
        }
        fn is_optional(&self, chain: &Chain) -> bool {
            chain.first().is_some_and(|(_, l)| (20..=22).contains(l))
        }
        fn generic_is_shared(&self, _: &Chain) -> bool {
            false
        }
        fn trips(&self, _: &Chain) -> Option<Trips> {
            None
        }
        fn site(&self, _: &Chain, _: bool, _: u32) -> Vec<Vec<u64>> {
            vec![]
        }
    }

    #[test]
    fn what_the_optional_blocks_branch_skips_is_optional_whatever_its_line() -> anyhow::Result<()> {
        let fs = sass::parse(GUARDED)?;
        let f = &fs[0];
        let loops = f.loops();
        let opt = optional(f, &loops[0], &Flag);
        let mut got: Vec<u32> = opt.into_iter().collect();
        got.sort();
        // The IMAD of line 5 runs only with the block; the LDS the other branch skips does not
        // belong to it, nor do the guards, the common HMMA and the loop's tail.
        assert_eq!(got, vec![0x50, 0x60, 0x70]);
        let c = super::super::model::count(f, &loops[0], &loops, &Flag);
        assert_eq!((c.base.issued, c.optional.issued), (6.0, 3.0));
        assert_eq!((c.base.hmma, c.optional.hmma), (1.0, 1.0));
        Ok(())
    }
}
