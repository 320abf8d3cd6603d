//! terse-tasks: prompts with checkable answers and their verifiers. Pure: no tensors, no IO.
//!
//! Data flow: a generator or dataset row -> prompt text + reference answer -> (rollout) ->
//! completion text -> a scorer here -> `Outcome`-like verdicts the reward crate shapes.
//!
//! Present: Knights & Knaves ([`kk`]) and math answers ([`math`]). Datasets (JSONL/Parquet),
//! chat templates and the CPU testbed are not written yet.

pub mod dataset;
pub mod kk;
pub mod math;
pub mod template;
pub mod testbed;

#[cfg(test)]
mod proptests;
