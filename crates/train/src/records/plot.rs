//! PNG curves of a run's metrics.jsonl (length, accuracy, reward, γ_ℓ against step), written
//! into the run directory with plotters; the font ships with the crate (DejaVu Sans).

use crate::report::StepReport;
use anyhow::{Context, Result};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

static FONT: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bundled font is valid; a failure would only drop text from the plots.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One curve: (step, value) pairs.
pub type Series = Vec<(f64, f64)>;

/// The largest |value| an axis takes: beyond it plotters' tick search does not end (a reward of
/// 1e308 hung `xtask plot` at 100 % CPU) and no curve is readable anyway.
pub const MAX_PLOTTABLE: f64 = 1e15;

/// Draws `series` (name, points) into `path` as a line chart (up to 16 distinguishable series).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Series)],
) -> Result<()> {
    band_chart(path, title, x_label, y_label, series, &[])
}

/// A shaded band from `lo` to `hi` at each x: (x, lo, hi).
pub type Band = Vec<(f64, f64, f64)>;

/// [`line_chart`] with a shaded band under each series (`bands[i]` belongs to `series[i]`), e.g.
/// mean ± sd over seeds.
pub fn band_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Series)],
    bands: &[Band],
) -> Result<()> {
    register_font();
    let bands: Vec<Band> = bands
        .iter()
        .map(|b| {
            b.iter()
                .copied()
                .filter(|p| p.0.is_finite() && p.1.is_finite() && p.2.is_finite())
                .filter(|p| p.1.abs().max(p.2.abs()) <= MAX_PLOTTABLE)
                .collect()
        })
        .collect();
    // NaN and infinities have no place on an axis; they are left out of the curves.
    let series: Vec<(String, Series)> = series
        .iter()
        .map(|(n, s)| {
            let s = s
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            (n.clone(), s)
        })
        .collect();
    let pts: Vec<&(f64, f64)> = series.iter().flat_map(|(_, s)| s).collect();
    if let Some((n, p)) = series.iter().find_map(|(n, s)| {
        Some((
            n,
            s.iter()
                .find(|p| p.0.abs().max(p.1.abs()) > MAX_PLOTTABLE)?,
        ))
    }) {
        anyhow::bail!(
            "{}: `{n}` has the point ({}, {}), beyond the plottable ±{MAX_PLOTTABLE:e}",
            path.display(),
            p.0,
            p.1
        );
    }
    let (x0, x1) = pts
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let (y0, y1) = pts
        .iter()
        .map(|p| (p.1, p.1))
        .chain(bands.iter().flatten().map(|b| (b.1, b.2)))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (lo, hi)| {
            (a.min(lo), b.max(hi))
        });
    let (x0, x1) = if x0.is_finite() {
        (x0, x1.max(x0 + 1.0))
    } else {
        (0.0, 1.0)
    };
    let pad = ((y1 - y0).abs() * 0.05).max(1e-3);
    let (y0, y1) = if y0.is_finite() {
        (y0 - pad, y1 + pad)
    } else {
        (0.0, 1.0)
    };
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, band) in bands.iter().enumerate().filter(|(_, b)| b.len() > 1) {
        let outline: Vec<(f64, f64)> = band
            .iter()
            .map(|b| (b.0, b.2))
            .chain(band.iter().rev().map(|b| (b.0, b.1)))
            .collect();
        let c = Palette99::pick(i).mix(0.18);
        chart
            .draw_series(std::iter::once(Polygon::new(outline, c.filled())))
            .map_err(|e| err(&e))?;
    }
    for (i, (name, s)) in series.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.iter().copied(), c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// A curve of the GRPO steps: its name and how to read it off a step's record (a typed field,
/// so a misspelt metric does not compile).
type Column = (&'static str, fn(&StepReport) -> Option<f64>);

/// length.png, accuracy.png, reward.png and gamma_l.png from a run's metrics.jsonl. A file
/// with no GRPO line is an error saying so (nothing would be drawn).
pub fn plot_run(metrics: &Path, out_dir: &Path) -> Result<Vec<PathBuf>> {
    let steps = crate::report::read_steps(metrics)?;
    if steps.is_empty() {
        anyhow::bail!(
            "{}: no GRPO lines (\"phase\": \"grpo\"), nothing to plot",
            metrics.display()
        );
    }
    let charts: [(&str, &str, &str, Vec<Column>); 4] = [
        (
            "length.png",
            "Mean completion length",
            "tokens",
            vec![
                ("len_mean", |s| s.len_mean),
                ("len_correct", |s| s.len_correct),
                ("len_incorrect", |s| s.len_incorrect),
            ],
        ),
        (
            "accuracy.png",
            "Rollout accuracy",
            "accuracy",
            vec![("accuracy", |s| Some(s.accuracy))],
        ),
        (
            "reward.png",
            "Mean shaped reward",
            "reward",
            vec![("reward", |s| Some(s.reward))],
        ),
        (
            "gamma_l.png",
            "Length control rate γ_ℓ (−1: gate off)",
            "γ_ℓ",
            vec![("gamma_l", |s| s.diagnostic("gamma_l"))],
        ),
    ];
    let mut out = vec![];
    for (file, title, y, columns) in charts {
        let series: Vec<(String, Series)> = columns
            .iter()
            .map(|(name, get)| {
                let pts = steps
                    .iter()
                    .filter_map(|s| Some((s.step as f64, get(s)?)))
                    .collect();
                (name.to_string(), pts)
            })
            .filter(|(_, s): &(String, Series)| !s.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let path = out_dir.join(file);
        line_chart(&path, title, "step", y, &series)
            .with_context(|| format!("writing {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}
