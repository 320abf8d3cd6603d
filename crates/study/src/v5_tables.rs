//! Study v5's generated report body (docs/v5/plan.md section 12), markdown from the
//! per-checkpoint tables alone: the premise checks V1-V2, the checkpoint means (the first
//! level), the family P1-P5 with the graph's decisions, its sensitivity tests and the variance
//! components (the second level), and the exploratory rows X1-X3. Data flow: checkpoints.rs's
//! tables -> twolevel.rs's tests -> [`render`] -> xtask/src/report_v5.rs writes results.md.

use crate::checkpoints::{Checkpoint, BASE};
use crate::twolevel::{
    self as tl, components, decision, graph, interval, Against, Claim, Tested, ACC_MARGIN, ALPHA,
    CLAIMS, MIN_CUT,
};
use std::fmt::Write as _;

/// The rows the report reads, in its order (the plan's six, then the exploratory ones).
pub const ROWS: [&str; 10] = [
    "standard",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo_paper",
    "dler",
    "laser_d",
    "gfpo",
    "think_prune",
    "grpo_lead",
];

fn p3(p: Option<f64>) -> String {
    p.map_or("-".into(), |p| format!("{p:.4}"))
}

fn ci(v: &[f64], scale: f64, d: usize) -> String {
    match interval(v) {
        (m, Some((lo, hi))) => {
            format!("{:.d$} [{:.d$}, {:.d$}]", m * scale, lo * scale, hi * scale)
        }
        (m, None) => format!("{:.d$}", m * scale),
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Premise checks V1 and V2 (section 2), with `plain_l1` the plain teacher's level-1 tokens.
fn premise(md: &mut String, cks: &[Checkpoint], plain_l1: f64) {
    let _ = writeln!(md, "## Premise checks (section 2)\n");
    let v1 = tl::v1(cks, plain_l1);
    let lower = |v: &[f64]| interval(v).1.map(|(lo, _)| lo);
    let (re, ratio): (Vec<f64>, Vec<f64>) = v1.iter().copied().unzip();
    let _ = writeln!(
        md,
        "| check | per checkpoint (K = {}) | mean [95 % CI] | needs | holds |",
        v1.len()
    );
    let _ = writeln!(md, "|---|---|---|---|---|");
    // V1's bounds are inclusive (at least), V2's strict (above).
    let holds = |lo: Option<f64>, x: f64, inclusive: bool| match lo {
        Some(lo) if lo > x || (inclusive && lo == x) => "yes",
        Some(_) => "no",
        None => "- (K < 2)",
    };
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "| V1 level-1 re-checks per completion | {} | {} | lower end ≥ 1 | {} |",
        list(&re),
        ci(&re, 1.0, 2),
        holds(lower(&re), 1.0, true)
    );
    let _ = writeln!(md, "| V1 level-1 tokens / the plain teacher's {plain_l1:.1} | {} | {} | lower end ≥ 1.25 | {} |", list(&ratio), ci(&ratio, 1.0, 2), holds(lower(&ratio), 1.25, true));
    let v2 = tl::v2(cks);
    let _ = writeln!(
        md,
        "| V2 Standard's eval tokens / the base's | {} | {} | lower end > 0.95 | {} |\n",
        list(&v2),
        ci(&v2, 1.0, 2),
        holds(lower(&v2), 0.95, false)
    );
}

/// The first level: each checkpoint's mean eval tokens and accuracy per row.
fn checkpoint_means(md: &mut String, cks: &[Checkpoint]) {
    let rows: Vec<&str> = std::iter::once(BASE)
        .chain(
            ROWS.iter()
                .copied()
                .filter(|r| cks.iter().any(|k| k.runs.contains_key(*r))),
        )
        .collect();
    let _ = writeln!(
        md,
        "## Checkpoint means (eval tokens / accuracy, mean over the checkpoint's seeds)\n"
    );
    let _ = writeln!(md, "| checkpoint | {} |", rows.join(" | "));
    let _ = writeln!(md, "|---|{}", "---|".repeat(rows.len()));
    for k in cks {
        let cells: Vec<String> = rows
            .iter()
            .map(|r| match k.runs.get(*r) {
                Some(v) => {
                    let t = mean(&v.iter().map(|x| x.eval_tokens).collect::<Vec<_>>());
                    let a = mean(&v.iter().map(|x| x.accuracy).collect::<Vec<_>>());
                    format!("{t:.1} / {a:.3}")
                }
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(md, "| ck{} | {} |", k.index, cells.join(" | "));
    }
    md.push('\n');
}

/// One claim's row of a decision table.
fn claim_row(md: &mut String, t: &Tested, alpha: f64, confirmed: bool) {
    let c = &t.claim;
    let words = decision(confirmed, t);
    let sens = |p: Option<f64>| p.is_some_and(|p| p <= alpha);
    let mut notes = vec![];
    if sens(t.p_flip) != confirmed {
        notes.push("sign-flip disagrees");
    }
    if sens(t.p_seeds) != confirmed {
        notes.push("per-seed disagrees");
    }
    let _ = writeln!(
        md,
        "| {} | {} (`{}`) | {} | {} | {} | {} | {} | {:.5} | {words} | {} | {} | {} |",
        c.id,
        c.paper,
        c.row,
        c.against.words(),
        t.cut_means.len(),
        ci(&t.cut_means, 100.0, 1),
        ci(&t.acc_means, 1.0, 3),
        p3(t.p),
        alpha,
        p3(t.p_flip),
        p3(t.p_seeds),
        if notes.is_empty() {
            "-".into()
        } else {
            notes.join("; ")
        },
    );
}

const HEAD: &str = "| id | paper (row) | against | K | relative cut % [95 % CI] | Δacc [95 % CI] | p (t, IUT) | α | decision | p sign-flip | p per seed | sensitivity |\n|---|---|---|---|---|---|---|---|---|---|---|---|";

/// The family (section 6) and its variance components (section 4).
fn family(md: &mut String, cks: &[Checkpoint]) {
    let _ = writeln!(md, "## Claims P1-P5 (sections 4, 6, 7)\n");
    let _ = writeln!(md, "Per run r = 1 − tokens / tokens(comparison) and Δacc; per checkpoint the mean over its seeds; one one-sided t test over the K checkpoint means per part (cut > {:.0} %, Δacc > {ACC_MARGIN}), the claim's p the larger; the graph of section 6 at α = {ALPHA} (α is the last level the claim was tested at). The sign-flip test over the checkpoint means and the t test over every run (checkpoints ignored) are sensitivity analyses at the same α; they never change a decision.\n", MIN_CUT * 100.0);
    let tested: Vec<Option<Tested>> = CLAIMS.iter().map(|c| tl::test(cks, *c)).collect();
    let ps: [Option<f64>; 5] = std::array::from_fn(|i| tested[i].as_ref().and_then(|t| t.p));
    let (done, alphas) = graph(&ps, ALPHA);
    let _ = writeln!(md, "{HEAD}");
    for (i, t) in tested.iter().enumerate() {
        match t {
            Some(t) => claim_row(md, t, alphas[i], done[i]),
            None => {
                let c = CLAIMS[i];
                let _ = writeln!(md, "| {} | {} (`{}`) | {} | - | - | - | - | - | not tested: a checkpoint lacks its runs | - | - | - |", c.id, c.paper, c.row, c.against.words());
            }
        }
    }
    let _ = writeln!(
        md,
        "\n### Variance components (between checkpoints σ_c², between seeds within them σ_s²)\n"
    );
    let _ = writeln!(
        md,
        "| id | cut σ_c² (%²) | cut σ_s² (%²) | Δacc σ_c² | Δacc σ_s² |\n|---|---|---|---|---|"
    );
    for t in tested.iter().flatten() {
        let part = |f: fn(&(f64, f64)) -> f64, s: f64| {
            let g: Vec<Vec<f64>> = t
                .groups
                .iter()
                .map(|g| g.iter().map(|r| f(r) * s).collect())
                .collect();
            components(&g).map_or(("-".into(), "-".into()), |(c, w)| {
                (format!("{c:.3e}"), format!("{w:.3e}"))
            })
        };
        let (cc, cs) = part(|r| r.0, 100.0);
        let (ac, as_) = part(|r| r.1, 1.0);
        let _ = writeln!(md, "| {} | {cc} | {cs} | {ac} | {as_} |", t.claim.id);
    }
    md.push('\n');
}

/// X1-X2 (section 10): the other comparison of each claim, raw decisions at α.
fn exploratory(md: &mut String, cks: &[Checkpoint]) {
    let _ = writeln!(
        md,
        "## Exploratory (section 10: raw decisions at α = {ALPHA}, no correction)\n"
    );
    let _ = writeln!(md, "{HEAD}");
    // X1: P2-P5's rows against Standard; X2: Short-RL against the base; X4 when run.
    let flipped = CLAIMS.iter().map(|c| match c.against {
        Against::Base => Claim {
            id: "X1",
            against: Against::Standard,
            ..*c
        },
        Against::Standard => Claim {
            id: "X2",
            against: Against::Base,
            ..*c
        },
    });
    for c in flipped.chain(EXTRA) {
        if let Some(t) = tl::test(cks, c) {
            let raw = t.p.is_some_and(|p| p <= ALPHA);
            claim_row(md, &t, ALPHA, raw);
        }
    }
    md.push('\n');
}

/// X4's newer methods against Standard (raw, when their runs exist).
const EXTRA: [Claim; 4] = [
    Claim {
        id: "X4",
        paper: "LASER-D",
        row: "laser_d",
        against: Against::Standard,
        weight: 0.0,
    },
    Claim {
        id: "X4",
        paper: "GFPO",
        row: "gfpo",
        against: Against::Standard,
        weight: 0.0,
    },
    Claim {
        id: "X4",
        paper: "ThinkPrune",
        row: "think_prune",
        against: Against::Standard,
        weight: 0.0,
    },
    Claim {
        id: "X4",
        paper: "GRPO-LEAD",
        row: "grpo_lead",
        against: Against::Standard,
        weight: 0.0,
    },
];

/// X3 (section 10): per level, every row's mean tokens, re-checks and pass@1 over all its runs.
fn per_level(md: &mut String, cks: &[Checkpoint]) {
    let levels = cks
        .iter()
        .find_map(|k| k.base())
        .map_or(0, |b| b.tokens_by_level.len());
    let _ = writeln!(
        md,
        "## X3: per level (mean over every run of the row: tokens / re-checks / pass@1)\n"
    );
    let _ = writeln!(
        md,
        "| row | {} |",
        (1..=levels)
            .map(|l| format!("L{l}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(md, "|---|{}", "---|".repeat(levels));
    for r in std::iter::once(BASE).chain(ROWS) {
        let runs: Vec<_> = cks.iter().filter_map(|k| k.runs.get(r)).flatten().collect();
        let re: Vec<_> = cks
            .iter()
            .filter_map(|k| k.rechecks.get(r))
            .flatten()
            .collect();
        if runs.is_empty() {
            continue;
        }
        let cells: Vec<String> = (0..levels)
            .map(|l| {
                let t = mean(
                    &runs
                        .iter()
                        .map(|x| x.tokens_by_level[l])
                        .collect::<Vec<_>>(),
                );
                let p = mean(&runs.iter().map(|x| x.pass1_by_level[l]).collect::<Vec<_>>());
                let c = mean(&re.iter().map(|x| x.by_level[l]).collect::<Vec<_>>());
                format!("{t:.1} / {c:.2} / {p:.3}")
            })
            .collect();
        let _ = writeln!(md, "| {r} | {} |", cells.join(" | "));
    }
    md.push('\n');
}

/// The generated body of results.md from the checkpoints' tables and the plain teacher's
/// level-1 tokens (verbose_start).
pub fn render(cks: &[Checkpoint], plain_l1: f64) -> String {
    let mut md = String::new();
    premise(&mut md, cks, plain_l1);
    checkpoint_means(&mut md, cks);
    family(&mut md, cks);
    exploratory(&mut md, cks);
    per_level(&mut md, cks);
    md
}
