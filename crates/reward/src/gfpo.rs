//! GFPO's group filter (docs/methods.md, GFPO; arXiv 2508.09726): of the G' completions sampled for
//! a prompt, keep the k best by length (shortest) or by reward per token, and train on those alone.
//! A pure function of one group; the trainer (crates/train/src/step/length_control.rs) marks the
//! others unscorable between scoring and shaping, so the shaper and the advantage estimator never
//! see them and the loss leaves them out.

use crate::types::Group;
use serde::{Deserialize, Serialize};

/// What GFPO ranks a group's completions by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GfpoMetric {
    /// Shortest first.
    #[default]
    Length,
    /// Highest reward / length first ("token efficiency"); ties shortest first.
    RewardPerToken,
}

/// A completion's token efficiency: its reward over its length (a length of 0 counts as 1).
pub fn reward_per_token(reward: f64, len: usize) -> f64 {
    reward / len.max(1) as f64
}

/// Which samples of `g` GFPO keeps: the `keep` best scorable ones by `metric`, the rest (and
/// every unscorable sample) false. The reward is the sample's `base_reward`, what the filter
/// sees before shaping. Equal keys keep the lower sample index: the samples of a group are
/// independent draws, so their index order is itself random (no seeded stream needed).
/// A group with at most `keep` scorable samples keeps them all.
pub fn keep_mask(g: &Group, keep: usize, metric: GfpoMetric) -> Vec<bool> {
    let mut order: Vec<usize> = (0..g.samples.len())
        .filter(|&i| g.samples[i].scorable)
        .collect();
    let key = |i: usize| {
        let s = &g.samples[i];
        (reward_per_token(s.base_reward, s.len), s.len)
    };
    order.sort_by(|&a, &b| {
        let ((ea, la), (eb, lb)) = (key(a), key(b));
        let by_metric = match metric {
            GfpoMetric::Length => la.cmp(&lb),
            GfpoMetric::RewardPerToken => eb.total_cmp(&ea).then(la.cmp(&lb)),
        };
        // The index breaks ties: the order is total and reproducible.
        by_metric.then(a.cmp(&b))
    });
    let mut mask = vec![false; g.samples.len()];
    for &i in order.iter().take(keep) {
        mask[i] = true;
    }
    mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::group;
    use crate::SampleStat;

    fn g01(lens: &[usize], right: &[bool]) -> Group {
        let mut g = group(lens, right);
        for s in &mut g.samples {
            s.base_reward = f64::from(u8::from(s.correct));
        }
        g
    }

    #[test]
    fn length_keeps_the_shortest_k() {
        // Lengths 30 10 50 20 40 60, keep 3: 10 (1), 20 (3), 30 (0).
        let g = g01(&[30, 10, 50, 20, 40, 60], &[true; 6]);
        assert_eq!(
            keep_mask(&g, 3, GfpoMetric::Length),
            [true, true, false, true, false, false]
        );
    }

    #[test]
    fn reward_per_token_prefers_short_right_answers() {
        // Rewards / lengths: 1/30 = 0.0333, 0/10 = 0, 1/50 = 0.02, 1/20 = 0.05, 0/40 = 0,
        // 1/60 = 0.0167. Keep 3: 0.05 (3), 0.0333 (0), 0.02 (2).
        let g = g01(
            &[30, 10, 50, 20, 40, 60],
            &[true, false, true, true, false, true],
        );
        assert_eq!(
            keep_mask(&g, 3, GfpoMetric::RewardPerToken),
            [true, false, true, true, false, false]
        );
        // Keep 5: then 1/60 (5), and among the two 0s the shorter (1, length 10).
        assert_eq!(
            keep_mask(&g, 5, GfpoMetric::RewardPerToken),
            [true, true, true, true, false, true]
        );
        // Negative rewards rank by their ratio too: −1/10 = −0.1 is below −1/40 = −0.025.
        let mut neg = g01(&[10, 40], &[false, false]);
        for s in &mut neg.samples {
            s.base_reward = -1.0;
        }
        assert_eq!(
            keep_mask(&neg, 1, GfpoMetric::RewardPerToken),
            [false, true]
        );
    }

    #[test]
    fn edge_cases_ties_small_groups_unscorable_and_truncation() {
        // Equal lengths: the lower indices win.
        let g = g01(&[7, 7, 7, 7], &[true, false, true, false]);
        assert_eq!(
            keep_mask(&g, 2, GfpoMetric::Length),
            [true, true, false, false]
        );
        // No right completion: reward per token is 0 for all, so the shortest are kept.
        let g = g01(&[9, 3, 6], &[false; 3]);
        assert_eq!(
            keep_mask(&g, 2, GfpoMetric::RewardPerToken),
            [false, true, true]
        );
        // One right completion: it is kept first whatever its length.
        let g = g01(&[90, 3, 6], &[true, false, false]);
        assert_eq!(
            keep_mask(&g, 1, GfpoMetric::RewardPerToken),
            [true, false, false]
        );
        // An unscorable sample is never kept, and a group with fewer scorable samples than k
        // keeps all of them.
        let mut g = g01(&[1, 2, 3], &[true; 3]);
        g.samples[0].scorable = false;
        assert_eq!(keep_mask(&g, 3, GfpoMetric::Length), [false, true, true]);
        // A truncated completion is ranked by its length and reward like any other (a long
        // one is dropped first by "length").
        let mut g = g01(&[5, 96, 7], &[true, true, true]);
        g.samples[1].truncated = true;
        assert_eq!(keep_mask(&g, 2, GfpoMetric::Length), [true, false, true]);
        assert!(keep_mask(&Group::new(0, vec![]), 2, GfpoMetric::Length).is_empty());
        let one = Group::new(0, vec![SampleStat::new(0, true, 1.0)]);
        assert_eq!(reward_per_token(1.0, 0), 1.0);
        assert_eq!(keep_mask(&one, 1, GfpoMetric::RewardPerToken), [true]);
    }
}
