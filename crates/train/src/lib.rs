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
// registry of plug-ins, the study of finished runs.
pub mod config;
pub mod registry;
pub mod report;
pub mod study;
pub mod task;

// Everything else is the crate's own; what research code and the tools need is re-exported
// below.
pub(crate) mod batches;
pub(crate) mod builder;
pub(crate) mod checkpoint;
pub(crate) mod collect;
pub(crate) mod correction;
pub(crate) mod data;
pub(crate) mod dp;
pub(crate) mod eval;
pub(crate) mod eval_budget;
pub(crate) mod eval_metrics;
pub(crate) mod eval_protocol;
pub(crate) mod eval_table;
pub(crate) mod failure;
pub(crate) mod gspo;
pub(crate) mod handoff;
pub(crate) mod length_control;
pub(crate) mod load;
pub(crate) mod lock;
pub(crate) mod loss;
pub(crate) mod metrics;
pub(crate) mod observe;
pub(crate) mod plan;
pub(crate) mod plot;
pub(crate) mod ranks;
pub(crate) mod run;
pub(crate) mod score_fault;
pub(crate) mod sft;
pub(crate) mod start;
pub(crate) mod step_time;
pub(crate) mod tensorboard;
pub(crate) mod trainer;
pub(crate) mod update;
pub(crate) mod zero;

// The builder and what it takes and gives.
pub use builder::TrainerBuilder;
pub use collect::Collected;
pub use config::RunConfig;
pub use failure::SampleFault;
pub use observe::Observer;
pub use registry::{register_estimator, register_loss, register_shaper};
pub use report::{MetricsLine, StepReport, Timing};
pub use run::{train, RunSummary};
pub use sft::sft_only;
pub use trainer::{GrpoTrainer, Scored};
pub use update::UpdateStats;

/// The pieces of one step, for research code that calls them alone: micro-batches and
/// log-probs, the policy losses, the data-parallel gradient sum, tokenizing.
pub mod step {
    pub use crate::batches::{gradients, logprobs, micro_batches, MicroBatching, Objective, Seq};
    pub use crate::data::sft_example;
    pub use crate::dp::all_reduce_grads;
    pub use crate::load::{encode, load_checkpoint_model, load_tokenizer};
    pub use crate::loss::{agg_weights, LossInputs, LossStats, PolicyLoss, PpoParams};
    pub use crate::update::sequences;
}

/// What a run leaves on disk and the tools that read it: checkpoints, the run lock, the
/// metrics file's writer, TensorBoard event files, plots.
pub mod records {
    pub use crate::checkpoint::{
        checkpoints_newest_first, export_lora, first_non_finite_weight, last_good, read_state,
        step_name,
    };
    pub use crate::lock::RunLock;
    pub use crate::metrics::{MetricsWriter, Start};
    pub use crate::plot::{band_chart, line_chart, plot_run, Band, Series};
    pub use crate::tensorboard::{read_scalars, scalars_of};
}

/// The evaluation `xtask eval` runs: the R1 protocol and budget sweeps, the metrics and the
/// printed tables.
pub mod evals {
    pub use crate::eval::EvalReport;
    pub use crate::eval_metrics::AesWeights;
    pub use crate::eval_protocol::{run, EvalOptions, Protocol};
    pub use crate::eval_table::{json, markdown};
}

/// The memory plan and the step-time model (`xtask plan`, `bench-step`).
pub mod planning {
    pub use crate::plan::{activation_bytes, model_shape, plan, Target};
    pub use crate::step_time::{estimate, Assumptions};
}
