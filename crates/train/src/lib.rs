//! terse-train: the GRPO loop with length-aware rewards, the SFT warm-up before it, checkpoints,
//! metrics and evaluation. The library research code embeds: [`train`] runs a [`RunConfig`];
//! [`train_with`] takes your own shaper (any `FnMut(&[Group], &StepCtx) -> Shaped`).

pub mod batches;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod eval;
pub mod loss;
pub mod metrics;
pub mod plot;
pub mod run;

pub use config::RunConfig;
pub use run::{train, train_with, RunSummary, ShaperWithState};
