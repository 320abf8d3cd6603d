//! terse-train: the GRPO loop with length-aware rewards, the SFT warm-up before it, checkpoints,
//! metrics and evaluation. The library research code embeds, through this façade alone (every
//! module is the crate's own; docs/library.md lists what is public, and a test keeps the two
//! equal): [`train`] runs a [`RunConfig`]; [`GrpoTrainer::builder`] is the one way to assemble
//! a trainer with more (your task, TRL-shaped rewards with weights, shaper, estimator, loss,
//! observers, data-parallel ranks), ending in `.build()` (step by step) or `.run()` (a whole
//! run).
//!
//! ```no_run
//! use terse_reward::{Group, Shaped, StepCtx};
//! use terse_train::{GrpoTrainer, RunConfig};
//!
//! let mut cfg = RunConfig::from_file("configs/default.toml".as_ref())?;
//! cfg.run.name = "my-reward".into();
//! // A custom reward: the verifier's reward minus 0.01 per token, for correct answers only.
//! let mine = |groups: &[Group], _ctx: &StepCtx| Shaped {
//!     rewards: groups
//!         .iter()
//!         .map(|g| g.samples.iter().map(|s| s.base_reward - if s.correct { 0.01 * s.len as f64 } else { 0.0 }).collect())
//!         .collect(),
//!     ..Default::default()
//! };
//! let summary = GrpoTrainer::builder(cfg).shaper(Box::new(mine)).run()?.expect("one process");
//! println!("pass@1 {:.3}, mean tokens {:.1}", summary.after.accuracy, summary.after.len_mean);
//! # Ok::<(), anyhow::Error>(())
//! ```

// The façade's own modules: the run config, the records a run writes, the task, the
// registry of plug-ins. (The study of finished runs is its own crate, terse-study.)
pub mod config;
pub mod records;
pub mod registry;
pub mod report;
pub mod step;
pub mod task;

// Everything else is the crate's own; what research code and the tools need is re-exported
// below.
pub(crate) mod builder;
pub(crate) mod checkpoint;
pub(crate) mod data;
pub(crate) mod eval;
pub(crate) mod failure;
pub(crate) mod load;
pub(crate) mod phase;
pub(crate) mod plan;
pub(crate) mod run;

// The builder and what it takes and gives.
pub use builder::TrainerBuilder;
// What a run leaves on disk, for the tools that read it: checkpoints and the run lock.
pub use checkpoint::{
    checkpoints_newest_first, export_lora, first_non_finite_weight, last_good, read_state,
    step_name,
};
pub use config::RunConfig;
pub use failure::SampleFault;
pub use records::observe::Observer;
pub use registry::{register_estimator, register_loss, register_shaper};
pub use report::{MetricsLine, StepReport, Timing};
pub use run::lock::RunLock;
pub use run::run_loop::{train, RunSummary};
pub use run::sft::sft_only;
pub use step::collect::Collected;
pub use step::trainer::{GrpoTrainer, Scored};
pub use step::update::UpdateStats;

/// The evaluation `xtask eval` runs: the R1 protocol and budget sweeps, the metrics and the
/// printed tables.
pub mod evals {
    pub use crate::eval::metrics::AesWeights;
    pub use crate::eval::protocol::{run, EvalOptions, Protocol};
    pub use crate::eval::table::{json, markdown};
    pub use crate::report::EvalReport;
}

/// The memory plan and the step-time model (`xtask plan`, `bench-step`).
pub mod planning {
    pub use crate::plan::memory::{activation_bytes, model_shape, plan, Target};
    pub use crate::plan::step_time::{estimate, Assumptions};
}
