//! The device sampler (kernels/sample.cu) through the shim against the sampler itself
//! (terse_model::sample::reference): the same token over a grid of warpers, rows and uniforms
//! except at ties, log-probs and entropy within f32 rounding, and batch invariance.
//!
//! A tie: the kernel's token differs from the reference's only where the reference's own
//! choice flips within 1e-12 of the uniform or of top-p (the two sides sum the same masses in
//! different orders), or the two tokens' logits are equal. Ties are counted and printed.

use super::{go, rand_vec};
use crate::Buf;
use terse_model::launch;
use terse_model::sample::reference::{distribution, sample_row, Drawn, Warpers};

/// Runs the kernel over `rows` (each of length v) with one uniform a row.
fn device(rows: &[Vec<f32>], us: &[f64], w: &Warpers) -> Vec<Drawn> {
    let (n, v) = (rows.len(), rows[0].len());
    let mut x: Vec<f32> = rows.concat();
    let mut ub: Vec<u32> = us
        .iter()
        .flat_map(|u| [u.to_bits() as u32, (u.to_bits() >> 32) as u32])
        .collect();
    let mut out = vec![0u32; 4 * n];
    go(
        &launch::sample(n, v, w),
        vec![Buf::F32(&mut x), Buf::U32(&mut ub), Buf::U32(&mut out)],
    );
    out.chunks(4)
        .map(|o| Drawn {
            token: o[0],
            logp_sampled: f32::from_bits(o[1]),
            logp_plain: f32::from_bits(o[2]),
            entropy: f32::from_bits(o[3]),
        })
        .collect()
}

/// Whether `got` is a token the reference picks for a uniform within 1e-12 of `u` (its span of
/// the reference's cumulative masses, in the reference's order, holds u within 1e-12), at top-p
/// within 1e-12, or one whose logit equals the reference's token's.
fn is_tie(row: &[f32], w: &Warpers, u: f64, want: u32, got: u32) -> bool {
    if row[want as usize] == row[got as usize] {
        return true;
    }
    let eps = 1e-12;
    [-eps, 0.0, eps].iter().any(|dp| {
        let top_p = if w.top_p < 1.0 {
            (w.top_p + dp).min(1.0)
        } else {
            1.0
        };
        let (dist, _) = distribution(row, &Warpers { top_p, ..*w });
        let mut cum = 0.0;
        dist.iter().any(|&(t, p)| {
            let lo = cum;
            cum += p;
            t == got && lo - eps <= u && u < cum + eps
        })
    })
}

/// Rows that break samplers: random, flat, one-hot, heavily tied, with -inf entries, huge spread.
fn rows(v: usize, seed: u64) -> Vec<Vec<f32>> {
    let r = rand_vec(v, seed);
    let random: Vec<f32> = r.iter().map(|x| 6.0 * x).collect();
    let flat = vec![0.5f32; v];
    let mut one_hot = vec![-30.0f32; v];
    one_hot[v / 3] = 10.0;
    let tied: Vec<f32> = r.iter().map(|x| (x * 3.0).round()).collect();
    let mut masked = random.clone();
    for x in masked.iter_mut().step_by(3) {
        *x = f32::NEG_INFINITY;
    }
    let spread: Vec<f32> = r.iter().map(|x| 400.0 * x).collect();
    vec![random, flat, one_hot, tied, masked, spread]
}

/// Uniforms that sit on the reference's own cumulative boundaries, and the ends of [0, 1).
fn edge_uniforms(row: &[f32], w: &Warpers) -> Vec<f64> {
    let (dist, _) = distribution(row, w);
    let mut us = vec![0.0, 1.0 - f64::EPSILON / 2.0];
    let mut cum = 0.0;
    for (i, x) in dist.iter().enumerate().take(3) {
        cum += x.1;
        if i < dist.len() - 1 {
            us.push(cum);
        }
    }
    us
}

#[test]
fn the_device_sampler_matches_the_cpu_sampler_except_at_ties() {
    let settings = [
        Warpers {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        },
        Warpers {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        },
        Warpers {
            temperature: 0.7,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
        },
        Warpers {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
        },
        Warpers {
            temperature: 1.3,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.1,
        },
        Warpers {
            temperature: 0.6,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.02,
        },
    ];
    let (mut rows_checked, mut ties) = (0, 0);
    for (v, seed) in [(7, 1), (300, 2)] {
        for w in &settings {
            let rows = rows(v, seed);
            // One launch per setting: every row with a random uniform, then its edge uniforms.
            let mut batch: Vec<Vec<f32>> = vec![];
            let mut us = vec![];
            for (i, row) in rows.iter().enumerate() {
                let mut edge = edge_uniforms(row, w);
                edge.push(rand_vec(1, seed * 31 + i as u64)[0].abs() as f64);
                for u in edge {
                    batch.push(row.clone());
                    us.push(u);
                }
            }
            let got = device(&batch, &us, w);
            for ((row, &u), d) in batch.iter().zip(&us).zip(&got) {
                let want = sample_row(row, w, u);
                rows_checked += 1;
                if d.token != want.token {
                    assert!(
                        is_tie(row, w, u, want.token, d.token),
                        "v {v}, {w:?}, u {u}: device token {} vs cpu {} (logits {} vs {})",
                        d.token,
                        want.token,
                        row[d.token as usize],
                        row[want.token as usize]
                    );
                    ties += 1;
                    continue;
                }
                let tol = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-5 * b.abs().max(1.0);
                assert!(
                    tol(d.logp_sampled, want.logp_sampled)
                        && tol(d.logp_plain, want.logp_plain)
                        && tol(d.entropy, want.entropy),
                    "v {v}, {w:?}, u {u}: device {d:?} vs cpu {want:?}"
                );
            }
        }
    }
    eprintln!("device sampler: {rows_checked} rows, {ties} ties");
    // The edge uniforms sit exactly on boundaries: some ties are expected there, never most.
    assert!(ties * 4 < rows_checked, "{ties} ties of {rows_checked}");
}

#[test]
fn a_row_samples_the_same_whatever_its_batch() {
    let w = Warpers {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.0,
    };
    let rows = rows(500, 9);
    let us: Vec<f64> = (0..rows.len())
        .map(|i| (i as f64 + 0.37) / rows.len() as f64)
        .collect();
    let together = device(&rows, &us, &w);
    for (i, row) in rows.iter().enumerate() {
        let alone = device(std::slice::from_ref(row), &us[i..=i], &w);
        assert_eq!(alone[0], together[i], "row {i}");
    }
}
