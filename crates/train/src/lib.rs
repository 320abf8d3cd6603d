//! terse-train: the GRPO loop with length-aware rewards, the SFT warm-up before it, checkpoints,
//! metrics and evaluation. The library research code embeds: [`train`] runs a [`RunConfig`];
//! [`Run`] is the one way to start a run with more: your own shaper (any
//! `FnMut(&[Group], &StepCtx) -> Shaped`), extra observers, data-parallel ranks.
//!
//! ```no_run
//! use terse_reward::{Group, Shaped, StepCtx};
//! use terse_train::RunConfig;
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
//! let summary = terse_train::Run::new(&cfg).shaper(Box::new(mine)).train()?;
//! println!("pass@1 {:.3}, mean tokens {:.1}", summary.after.accuracy, summary.after.len_mean);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod batches;
pub mod checkpoint;
pub mod collect;
pub mod config;
pub mod correction;
pub mod data;
pub mod dp;
pub mod eval;
pub(crate) mod eval_budget;
pub mod eval_metrics;
pub mod eval_protocol;
pub mod eval_table;
pub(crate) mod failure;
pub mod gspo;
pub mod handoff;
pub(crate) mod length_control;
pub mod load;
pub mod lock;
pub mod loss;
pub mod metrics;
pub mod observe;
pub mod plan;
pub mod plot;
pub mod ranks;
pub mod registry;
pub mod report;
pub mod run;
pub(crate) mod score_fault;
pub mod sft;
pub mod shaper;
pub mod start;
pub mod step_time;
pub mod study;
pub mod task;
pub mod tensorboard;
pub mod trainer;
pub mod update;
pub mod zero;

pub use config::RunConfig;
pub use failure::SampleFault;
pub use observe::Observer;
pub use registry::{register_estimator, register_loss, register_shaper};
pub use report::{MetricsLine, StepReport};
pub use run::{train, Run, RunSummary};
pub use sft::sft_only;
pub use trainer::TrainerBuilder;
pub use trainer::{GrpoTrainer, ShaperWithState};
