//! What a verifier says of one completion, before any shaping: the one verdict type
//! ([`Outcome`]), why a completion may have none ([`ScoreFault`]), the verifier trait research
//! code's tasks implement ([`RewardFn`]) and TRL-shaped per-completion rewards
//! ([`CompletionReward`]) added to the verifier's base reward.
//!
//! Data flow: completion text -> `RewardFn` (+ weighted `CompletionReward`s) -> `SampleStat` ->
//! `Group`s -> the shaper (shaper.rs).

use crate::types::SampleStat;
use serde::{Deserialize, Serialize};

/// A verifier's verdict on one completion. An unparsable completion is a zero reward with a
/// reason, never an error.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub correct: bool,
    pub base_reward: f64,
    pub format_ok: bool,
    /// Why the completion scored as it did, when it was not plainly right.
    pub reason: Option<String>,
    /// Why the verdict is not the verifier's own, when it is not: counted per step
    /// (`verify_budget_exceeded`, `verify_panics` in metrics.jsonl).
    #[serde(default)]
    pub fault: Option<ScoreFault>,
}

/// Why a completion was scored without a verdict; either way it is not correct and the step
/// goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFault {
    /// The math verifier's budget refused the answer (`terse_tasks::math::Unverifiable`): it
    /// scores as a wrong answer (0 for the boxed rule, Short-RL's −0.5, EasyR1's accuracy 0).
    BudgetExceeded,
    /// The scorer panicked: correct = false, base reward 0, format_ok = false.
    Panicked,
}

/// A task's reward function: completion text + reference answer -> outcome. Implemented by the
/// tasks crate's verifiers and by any `Fn(&str, &str) -> Outcome` closure.
pub trait RewardFn: Send + Sync {
    fn score(&self, completion: &str, answer: &str) -> Outcome;
}

impl<F: Fn(&str, &str) -> Outcome + Send + Sync> RewardFn for F {
    fn score(&self, completion: &str, answer: &str) -> Outcome {
        self(completion, answer)
    }
}

/// A per-completion reward in TRL's shape (`reward_funcs`): the completion's text, the row's
/// reference answer and the completion's statistics in, a number out. The trainer adds
/// `weight x value` of each to the verifier's base reward before any shaping (see
/// [`combined_base_reward`]). Implemented by any `Fn(&str, &str, &SampleStat) -> f64` closure.
pub trait CompletionReward: Send + Sync {
    fn reward(&self, completion: &str, answer: &str, stat: &SampleStat) -> f64;
}

impl<F: Fn(&str, &str, &SampleStat) -> f64 + Send + Sync> CompletionReward for F {
    fn reward(&self, completion: &str, answer: &str, stat: &SampleStat) -> f64 {
        self(completion, answer, stat)
    }
}

/// TRL's `reward_funcs` + `reward_weights`, on top of the verifier: the base reward a shaper
/// sees is `stat.base_reward + sum_k w_k * f_k(completion, answer, stat)`, where `stat` is the
/// verifier's statistics of the completion (its base reward, correctness, length, steps,
/// truncation). Each function sees the verifier's statistics, not the other functions' sums,
/// so their order does not matter beyond float addition, which runs in the given order.
/// `correct` and `format_ok` stay the verifier's. With no functions the base reward is the
/// verifier's, bit for bit.
pub fn combined_base_reward(
    rewards: &[(std::sync::Arc<dyn CompletionReward>, f64)],
    completion: &str,
    answer: &str,
    stat: &SampleStat,
) -> f64 {
    rewards.iter().fold(stat.base_reward, |acc, (f, w)| {
        acc + w * f.reward(completion, answer, stat)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn weighted_rewards_add_to_the_verifier_s_base_reward() {
        let stat = SampleStat::new(40, true, 1.0);
        let none: Vec<(Arc<dyn CompletionReward>, f64)> = vec![];
        assert_eq!(combined_base_reward(&none, "x", "4", &stat), 1.0);
        let per_token = |_: &str, _: &str, s: &SampleStat| -(s.len as f64);
        let exact = |c: &str, a: &str, _: &SampleStat| f64::from(u8::from(c == a));
        let both: Vec<(Arc<dyn CompletionReward>, f64)> =
            vec![(Arc::new(per_token), 0.01), (Arc::new(exact), 0.5)];
        // 1 + 0.01 * (-40) + 0.5 * 1
        assert_eq!(
            combined_base_reward(&both, "4", "4", &stat),
            1.0 - 0.4 + 0.5
        );
        assert_eq!(combined_base_reward(&both, "5", "4", &stat), 1.0 - 0.4);
    }
}
