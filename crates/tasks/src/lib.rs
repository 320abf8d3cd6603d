//! terse-tasks: prompts with checkable answers and their verifiers. Pure: no tensors, no IO.
//!
//! Data flow: a generator or dataset row -> prompt text + reference answer -> (rollout) ->
//! completion text -> a scorer here -> `Outcome`-like verdicts the reward crate shapes.
//!
//! Modules: [`kk`] (Knights & Knaves), [`math`] (answer extraction, equivalence, scorers),
//! [`template`] (chat templates via minijinja, plain templates), [`dataset`] (JSONL/Parquet
//! loading) and [`testbed`] (the CPU testbed task, its teacher, verifier and model recipe).

pub mod dataset;
pub mod kk;
pub mod math;
pub mod template;
pub mod testbed;

#[cfg(test)]
mod proptests;
