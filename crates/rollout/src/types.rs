//! The rollout's types, what its parts pass between them: prompts in (`Prompt`), the settings
//! (`GenParams`, `KvCacheDtype`), samples out (`Sample`, `Finish`), a sample being generated
//! (`Row`: its output so far and its random stream), what a rollout used (`RolloutStats`), and
//! the `Detokenizer` stop strings and triggers read through.

use crate::paging::KvPaging;
use crate::sampling::SamplingParams;
use crate::step_exit::StepExit;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Turns token ids into text, for stop strings and trigger words. Any `Fn(&[u32]) -> String`
/// works; the trainer passes its tokenizer.
pub trait Detokenizer {
    fn decode(&self, ids: &[u32]) -> String;
}

impl<F: Fn(&[u32]) -> String> Detokenizer for F {
    fn decode(&self, ids: &[u32]) -> String {
        self(ids)
    }
}

/// A prompt with a stable id: the id (not the batch position) keys the samples' random streams.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub id: u64,
    pub tokens: Vec<u32>,
}

/// How a rollout generates. Built with [`GenParams::new`] and field assignment (the type may
/// gain fields without breaking callers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GenParams {
    #[serde(default)]
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    /// Generation stops after sampling any of these (the EOS token is kept in the completion).
    pub eos_ids: Vec<u32>,
    #[serde(default)]
    pub stop_strings: Vec<String>,
    /// Padding id for left-padded prefill.
    #[serde(default)]
    pub pad_id: u32,
    /// Step-GRPO dynamic truncated rollout; None = plain sampling.
    #[serde(default)]
    pub step_exit: Option<StepExit>,
    /// What the KV cache stores.
    #[serde(default)]
    pub kv_cache: KvCacheDtype,
    /// The paged cache's block size and memory budget, and how many sequences run at once.
    #[serde(default)]
    pub paging: KvPaging,
}

impl GenParams {
    /// Up to `max_new_tokens` per completion with the default sampling (temperature 1), no stop
    /// ids or strings, pad id 0, no Step-GRPO exit, the KV cache in the model's dtype and the
    /// default paging.
    pub fn new(max_new_tokens: usize) -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_new_tokens,
            eos_ids: vec![],
            stop_strings: vec![],
            pad_id: 0,
            step_exit: None,
            kv_cache: KvCacheDtype::default(),
            paging: KvPaging::default(),
        }
    }
}

/// What the KV cache stores during generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheDtype {
    /// The model's compute dtype: the sampler's logits are the trainer's (exact sampling).
    #[default]
    Model,
    /// f16: half the bytes each decode step reads, so long contexts decode faster; K and V
    /// are rounded, so the sampler's log-probs (the PPO ratio's old policy) drift slightly from
    /// the trainer's (the `logp_gap` metric shows by how much).
    F16,
}

/// Why a sample stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    Eos,
    Stop,
    Length,
    /// Step-GRPO exit: path ⊕ induction ⊕ trial answer ⊕ close.
    EarlyExit,
}

/// One completion of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub prompt_id: u64,
    pub index: usize,
    /// Completion tokens (prompt excluded), injected ones included.
    pub tokens: Vec<u32>,
    /// True for tokens the policy produced (sampled, or the greedy trial answer); false for
    /// injected induction/close tokens, which the loss must mask.
    pub sampled: Vec<bool>,
    /// log-prob under the distribution actually sampled from (0 for injected tokens).
    pub logp_sampled: Vec<f32>,
    /// log-prob under the plain temperature-scaled softmax (0 for injected tokens).
    pub logp_plain: Vec<f32>,
    pub finish: Finish,
    /// Step-GRPO: trial answers tried, and the judge step / path length at which it exited.
    pub judge_count: usize,
    pub exit_step: Option<usize>,
    pub exit_token: Option<usize>,
    /// Sum of the plain softmax's entropy over the tokens the sampler drew (not the injected
    /// or greedy trial-answer ones); divide by `entropy_tokens` for the mean.
    pub entropy_sum: f64,
    pub entropy_tokens: usize,
}

impl Sample {
    /// Length as the rewards count it: policy-produced tokens only (docs/methods.md, Notation, Step-GRPO).
    pub fn len(&self) -> usize {
        self.sampled.iter().filter(|s| **s).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn push(&mut self, token: u32, sampled: bool, lp_s: f32, lp_p: f32) {
        self.tokens.push(token);
        self.sampled.push(sampled);
        self.logp_sampled.push(lp_s);
        self.logp_plain.push(lp_p);
    }
}

pub(crate) struct Row {
    pub out: Sample,
    pub rng: ChaCha8Rng,
}

impl Row {
    pub(crate) fn new(prompt_id: u64, index: usize, rng: ChaCha8Rng) -> Self {
        Row {
            out: Sample {
                prompt_id,
                index,
                tokens: vec![],
                sampled: vec![],
                logp_sampled: vec![],
                logp_plain: vec![],
                finish: Finish::Length,
                judge_count: 0,
                exit_step: None,
                exit_token: None,
                entropy_sum: 0.0,
                entropy_tokens: 0,
            },
            rng,
        }
    }
}

/// What one rollout used: steps, preemptions and the KV pool's size and peak.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutStats {
    /// Batched forwards (each feeds every running sequence one token or one prefill chunk).
    pub steps: usize,
    /// Sequences preempted for memory (and recomputed later).
    pub preemptions: usize,
    /// Prompt prefixes evicted for memory (re-prefilled by their next sample).
    pub evictions: usize,
    /// Blocks in the pool, and the most in use at once.
    pub pool_blocks: usize,
    pub peak_blocks: usize,
    /// Bytes of one block (all layers, K and V) and tokens per block.
    pub block_bytes: usize,
    pub block_size: usize,
}

impl RolloutStats {
    /// Peak K/V memory in use, bytes.
    pub fn peak_bytes(&self) -> usize {
        self.peak_blocks * self.block_bytes
    }
}
