//! The rollout scheduler: continuous batching over a paged KV cache under a memory budget.
//!
//! Every (prompt, sample index) is a sequence. Sequences are admitted in order while the pool
//! has room and fewer than `max_num_seqs` run; the first sample of a prompt prefills the prompt
//! (in chunks) and leaves a forked copy of its table as the prompt's prefix, which the other
//! samples fork (the prompt's K/V is stored once; a sample's first write copies the shared
//! partial last block). Each step: the running sequences that hold logits sample a token (and
//! Step-GRPO probes fork the sequence's table), waiting ones are admitted, and one
//! `forward_paged` feeds every running sequence its next token or prefill chunk. A finished
//! sequence frees its blocks at once. When a sequence needs a block and none is free, the newest
//! running sequence is preempted: its blocks are freed and it waits at the front of the queue,
//! to be recomputed (prompt prefix, then its tokens so far, as a prefill) when there is room.
//!
//! Data flow: `generate` -> `run` -> `Qwen3::forward_paged` per step -> `Sample`s + `RolloutStats`.
//!
//! A sample's tokens depend only on (seed, prompt id, sample index) and the model: its random
//! stream is its own, and `forward_paged` gives a sequence's logits from its own tokens alone,
//! bit for bit the same whether it was decoded token by token or recomputed as a prefill.

use crate::paging::{all_at_once_blocks, pool_blocks};
use crate::sampling::sample_stream;
use crate::step::{sample_next, try_exit, Next};
use crate::types::Detokenizer;
use crate::types::{GenParams, KvCacheDtype, Prompt, RolloutStats, Row, Sample};
use candle_core::{DType, Result};

use std::collections::VecDeque;
use terse_model::{BlockTable, PagedKvCache, PagedSeq, Qwen3};

enum State {
    Waiting,
    Running,
    Done,
}

struct Seq {
    p: usize,
    row: Row,
    table: BlockTable,
    /// Tokens to feed before the next sample: the prompt (when this sequence prefills its
    /// prompt's prefix), the tokens so far (after a preemption), or the last sampled token.
    pending: Vec<u32>,
    /// Logits to sample the next token from, once everything is fed.
    logits: Option<Vec<f32>>,
    state: State,
    /// Prefilling its prompt's prefix.
    owner: bool,
}

#[derive(Default)]
struct Prefix {
    table: Option<BlockTable>,
    logits: Option<Vec<f32>>,
    owner: Option<usize>,
    /// Samples not finished.
    left: usize,
}

/// Samples G completions for every prompt through a paged cache. See the module doc.
pub(crate) fn run(
    model: &Qwen3,
    prompts: &[Prompt],
    g: usize,
    params: &GenParams,
    seed: u64,
    detok: &dyn Detokenizer,
) -> Result<(Vec<Sample>, RolloutStats)> {
    let pg = &params.paging;
    let limit = model.config.max_position_embeddings;
    let bs = pg.block_size;
    let dtype = match params.kv_cache {
        KvCacheDtype::Model => model.compute_dtype(),
        KvCacheDtype::F16 => DType::F16,
    };
    let block_bytes = model.kv_bytes_per_token(dtype) * bs;
    // Blocks kept free for one Step-GRPO probe at a time (its fork copies one block).
    let probe_blocks = params.step_exit.as_ref().map_or(0, |se| {
        (1 + se.induction_ids.len() + se.max_ans_tokens + se.close_ids.len()).div_ceil(bs) + 1
    });
    let extra = params
        .step_exit
        .as_ref()
        .map_or(0, |s| s.induction_ids.len() + s.max_ans_tokens + 2);
    let full = |p: &Prompt| (p.tokens.len() + params.max_new_tokens + extra).min(limit);
    let seqs = prompts.iter().map(|p| (p.tokens.len(), full(p)));
    let worst = all_at_once_blocks(seqs, g, bs) + probe_blocks;
    let longest = prompts.iter().map(full).max().unwrap_or(0);
    let one = longest.div_ceil(bs) + 1 + probe_blocks;
    let blocks = pool_blocks(pg.kv_budget, worst, block_bytes, model.device());
    if blocks < one {
        return Err(candle_core::Error::Msg(format!(
            "rollout kv_budget: {blocks} blocks of {bs} tokens ({:.3} GiB) cannot hold one sequence of {longest} tokens, which needs {one} blocks",
            (blocks * block_bytes) as f64 / f64::from(1u32 << 30)
        )));
    }
    let mut cache = model.new_paged_cache(bs, blocks, dtype)?;
    let snap = model.decode_weights();
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .enumerate()
        .flat_map(|(p, pr)| (0..g).map(move |i| (p, pr, i)))
        .map(|(p, pr, i)| Seq {
            p,
            row: Row::new(pr.id, i, sample_stream(seed, pr.id, i as u64)),
            table: BlockTable::default(),
            pending: vec![],
            logits: None,
            state: State::Waiting,
            owner: false,
        })
        .collect();
    let mut prefixes: Vec<Prefix> = prompts
        .iter()
        .map(|_| Prefix {
            left: g,
            ..Prefix::default()
        })
        .collect();
    let mut waiting: VecDeque<usize> = (0..seqs.len()).collect();
    let mut running: Vec<usize> = vec![];
    let mut stats = RolloutStats {
        pool_blocks: blocks,
        block_bytes,
        block_size: bs,
        ..RolloutStats::default()
    };
    loop {
        // Sample where logits are ready.
        for &s in &running {
            let Some(logits) = seqs[s].logits.take() else {
                continue;
            };
            let plen = prompts[seqs[s].p].tokens.len();
            let seq = &mut seqs[s];
            let next = sample_next(&mut seq.row, &logits, params, detok, plen, limit);
            let done = match next {
                Next::Done => true,
                Next::Feed(t) => {
                    seq.pending.push(t);
                    false
                }
                Next::Probe(t) => {
                    let se = params.step_exit.as_ref().expect("probes need step_exit");
                    let pos = (plen + seq.row.out.tokens.len() - 1) as u32;
                    let exited = try_exit(
                        model,
                        &snap,
                        &mut cache,
                        &seq.table,
                        &mut seq.row,
                        pos,
                        se,
                        detok,
                    )?;
                    if !exited {
                        seq.pending.push(t);
                    }
                    exited
                }
            };
            if done {
                seq.state = State::Done;
                cache.release(&mut seq.table);
                let pre = &mut prefixes[seq.p];
                pre.left -= 1;
                if pre.left == 0 {
                    if let Some(mut t) = pre.table.take() {
                        cache.release(&mut t);
                    }
                }
            }
        }
        running.retain(|&s| matches!(seqs[s].state, State::Running));
        if running.is_empty() && waiting.is_empty() {
            break;
        }
        admit(
            &mut seqs,
            &mut prefixes,
            &mut waiting,
            &mut running,
            &mut cache,
            prompts,
            pg,
            probe_blocks,
        );
        if running.is_empty() {
            // Nothing fits beside the cached prefixes of waiting prompts: give one back.
            evict_prefix(&mut prefixes, &mut cache)?;
            stats.evictions += 1;
            continue;
        }
        // The step: each running sequence's next chunk, room reserved oldest first; the newest
        // running sequence is preempted while there is none.
        let mut batch: Vec<(usize, usize)> = vec![];
        let mut i = 0;
        while i < running.len() {
            let s = running[i];
            let seq = &seqs[s];
            let plen = prompts[seq.p].tokens.len();
            let mut n = seq.pending.len().min(pg.prefill_chunk);
            if seq.owner {
                n = n.min(plen - seq.table.len());
            }
            if n == 0 {
                i += 1;
                continue;
            }
            if cache.blocks_needed(&seqs[s].table, n) + probe_blocks <= cache.free_blocks() {
                let ok = cache.reserve(&mut seqs[s].table, n)?;
                debug_assert!(ok);
                batch.push((s, n));
                i += 1;
                continue;
            }
            let victim = *running.last().expect("s is running");
            if victim != s || running.len() > 1 {
                preempt(
                    victim,
                    &mut seqs,
                    &mut prefixes,
                    &mut waiting,
                    &mut running,
                    &mut cache,
                );
                stats.preemptions += 1;
                continue; // retry s (or move on, when s itself was the newest)
            }
            // s alone: give back the cached prompt prefixes (waiting samples re-prefill them).
            evict_prefix(&mut prefixes, &mut cache)?;
            stats.evictions += 1;
        }
        if batch.is_empty() {
            continue;
        }
        let mut tables: Vec<(BlockTable, Vec<u32>)> = batch
            .iter()
            .map(|&(s, n)| {
                let seq = &mut seqs[s];
                (
                    std::mem::take(&mut seq.table),
                    seq.pending.drain(..n).collect(),
                )
            })
            .collect();
        let mut fw: Vec<PagedSeq> = tables
            .iter_mut()
            .map(|(t, toks)| PagedSeq {
                table: t,
                tokens: toks,
            })
            .collect();
        let logits = model.forward_paged(&snap, &mut cache, &mut fw)?; // (B, V)
        drop(fw);
        stats.steps += 1;
        let host = logits
            .to_device(&candle_core::Device::Cpu)?
            .to_vec2::<f32>()?;
        for ((&(s, _), (t, _)), row) in batch.iter().zip(tables).zip(host) {
            let seq = &mut seqs[s];
            seq.table = t;
            let plen = prompts[seq.p].tokens.len();
            if seq.owner && seq.table.len() == plen {
                let pre = &mut prefixes[seq.p];
                pre.table = Some(cache.fork(&seq.table));
                pre.logits = Some(row.clone());
                pre.owner = None;
                seq.owner = false;
            }
            if seq.pending.is_empty() {
                seq.logits = Some(row);
            }
        }
    }
    stats.peak_blocks = cache.peak_blocks();
    Ok((seqs.into_iter().map(|s| s.row.out).collect(), stats))
}

/// Admits waiting sequences in order while there is room: a sample of a prompt with a prefix
/// forks it; the first of a prompt without one prefills the prompt; others of that prompt wait
/// for its prefix.
#[allow(clippy::too_many_arguments)]
fn admit(
    seqs: &mut [Seq],
    prefixes: &mut [Prefix],
    waiting: &mut VecDeque<usize>,
    running: &mut Vec<usize>,
    cache: &mut PagedKvCache,
    prompts: &[Prompt],
    pg: &crate::paging::KvPaging,
    probe_blocks: usize,
) {
    let mut i = 0;
    while i < waiting.len() && running.len() < pg.max_num_seqs {
        let s = waiting[i];
        let p = seqs[s].p;
        // Headroom of two blocks per running sequence (each needs a new block every
        // `block_size` tokens): admitting into the last free blocks would only preempt the
        // newcomer again at its next block (recomputing it each time). Measured on the bench's
        // 1/8 budget: one block per sequence preempted 777 times, two 257.
        let room = cache
            .free_blocks()
            .saturating_sub(probe_blocks + 2 * running.len());
        if let Some(pre) = &prefixes[p].table {
            let mut t = cache.fork(pre);
            let first = seqs[s].pending.len().clamp(1, pg.prefill_chunk);
            if cache.blocks_needed(&t, first) > room {
                cache.release(&mut t);
                break;
            }
            let seq = &mut seqs[s];
            seq.table = t;
            if seq.pending.is_empty() {
                seq.logits.clone_from(&prefixes[p].logits);
            }
        } else if prefixes[p].owner.is_none() {
            let plen = prompts[p].tokens.len();
            if plen.min(pg.prefill_chunk).div_ceil(cache.block_size()) > room {
                break;
            }
            let seq = &mut seqs[s];
            let mut feed = prompts[p].tokens.clone();
            feed.extend_from_slice(&seq.row.out.tokens);
            seq.pending = feed;
            seq.owner = true;
            prefixes[p].owner = Some(s);
        } else {
            i += 1;
            continue;
        }
        seqs[s].state = State::Running;
        running.push(s);
        waiting.remove(i);
    }
}

/// Frees sequence v's blocks and puts it at the front of the queue, to be recomputed.
fn preempt(
    v: usize,
    seqs: &mut [Seq],
    prefixes: &mut [Prefix],
    waiting: &mut VecDeque<usize>,
    running: &mut Vec<usize>,
    cache: &mut PagedKvCache,
) {
    let seq = &mut seqs[v];
    cache.release(&mut seq.table);
    seq.pending = seq.row.out.tokens.clone();
    seq.logits = None;
    if seq.owner {
        seq.owner = false;
        prefixes[seq.p].owner = None;
    }
    seq.state = State::Waiting;
    running.retain(|&s| s != v);
    waiting.push_front(v);
}

/// Releases the last cached prompt prefix (its waiting samples will prefill the prompt again);
/// an error when none is left, which the budget check at the start rules out.
fn evict_prefix(prefixes: &mut [Prefix], cache: &mut PagedKvCache) -> Result<()> {
    let Some(pre) = prefixes.iter_mut().rev().find(|p| p.table.is_some()) else {
        return Err(candle_core::Error::Msg(format!(
            "rollout: no kv block free and nothing left to free ({} of {} blocks in use)",
            cache.used_blocks(),
            cache.num_blocks()
        )));
    };
    let mut t = pre.table.take().expect("found");
    pre.logits = None;
    cache.release(&mut t);
    Ok(())
}
