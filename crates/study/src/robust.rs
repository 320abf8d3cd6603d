//! The robustness cells side by side (docs/v4/plan.md section 8): for the main design and each
//! cell that has run, Standard's length, accuracy and level-1 length and how much of its length
//! its training added, then P1-P4's cut and both tests' decisions, raw and after Holm over P1-P4
//! within the cell, one row per cell; then, per claim, in how many cells it holds. Every cell is
//! exploratory; the row shows where a primary claim carries over and where it does not. Data
//! flow: each cell's seeds.csv + trajectory.csv (docs/v4/robust/<cell>/, and the main
//! design's) -> [`section`] -> docs/v4/results.md.

use super::confirmatory::{
    decide, holds, holm_confirmed, verdict, Scope, ALPHA, ROBUSTNESS_CLAIMS,
};
use super::seeds::SeedRow;
use super::trajectory::TrajRow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One cell's tables, as its report reads them.
pub struct CellTables<'a> {
    /// The cell's name (`main` for the main design).
    pub name: &'a str,
    /// What the cell changes, in words.
    pub what: &'a str,
    pub seeds: &'a BTreeMap<String, Vec<SeedRow>>,
    pub traj: &'a BTreeMap<String, Vec<TrajRow>>,
}

/// One test's decision in a cell: raw, and confirmed by Holm within the cell.
fn word(raw: (Option<f64>, bool), confirmed: bool) -> String {
    match (verdict(raw), confirmed) {
        (_, true) => "**holds (Holm)**".into(),
        (v, false) => v.replace("**", ""),
    }
}

/// The section: one row per cell, then a count per claim.
pub fn section(cells: &[CellTables]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Robustness cells side by side (plan section 8; exploratory)\n"
    );
    let _ = writeln!(
        s,
        "Each cell's own report (docs/v4/robust/<cell>/results.md) has the full rows; here, per cell, Standard's final eval tokens, accuracy and level-1 eval tokens (means over seeds) and the share of them its GRPO training added (the ceiling of plan item 10.3, mean over seeds), then for each primary claim its Δ eval tokens and Δ accuracy (method − Standard, mean over paired seeds) and the t and sign-flip decisions at one-sided α = {ALPHA}: raw, or \"holds (Holm)\" when Holm's step-down over P1-P4 within the cell confirms it. The main design's row is decided the same way (Holm over P1-P4, not the confirmatory family's nine claims, so the rows compare); its confirmatory decisions are in the Claims section above.\n"
    );
    let _ = writeln!(
        s,
        "| Cell | Standard eval tokens | Standard accuracy | Standard level-1 tokens | Added by training | P1 Short-RL | P2 GRPO-λ | P3 CARE | P4 Step-GRPO (paper) |\n|---|---|---|---|---|---|---|---|---|"
    );
    // Per claim: cells decided, raw holds by t, holds by both tests, confirmed by Holm (t).
    let mut tally: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    for c in cells {
        let rows = decide(c.seeds, Scope::Robustness);
        // Holm over the cell's P1-P4 (all four needed; an incomplete cell confirms nothing).
        let complete = rows.len() == ROBUSTNESS_CLAIMS.len();
        let ht = holm_confirmed(&rows, complete, |d| d.t.0);
        let hf = holm_confirmed(&rows, complete, |d| d.flip.0);
        // Standard's mean over seeds of one seeds.csv column, at `prec` decimals.
        let standard_mean = |f: fn(&SeedRow) -> Option<f64>, prec: usize| {
            c.seeds.get("standard").map_or("not run".into(), |r| {
                let v: Vec<f64> = r.iter().filter_map(f).collect();
                if v.is_empty() {
                    return "-".into();
                }
                format!("{:.prec$}", v.iter().sum::<f64>() / v.len() as f64)
            })
        };
        let standard = standard_mean(|r| Some(r.eval_tokens), 1);
        let accuracy = standard_mean(|r| Some(r.accuracy), 3);
        let level1 = standard_mean(|r| r.tokens_by_level.first().copied(), 1);
        let added = super::effect::ceiling(c.seeds, c.traj)
            .map_or("-".into(), |i| format!("{:.1} %", 100.0 * i.mean));
        let _ = write!(
            s,
            "| `{}` ({}) | {standard} | {accuracy} | {level1} | {added} |",
            c.name, c.what
        );
        for id in ROBUSTNESS_CLAIMS {
            let Some(k) = rows.iter().position(|d| d.claim.id == id) else {
                let _ = write!(s, " not run |");
                continue;
            };
            let d = &rows[k];
            let _ = write!(
                s,
                " {:+.1} tok, {:+.3} acc; t {}, sign-flip {} |",
                d.len.mean,
                d.acc.mean,
                word(d.t, ht[k]),
                word(d.flip, hf[k])
            );
            let t = tally.entry(id).or_default();
            t[0] += 1;
            t[1] += usize::from(holds(d.t));
            t[2] += usize::from(holds(d.t) && holds(d.flip));
            t[3] += usize::from(ht[k]);
        }
        s.push('\n');
    }
    let _ = writeln!(s);
    for id in ROBUSTNESS_CLAIMS {
        let [n, t, both, h] = tally.get(id).copied().unwrap_or_default();
        let _ = writeln!(
            s,
            "- {id}: computed in {n} of {} cells (runs present); holds by t in {t}, by both tests in {both}, confirmed by Holm (t) in {h}.",
            cells.len()
        );
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(method: &str, seed: u64, acc: f64, tokens: f64) -> SeedRow {
        SeedRow::fixture(method, seed, acc, tokens)
    }

    fn traj(seed: u64, start: f64) -> TrajRow {
        TrajRow {
            method: "standard".into(),
            seed,
            growth: 1.2,
            start_accuracy: 0.7,
            start_tokens: start,
            care_longer: None,
            care_shorter: None,
            start_pass1_by_level: vec![0.7],
        }
    }

    /// A cell where every method is `cut` tokens shorter than Standard's 50 on 9 seeds (a
    /// little noise so the t interval has width), at Standard's accuracy.
    fn cell(
        cut: f64,
        methods: &[&str],
    ) -> (
        BTreeMap<String, Vec<SeedRow>>,
        BTreeMap<String, Vec<TrajRow>>,
    ) {
        let mut seeds: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
        let mut tr: BTreeMap<String, Vec<TrajRow>> = BTreeMap::new();
        for s in 0..9u64 {
            let noise = 0.1 * (s as f64 - 4.0);
            seeds
                .entry("standard".into())
                .or_default()
                .push(row("standard", s, 0.8, 50.0));
            for m in methods {
                seeds
                    .entry(m.to_string())
                    .or_default()
                    .push(row(m, s, 0.8, 50.0 - cut + noise));
            }
            tr.entry("standard".into()).or_default().push(traj(s, 40.0));
        }
        (seeds, tr)
    }

    #[test]
    fn each_cell_is_one_row_and_each_claim_is_counted() {
        let all = ["short_rl", "grpo_lambda", "care", "step_grpo_paper"];
        let (s1, t1) = cell(5.0, &all);
        // A cell where nothing shortens, and one whose CARE and Step-GRPO runs are missing.
        let (s2, t2) = cell(-3.0, &all);
        let (s3, t3) = cell(5.0, &all[..2]);
        let cells = [
            CellTables {
                name: "main",
                what: "design 3",
                seeds: &s1,
                traj: &t1,
            },
            CellTables {
                name: "flat",
                what: "no cut",
                seeds: &s2,
                traj: &t2,
            },
            CellTables {
                name: "part",
                what: "two methods",
                seeds: &s3,
                traj: &t3,
            },
        ];
        let md = section(&cells);
        let line = |c: &str| md.lines().find(|l| l.starts_with(c)).unwrap_or_default();
        // 40 -> 50 tokens: training added 20 % of Standard's final length.
        assert!(line("| `main`").starts_with("| `main` (design 3) | 50.0 | 0.800 | 50.0 | 20.0 % | -5.0 tok, +0.000 acc; t **holds (Holm)**, sign-flip **holds (Holm)** |"), "{md}");
        assert!(
            line("| `flat`").contains("+3.0 tok, +0.000 acc; t fails, sign-flip fails |"),
            "{md}"
        );
        // Two of four claims decided: they may hold raw, but Holm confirms nothing.
        let part = line("| `part`");
        assert!(
            part.contains("t holds, sign-flip holds |") && part.ends_with("not run | not run |"),
            "{md}"
        );
        assert!(!part.contains("Holm"), "{md}");
        assert!(md.contains("- P1: computed in 3 of 3 cells (runs present); holds by t in 2, by both tests in 2, confirmed by Holm (t) in 1."), "{md}");
        assert!(md.contains("- P4: computed in 2 of 3 cells (runs present); holds by t in 1, by both tests in 1, confirmed by Holm (t) in 1."), "{md}");
    }
}
