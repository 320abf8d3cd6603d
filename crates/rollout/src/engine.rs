//! The generation API: `generate` (G completions per prompt through the scheduler over the
//! paged KV cache), `generate_with_stats`, and the greedy references the tests compare with.
//!
//! Data flow: prompts -> `generate` -> scheduler.rs (step.rs per sequence) -> one `Sample` per
//! (prompt, g) with tokens, sampled mask, sampler log-probs, finish reason and Step-GRPO
//! records -> the trainer's scoring.

use crate::paging::KvPaging;
use crate::sampling::SamplingParams;
use crate::types::{Detokenizer, GenParams, KvCacheDtype, Prompt, RolloutStats, Sample};
use candle_core::{Device, Result, D};
use terse_model::{Batch, Padding, Qwen3};

/// Samples G completions for every prompt. Deterministic in (seed, prompt id, sample index).
pub fn generate(
    model: &Qwen3,
    prompts: &[Prompt],
    g: usize,
    params: &GenParams,
    seed: u64,
    detok: &dyn Detokenizer,
) -> Result<Vec<Sample>> {
    Ok(generate_with_stats(model, prompts, g, params, seed, detok)?.0)
}

/// `generate`, also saying what the rollout used (steps, preemptions, peak KV memory).
pub fn generate_with_stats(
    model: &Qwen3,
    prompts: &[Prompt],
    g: usize,
    params: &GenParams,
    seed: u64,
    detok: &dyn Detokenizer,
) -> Result<(Vec<Sample>, RolloutStats)> {
    let msg = candle_core::Error::Msg;
    params.sampling.validate().map_err(msg)?;
    params.paging.validate().map_err(msg)?;
    if let Some(se) = &params.step_exit {
        se.validate().map_err(msg)?;
        if se.induction_ids.is_empty() {
            return Err(msg(
                "step_exit.induction_ids is empty (call StepExit::resolve with a tokenizer)".into(),
            ));
        }
    }
    if prompts.is_empty() || g == 0 {
        return Ok((vec![], RolloutStats::default()));
    }
    // Positions past the model's context were never trained (and RoPE tables may end there):
    // a prompt must leave room for one token, and every row stops at the limit.
    let limit = model.config.max_position_embeddings;
    if let Some(p) = prompts.iter().find(|p| p.tokens.len() >= limit) {
        return Err(msg(format!(
            "prompt {} has {} tokens: no room for a completion within the model's max_position_embeddings ({limit})",
            p.id,
            p.tokens.len()
        )));
    }
    if let Some(p) = prompts.iter().find(|p| p.tokens.is_empty()) {
        return Err(msg(format!("prompt {} has no tokens", p.id)));
    }
    // The weights in the compute dtype once for the whole rollout, not cast at every use (a
    // no-op where the caller decodes such a copy already, as the trainer does once a step).
    model.with_decoding_weights(|m| crate::scheduler::run(m, prompts, g, params, seed, detok))
}

/// Greedy decoding of one prompt without sampling machinery: the reference path tests use.
pub fn greedy(model: &Qwen3, prompt: &[u32], new_tokens: usize) -> Result<Vec<u32>> {
    let params = GenParams {
        sampling: SamplingParams::greedy(),
        max_new_tokens: new_tokens,
        eos_ids: vec![],
        stop_strings: vec![],
        pad_id: 0,
        step_exit: None,
        kv_cache: KvCacheDtype::Model,
        paging: KvPaging::default(),
    };
    let none = |_: &[u32]| String::new();
    let out = generate(
        model,
        &[Prompt {
            id: 0,
            tokens: prompt.to_vec(),
        }],
        1,
        &params,
        0,
        &none,
    )?;
    Ok(out.into_iter().next().map(|s| s.tokens).unwrap_or_default())
}

/// Decoding without a KV cache (a full forward over the whole sequence per token): the
/// baseline `bench rollout` compares against. Greedy, one prompt batch, no stops.
pub fn greedy_no_cache(
    model: &Qwen3,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    device: &Device,
) -> Result<Vec<Vec<u32>>> {
    let mut seqs = prompts.to_vec();
    for _ in 0..new_tokens {
        let batch = Batch::from_rows(&seqs, 0, Padding::Left, device)?;
        let logits = model.logits(&batch)?; // (B, T, V)
        let last = logits
            .narrow(1, batch.t - 1, 1)?
            .squeeze(1)?
            .argmax(D::Minus1)?
            .to_vec1::<u32>()?;
        for (s, t) in seqs.iter_mut().zip(last) {
            s.push(t);
        }
    }
    Ok(seqs)
}
