//! The generation API and what one sample step does: `generate`'s types (`GenParams`,
//! `Sample`, `Finish`), the per-token sampling and stop logic (`sample_next`) and Step-GRPO's
//! probe (`try_exit`, over a fork of the sequence's block table). The scheduler
//! (scheduler.rs) drives them over the paged KV cache. Probes never touch a sample's random
//! stream.
//!
//! Data flow: prompts -> `generate` -> scheduler -> one `Sample` per (prompt, g) with tokens,
//! sampled mask, sampler log-probs, finish reason and Step-GRPO records -> the trainer's
//! scoring.

use crate::paging::KvPaging;
use crate::sampling::{sample_row, uniform, SamplingParams};
use crate::scheduler::RolloutStats;
use crate::step_exit::{confidence, StepExit};
use candle_core::{Device, Result, Tensor, D};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use terse_model::{Batch, BlockTable, DecodeWeights, Padding, PagedKvCache, PagedSeq, Qwen3};

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

    fn push(&mut self, token: u32, sampled: bool, lp_s: f32, lp_p: f32) {
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

/// How many trailing tokens to decode for stop strings and triggers.
const TAIL: usize = 24;

fn tail(tokens: &[u32]) -> &[u32] {
    &tokens[tokens.len().saturating_sub(TAIL)..]
}

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
    crate::scheduler::run(model, prompts, g, params, seed, detok)
}

/// What follows a sampled token.
pub(crate) enum Next {
    /// The sample is finished (EOS, stop string, length).
    Done,
    /// Feed this token and go on.
    Feed(u32),
    /// This token completed a Step-GRPO trigger: probe before feeding it.
    Probe(u32),
}

/// Samples the next token of a row from its logits (its own uniform), records it, and says
/// whether the sample stops, goes on, or reached a Step-GRPO trigger. `plen` is the prompt's
/// length; `limit` the model's context.
pub(crate) fn sample_next(
    row: &mut Row,
    logits: &[f32],
    params: &GenParams,
    detok: &dyn Detokenizer,
    plen: usize,
    limit: usize,
) -> Next {
    let d = sample_row(logits, &params.sampling, uniform(&mut row.rng));
    row.out.push(d.token, true, d.logp_sampled, d.logp_plain);
    row.out.entropy_sum += f64::from(d.entropy);
    row.out.entropy_tokens += 1;
    // Position of the sampled token, were it fed.
    let pos = plen + row.out.tokens.len() - 1;
    let text_now = || detok.decode(tail(&row.out.tokens));
    if params.eos_ids.contains(&d.token) {
        row.out.finish = Finish::Eos;
        return Next::Done;
    }
    if !params.stop_strings.is_empty() && {
        let now = text_now();
        let before = detok.decode(tail(&row.out.tokens[..row.out.tokens.len() - 1]));
        params
            .stop_strings
            .iter()
            .any(|s| now.contains(s.as_str()) && !before.contains(s.as_str()))
    } {
        row.out.finish = Finish::Stop;
        return Next::Done;
    }
    if row.out.tokens.len() >= params.max_new_tokens || pos + 1 >= limit {
        // pos + 1 tokens in the sequence now: the context is full.
        row.out.finish = Finish::Length;
        return Next::Done;
    }
    if let Some(se) = &params.step_exit {
        let probe_len = 1 + se.induction_ids.len() + se.max_ans_tokens + se.close_ids.len();
        if row.out.judge_count < se.max_judge_steps
            && pos + probe_len < limit
            && se.trigger_at_end(&text_now()).is_some()
        {
            row.out.judge_count += 1;
            return Next::Probe(d.token);
        }
    }
    Next::Feed(d.token)
}

/// Runs one Step-GRPO probe for a sequence (its table holds everything before its last sampled
/// token, at position `pos`) whose last token completed a trigger: fork its table, feed the
/// induction text, decode a greedy trial answer, and on confidence > δ finish the row with
/// path ⊕ induction ⊕ answer ⊕ close. The probe sees the path exactly as the finished row keeps
/// it: with the trigger (Step-GRPO's text) or without (DEER's), so the answer's log-probs are the
/// policy's in the context it is trained in. The probe's blocks are freed on return; the row's
/// random stream is not touched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn try_exit(
    model: &Qwen3,
    snap: &DecodeWeights,
    cache: &mut PagedKvCache,
    table: &BlockTable,
    row: &mut Row,
    pos: u32,
    se: &StepExit,
    detok: &dyn Detokenizer,
) -> Result<bool> {
    debug_assert_eq!(table.len(), pos as usize);
    let drop = if se.include_trigger_on_exit {
        0
    } else {
        trigger_tokens(&row.out.tokens, se, detok)
    };
    // The path the probe continues: the table plus the last sampled token, less the trigger's
    // tokens when they are dropped (the table ends `drop - 1` tokens into the trigger).
    let last = row.out.tokens.len().saturating_sub(1);
    let (mut probe, lead) = match drop {
        0 => (cache.fork(table), &row.out.tokens[last..]),
        d => (cache.fork_prefix(table, pos as usize + 1 - d), &[][..]),
    };
    let out = probe_answer(model, snap, cache, &mut probe, lead, se, detok);
    cache.release(&mut probe);
    let (ans, lps) = out?;
    if confidence(&lps, se.confidence, se.skip_first_token) <= se.delta {
        return Ok(false);
    }
    let out = &mut row.out;
    let keep = out.tokens.len() - drop;
    out.tokens.truncate(keep);
    out.sampled.truncate(keep);
    out.logp_sampled.truncate(keep);
    out.logp_plain.truncate(keep);
    out.exit_step = Some(out.judge_count);
    out.exit_token = Some(out.tokens.len());
    for &t in &se.induction_ids {
        out.push(t, false, 0.0, 0.0);
    }
    for (&t, &lp) in ans.iter().zip(&lps) {
        out.push(t, true, lp, lp);
    }
    for &t in &se.close_ids {
        out.push(t, false, 0.0, 0.0);
    }
    out.finish = Finish::EarlyExit;
    Ok(true)
}

/// How many trailing tokens the trigger that ends `tokens` spans: the fewest whose text covers
/// it (a trigger split over two tokens drops both). 0 when the tokens end with no trigger.
fn trigger_tokens(tokens: &[u32], se: &StepExit, detok: &dyn Detokenizer) -> usize {
    let Some(trigger) = se.trigger_at_end(&detok.decode(tail(tokens))) else {
        return 0;
    };
    let most = tokens.len().min(TAIL);
    (1..=most)
        .find(|&k| detok.decode(&tokens[tokens.len() - k..]).len() >= trigger.len())
        .unwrap_or(most)
}

/// The probe's greedy trial answer and its log-probs, decoded through the forked table after
/// `lead` (the path tokens the table does not hold yet) and the induction text.
fn probe_answer(
    model: &Qwen3,
    snap: &DecodeWeights,
    cache: &mut PagedKvCache,
    probe: &mut BlockTable,
    lead: &[u32],
    se: &StepExit,
    detok: &dyn Detokenizer,
) -> Result<(Vec<u32>, Vec<f32>)> {
    let feed = |cache: &mut PagedKvCache, probe: &mut BlockTable, ids: &[u32]| {
        // The scheduler keeps enough blocks free for one probe.
        if !cache.reserve(probe, ids.len())? {
            return Err(candle_core::Error::Msg(
                "rollout: no kv block left for a Step-GRPO probe".into(),
            ));
        }
        let mut s = [PagedSeq {
            table: probe,
            tokens: ids,
        }];
        model.forward_paged(snap, cache, &mut s)?.squeeze(0) // (V)
    };
    let ids = [lead, &se.induction_ids].concat();
    let mut logits = feed(cache, probe, &ids)?;
    let (mut ans, mut lps) = (vec![], vec![]);
    for _ in 0..se.max_ans_tokens {
        let tok = logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        let lse = log_sum_exp(&logits)?;
        let lp = logits.get(tok as usize)?.to_scalar::<f32>()? - lse;
        ans.push(tok);
        let text = detok.decode(&ans);
        if se.answer_stops.iter().any(|s| text.contains(s.as_str())) {
            ans.pop();
            break;
        }
        lps.push(lp);
        logits = feed(cache, probe, &[tok])?;
    }
    Ok((ans, lps))
}

fn log_sum_exp(x: &Tensor) -> Result<f32> {
    let m = x.max(D::Minus1)?.to_scalar::<f32>()?;
    Ok(m + (x - f64::from(m))?
        .exp()?
        .sum_all()?
        .to_scalar::<f32>()?
        .ln())
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
