//! Advantage estimators over shaped rewards (docs/methods.md, Advantage estimators): GRPO (group mean/std), Dr.GRPO (mean
//! only), RLOO (leave-one-out mean) and REINFORCE++ (token-weighted whitening over the batch).
//! GRPO's std can be the step's (DLER, `norm = "batch"`, batch_norm.rs) and its advantages
//! reweighted by the group's difficulty (GRPO-LEAD, `difficulty`, lead.rs).
//! Unscorable samples get advantage 0 and do not enter any statistic. A group (or, for
//! REINFORCE++, a batch) whose scorable rewards are all equal gets exactly 0 whatever `eps` is
//! (docs/methods.md, Advantage estimators): with `eps = 0` the float noise of the mean would otherwise be divided by the
//! float noise of the std. A zero denominator gives 0, never NaN.

use crate::batch_norm::{batch_std, Norm};
use crate::lead::{accuracy_of_scorable, DifficultyWeight};
use crate::types::{mean, std, Group, RewardError, Shaped};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "estimator", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Advantage {
    /// (r − mean) / (std + ε); `std = false` skips the division. Singleton groups: mean 0 and
    /// std 1 (verl), so r / (1 + ε), or r itself when `std = false`. Built with
    /// [`Advantage::grpo`] (the variant may gain fields without breaking callers).
    #[non_exhaustive]
    Grpo {
        std: bool,
        ddof: usize,
        eps: f64,
        /// Whose std divides: "group" (GRPO) or "batch" (DLER: the std of every sample's
        /// group-centred reward over the step; a singleton group's r is divided by it too).
        #[serde(default)]
        norm: Norm,
        /// GRPO-LEAD's difficulty weights `{ a, b, rho0, k }` on the advantages; absent = off.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        difficulty: Option<DifficultyWeight>,
    },
    /// r − mean (no std normalisation, Liu et al.).
    DrGrpo,
    /// r_i − mean_{j≠i} r_j.
    Rloo,
    /// Outcome reward whitened over all tokens of the batch (γ = 1): each sample weighs its length.
    ReinforcePp { eps: f64 },
}

impl Default for Advantage {
    fn default() -> Self {
        Advantage::grpo(true, 1, 1e-6)
    }
}

impl Advantage {
    /// GRPO's estimator, divided by the group's std (`ddof` its degrees of freedom, `eps` added)
    /// or not (`std = false`), without difficulty weights: how code outside this crate builds
    /// the variant. Set the rest on the result: `if let Advantage::Grpo { norm, .. } = &mut a`.
    pub fn grpo(std: bool, ddof: usize, eps: f64) -> Self {
        Advantage::Grpo {
            std,
            ddof,
            eps,
            norm: Norm::Group,
            difficulty: None,
        }
    }
}

/// Per-sample advantages and how many groups carried no signal.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Advantages {
    pub values: Vec<Vec<f64>>,
    /// Groups whose scorable rewards are all equal (zero advantage under group estimators).
    pub zero_std_groups: usize,
}

impl Advantage {
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Advantage::Grpo {
                std: use_std,
                ddof,
                eps,
                norm,
                difficulty,
            } => {
                if ddof > 1 {
                    return Err(format!("advantage.ddof must be 0 or 1, got {ddof}"));
                }
                if !(eps >= 0.0 && eps.is_finite()) {
                    return Err(format!(
                        "advantage.eps must be a finite number >= 0, got {eps}"
                    ));
                }
                if norm == Norm::Batch && !use_std {
                    return Err(
                        "advantage.norm = \"batch\" needs advantage.std = true (it replaces the group's std by the step's), got std = false".into(),
                    );
                }
                if let Some(w) = difficulty {
                    w.validate()?;
                }
            }
            Advantage::ReinforcePp { eps } if !(eps >= 0.0 && eps.is_finite()) => {
                return Err(format!(
                    "advantage.eps must be a finite number >= 0, got {eps}"
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Advantages indexed like `groups`. Errors when `shaped` does not have one reward per
    /// sample of every group (a custom shaper's output is checked here, not trusted).
    pub fn compute(&self, groups: &[Group], shaped: &Shaped) -> Result<Advantages, RewardError> {
        check_shape(groups, shaped)?;
        // DLER: one std for the whole step, computed before any group's advantages.
        let step_std = match *self {
            Advantage::Grpo {
                std: true,
                ddof,
                norm: Norm::Batch,
                ..
            } => Some(batch_std(groups, shaped, ddof)),
            _ => None,
        };
        let mut zero_std_groups = 0;
        let mut values: Vec<Vec<f64>> = groups.iter().map(|g| vec![0.0; g.samples.len()]).collect();
        let scorable = |g: &Group, r: &[f64]| -> (Vec<usize>, Vec<f64>) {
            g.samples
                .iter()
                .enumerate()
                .filter(|(_, s)| s.scorable)
                .map(|(i, _)| (i, r[i]))
                .unzip()
        };
        for (k, (g, r)) in groups.iter().zip(&shaped.rewards).enumerate() {
            let (idx, rs) = scorable(g, r);
            let all_equal = rs.len() > 1 && rs.iter().all(|x| *x == rs[0]);
            if all_equal {
                zero_std_groups += 1;
            }
            let m = mean(&rs);
            let adv: Vec<f64> = match *self {
                _ if all_equal && !matches!(self, Advantage::ReinforcePp { .. }) => {
                    vec![0.0; rs.len()]
                }
                Advantage::Grpo {
                    std: use_std,
                    ddof,
                    eps,
                    difficulty,
                    ..
                } => {
                    let adv: Vec<f64> = if let (1, Some(sd)) = (rs.len(), step_std) {
                        // verl's singleton mean 0, over the step's std.
                        vec![safe_div(rs[0], sd + eps)]
                    } else if rs.len() == 1 {
                        // verl: a singleton group has mean 0 and std 1; no std, no division.
                        vec![if use_std { rs[0] / (1.0 + eps) } else { rs[0] }]
                    } else if use_std {
                        let sd = step_std.unwrap_or_else(|| std(&rs, ddof));
                        rs.iter().map(|x| safe_div(x - m, sd + eps)).collect()
                    } else {
                        rs.iter().map(|x| x - m).collect()
                    };
                    match difficulty {
                        Some(w) => {
                            let rho = accuracy_of_scorable(g);
                            adv.into_iter().map(|a| w.apply(a, rho)).collect()
                        }
                        None => adv,
                    }
                }
                Advantage::DrGrpo => rs.iter().map(|x| x - m).collect(),
                Advantage::Rloo => {
                    let n = rs.len() as f64;
                    if rs.len() < 2 {
                        vec![0.0; rs.len()]
                    } else {
                        let sum: f64 = rs.iter().sum();
                        rs.iter().map(|x| x - (sum - x) / (n - 1.0)).collect()
                    }
                }
                Advantage::ReinforcePp { .. } => rs.clone(),
            };
            for (i, a) in idx.into_iter().zip(adv) {
                values[k][i] = a;
            }
        }
        if let Advantage::ReinforcePp { eps } = *self {
            // verl masked_whiten over tokens: each sample's return repeats on its L tokens.
            let scored: Vec<f64> = groups
                .iter()
                .zip(&values)
                .flat_map(|(g, v)| g.samples.iter().zip(v).filter(|(s, _)| s.scorable))
                .map(|(_, x)| *x)
                .collect();
            if scored.iter().all(|x| *x == scored[0]) {
                // One value over the whole batch: nothing to whiten.
                return Ok(Advantages {
                    values: groups.iter().map(|g| vec![0.0; g.samples.len()]).collect(),
                    zero_std_groups,
                });
            }
            let (mut w, mut s1) = (0.0, 0.0);
            for (g, v) in groups.iter().zip(&values) {
                for (s, x) in g.samples.iter().zip(v).filter(|(s, _)| s.scorable) {
                    w += s.len.max(1) as f64;
                    s1 += s.len.max(1) as f64 * x;
                }
            }
            let m = if w > 0.0 { s1 / w } else { 0.0 };
            let mut ss = 0.0;
            for (g, v) in groups.iter().zip(&values) {
                for (s, x) in g.samples.iter().zip(v).filter(|(s, _)| s.scorable) {
                    ss += s.len.max(1) as f64 * (x - m) * (x - m);
                }
            }
            // Unbiased token variance, as torch's masked_var.
            let var = if w > 1.0 { ss / (w - 1.0) } else { 0.0 };
            for (g, v) in groups.iter().zip(values.iter_mut()) {
                for (s, x) in g.samples.iter().zip(v.iter_mut()) {
                    *x = if s.scorable {
                        safe_div(*x - m, (var + eps).sqrt())
                    } else {
                        0.0
                    };
                }
            }
        }
        Ok(Advantages {
            values,
            zero_std_groups,
        })
    }
}

/// How shaped rewards become advantages: the built-in estimators ([`Advantage`], the TOML
/// face) and research code's own (a closure `Fn(&[Group], &Shaped) -> Vec<Vec<f64>>` works;
/// its output is checked to have one value per sample).
pub trait AdvantageEstimator {
    fn estimate(&self, groups: &[Group], shaped: &Shaped) -> Result<Advantages, RewardError>;
}

impl AdvantageEstimator for Advantage {
    fn estimate(&self, groups: &[Group], shaped: &Shaped) -> Result<Advantages, RewardError> {
        self.compute(groups, shaped)
    }
}

impl<F: Fn(&[Group], &Shaped) -> Vec<Vec<f64>>> AdvantageEstimator for F {
    fn estimate(&self, groups: &[Group], shaped: &Shaped) -> Result<Advantages, RewardError> {
        check_shape(groups, shaped)?;
        let values = self(groups, shaped);
        let as_shaped = Shaped {
            rewards: values,
            ..Default::default()
        };
        check_shape(groups, &as_shaped)?;
        let zero_std_groups = shaped
            .rewards
            .iter()
            .filter(|r| r.len() > 1 && r.iter().all(|x| *x == r[0]))
            .count();
        Ok(Advantages {
            values: as_shaped.rewards,
            zero_std_groups,
        })
    }
}

/// x / d, or 0 when d is 0 (an `eps = 0` group whose std underflows): never NaN.
fn safe_div(x: f64, d: f64) -> f64 {
    if d > 0.0 {
        x / d
    } else {
        0.0
    }
}

/// One reward per sample of every group, or an error naming the first mismatch.
pub fn check_shape(groups: &[Group], shaped: &Shaped) -> Result<(), RewardError> {
    if shaped.rewards.len() != groups.len() {
        return Err(RewardError(format!(
            "shaper returned rewards for {} groups, the batch has {}",
            shaped.rewards.len(),
            groups.len()
        )));
    }
    for (g, r) in groups.iter().zip(&shaped.rewards) {
        if r.len() != g.samples.len() {
            return Err(RewardError(format!(
                "shaper returned {} rewards for prompt {}, which has {} samples",
                r.len(),
                g.prompt_id,
                g.samples.len()
            )));
        }
    }
    Ok(())
}
