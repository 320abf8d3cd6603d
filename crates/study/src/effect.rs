//! Effect sizes against the papers' (docs/v4/plan.md item 10.3): each primary method's
//! relative length cut against Standard, measured per seed, set beside the cut its paper
//! reports, with the testbed's ceiling, the share of Standard's final length that its GRPO
//! training added on top of the SFT checkpoint. Data flow: seeds.csv + trajectory.csv ->
//! [`section`] -> docs/v4/results.md.

use super::seeds::SeedRow;
use super::stats::{paired_at, Interval};
use super::trajectory::TrajRow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One paper's headline length cut.
pub struct PaperCut {
    pub method: &'static str,
    pub paper: &'static str,
    /// Percent shorter, as the paper reports it.
    pub cut_pct: f64,
    /// Against what, and on which setting.
    pub against: &'static str,
}

/// The papers' numbers, read from the papers themselves.
#[rustfmt::skip]
pub const PAPERS: &[PaperCut] = &[
    // Yuan, Xie et al., "Efficient RL Training for Reasoning Models via Length-Aware
    // Optimization" (Short-RL), abstract and section 4: 33 % (math), 40 % (logic).
    PaperCut { method: "short_rl", paper: "Short-RL", cut_pct: 33.0, against: "standard RL, step-averaged response length, math (40 % on logic)" },
    // Dai, Liu, Si, "Stable Reinforcement Learning for Efficient Reasoning" (GRPO-λ), abstract:
    // 47.3 % shorter CoT with +1.48 % accuracy.
    PaperCut { method: "grpo_lambda", paper: "GRPO-λ", cut_pct: 47.3, against: "the base model, mean over five benchmarks (+1.48 % accuracy)" },
    // He et al., "To Think or Not to Think: Allocating Reasoning Where It Helps" (CARE),
    // results on Qwen3-4B: 37.7 % fewer tokens than the base model, 11.1 % fewer than GRPO.
    PaperCut { method: "care", paper: "CARE", cut_pct: 37.7, against: "the base model, Qwen3-4B (11.1 % against GRPO)" },
    // "Step-GRPO: Internalizing Dynamic Early Exit for Efficient Reasoning" (Chen, Wang et al.),
    // main results on Qwen3-8B: 32.0 % fewer tokens than the vanilla model.
    PaperCut { method: "step_grpo_paper", paper: "Step-GRPO", cut_pct: 32.0, against: "the vanilla model, Qwen3-8B" },
];

fn pct(i: &Interval) -> String {
    match i.ci {
        Some((lo, hi)) => format!(
            "{:.1} % [{:.1}, {:.1}]",
            100.0 * i.mean,
            100.0 * lo,
            100.0 * hi
        ),
        None => format!("{:.1} %", 100.0 * i.mean),
    }
}

/// Per seed, 1 − method's eval tokens / Standard's (paired by seed index; None when a seed of
/// either is missing).
fn cut(seeds: &BTreeMap<String, Vec<SeedRow>>, method: &str) -> Option<Interval> {
    let (m, s) = (seeds.get(method)?, seeds.get("standard")?);
    if m.len() != s.len() || m.iter().zip(s).any(|(a, b)| a.seed != b.seed) || m.is_empty() {
        return None;
    }
    let d: Vec<f64> = m
        .iter()
        .zip(s)
        .map(|(a, b)| 1.0 - a.eval_tokens / b.eval_tokens)
        .collect();
    Some(paired_at(&d, super::confirmatory::ALPHA))
}

/// Per seed, the share of Standard's final eval tokens that its training added:
/// (end − start) / end.
pub fn ceiling(
    seeds: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
) -> Option<Interval> {
    let (end, start) = (seeds.get("standard")?, traj.get("standard")?);
    let d: Vec<f64> = end
        .iter()
        .filter_map(|e| {
            let s = start.iter().find(|s| s.seed == e.seed)?;
            Some((e.eval_tokens - s.start_tokens) / e.eval_tokens)
        })
        .collect();
    (!d.is_empty()).then(|| paired_at(&d, super::confirmatory::ALPHA))
}

/// The section: one row per paper with the measured cut here, then the ceiling.
pub fn section(
    seeds: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Effect sizes against the papers' (plan item 10.3)\n");
    let _ = writeln!(
        s,
        "Measured: per seed, 1 − the method's final eval tokens / Standard's on the same seed, mean and 95 % t interval over seeds (positive is shorter). The papers' numbers are their headlines, against the comparison each names; they are for scale, not tested.\n"
    );
    let _ = writeln!(s, "| Method | Shorter here [95 %] | Paper | Paper's cut | Paper's comparison |\n|---|---|---|---|---|");
    for p in PAPERS {
        let here = cut(seeds, p.method)
            .map_or("not run".into(), |i| format!("{} ({} seeds)", pct(&i), i.n));
        let _ = writeln!(
            s,
            "| `{}` | {here} | {} | {:.1} % | {} |",
            p.method, p.paper, p.cut_pct, p.against
        );
    }
    let c = ceiling(seeds, traj).map_or(
        "not computable (no Standard run with both ends)".into(),
        |i| {
            format!(
                "{} of Standard's final eval tokens ({} seeds)",
                pct(&i),
                i.n
            )
        },
    );
    let _ = writeln!(
        s,
        "\nThe testbed's ceiling: what Standard's GRPO training added to the SFT checkpoint's eval length, {c}. A length method can remove about that much and no more without cutting the chain itself, which every answer needs: the testbed's problems are chains of operations whose every step must be written, and the only removable length is reflection (the rounds of `Wait` after the stated answer; seeds.csv's tokens_L1..tokens_L6 give each method's cut by level). The papers' models start from long, repetitive reasoning with much more to remove, so their 32-47 % are not reachable here.\n"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(method: &str, seed: u64, tokens: f64) -> SeedRow {
        SeedRow::fixture(method, seed, 0.9, tokens)
    }

    #[test]
    fn the_cut_and_the_ceiling_follow_from_the_tables() {
        let mut seeds: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
        let mut traj: BTreeMap<String, Vec<TrajRow>> = BTreeMap::new();
        for s in 0..9u64 {
            seeds
                .entry("standard".into())
                .or_default()
                .push(row("standard", s, 50.0));
            // 45 of 50 tokens: 10 % shorter on every seed.
            seeds
                .entry("short_rl".into())
                .or_default()
                .push(row("short_rl", s, 45.0));
            traj.entry("standard".into()).or_default().push(TrajRow {
                method: "standard".into(),
                seed: s,
                growth: 1.3,
                start_accuracy: 0.7,
                start_tokens: 40.0,
                care_longer: None,
                care_shorter: None,
                start_pass1_by_level: vec![0.7],
            });
        }
        let md = section(&seeds, &traj);
        let line = |m: &str| md.lines().find(|l| l.starts_with(m)).unwrap_or_default();
        assert!(
            line("| `short_rl` |")
                .starts_with("| `short_rl` | 10.0 % [10.0, 10.0] (9 seeds) | Short-RL | 33.0 % |"),
            "{md}"
        );
        assert!(
            line("| `care` |").contains("| not run | CARE | 37.7 % |"),
            "{md}"
        );
        // Standard grew from 40 to 50 tokens: 20 % of its final length is the ceiling.
        assert!(
            md.contains("20.0 % [20.0, 20.0] of Standard's final eval tokens (9 seeds)"),
            "{md}"
        );
        assert!(PAPERS.iter().all(|p| p.cut_pct > 30.0 && p.cut_pct < 50.0));
    }
}
