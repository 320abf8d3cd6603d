//! Study v5's two-level analysis (docs/v5/plan.md sections 2-8): checkpoints as the unit, GRPO
//! seeds within them. Per run a relative cut r = 1 − tokens(m) / tokens(c) and Δacc against the
//! claim's comparison (Standard paired by seed, or the checkpoint's base evaluation); per
//! checkpoint the mean over its seeds; then one one-sample t test over the K checkpoint means per
//! claim (the exact test of the fixed effect with a random checkpoint intercept and equal seeds),
//! the minimum meaningful cut and accuracy margin, the plan's graphical gatekeeping (P1-P4 before
//! DLER), the sign-flip and per-seed sensitivity tests and the variance components. Data flow:
//! checkpoints.rs's tables -> [`test`] / [`graph`] -> v5_tables.rs's markdown.

use crate::checkpoints::{Checkpoint, BASE};
use crate::stats::{sign_flip_p, t_cdf, t_quantile, MAX_FLIP_SEEDS};

/// One-sided α of every test (the family's, section 6).
pub const ALPHA: f64 = 0.025;
/// The minimum meaningful relative cut (section 4): 5 % of the comparison's length.
pub const MIN_CUT: f64 = 0.05;
/// The accuracy margin: Δacc must exceed −0.02.
pub const ACC_MARGIN: f64 = -0.02;

/// What a claim's row is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Against {
    Standard,
    Base,
}

impl Against {
    pub fn words(self) -> &'static str {
        match self {
            Against::Standard => "Standard",
            Against::Base => "the SFT base",
        }
    }
}

/// One planned claim: its row, its comparison and its initial weight in the graph.
#[derive(Debug, Clone, Copy)]
pub struct Claim {
    pub id: &'static str,
    pub paper: &'static str,
    pub row: &'static str,
    pub against: Against,
    pub weight: f64,
}

/// Section 4's five claims with section 6's initial weights.
pub const CLAIMS: [Claim; 5] = [
    Claim {
        id: "P1",
        paper: "Short-RL",
        row: "short_rl",
        against: Against::Standard,
        weight: 0.5,
    },
    Claim {
        id: "P2",
        paper: "GRPO-λ",
        row: "grpo_lambda",
        against: Against::Base,
        weight: 1.0 / 6.0,
    },
    Claim {
        id: "P3",
        paper: "CARE",
        row: "care",
        against: Against::Base,
        weight: 1.0 / 6.0,
    },
    Claim {
        id: "P4",
        paper: "Step-GRPO",
        row: "step_grpo_paper",
        against: Against::Base,
        weight: 1.0 / 6.0,
    },
    Claim {
        id: "P5",
        paper: "DLER",
        row: "dler",
        against: Against::Base,
        weight: 0.0,
    },
];

/// Per run of `row` in `ck`: (relative cut, Δacc) against `against`, by seed; empty when the
/// comparison is missing (a Standard run of the same seed, or the base evaluation).
pub fn per_run(ck: &Checkpoint, row: &str, against: Against) -> Vec<(f64, f64)> {
    let Some(rows) = ck.runs.get(row) else {
        return vec![];
    };
    rows.iter()
        .filter_map(|r| {
            let c = match against {
                Against::Base => ck.base()?,
                Against::Standard => ck.runs.get("standard")?.iter().find(|s| s.seed == r.seed)?,
            };
            Some((1.0 - r.eval_tokens / c.eval_tokens, r.accuracy - c.accuracy))
        })
        .collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn var(v: &[f64]) -> f64 {
    let m = mean(v);
    v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0)
}

/// The one-sided t p-value that the mean of `v` is above `x` (`above`) or below it; None with
/// fewer than two values. A zero spread gives 0 when the mean is strictly on the side, else 1.
pub fn t_one_sided(v: &[f64], x: f64, above: bool) -> Option<f64> {
    if v.len() < 2 {
        return None;
    }
    let se = (var(v) / v.len() as f64).sqrt();
    let shift = if above { mean(v) - x } else { x - mean(v) };
    if se == 0.0 {
        return Some(if shift > 0.0 { 0.0 } else { 1.0 });
    }
    Some(t_cdf(-shift / se, v.len() - 1))
}

/// The mean of `v` and its two-sided 95 % t interval (None with fewer than two values).
pub fn interval(v: &[f64]) -> (f64, Option<(f64, f64)>) {
    if v.len() < 2 {
        return (v.first().copied().unwrap_or(f64::NAN), None);
    }
    let h = t_quantile(0.975, v.len() - 1) * (var(v) / v.len() as f64).sqrt();
    (mean(v), Some((mean(v) - h, mean(v) + h)))
}

/// The exact sign-flip p-value that the mean of `v` is above `x` (None past MAX_FLIP_SEEDS).
fn flip_above(v: &[f64], x: f64) -> Option<f64> {
    if v.len() < 2 || v.len() > MAX_FLIP_SEEDS {
        return None;
    }
    sign_flip_p(&v.iter().map(|d| -d).collect::<Vec<_>>(), -x)
}

/// Between-checkpoint and within-checkpoint variance components from the ANOVA mean squares
/// (σ_c² = var(checkpoint means) − σ_s² / n̄, floored at 0; σ_s² the mean within variance).
pub fn components(groups: &[Vec<f64>]) -> Option<(f64, f64)> {
    let within: Vec<f64> = groups
        .iter()
        .filter(|g| g.len() >= 2)
        .map(|g| var(g))
        .collect();
    let means: Vec<f64> = groups
        .iter()
        .filter(|g| !g.is_empty())
        .map(|g| mean(g))
        .collect();
    if within.is_empty() || means.len() < 2 {
        return None;
    }
    let n = groups.iter().map(Vec::len).sum::<usize>() as f64 / groups.len() as f64;
    let s = mean(&within);
    Some(((var(&means) - s / n).max(0.0), s))
}

/// A claim's tests over the K checkpoints.
#[derive(Debug, Clone)]
pub struct Tested {
    pub claim: Claim,
    /// Per checkpoint: mean relative cut and mean Δacc over its seeds.
    pub cut_means: Vec<f64>,
    pub acc_means: Vec<f64>,
    /// Every run's (cut, Δacc), checkpoints ignored (the per-seed sensitivity analysis).
    pub runs: Vec<(f64, f64)>,
    /// Grouped by checkpoint, for the variance components.
    pub groups: Vec<Vec<(f64, f64)>>,
    /// The primary test's p: the larger of the two parts' one-sided t p-values (IUT).
    pub p: Option<f64>,
    /// The descriptive OR: the cut shown below the minimum or Δacc below the margin.
    pub fails: bool,
    /// The same rule by the sign-flip test over the checkpoint means, and by the t test over
    /// every run ignoring checkpoints.
    pub p_flip: Option<f64>,
    pub p_seeds: Option<f64>,
}

/// The larger of two p-values, None when either is.
fn iut(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a?.max(b?))
}

/// Claim `c`'s tests over `cks`; None when a checkpoint has no run of its row with a comparison.
pub fn test(cks: &[Checkpoint], c: Claim) -> Option<Tested> {
    let groups: Vec<Vec<(f64, f64)>> = cks.iter().map(|k| per_run(k, c.row, c.against)).collect();
    if groups.is_empty() || groups.iter().any(Vec::is_empty) {
        return None;
    }
    let m = |f: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        groups
            .iter()
            .map(|g| mean(&g.iter().map(f).collect::<Vec<_>>()))
            .collect()
    };
    let (cut_means, acc_means) = (m(|r| r.0), m(|r| r.1));
    let runs: Vec<(f64, f64)> = groups.iter().flatten().copied().collect();
    let (cuts, accs): (Vec<f64>, Vec<f64>) = runs.iter().copied().unzip();
    let p = iut(
        t_one_sided(&cut_means, MIN_CUT, true),
        t_one_sided(&acc_means, ACC_MARGIN, true),
    );
    let shown = |p: Option<f64>| p.is_some_and(|p| p <= ALPHA);
    let fails = shown(t_one_sided(&cut_means, MIN_CUT, false))
        || shown(t_one_sided(&acc_means, ACC_MARGIN, false));
    Some(Tested {
        claim: c,
        p,
        fails,
        p_flip: iut(
            flip_above(&cut_means, MIN_CUT),
            flip_above(&acc_means, ACC_MARGIN),
        ),
        p_seeds: iut(
            t_one_sided(&cuts, MIN_CUT, true),
            t_one_sided(&accs, ACC_MARGIN, true),
        ),
        cut_means,
        acc_means,
        runs,
        groups,
    })
}

/// Section 6's graph over P1-P5 (in [`CLAIMS`]' order) at family-wise `alpha`: a claim is
/// confirmed when its p is at most its current weight × α; a confirmed P1-P4 passes half its
/// weight to an unconfirmed DLER and the rest equally to the unconfirmed of P1-P4 (all to DLER
/// when none is left), a confirmed DLER passes its weight equally to the unconfirmed of P1-P4;
/// repeated until nothing more is confirmed. Returns each claim's decision and the last α it
/// was tested at (weight × α).
pub fn graph(ps: &[Option<f64>; 5], alpha: f64) -> ([bool; 5], [f64; 5]) {
    let mut w: [f64; 5] = CLAIMS.map(|c| c.weight);
    let mut done = [false; 5];
    let next = |done: &[bool; 5], w: &[f64; 5]| {
        (0..5).find(|&j| !done[j] && w[j] > 0.0 && ps[j].is_some_and(|p| p <= w[j] * alpha))
    };
    while let Some(j) = next(&done, &w) {
        done[j] = true;
        let open: Vec<usize> = (0..4).filter(|&i| !done[i]).collect();
        let dler_open = !done[4];
        let give = w[j];
        let to_dler = if j == 4 || !dler_open {
            0.0
        } else if open.is_empty() {
            give
        } else {
            give / 2.0
        };
        if dler_open {
            w[4] += to_dler;
        }
        for &i in &open {
            w[i] += (give - to_dler) / open.len() as f64;
        }
    }
    (done, w.map(|x| x * alpha))
}

/// A claim's decision words from the primary test alone (section 7).
pub fn decision(confirmed: bool, t: &Tested) -> &'static str {
    if confirmed {
        "holds (confirmed)"
    } else if t.fails {
        "fails"
    } else {
        "unresolved"
    }
}

/// Premise V1 per checkpoint: (level-1 re-checks per completion, level-1 tokens over the plain
/// teacher's `plain_l1` tokens) of its base evaluation.
pub fn v1(cks: &[Checkpoint], plain_l1: f64) -> Vec<(f64, f64)> {
    cks.iter()
        .filter_map(|k| {
            let re = *k.base_rechecks()?.first()?;
            let tok = *k.base()?.tokens_by_level.first()?;
            Some((re, tok / plain_l1))
        })
        .collect()
}

/// Premise V2 per checkpoint: Standard's mean final eval tokens over the base's.
pub fn v2(cks: &[Checkpoint]) -> Vec<f64> {
    cks.iter()
        .filter_map(|k| {
            let s = k.runs.get("standard")?;
            let t = mean(&s.iter().map(|r| r.eval_tokens).collect::<Vec<_>>());
            Some(t / k.base()?.eval_tokens)
        })
        .collect()
}

/// Whether every checkpoint has a base row (the comparison of P2-P5 and V1).
pub fn all_based(cks: &[Checkpoint]) -> bool {
    cks.iter().all(|k| k.runs.contains_key(BASE))
}

#[cfg(test)]
mod tests;
