//! The generation engine: prefill each prompt once, copy its KV cache into its G sample rows,
//! then decode all rows together, one batched forward and one sampling pass per step. Finished
//! rows are compacted out of the cache; Step-GRPO probes fork a row's cache and never touch its
//! random stream.
//!
//! Data flow: prompts -> `generate` -> one `Sample` per (prompt, g) with tokens, sampled mask,
//! sampler log-probs, finish reason and Step-GRPO records -> the trainer's scoring.

use crate::sampling::{sample_row, sample_stream, uniform, SamplingParams};
use crate::step_exit::{confidence, StepExit};
use candle_core::{DType, Device, Result, Tensor, D};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use terse_model::{Batch, DecodeWeights, KvCache, Padding, Qwen3};

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
    /// Length as the rewards count it: policy-produced tokens only (spec §0.2, §5.3).
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

struct Row {
    out: Sample,
    rng: ChaCha8Rng,
    /// Position id of the next token fed for this row.
    pos: u32,
    done: bool,
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
    if let Err(e) = params.sampling.validate() {
        return Err(candle_core::Error::Msg(e));
    }
    if let Some(se) = &params.step_exit {
        se.validate().map_err(candle_core::Error::Msg)?;
        if se.induction_ids.is_empty() {
            return Err(candle_core::Error::Msg(
                "step_exit.induction_ids is empty (call StepExit::resolve with a tokenizer)".into(),
            ));
        }
    }
    if prompts.is_empty() || g == 0 {
        return Ok(vec![]);
    }
    // Positions past the model's context were never trained (and RoPE tables may end there):
    // a prompt must leave room for one token, and every row stops at the limit.
    let limit = model.config.max_position_embeddings;
    if let Some(p) = prompts.iter().find(|p| p.tokens.len() >= limit) {
        return Err(candle_core::Error::Msg(format!(
            "prompt {} has {} tokens: no room for a completion within the model's max_position_embeddings ({limit})",
            p.id,
            p.tokens.len()
        )));
    }
    let dev = model.device().clone();
    let rows_in: Vec<Vec<u32>> = prompts.iter().map(|p| p.tokens.clone()).collect();
    let prefill = Batch::from_rows(&rows_in, params.pad_id, Padding::Left, &dev)?;
    let extra = params
        .step_exit
        .as_ref()
        .map_or(0, |s| s.induction_ids.len() + s.max_ans_tokens + 2);
    let cap = prefill.t + params.max_new_tokens + extra;
    let mut cache = match params.kv_cache {
        KvCacheDtype::Model => model.new_cache(prompts.len(), cap)?,
        KvCacheDtype::F16 => model.new_cache_in(prompts.len(), cap, DType::F16)?,
    };
    // One decode snapshot of the weights for the whole rollout (its probes included).
    let snap = model.decode_weights();
    let logits = model.forward_cached(
        &snap,
        &mut cache,
        &prefill.input_ids,
        &prefill.position_ids,
        &prefill.mask,
    )?;

    // Copy each prompt's prefill into its G rows.
    let expand: Vec<usize> = (0..prompts.len())
        .flat_map(|p| std::iter::repeat_n(p, g))
        .collect();
    // One sample per prompt: the prefill rows already are the sample rows.
    let mut cache = if g == 1 {
        cache
    } else {
        cache.select_rows(&expand)?
    };
    let idx = Tensor::from_vec(
        expand.iter().map(|&p| p as u32).collect::<Vec<_>>(),
        expand.len(),
        &dev,
    )?;
    let mut logits = logits.index_select(&idx, 0)?; // (A, V)
    let mut rows: Vec<Row> = expand
        .iter()
        .enumerate()
        .map(|(r, &p)| Row {
            out: Sample {
                prompt_id: prompts[p].id,
                index: r % g,
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
            rng: sample_stream(seed, prompts[p].id, (r % g) as u64),
            pos: prompts[p].tokens.len() as u32,
            done: false,
        })
        .collect();
    // Cache slot -> row, for the rows still in the cache.
    let mut slots: Vec<usize> = (0..rows.len()).collect();

    while rows.iter().any(|r| !r.done) {
        let host = logits.to_vec2::<f32>()?;
        let mut feed = Vec::with_capacity(slots.len());
        for (slot, &r) in slots.iter().enumerate() {
            let row = &mut rows[r];
            if row.done {
                feed.push(None);
                continue;
            }
            let d = sample_row(&host[slot], &params.sampling, uniform(&mut row.rng));
            row.out.push(d.token, true, d.logp_sampled, d.logp_plain);
            row.out.entropy_sum += f64::from(d.entropy);
            row.out.entropy_tokens += 1;
            let text_now = || detok.decode(tail(&row.out.tokens));
            if params.eos_ids.contains(&d.token) {
                row.out.finish = Finish::Eos;
                row.done = true;
            } else if !params.stop_strings.is_empty() && {
                let now = text_now();
                let before = detok.decode(tail(&row.out.tokens[..row.out.tokens.len() - 1]));
                params
                    .stop_strings
                    .iter()
                    .any(|s| now.contains(s.as_str()) && !before.contains(s.as_str()))
            } {
                row.out.finish = Finish::Stop;
                row.done = true;
            } else if row.out.tokens.len() >= params.max_new_tokens || row.pos as usize + 1 >= limit
            {
                // row.pos + 1 tokens in the sequence now: the context is full.
                row.out.finish = Finish::Length;
                row.done = true;
            } else if let Some(se) = &params.step_exit {
                let probe_len = 1 + se.induction_ids.len() + se.max_ans_tokens + se.close_ids.len();
                if row.out.judge_count < se.max_judge_steps
                    && row.pos as usize + probe_len < limit
                    && se.trigger_at_end(&text_now()).is_some()
                {
                    row.out.judge_count += 1;
                    if try_exit(model, &snap, &cache, slot, row, se, detok)? {
                        row.done = true;
                    }
                }
            }
            feed.push((!row.done).then_some(d.token));
        }
        if rows.iter().all(|r| r.done) {
            break;
        }
        // Drop finished rows from the cache once they are a noticeable share of it.
        let finished = feed.iter().filter(|f| f.is_none()).count();
        if finished > 0 && finished * 8 >= slots.len() {
            let keep: Vec<usize> = (0..slots.len()).filter(|&s| feed[s].is_some()).collect();
            cache = cache.select_rows(&keep)?;
            slots = keep.iter().map(|&s| slots[s]).collect();
            feed = keep.iter().map(|&s| feed[s]).collect();
        }
        let ids: Vec<u32> = feed.iter().map(|f| f.unwrap_or(params.pad_id)).collect();
        let valid: Vec<u8> = feed.iter().map(|f| u8::from(f.is_some())).collect();
        let pos: Vec<u32> = slots.iter().map(|&r| rows[r].pos).collect();
        for (&r, f) in slots.iter().zip(&feed) {
            if f.is_some() {
                rows[r].pos += 1;
            }
        }
        let n = slots.len();
        logits = model.forward_cached(
            &snap,
            &mut cache,
            &Tensor::from_vec(ids, (n, 1), &dev)?,
            &Tensor::from_vec(pos, (n, 1), &dev)?,
            &valid,
        )?;
    }
    Ok(rows.into_iter().map(|r| r.out).collect())
}

/// Runs one Step-GRPO probe for the row in cache slot `slot` whose last sampled token completed
/// a trigger: fork its cache, feed that token and the induction text, decode a greedy trial
/// answer, and on confidence > δ finish the row with path ⊕ induction ⊕ answer ⊕ close.
/// The row's random stream is not touched.
fn try_exit(
    model: &Qwen3,
    snap: &DecodeWeights,
    cache: &KvCache,
    slot: usize,
    row: &mut Row,
    se: &StepExit,
    detok: &dyn Detokenizer,
) -> Result<bool> {
    let dev = model.device().clone();
    let mut probe = cache.select_rows(&[slot])?;
    let last = *row.out.tokens.last().unwrap_or(&0);
    let mut ids = vec![last];
    ids.extend_from_slice(&se.induction_ids);
    let n = ids.len();
    let pos: Vec<u32> = (0..n as u32).map(|i| row.pos + i).collect();
    let mut logits = model.forward_cached(
        snap,
        &mut probe,
        &Tensor::from_vec(ids, (1, n), &dev)?,
        &Tensor::from_vec(pos, (1, n), &dev)?,
        &vec![1; n],
    )?;
    let (mut ans, mut lps) = (vec![], vec![]);
    for next_pos in (row.pos + n as u32..).take(se.max_ans_tokens) {
        let row_logits = logits.squeeze(0)?;
        let tok = row_logits.argmax(D::Minus1)?.to_scalar::<u32>()?;
        let lse = log_sum_exp(&row_logits)?;
        let lp = row_logits.get(tok as usize)?.to_scalar::<f32>()? - lse;
        ans.push(tok);
        let text = detok.decode(&ans);
        if se.answer_stops.iter().any(|s| text.contains(s.as_str())) {
            ans.pop();
            break;
        }
        lps.push(lp);
        logits = model.forward_cached(
            snap,
            &mut probe,
            &Tensor::from_vec(vec![tok], (1, 1), &dev)?,
            &Tensor::from_vec(vec![next_pos], (1, 1), &dev)?,
            &[1],
        )?;
    }
    if confidence(&lps, se.confidence, se.skip_first_token) <= se.delta {
        return Ok(false);
    }
    let out = &mut row.out;
    if !se.include_trigger_on_exit {
        // Drop trailing tokens until the decoded path no longer ends with the trigger.
        while !out.tokens.is_empty()
            && se
                .trigger_at_end(&detok.decode(tail(&out.tokens)))
                .is_some()
        {
            out.tokens.pop();
            out.sampled.pop();
            out.logp_sampled.pop();
            out.logp_plain.pop();
        }
    }
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
