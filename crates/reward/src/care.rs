//! CARE (docs/methods.md, CARE): per question, compare the accuracy of the shorter and the longer half of the
//! group; reward length in the direction that helped: r = y + coef · d(q) · L / L_max.
//! Also the fixed-direction "short"/"long" proxies and the signal-stability analysis (docs/methods.md, CARE).

use crate::grpo_lambda::{tie_rng, TieBreak};
use crate::types::{mean, Group, Shaped, StepCtx};
use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Care {
    /// L_max: the maximum response length in training (6144 in the paper).
    pub l_max: usize,
    /// λ in r = y + λ·d·L/L_max.
    pub coef: f64,
    /// CARE-Magnitude: scale d by |ȳ_L − ȳ_S|.
    pub magnitude: bool,
    /// Fixed direction −1 ("short" proxy) or +1 ("long" proxy) instead of the contrast.
    pub fixed_direction: Option<i8>,
    /// Order of equal lengths at the split.
    pub tie_break: TieBreak,
}

impl Default for Care {
    fn default() -> Self {
        Self {
            l_max: 6144,
            coef: 1.0,
            magnitude: false,
            fixed_direction: None,
            tie_break: TieBreak::Seeded,
        }
    }
}

/// The direction d(q) ∈ {−1, 0, +1} and |ȳ_L − ȳ_S| of a group of (length, correct, tie key),
/// halves of ⌊G/2⌋ (an odd group's median is in neither).
pub fn direction(samples: &[(usize, bool, u64)]) -> (i8, f64) {
    let g = samples.len();
    let h = g / 2;
    if h == 0 {
        return (0, 0.0);
    }
    let mut idx: Vec<usize> = (0..g).collect();
    idx.sort_by_key(|&i| (samples[i].0, samples[i].2));
    let y = |i: &usize| f64::from(u8::from(samples[*i].1));
    let ys = mean(&idx[..h].iter().map(y).collect::<Vec<_>>());
    let yl = mean(&idx[g - h..].iter().map(y).collect::<Vec<_>>());
    let d = if ys > yl {
        -1
    } else if ys < yl {
        1
    } else {
        0
    };
    (d, (yl - ys).abs())
}

impl Care {
    pub fn validate(&self) -> Result<(), String> {
        if self.l_max == 0 {
            return Err("care.l_max must be > 0, got 0".into());
        }
        if !self.coef.is_finite() {
            return Err(format!("care.coef must be finite, got {}", self.coef));
        }
        if let Some(d) = self.fixed_direction {
            if d != -1 && d != 1 {
                return Err(format!("care.fixed_direction must be -1 or 1, got {d}"));
            }
        }
        Ok(())
    }

    fn keyed(&self, g: &Group, rng: &mut impl Rng) -> Vec<(usize, bool, u64)> {
        g.samples
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.len,
                    s.correct,
                    if self.tie_break == TieBreak::Seeded {
                        rng.random()
                    } else {
                        i as u64
                    },
                )
            })
            .collect()
    }

    pub fn shape(&self, groups: &[Group], ctx: &StepCtx) -> Shaped {
        let mut rng = tie_rng(ctx, 0x6361_7265);
        let mut dirs = Vec::with_capacity(groups.len());
        let rewards = groups
            .iter()
            .map(|g| {
                let (d, gap) = match self.fixed_direction {
                    Some(d) => (d, 1.0),
                    None => direction(&self.keyed(g, &mut rng)),
                };
                dirs.push(f64::from(d));
                let scale = self.coef * f64::from(d) * if self.magnitude { gap } else { 1.0 };
                g.samples
                    .iter()
                    .map(|s| {
                        f64::from(u8::from(s.correct))
                            + scale * (s.len as f64 / self.l_max as f64).min(1.0)
                    })
                    .collect()
            })
            .collect();
        let mut out = Shaped {
            rewards,
            ..Default::default()
        };
        out.diagnostics.insert("care_dir_mean".into(), mean(&dirs));
        out.diagnostics.insert(
            "care_dir_longer".into(),
            dirs.iter().filter(|&&d| d > 0.0).count() as f64,
        );
        out.diagnostics.insert(
            "care_dir_shorter".into(),
            dirs.iter().filter(|&&d| d < 0.0).count() as f64,
        );
        out
    }
}

/// Signal stability (docs/methods.md, CARE): subsample `g` of the group without replacement `draws` times and
/// report (exact agreement P[d_g = d_G], agreement restricted to d_G ≠ 0, or None when d_G = 0).
pub fn signal_stability(
    group: &Group,
    g: usize,
    draws: usize,
    rng: &mut impl Rng,
) -> (f64, Option<f64>) {
    let full: Vec<(usize, bool, u64)> = group
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| (s.len, s.correct, i as u64))
        .collect();
    let (d_full, _) = direction(&full);
    let mut agree = 0usize;
    for _ in 0..draws {
        let pick = rand::seq::index::sample(rng, full.len(), g.min(full.len()));
        let sub: Vec<_> = pick.iter().map(|i| full[i]).collect();
        agree += usize::from(direction(&sub).0 == d_full);
    }
    let p = agree as f64 / draws.max(1) as f64;
    (p, (d_full != 0).then_some(p))
}
