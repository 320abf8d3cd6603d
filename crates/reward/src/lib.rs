//! terse-reward: outcomes and lengths in, shaped rewards and advantages out. Pure functions, no
//! tensors, no IO: every formula, default and edge case is written down, with its paper, in docs/methods.md.
//!
//! Data flow: `Group`s (one per prompt, G `SampleStat`s) -> [`RewardConfig::shape`] (with
//! [`ShaperState`] for Short-RL's acc_max and LASER-D's targets) -> [`Shaped`] -> [`Advantage::compute`].
//!
//! Research code plugs in its own shaper through [`LengthShaper`] (a closure works), its own
//! verifier through [`RewardFn`] (its verdict: [`Outcome`]) and TRL-shaped weighted rewards
//! through [`CompletionReward`]:
//!
//! ```
//! use terse_reward::{Advantage, Group, LengthShaper, Outcome, RewardFn, SampleStat, Shaped, StepCtx};
//!
//! // A custom shaper: −0.001 per token on correct answers only.
//! let mut mine = |groups: &[Group], _ctx: &StepCtx| Shaped {
//!     rewards: groups
//!         .iter()
//!         .map(|g| g.samples.iter().map(|s| s.base_reward - if s.correct { 0.001 * s.len as f64 } else { 0.0 }).collect())
//!         .collect(),
//!     ..Default::default()
//! };
//! // A custom verifier: exact match of the last line.
//! let exact = |completion: &str, answer: &str| Outcome {
//!     correct: completion.lines().last() == Some(answer),
//!     base_reward: f64::from(u8::from(completion.lines().last() == Some(answer))),
//!     format_ok: true,
//!     ..Default::default()
//! };
//! let o = exact.score("thinking...\n42", "42");
//! let groups = vec![Group::new(0, vec![SampleStat::new(100, o.correct, o.base_reward), SampleStat::new(300, true, 1.0)])];
//! let shaped = mine.shape(&groups, &StepCtx::default()).unwrap();
//! let adv = Advantage::default().compute(&groups, &shaped).unwrap();
//! assert!(adv.values[0][0] > adv.values[0][1]); // the shorter correct answer is preferred
//! ```

pub mod advantage;
pub mod baselines;
pub mod batch_norm;
pub mod care;
pub mod gfpo;
pub mod grpo_lambda;
pub mod laser;
pub mod lead;
pub mod metrics;
pub mod shaper;
pub mod short_rl;
pub mod step_grpo;
pub mod types;
mod verdict;

pub use advantage::{Advantage, AdvantageEstimator, Advantages};
pub use batch_norm::Norm;
pub use shaper::{
    shape_scorable, BuiltinShaper, LengthShaper, Method, RewardConfig, RewardError, ShaperState,
};
pub use types::{Group, SampleStat, Shaped, StepCtx};
pub use verdict::{combined_base_reward, CompletionReward, Outcome, RewardFn, ScoreFault};

#[cfg(test)]
mod batch_norm_tests;
#[cfg(test)]
#[path = "edge_case_tests.rs"]
mod edge_cases;
#[cfg(test)]
#[path = "prop_tests.rs"]
mod proptests;
#[cfg(test)]
#[path = "regression_tests.rs"]
mod regressions;
#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
