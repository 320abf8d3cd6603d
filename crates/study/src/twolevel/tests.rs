//! twolevel.rs's tests: the graph's gate and weight passing, the minimum meaningful cut and the
//! checkpoint as the unit, and the variance components on known data.

use super::*;
use crate::seeds::SeedRow;
use std::collections::BTreeMap;

/// A checkpoint whose `row` cuts Standard's 100 tokens by `cuts[i]` (as a share) on seed i at
/// Standard's accuracy, with a base of `base` tokens.
fn ck(index: usize, row: &str, cuts: &[f64], base: f64) -> Checkpoint {
    let mut runs: BTreeMap<String, Vec<SeedRow>> = BTreeMap::new();
    runs.insert(BASE.into(), vec![SeedRow::fixture(BASE, 0, 0.9, base)]);
    for (i, c) in cuts.iter().enumerate() {
        let s = i as u64;
        runs.entry("standard".into())
            .or_default()
            .push(SeedRow::fixture("standard", s, 0.9, 100.0));
        runs.entry(row.into())
            .or_default()
            .push(SeedRow::fixture(row, s, 0.9, 100.0 * (1.0 - c)));
    }
    Checkpoint {
        index,
        runs,
        rechecks: BTreeMap::new(),
    }
}

#[test]
fn the_graph_gates_dler_and_passes_weight() {
    // DLER alone at p = 0: weight 0, never confirmed.
    let (d, _) = graph(
        &[Some(0.5), Some(0.5), Some(0.5), Some(0.5), Some(0.0)],
        ALPHA,
    );
    assert_eq!(d, [false; 5]);
    // P1 at its 0.0125 opens DLER at 0.00625 and lifts P2 to (1/6 + 1/12) α.
    let (d, a) = graph(
        &[Some(0.012), Some(0.5), Some(0.5), Some(0.5), Some(0.006)],
        ALPHA,
    );
    assert_eq!(d, [true, false, false, false, true]);
    // DLER then passes its 0.25 equally to P2-P4: each at (1/6 + 1/12 + 1/12) α.
    assert!((a[1] - ALPHA / 3.0).abs() < 1e-12, "{a:?}");
    // P2 at 0.005 > α/6 alone, confirmed once P1's weight arrives.
    let (d, _) = graph(
        &[Some(0.012), Some(0.005), Some(0.5), Some(0.5), Some(0.5)],
        ALPHA,
    );
    assert_eq!(d, [true, true, false, false, false]);
    let (d, _) = graph(
        &[Some(0.02), Some(0.005), Some(0.5), Some(0.5), Some(0.5)],
        ALPHA,
    );
    assert_eq!(d, [false; 5]);
    // Everything at 0: all confirmed, the weights never exceed the family's α.
    let (d, a) = graph(&[Some(0.0); 5], ALPHA);
    assert_eq!(d, [true; 5]);
    assert!(a.iter().all(|&x| x <= ALPHA + 1e-12), "{a:?}");
}

#[test]
fn a_cut_below_the_minimum_cannot_hold_and_checkpoints_are_the_unit() {
    let p1 = CLAIMS[0];
    // A steady 3 % cut: significant against 0, but shown below the 5 % minimum: fails.
    let cks: Vec<Checkpoint> = (0..6)
        .map(|k| ck(k, "short_rl", &[0.03, 0.031, 0.029], 80.0))
        .collect();
    let t = test(&cks, p1).expect("tested");
    assert!(t.p.expect("test input") > 0.5 && t.fails, "{t:?}");
    // A 10 % cut on every checkpoint holds.
    let cks: Vec<Checkpoint> = (0..6)
        .map(|k| ck(k, "short_rl", &[0.10, 0.11 + 0.001 * k as f64, 0.09], 80.0))
        .collect();
    let t = test(&cks, p1).expect("tested");
    assert!(t.p.expect("test input") < 1e-4 && !t.fails, "{t:?}");
    // One checkpoint with a large cut and the rest none: many seeds agree within each
    // checkpoint, so the per-seed test is far smaller than the checkpoint-level one.
    let mut cks: Vec<Checkpoint> = (0..5)
        .map(|k| ck(k, "short_rl", &[0.0, 0.001, -0.001], 80.0))
        .collect();
    cks.push(ck(5, "short_rl", &[0.6, 0.61, 0.59], 80.0));
    let t = test(&cks, p1).expect("tested");
    assert_eq!(t.cut_means.len(), 6);
    assert!(
        t.p.expect("test input") > ALPHA,
        "one checkpoint cannot carry it: {t:?}"
    );
    // Against the base: 100 tokens from a 125-token base is a 20 % cut.
    let cks: Vec<Checkpoint> = (0..4).map(|k| ck(k, "care", &[0.0, 0.0], 125.0)).collect();
    let t = test(&cks, CLAIMS[2]).expect("tested");
    assert!((t.cut_means[0] - 0.2).abs() < 1e-12);
    // A checkpoint without the row: not tested.
    assert!(test(&cks, CLAIMS[1]).is_none());
}

#[test]
fn variance_components_split_the_spread() {
    // Checkpoint means 0, 1, 2 (variance 1); within variance 0.25 at n = 2.
    let g = vec![vec![0.0, 1.0]];
    assert!(
        components(&g).is_none(),
        "one checkpoint has no between part"
    );
    let d = 0.5f64.sqrt() / 2.0f64.sqrt(); // ± d gives a within variance of 2 d² = 0.5
    let g: Vec<Vec<f64>> = (0..3).map(|k| vec![k as f64 - d, k as f64 + d]).collect();
    let (c, s) = components(&g).expect("test input");
    assert!(
        (s - 0.5).abs() < 1e-12 && (c - 0.75).abs() < 1e-12,
        "{c} {s}"
    );
}
