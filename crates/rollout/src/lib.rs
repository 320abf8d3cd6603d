//! terse-rollout: G completions per prompt from a `terse_model::Qwen3`, continuously batched
//! through a paged KV cache under a memory budget (prompt blocks shared by their samples,
//! preemption and recompute when memory runs out), with exact seeded sampling and Step-GRPO's
//! dynamic truncated rollout.
//!
//! Data flow: prompts (token ids with stable ids) -> [`generate`] -> [`Sample`]s (tokens,
//! sampled mask, sampler log-probs, finish reason, Step-GRPO records) -> the trainer scores them.

mod draw;
pub mod engine;
pub mod paging;
pub mod sampling;
mod scheduler;
mod step;
pub mod step_exit;
pub mod types;

pub use engine::{generate, generate_with_stats, greedy, greedy_no_cache};
pub use paging::{KvBudget, KvPaging};
pub use sampling::{sample_row, sample_stream, SamplingParams};
pub use step_exit::{confidence, ConfidencePolicy, StepExit};
pub use types::{Detokenizer, Finish, GenParams, KvCacheDtype, Prompt, RolloutStats, Sample};
