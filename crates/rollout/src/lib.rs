//! terse-rollout: G completions per prompt from a `terse_model::Qwen3`, batched through its KV
//! cache, with exact seeded sampling and Step-GRPO's dynamic truncated rollout.
//!
//! Data flow: prompts (token ids with stable ids) -> [`generate`] -> [`Sample`]s (tokens,
//! sampled mask, sampler log-probs, finish reason, Step-GRPO records) -> the trainer scores them.

pub mod engine;
pub mod sampling;
pub mod step_exit;

pub use engine::{
    generate, greedy, greedy_no_cache, Detokenizer, Finish, GenParams, KvCacheDtype, Prompt, Sample,
};
pub use sampling::{sample_row, sample_stream, SamplingParams};
pub use step_exit::{confidence, ConfidencePolicy, StepExit};
