//! DLER's batch-wise reward normalisation (docs/methods.md, Advantage estimators and DLER; arXiv
//! 2510.15110): GRPO's group-mean-centred rewards divided by one standard deviation taken over
//! the whole step instead of each group's own, `advantage.norm = "batch"`. A group whose
//! rewards barely differ (a strict truncation makes many such) no longer has its noise blown
//! up by a tiny group std. Used by `Advantage::compute`; a pure function of the step's groups.

use crate::types::{mean, std, Group, Shaped};
use serde::{Deserialize, Serialize};

/// Whose standard deviation divides GRPO's centred rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// The group's own (GRPO).
    #[default]
    Group,
    /// The step's: every scorable sample's reward minus its group's mean (DLER).
    Batch,
}

/// Every scorable sample's reward minus its group's mean, over the step, in group order. A
/// group whose scorable rewards are all equal contributes exact zeros (its mean's float noise
/// would otherwise enter the std); a one-sample group contributes its reward (verl's mean 0).
pub fn centred(groups: &[Group], shaped: &Shaped) -> Vec<f64> {
    let mut out = vec![];
    for (g, r) in groups.iter().zip(&shaped.rewards) {
        let rs: Vec<f64> = g
            .samples
            .iter()
            .zip(r)
            .filter(|(s, _)| s.scorable)
            .map(|(_, x)| *x)
            .collect();
        let m = match rs.len() {
            1 => 0.0,
            _ => mean(&rs),
        };
        let all_equal = rs.len() > 1 && rs.iter().all(|x| *x == rs[0]);
        out.extend(rs.iter().map(|x| if all_equal { 0.0 } else { x - m }));
    }
    out
}

/// The step's standard deviation of the centred rewards, with `ddof` (0 when undefined).
pub fn batch_std(groups: &[Group], shaped: &Shaped, ddof: usize) -> f64 {
    std(&centred(groups, shaped), ddof)
}
