//! The report's curves: rollout length and accuracy per step, one line per method, with a 95 %
//! band over seeds for the methods the figures compare.

use super::runs::{MethodRuns, RunResult};
use anyhow::Result;
use std::path::Path;
use terse_study::claims;
use terse_train::records::{band_chart, line_chart, Band, Series};

/// Per-step mean over seeds, then a trailing moving average over 5 steps.
fn curve(runs: &[RunResult], pick: impl Fn(&RunResult) -> &Vec<f64>) -> Series {
    curve_band(runs, pick).0
}

/// [`curve`] and its 95 % band: each seed's curve is smoothed (5 steps) first, then the t
/// interval of the mean over seeds is taken step by step (no band with one seed).
fn curve_band(runs: &[RunResult], pick: impl Fn(&RunResult) -> &Vec<f64>) -> (Series, Band) {
    let steps = runs.iter().map(|r| pick(r).len()).min().unwrap_or(0);
    let smooth = |c: &Vec<f64>, i: usize| {
        let w = &c[i.saturating_sub(4)..=i];
        w.iter().sum::<f64>() / w.len() as f64
    };
    let mut series = vec![];
    let mut band = vec![];
    for i in 0..steps {
        let at: Vec<f64> = runs.iter().map(|r| smooth(pick(r), i)).collect();
        let iv = claims::paired(&at);
        series.push((i as f64, iv.mean));
        if let Some((lo, hi)) = iv.ci {
            band.push((i as f64, lo, hi));
        }
    }
    (series, band)
}

/// The methods drawn with bands (all of them would hide each other).
pub(super) const BANDED: [&str; 6] = [
    "standard",
    "kimi",
    "short_rl",
    "grpo_lambda",
    "care",
    "step_grpo",
];

/// The length and accuracy curves, and their 95 % bands for the main methods.
pub(super) fn charts(out: &Path, suffix: &str, all: &[MethodRuns]) -> Result<()> {
    for (file, title, y, pick) in [
        (
            "length",
            "Rollout length (mean over seeds, 5-step average)",
            "tokens",
            0,
        ),
        (
            "accuracy",
            "Rollout accuracy (mean over seeds, 5-step average)",
            "accuracy",
            1,
        ),
    ] {
        let series: Vec<(String, Series)> = all
            .iter()
            .map(|(m, runs)| {
                let c = curve(runs, |r| {
                    if pick == 0 {
                        &r.len_curve
                    } else {
                        &r.acc_curve
                    }
                });
                (m.name.to_string(), c)
            })
            .collect();
        let p = out.join(format!("repro{suffix}_{file}.png"));
        line_chart(&p, title, "step", y, &series)?;
        let (series, bands): (Vec<(String, Series)>, Vec<Band>) = all
            .iter()
            .filter(|(m, _)| BANDED.contains(&m.name))
            .map(|(m, runs)| {
                let (c, b) = curve_band(runs, |r| {
                    if pick == 0 {
                        &r.len_curve
                    } else {
                        &r.acc_curve
                    }
                });
                ((m.name.to_string(), c), b)
            })
            .unzip();
        if series.is_empty() {
            continue;
        }
        let p = out.join(format!("repro{suffix}_{file}_bands.png"));
        band_chart(
            &p,
            &title.replace("mean over seeds", "95 % band over seeds"),
            "step",
            y,
            &series,
            &bands,
        )?;
    }
    Ok(())
}
