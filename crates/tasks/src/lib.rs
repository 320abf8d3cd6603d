//! terse-tasks: prompts with checkable answers and their verifiers. Pure: no tensors, no IO.
//!
//! Data flow: a generator or dataset row -> prompt text + reference answer -> (rollout) ->
//! completion text -> a scorer here -> `Outcome`-like verdicts the reward crate shapes.
//!
//! Modules: [`kk`] (Knights & Knaves), [`math`] (answer extraction, equivalence, scorers),
//! [`template`] (chat templates via minijinja, plain templates), [`dataset`] (JSONL/Parquet
//! loading), [`bench`] (the published layouts of the math benchmarks) and [`testbed`] (the CPU
//! testbed task, its teacher, verifier and model recipe).

pub mod bench;
pub mod dataset;
pub mod kk;
pub mod math;
pub mod template;
pub mod testbed;

/// The message of a caught panic (`catch_unwind`'s payload): its text, or "a non-text panic".
/// Parsers here and in the trainer catch the panics of the crates they call (parquet,
/// tokenizers, minijinja) and of research code's scorers, and report them in one line.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".into())
}

#[cfg(test)]
#[path = "prop_tests.rs"]
mod proptests;
