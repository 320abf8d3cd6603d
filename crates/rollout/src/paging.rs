//! The rollout's memory settings (`GenParams.paging`, TOML `[grpo.paging]`): block size, the
//! KV budget (GiB, a share of device memory, or blocks), how many sequences decode at once and
//! the prefill chunk; and the budget's resolution into a number of blocks for one `generate`.
//!
//! Data flow: config -> `KvPaging` -> [`PoolPlan`] (the pool's blocks, probe blocks included;
//! the scheduler sizes its pool by it and `xtask plan` counts it) -> `pool_blocks` (at the start
//! of `generate`) -> `PagedKvCache::new` -> the scheduler's admission and preemption.

use crate::step_exit::StepExit;
use serde::{Deserialize, Serialize};

/// How the rollout pages its KV cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct KvPaging {
    /// Tokens per block: a positive multiple of 16. 64 (the default) makes the CPU kernels sum
    /// exactly as over one contiguous run.
    pub block_size: usize,
    /// Memory for K/V: "auto", a number of GiB, "N%" of the device's memory, or "N blocks".
    pub kv_budget: KvBudget,
    /// Sequences decoding at once (more wait for a slot).
    pub max_num_seqs: usize,
    /// Tokens a sequence feeds per step while prefilling (its prompt, or its tokens after a
    /// preemption), so a long prompt does not stall the running decodes.
    pub prefill_chunk: usize,
}

impl Default for KvPaging {
    fn default() -> Self {
        Self {
            block_size: 64,
            kv_budget: KvBudget::Auto,
            max_num_seqs: 256,
            prefill_chunk: 512,
        }
    }
}

/// The KV memory a rollout may use. Never more than every sequence at full length needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "BudgetRepr", into = "BudgetRepr")]
pub enum KvBudget {
    /// CUDA: 80 % of the free device memory when the rollout starts; CPU: half the available
    /// RAM.
    Auto,
    /// GiB.
    Gib(f64),
    /// A share (0, 1] of the device's total memory (RAM on the CPU).
    Fraction(f64),
    /// An exact number of blocks (tests, benchmarks).
    Blocks(usize),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum BudgetRepr {
    Num(f64),
    Text(String),
}

impl TryFrom<BudgetRepr> for KvBudget {
    type Error = String;

    fn try_from(r: BudgetRepr) -> Result<Self, String> {
        let bad = |s: &str| {
            format!("kv_budget `{s}`: expected \"auto\", a number of GiB, \"N%\" or \"N blocks\"")
        };
        match r {
            BudgetRepr::Num(g) if g > 0.0 && g.is_finite() => Ok(KvBudget::Gib(g)),
            BudgetRepr::Num(g) => Err(bad(&g.to_string())),
            BudgetRepr::Text(s) => {
                let t = s.trim();
                if t == "auto" {
                    return Ok(KvBudget::Auto);
                }
                if let Some(p) = t.strip_suffix('%') {
                    return match p.trim().parse::<f64>() {
                        Ok(p) if p > 0.0 && p <= 100.0 => Ok(KvBudget::Fraction(p / 100.0)),
                        _ => Err(bad(&s)),
                    };
                }
                if let Some(n) = t.strip_suffix("blocks") {
                    return match n.trim().parse::<usize>() {
                        Ok(n) if n > 0 => Ok(KvBudget::Blocks(n)),
                        _ => Err(bad(&s)),
                    };
                }
                Err(bad(&s))
            }
        }
    }
}

impl From<KvBudget> for BudgetRepr {
    fn from(b: KvBudget) -> Self {
        match b {
            KvBudget::Auto => BudgetRepr::Text("auto".into()),
            KvBudget::Gib(g) => BudgetRepr::Num(g),
            KvBudget::Fraction(f) => BudgetRepr::Text(format!("{}%", f * 100.0)),
            KvBudget::Blocks(n) => BudgetRepr::Text(format!("{n} blocks")),
        }
    }
}

impl KvPaging {
    pub fn validate(&self) -> Result<(), String> {
        if self.block_size == 0 || !self.block_size.is_multiple_of(16) {
            return Err(format!(
                "paging.block_size = {}: must be a positive multiple of 16",
                self.block_size
            ));
        }
        if self.max_num_seqs == 0 {
            return Err("paging.max_num_seqs = 0: at least one sequence must run".into());
        }
        if self.prefill_chunk == 0 {
            return Err("paging.prefill_chunk = 0: a prefill must feed at least one token".into());
        }
        Ok(())
    }
}

/// Blocks of `block` tokens a rollout holds with every sequence at full length at once: each
/// prompt's blocks once (its `g` samples share them) and, per sample, the blocks past the
/// prompt's full ones (its copy of the prompt's partial last block, then its completion's).
/// `seqs` gives (prompt tokens, full sequence tokens) per prompt. The rollout caps its pool
/// here and `xtask plan` reports it.
pub fn all_at_once_blocks(
    seqs: impl IntoIterator<Item = (usize, usize)>,
    g: usize,
    block: usize,
) -> usize {
    // Saturating: `xtask plan` feeds it config numbers, which may be absurd.
    seqs.into_iter()
        .map(|(p, full)| {
            let own = full.div_ceil(block).saturating_sub(p / block);
            p.div_ceil(block).saturating_add(g.saturating_mul(own))
        })
        .fold(0, usize::saturating_add)
}

/// The rollout pool's figures in blocks, computed once for the scheduler (which sizes its pool
/// by them) and the memory plan (plan.rs, which counts them): every sequence at full length at
/// once and one longest sequence, each with the blocks kept free for one Step-GRPO probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    pub block_size: usize,
    /// Blocks kept free for one probe at a time (its fork copies one block); 0 without exits.
    pub probe_blocks: usize,
    /// Every sequence at full length at once, plus the probe blocks: the pool's cap.
    pub worst: usize,
    /// The longest sequence, in tokens (prompt, completion and an exit's tokens, within the
    /// context limit).
    pub longest: usize,
    /// The least pool that holds the longest sequence with a probe.
    pub one: usize,
}

impl PoolPlan {
    /// `prompts`: (prompt tokens, prompts of that length), each sampled `g` times up to
    /// `max_new_tokens` (plus an exit's induction and trial answer) within `limit`, the
    /// model's context. Saturating: `xtask plan` feeds it config numbers, which may be absurd.
    pub fn new(
        prompts: impl IntoIterator<Item = (usize, usize)>,
        g: usize,
        max_new_tokens: usize,
        step_exit: Option<&StepExit>,
        limit: usize,
        block_size: usize,
    ) -> Self {
        let bs = block_size;
        let (induction, close) = step_exit.map_or((0, 0), StepExit::probe_text_tokens);
        let probe_blocks = step_exit.map_or(0, |se| {
            (1 + induction + se.max_ans_tokens + close)
                .div_ceil(bs)
                .saturating_add(1)
        });
        let extra = step_exit.map_or(0, |se| induction + se.max_ans_tokens + 2);
        let full = |p: usize| {
            p.saturating_add(max_new_tokens)
                .saturating_add(extra)
                .min(limit)
        };
        let (mut worst, mut longest) = (0usize, 0usize);
        for (p, n) in prompts {
            let each = all_at_once_blocks([(p, full(p))], g, bs);
            worst = worst.saturating_add(each.saturating_mul(n));
            if n > 0 {
                longest = longest.max(full(p));
            }
        }
        Self {
            block_size: bs,
            probe_blocks,
            worst: worst.saturating_add(probe_blocks),
            longest,
            one: longest.div_ceil(bs).saturating_add(1 + probe_blocks),
        }
    }
}

/// Bytes of RAM under `key` of /proc/meminfo (`MemAvailable`, `MemTotal`), when the system says.
fn meminfo(key: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info
        .lines()
        .find(|l| l.strip_prefix(key).is_some_and(|r| r.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The memory a KV budget is a share of, in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetMemory {
    /// Free now: what "auto" takes its share of.
    pub free: u64,
    /// The device's (or the host's) size: what "N%" is a share of, as in vLLM's
    /// `gpu_memory_utilization`.
    pub total: u64,
    /// The share of `free` "auto" takes: 80 % of a GPU's, half the host's available RAM.
    pub auto_share: f64,
}

impl BudgetMemory {
    /// A GPU's free and total memory.
    pub fn device(free: u64, total: u64) -> Self {
        Self {
            free,
            total,
            auto_share: 0.8,
        }
    }

    /// What `device` has: its free and total memory on a GPU, the host's available and total
    /// RAM on the CPU; None where the system does not say.
    pub fn of(device: &candle_core::Device) -> Option<Self> {
        match terse_model::device::memory(device) {
            Some((free, total)) => Some(Self::device(free, total)),
            None => Some(Self {
                free: meminfo("MemAvailable")?,
                total: meminfo("MemTotal")?,
                auto_share: 0.5,
            }),
        }
    }
}

/// The one conversion of a budget into blocks of `block_bytes`: the rollout's pool and the
/// start-up memory plan both call it, so "N%" means the same in both (N % of the total).
/// None when the budget depends on memory that is not known.
pub fn budget_blocks(
    budget: KvBudget,
    block_bytes: usize,
    mem: Option<BudgetMemory>,
) -> Option<usize> {
    let bytes = |b: f64| (b / block_bytes as f64).floor() as usize;
    match budget {
        KvBudget::Blocks(n) => Some(n),
        KvBudget::Gib(g) => Some(bytes(g * f64::from(1u32 << 30))),
        KvBudget::Fraction(f) => mem.map(|m| bytes(f * m.total as f64)),
        KvBudget::Auto => mem.map(|m| bytes(m.auto_share * m.free as f64)),
    }
}

/// The pool size in blocks for a rollout whose sequences need at most `worst` blocks all
/// together, `block_bytes` each, on `device`: the budget, capped at `worst`.
pub fn pool_blocks(
    budget: KvBudget,
    worst: usize,
    block_bytes: usize,
    device: &candle_core::Device,
) -> usize {
    budget_blocks(budget, block_bytes, BudgetMemory::of(device))
        .unwrap_or(worst)
        .min(worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        b: KvBudget,
    }

    fn parse(s: &str) -> Result<KvBudget, String> {
        toml::from_str::<T>(s)
            .map(|t| t.b)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn budgets_parse_or_say_what_is_wrong() {
        assert_eq!(parse("b = 2.5"), Ok(KvBudget::Gib(2.5)));
        assert_eq!(parse("b = 3"), Ok(KvBudget::Gib(3.0)));
        assert_eq!(parse("b = \"auto\""), Ok(KvBudget::Auto));
        assert_eq!(parse("b = \"40%\""), Ok(KvBudget::Fraction(0.4)));
        assert_eq!(parse("b = \"12 blocks\""), Ok(KvBudget::Blocks(12)));
        for bad in ["b = -1", "b = \"140%\"", "b = \"lots\"", "b = \"0 blocks\""] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("kv_budget"), "{bad}: {e}");
        }
        let dev = candle_core::Device::Cpu;
        assert_eq!(pool_blocks(KvBudget::Blocks(7), 100, 1024, &dev), 7);
        assert_eq!(pool_blocks(KvBudget::Blocks(700), 100, 1024, &dev), 100);
        assert_eq!(
            pool_blocks(KvBudget::Gib(1.0), 1 << 40, 1 << 20, &dev),
            1024
        );
        assert!(KvPaging {
            block_size: 24,
            ..KvPaging::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn all_at_once_counts_prompts_once_and_each_samples_own_blocks() {
        // A 40-token prompt shares its partial block; each sample copies it and adds one.
        assert_eq!(all_at_once_blocks([(40, 100)], 8, 64), 1 + 8 * 2);
        // A prompt of whole blocks: no copy, the completion starts a block of its own.
        assert_eq!(all_at_once_blocks([(64, 128)], 8, 64), 1 + 8);
        assert_eq!(
            all_at_once_blocks([(40, 100), (64, 128)], 2, 64),
            (1 + 4) + (1 + 2)
        );
    }

    /// Issue 37 item 3: "N%" is N % of the total memory, whatever is free; "auto" is a share of
    /// what is free.
    #[test]
    fn item3_a_percent_budget_is_a_share_of_the_total() {
        let gib = 1usize << 30;
        let mem = BudgetMemory::device(10 * gib as u64, 100 * gib as u64);
        let blocks = |b| budget_blocks(b, gib, Some(mem));
        assert_eq!(blocks(KvBudget::Fraction(0.25)), Some(25));
        assert_eq!(blocks(KvBudget::Auto), Some(8));
        assert_eq!(blocks(KvBudget::Gib(3.0)), Some(3));
        assert_eq!(blocks(KvBudget::Blocks(7)), Some(7));
        assert_eq!(budget_blocks(KvBudget::Fraction(0.25), gib, None), None);
    }
}
