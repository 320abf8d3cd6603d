//! The v4 reports' descriptive tables by level and over a run's trajectory: each method's start
//! (step 0), rollout growth and CARE's direction counts, its final pass@1 and eval tokens per
//! level, and per level its difference from Standard, all means over seeds. They exist so that
//! a hand-written reading cites printed numbers (readings.rs checks that it does) instead of
//! numbers computed by hand from the per-seed tables. Data flow: seeds.csv + trajectory.csv ->
//! [`section`] -> every v4 results.md (main design, premise conditions, robustness cells).

use super::seeds::SeedRow;
use super::trajectory::TrajRow;
use std::collections::BTreeMap;
use std::fmt::Write as _;

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The column-wise mean of per-seed vectors (levels), or None when their lengths differ.
fn mean_by_level(rows: &[&[f64]]) -> Option<Vec<f64>> {
    let n = rows.first()?.len();
    if rows.iter().any(|r| r.len() != n) {
        return None;
    }
    Some(
        (0..n)
            .map(|l| mean(&rows.iter().map(|r| r[l]).collect::<Vec<_>>()))
            .collect(),
    )
}

/// The row a method is compared with by level: `standard_g16` for a `*_g16` row when the study
/// has it (the premise conditions' G = 16 arm), `standard` otherwise; None for Standard itself.
fn baseline<'a, T>(method: &str, rows: &'a BTreeMap<String, Vec<T>>) -> Option<&'a str> {
    if method.starts_with("standard") {
        return None;
    }
    let key = if method.ends_with("_g16") && rows.contains_key("standard_g16") {
        "standard_g16"
    } else {
        "standard"
    };
    rows.get_key_value(key).map(|(k, _)| k.as_str())
}

/// Per level, the mean over paired seeds of method − baseline (None when a seed of either is
/// missing, so only paired differences are printed).
fn paired_by_level(m: &[SeedRow], b: &[SeedRow], f: fn(&SeedRow) -> &[f64]) -> Option<Vec<f64>> {
    if m.is_empty() || m.len() != b.len() || m.iter().zip(b).any(|(x, y)| x.seed != y.seed) {
        return None;
    }
    let diffs: Vec<Vec<f64>> = m
        .iter()
        .zip(b)
        .map(|(x, y)| f(x).iter().zip(f(y)).map(|(a, c)| a - c).collect())
        .collect();
    mean_by_level(&diffs.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

fn cells(xs: &[f64], prec: usize, signed: bool) -> String {
    xs.iter()
        .map(|x| {
            if signed {
                format!("{x:+.prec$}")
            } else {
                format!("{x:.prec$}")
            }
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn header(md: &mut String, first: &str, levels: usize, what: &[&str]) {
    let mut cols = vec![first.to_string()];
    for w in what {
        cols.extend((1..=levels).map(|l| format!("{w} L{l}")));
    }
    let _ = writeln!(md, "| {} |", cols.join(" | "));
    let _ = writeln!(md, "|{}", "---|".repeat(cols.len()));
}

/// The section, in the order of `seeds`' methods (alphabetical, as the CSV is read).
pub fn section(
    seeds: &BTreeMap<String, Vec<SeedRow>>,
    traj: &BTreeMap<String, Vec<TrajRow>>,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## By level and over training (descriptive, means over seeds)\n"
    );
    let _ = writeln!(
        md,
        "Means over each method's seeds of seeds.csv's and trajectory.csv's columns, no test: the start is the step-0 evaluation (the SFT checkpoint under the run's sampling seed), growth the rollout length of the last 3 steps over the first 3 (×), CARE's counts its groups a step with d = −1 (shorter) and d = +1 (longer). The last table is per level method − Standard (a G = 16 row against Standard at G = 16), mean over paired seeds.\n"
    );
    let _ = writeln!(
        md,
        "| Method | Start accuracy | Start eval tokens | Rollout growth | CARE d = −1 | CARE d = +1 |\n|---|---|---|---|---|---|"
    );
    for (m, rows) in traj {
        let opt = |f: fn(&TrajRow) -> Option<f64>| {
            let v: Vec<f64> = rows.iter().filter_map(f).collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", mean(&v))
            }
        };
        let _ = writeln!(
            md,
            "| `{m}` | {:.3} | {:.1} | ×{:.3} | {} | {} |",
            mean(&rows.iter().map(|r| r.start_accuracy).collect::<Vec<_>>()),
            mean(&rows.iter().map(|r| r.start_tokens).collect::<Vec<_>>()),
            mean(&rows.iter().map(|r| r.growth).collect::<Vec<_>>()),
            opt(|r| r.care_shorter),
            opt(|r| r.care_longer),
        );
    }
    let levels = seeds
        .values()
        .flatten()
        .map(|r| r.pass1_by_level.len())
        .max()
        .unwrap_or(0);
    if levels == 0 {
        return md;
    }
    let _ = writeln!(md);
    header(&mut md, "Method", levels, &["pass@1", "tokens"]);
    // The start by level of Standard's runs only: every row starts from the same checkpoint.
    for (m, rows) in traj.iter().filter(|(m, _)| m.starts_with("standard")) {
        let start: Vec<&[f64]> = rows
            .iter()
            .map(|r| r.start_pass1_by_level.as_slice())
            .collect();
        if let Some(p) = mean_by_level(&start).filter(|p| p.len() == levels) {
            let _ = writeln!(
                md,
                "| `{m}` at step 0 | {} | {} |",
                cells(&p, 3, false),
                vec!["-"; levels].join(" | ")
            );
        }
    }
    for (m, rows) in seeds {
        let p: Vec<&[f64]> = rows.iter().map(|r| r.pass1_by_level.as_slice()).collect();
        let t: Vec<&[f64]> = rows.iter().map(|r| r.tokens_by_level.as_slice()).collect();
        if let (Some(p), Some(t)) = (mean_by_level(&p), mean_by_level(&t)) {
            if p.len() == levels && t.len() == levels {
                let _ = writeln!(
                    md,
                    "| `{m}` | {} | {} |",
                    cells(&p, 3, false),
                    cells(&t, 1, false)
                );
            }
        }
    }
    let _ = writeln!(md);
    header(&mut md, "Comparison", levels, &["Δ tokens", "Δ pass@1"]);
    for (m, rows) in seeds {
        let Some(b) = baseline(m, seeds) else {
            continue;
        };
        let d = |f| paired_by_level(rows, &seeds[b], f);
        if let (Some(t), Some(p)) = (
            d(|r: &SeedRow| r.tokens_by_level.as_slice()),
            d(|r: &SeedRow| r.pass1_by_level.as_slice()),
        ) {
            if t.len() == levels {
                let _ = writeln!(
                    md,
                    "| {m} − {b} | {} | {} |",
                    cells(&t, 1, true),
                    cells(&p, 3, true)
                );
            }
        }
    }
    let _ = writeln!(md);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(method: &str, seed: u64, tokens: [f64; 2], pass: [f64; 2]) -> SeedRow {
        let mut r = SeedRow::fixture(method, seed, 0.9, tokens.iter().sum::<f64>() / 2.0);
        r.tokens_by_level = tokens.to_vec();
        r.pass1_by_level = pass.to_vec();
        r
    }

    #[test]
    fn level_means_and_paired_differences_follow_from_the_rows() {
        let mut seeds: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
        let mut traj: BTreeMap<String, Vec<TrajRow>> = BTreeMap::new();
        for s in 0..2u64 {
            let x = s as f64;
            seeds.entry("standard".into()).or_default().push(row(
                "standard",
                s,
                [20.0 + x, 60.0],
                [1.0, 0.5 + 0.1 * x],
            ));
            seeds.entry("short_rl".into()).or_default().push(row(
                "short_rl",
                s,
                [14.0, 58.0 + 2.0 * x],
                [1.0, 0.5],
            ));
            traj.entry("standard".into()).or_default().push(TrajRow {
                method: "standard".into(),
                seed: s,
                growth: 1.2 + 0.1 * x,
                start_accuracy: 0.7,
                start_tokens: 40.0 + x,
                care_longer: None,
                care_shorter: None,
                start_pass1_by_level: vec![0.99, 0.4 + 0.2 * x],
            });
        }
        let md = section(&seeds, &traj);
        assert!(
            md.contains("| `standard` | 0.700 | 40.5 | ×1.250 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| `standard` at step 0 | 0.990 | 0.500 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| `standard` | 1.000 | 0.550 | 20.5 | 60.0 |"),
            "{md}"
        );
        // Short-RL − Standard, paired: level 1 (14 − 20, 14 − 21), level 2 (58 − 60, 60 − 60).
        assert!(
            md.contains("| short_rl − standard | -6.5 | -1.0 | +0.000 | -0.050 |"),
            "{md}"
        );
        // An unpaired method (a seed missing) gets no difference row.
        seeds.get_mut("short_rl").expect("row").pop();
        assert!(!section(&seeds, &traj).contains("short_rl − standard"));
    }

    #[test]
    fn a_g16_row_is_compared_with_standard_at_g16() {
        let mut seeds: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
        for m in ["standard", "standard_g16", "care", "care_g16"] {
            seeds.insert(m.into(), vec![]);
        }
        assert_eq!(baseline("care_g16", &seeds), Some("standard_g16"));
        assert_eq!(baseline("care", &seeds), Some("standard"));
        assert_eq!(baseline("standard_g16", &seeds), None);
        seeds.remove("standard_g16");
        assert_eq!(baseline("care_g16", &seeds), Some("standard"));
    }
}
