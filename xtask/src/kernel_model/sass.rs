//! The SASS side of `cargo xtask kernel-model`: parses `nvdisasm -c -gi -hex` text into functions
//! (instructions with their address, opcode, branch target, inlined source-line chain and the
//! scheduling control bits ptxas encodes beside each instruction), finds
//! the loops from back-edges and classes each instruction. Pure functions over text: the tests
//! run on a fixture cut from real nvdisasm output, without nvcc.

use anyhow::{bail, Context, Result};
use std::collections::HashMap;

/// One instruction of a function.
#[derive(Debug, Clone)]
pub struct Instr {
    pub addr: u32,
    /// The opcode with its modifiers (`LD.E`, `HMMA.16816.F32.BF16`), without the guard.
    pub op: String,
    /// Its guard predicate without the `@` (`P0`, `!P0`, `!PT`), if any.
    pub guard: Option<String>,
    /// A branch's target label.
    pub target: Option<String>,
    /// Its source position, innermost first: (file name, line) for the code itself, then each
    /// call site it was inlined at.
    pub chain: Vec<(String, u32)>,
    /// Its control bits, when the text carries the encodings (`-hex`).
    pub control: Option<Control>,
}

/// The scheduling control ptxas encodes in bits 105-125 of each sm_70+ instruction (the high
/// 64-bit word's bits 41-61): the cycles the warp stalls before its next instruction (the
/// fixed-latency dependencies ptxas resolved statically), the scoreboard a variable-latency
/// result (shared or global load, MUFU, shuffle) or a source read releases, and the scoreboards
/// it waits on before issuing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    pub stall: u32,
    /// Scoreboard set until the result is written (None: fixed latency).
    pub write: Option<u8>,
    /// Scoreboard set until the sources are read.
    pub read: Option<u8>,
    /// Scoreboards (bit k: number k) it waits for.
    pub wait: u8,
}

impl Control {
    /// From the high 64-bit word of an instruction's encoding.
    pub fn from_high(word: u64) -> Control {
        let c = word >> 41;
        let board = |v: u64| (v != 7).then_some(v as u8);
        Control {
            stall: (c & 0xf) as u32,
            write: board((c >> 5) & 7),
            read: board((c >> 8) & 7),
            wait: ((c >> 11) & 0x3f) as u8,
        }
    }
}

impl Instr {
    /// The lines of `file` (a path suffix) in the chain, innermost first.
    pub fn lines_in(&self, file: &str) -> Vec<u32> {
        self.chain
            .iter()
            .filter(|(f, _)| f.ends_with(file))
            .map(|&(_, l)| l)
            .collect()
    }

    /// Whether it never executes: guarded by `!PT` (nvcc pads each `LDGSTS` with such `LDS`).
    pub fn never(&self) -> bool {
        self.guard.as_deref() == Some("!PT")
    }

    /// Whether it is a branch taken only when its guard holds.
    pub fn conditional_branch(&self) -> bool {
        self.op.starts_with("BRA") && self.guard.is_some() && !self.never()
    }
}

/// One function (`.text.NAME`): its instructions in address order and its labels.
#[derive(Debug)]
pub struct Function {
    pub name: String,
    pub instrs: Vec<Instr>,
    labels: HashMap<String, u32>,
}

/// A loop: the instructions from `head` (a back-edge's target) to `back` (the last back-edge
/// to it), inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loop {
    pub head: u32,
    pub back: u32,
}

impl Loop {
    pub fn contains(&self, addr: u32) -> bool {
        (self.head..=self.back).contains(&addr)
    }
    fn encloses(&self, other: &Loop) -> bool {
        *self != *other && self.head <= other.head && other.back <= self.back
    }
}

/// What an instruction does, for the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Hmma,
    /// LDS, STS, LDSM, LDGSTS, ATOMS: shared memory by their opcode.
    Shared,
    /// LD, ST, ATOM: generic addressing; shared or global depending on the pointer.
    Generic,
    /// LDG, STG, ATOMG, RED.
    Global,
    Movm,
    /// F2F, F2FP, I2F, F2I, I2FP: conversions.
    Convert,
    Other,
}

/// The class of opcode `op`.
pub fn class(op: &str) -> Class {
    let base = op.split('.').next().unwrap_or(op);
    match base {
        "HMMA" => Class::Hmma,
        "LDS" | "STS" | "LDSM" | "STSM" | "LDGSTS" | "ATOMS" => Class::Shared,
        "LD" | "ST" | "ATOM" => Class::Generic,
        "LDG" | "STG" | "ATOMG" | "RED" | "REDG" => Class::Global,
        "MOVM" => Class::Movm,
        "F2F" | "F2FP" | "I2F" | "F2I" | "I2FP" | "F2IP" => Class::Convert,
        _ => Class::Other,
    }
}

/// Whether a memory opcode writes (its name starts with ST, is an atomic/reduction, or is
/// `LDGSTS`, the cp.async copy that writes shared memory).
pub fn is_store(op: &str) -> bool {
    let base = op.split('.').next().unwrap_or(op);
    base.starts_with("ST")
        || base.starts_with("ATOM")
        || base.starts_with("RED")
        || base == "LDGSTS"
}

/// The bytes one lane moves for a memory opcode: 16, 8, 2 or 1 from the size modifier, else 4.
/// LDSM: 16 (a row of one 8 x 8 b16 matrix per addressing lane).
pub fn width(op: &str) -> u32 {
    let mods: Vec<&str> = op.split('.').skip(1).collect();
    if op.starts_with("LDSM") {
        return 16; // each lane addresses one 16-byte row of an 8 x 8 matrix
    }
    for m in mods {
        match m {
            "128" => return 16,
            "64" => return 8,
            "U16" | "S16" => return 2,
            "U8" | "S8" => return 1,
            _ => {}
        }
    }
    4
}

/// Flops of one HMMA: 2 m n k from its shape modifier (16816: m16 n8 k16).
pub fn hmma_flops(op: &str) -> f64 {
    match op.split('.').nth(1) {
        Some("1688") => 2.0 * 16.0 * 8.0 * 8.0,
        Some("16832") => 2.0 * 16.0 * 8.0 * 32.0,
        _ => 2.0 * 16.0 * 8.0 * 16.0,
    }
}

/// The functions of `nvdisasm -c -gi` output.
pub fn parse(text: &str) -> Result<Vec<Function>> {
    let mut out: Vec<Function> = vec![];
    let mut pending_labels: Vec<String> = vec![];
    let mut chain: Vec<(String, u32)> = vec![];
    let mut chain_open = false; // the last line read was a line-info comment
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(name) = line
            .strip_prefix(".text.")
            .and_then(|r| r.strip_suffix(':'))
        {
            out.push(Function {
                name: name.to_string(),
                instrs: vec![],
                labels: HashMap::new(),
            });
            chain.clear();
            chain_open = false;
        } else if let Some(rest) = line.strip_prefix("//## File \"") {
            if !chain_open {
                chain.clear();
            }
            chain_open = true;
            let (file, tail) = rest
                .split_once('"')
                .with_context(|| format!("SASS line {}: unterminated file name", n + 1))?;
            let num = tail
                .trim_start_matches(", line ")
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("SASS line {}: no line number in `{line}`", n + 1))?;
            chain.push((file.rsplit('/').next().unwrap_or(file).to_string(), num));
        } else if line.starts_with(".L_x_") && line.ends_with(':') {
            pending_labels.push(line.trim_end_matches(':').to_string());
        } else if let Some(hex) = line
            .strip_prefix("/* 0x")
            .and_then(|r| r.strip_suffix("*/"))
        {
            // `-hex` prints an instruction's two 64-bit words: the low one on its line, the
            // high one (with the control bits) alone on the next.
            let word = u64::from_str_radix(hex.trim(), 16)
                .with_context(|| format!("SASS line {}: encoding `{hex}`", n + 1))?;
            if let Some(i) = out.last_mut().and_then(|f| f.instrs.last_mut()) {
                if i.control.is_none() {
                    i.control = Some(Control::from_high(word));
                }
            }
        } else if let Some(rest) = line.strip_prefix("/*") {
            chain_open = false;
            let Some(f) = out.last_mut() else {
                bail!(
                    "SASS line {}: an instruction before any .text. section",
                    n + 1
                );
            };
            let (hex, body) = rest
                .split_once("*/")
                .with_context(|| format!("SASS line {}: no address in `{line}`", n + 1))?;
            let addr = u32::from_str_radix(hex.trim(), 16)
                .with_context(|| format!("SASS line {}: address `{hex}`", n + 1))?;
            // The instruction, without the `;` and the low word `-hex` prints after it.
            let body = body.split(';').next().unwrap_or_default().trim();
            let mut words = body.split_whitespace();
            let mut op = words.next().unwrap_or_default();
            let mut guard = None;
            if let Some(g) = op.strip_prefix('@') {
                guard = Some(g.to_string());
                op = words.next().unwrap_or_default();
            }
            if op.is_empty() {
                bail!("SASS line {}: an empty instruction", n + 1);
            }
            let target = body
                .split_once("`(")
                .and_then(|(_, t)| t.split_once(')'))
                .map(|(t, _)| t.to_string());
            for l in pending_labels.drain(..) {
                f.labels.insert(l, addr);
            }
            f.instrs.push(Instr {
                addr,
                op: op.to_string(),
                guard,
                target,
                chain: chain.clone(),
                control: None,
            });
        }
    }
    if out.is_empty() {
        bail!("no `.text.` function in the SASS (was it disassembled with nvdisasm -c -gi?)");
    }
    Ok(out)
}

impl Function {
    /// Its loops, innermost first: every branch to a lower (or equal) address is a back-edge;
    /// back-edges to one head make one loop, ending at the last of them.
    pub fn loops(&self) -> Vec<Loop> {
        let mut by_head: HashMap<u32, u32> = HashMap::new();
        for i in &self.instrs {
            let Some(t) = i.target.as_ref().and_then(|t| self.labels.get(t)) else {
                continue;
            };
            if i.op.starts_with("BRA") && *t <= i.addr {
                let back = by_head.entry(*t).or_insert(i.addr);
                *back = (*back).max(i.addr);
            }
        }
        let mut loops: Vec<Loop> = by_head
            .into_iter()
            .map(|(head, back)| Loop { head, back })
            .collect();
        let depth = |l: &Loop| loops.iter().filter(|o| o.encloses(l)).count();
        let mut keyed: Vec<(usize, Loop)> = loops.iter().map(|l| (depth(l), *l)).collect();
        keyed.sort_by_key(|(d, l)| (std::cmp::Reverse(*d), l.head));
        loops = keyed.into_iter().map(|(_, l)| l).collect();
        loops
    }

    /// The loops directly inside `outer` among `all`.
    pub fn children(outer: &Loop, all: &[Loop]) -> Vec<Loop> {
        all.iter()
            .filter(|c| outer.encloses(c))
            .filter(|c| !all.iter().any(|m| outer.encloses(m) && m.encloses(c)))
            .copied()
            .collect()
    }

    /// The instructions of `l`.
    pub fn body<'a>(&'a self, l: &Loop) -> impl Iterator<Item = &'a Instr> + use<'a> {
        let l = *l;
        self.instrs.iter().filter(move |i| l.contains(i.addr))
    }

    /// The address of a branch's target.
    pub fn target_addr(&self, i: &Instr) -> Option<u32> {
        i.target.as_ref().and_then(|t| self.labels.get(t)).copied()
    }

    /// The back-edge instruction of `l`.
    pub fn back_edge(&self, l: &Loop) -> Option<&Instr> {
        self.instrs.iter().find(|i| i.addr == l.back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("fixture.sass");

    #[test]
    fn the_fixture_parses_into_one_function_with_chains() -> Result<()> {
        let fs = parse(FIXTURE)?;
        assert_eq!(fs.len(), 1);
        let f = &fs[0];
        assert_eq!(f.name, "flash_tc_fwd_d128");
        // The first instruction precedes any line comment.
        assert!(f.instrs[0].chain.is_empty());
        let hmma: Vec<&Instr> = f
            .instrs
            .iter()
            .filter(|i| class(&i.op) == Class::Hmma)
            .collect();
        assert!(!hmma.is_empty());
        // An HMMA of scores() at :76, inlined at :146, inlined into the entry at :405.
        assert_eq!(hmma[0].lines_in("flash_tc.cu"), vec![76, 146, 405]);
        assert_eq!(hmma[0].chain[0].0, "mma.hpp");
        let ld = f
            .instrs
            .iter()
            .find(|i| i.addr == 0x2cd0)
            .context("no 0x2cd0")?;
        assert_eq!((ld.op.as_str(), class(&ld.op)), ("LD.E", Class::Generic));
        // Guards are kept apart from the opcode; a conditional branch knows its target (the
        // fixture holds the inner loop's back-edge target, not the first branch's).
        let at = |a: u32| f.instrs.iter().find(|i| i.addr == a);
        let bra = at(0x1980).context("no 0x1980")?;
        assert_eq!((bra.op.as_str(), bra.guard.as_deref()), ("BRA", Some("P0")));
        assert!(bra.conditional_branch() && !bra.never());
        let back = at(0x52c0).context("no 0x52c0")?;
        assert_eq!(back.guard.as_deref(), Some("!P0"));
        assert_eq!(f.target_addr(back), Some(0x50a0));
        assert!(ld.guard.is_none() && !ld.conditional_branch());
        Ok(())
    }

    #[test]
    fn back_edges_make_nested_loops_innermost_first() -> Result<()> {
        let fs = parse(FIXTURE)?;
        let f = &fs[0];
        let loops = f.loops();
        assert_eq!(
            loops,
            vec![
                Loop {
                    head: 0x50a0,
                    back: 0x52c0
                },
                Loop {
                    head: 0x1960,
                    back: 0x73a0
                }
            ]
        );
        assert_eq!(Function::children(&loops[1], &loops), vec![loops[0]]);
        // The inner loop is scale_rows's `buf[e] *= scale[e / 16]` at :86, called at :176.
        let back = f.back_edge(&loops[0]).context("no back-edge")?;
        assert_eq!(back.lines_in("flash_tc.cu")[..2], [86, 176]);
        let stores = f.body(&loops[0]).filter(|i| i.op == "STS").count();
        assert_eq!(stores, 4, "the loop is unrolled 4 times");
        Ok(())
    }

    #[test]
    fn opcodes_are_classed_and_sized() {
        assert_eq!(class("LDS.64"), Class::Shared);
        assert_eq!(class("LDGSTS.E.BYPASS.128"), Class::Shared);
        assert_eq!(class("STG.E.U16"), Class::Global);
        assert_eq!(class("MOVM.16.MT88"), Class::Movm);
        assert_eq!(class("F2FP.BF16.F32.PACK_AB"), Class::Convert);
        assert_eq!(class("FMUL"), Class::Other);
        assert_eq!(width("STS.U16"), 2);
        assert_eq!(width("LDS.128"), 16);
        assert_eq!(width("LD.E.64"), 8);
        assert_eq!(width("LD.E"), 4);
        assert!(is_store("STS.64") && !is_store("LDS"));
        assert!(is_store("LDGSTS.E.BYPASS.128") && is_store("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU"));
        assert_eq!(width("LDSM.16.MT88.4"), 16);
        assert_eq!(hmma_flops("HMMA.16816.F32.BF16"), 4096.0);
    }

    #[test]
    fn text_without_a_function_is_an_error() {
        let e = parse("        /*0000*/ NOP ;").map(|_| ()).err();
        let e = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("before any .text."), "{e}");
        assert!(parse("nothing").is_err());
    }
}
