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
//! On CUDA a pure decode step (every row feeding its one last token) runs as a graph launch
//! that also draws each row's token (terse_model's `DecodeGraphs`), so the row holds its draw
//! rather than logits; other steps run `forward_paged` and draw at the next `sample_ready`.
//!
//! Data flow: `generate` -> `run` -> `Qwen3::forward_paged` per step -> `Sample`s + `RolloutStats`.
//!
//! A sample's tokens depend only on (seed, prompt id, sample index) and the model: its random
//! stream is its own, and `forward_paged` gives a sequence's logits from its own tokens alone,
//! bit for bit the same whether it was decoded token by token or recomputed as a prefill.

use crate::draw::{draw, host_sampler, RowLogits};
use crate::paging::{pool_blocks, PoolPlan};
use crate::sampling::{sample_stream, uniform};
use crate::step::{record_next, try_exit, Next};
use crate::types::Detokenizer;
use crate::types::{GenParams, KvCacheDtype, Prompt, RolloutStats, Row, Sample};
use candle_core::{DType, Result};

use std::collections::VecDeque;
use terse_model::paged::DecodeGraphs;
use terse_model::sample::Drawn;
use terse_model::{BlockTable, DecodeWeights, PagedKvCache, PagedSeq, Qwen3};

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
    logits: Option<RowLogits>,
    /// Or the token already drawn, by a decode graph (which samples in the step it feeds).
    drawn: Option<Drawn>,
    state: State,
    /// Prefilling its prompt's prefix.
    owner: bool,
}

#[derive(Default)]
struct Prefix {
    table: Option<BlockTable>,
    logits: Option<RowLogits>,
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
    let mut s = Scheduler::new(model, prompts, g, params, seed, detok)?;
    loop {
        s.sample_ready()?;
        if s.running.is_empty() && s.waiting.is_empty() {
            break;
        }
        s.admit();
        if s.running.is_empty() {
            // Nothing fits beside the cached prefixes of waiting prompts: give one back.
            s.evict_prefix()?;
            continue;
        }
        let batch = s.reserve()?;
        if !batch.is_empty() {
            s.forward(&batch)?;
        }
    }
    if let Some(g) = s.graphs.take() {
        g.release(&mut s.cache);
    }
    s.stats.peak_blocks = s.cache.peak_blocks();
    Ok((s.seqs.into_iter().map(|q| q.row.out).collect(), s.stats))
}

/// One rollout's state: the pool, every sequence, the prompts' cached prefixes, the queues.
/// Each phase of a step is a method; `run` calls them in order.
struct Scheduler<'a> {
    model: &'a Qwen3,
    snap: DecodeWeights,
    prompts: &'a [Prompt],
    params: &'a GenParams,
    detok: &'a dyn Detokenizer,
    /// The model's context limit.
    limit: usize,
    /// Blocks kept free for one Step-GRPO probe at a time (its fork copies one block).
    probe_blocks: usize,
    cache: PagedKvCache,
    seqs: Vec<Seq>,
    prefixes: Vec<Prefix>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    stats: RolloutStats,
    /// `TERSE_HOST_SAMPLER=1`: logits to the host, sampled there (draw.rs).
    host_sampler: bool,
    /// CUDA: pure decode steps as graph launches (terse_model's paged/graphs.rs).
    graphs: Option<DecodeGraphs>,
}

impl<'a> Scheduler<'a> {
    /// Sizes the pool (the budget, capped at what all sequences at once could use; an error
    /// when it cannot hold the longest one) and queues every (prompt, sample index).
    fn new(
        model: &'a Qwen3,
        prompts: &'a [Prompt],
        g: usize,
        params: &'a GenParams,
        seed: u64,
        detok: &'a dyn Detokenizer,
    ) -> Result<Self> {
        let pg = &params.paging;
        let limit = model.config.max_position_embeddings;
        let bs = pg.block_size;
        let dtype = match params.kv_cache {
            KvCacheDtype::Model => model.compute_dtype(),
            KvCacheDtype::F16 => DType::F16,
        };
        let block_bytes = model.kv_bytes_per_token(dtype) * bs;
        let lens = prompts.iter().map(|p| (p.tokens.len(), 1));
        let plan = PoolPlan::new(
            lens,
            g,
            params.max_new_tokens,
            params.step_exit.as_ref(),
            limit,
            bs,
        );
        let (probe_blocks, longest, one) = (plan.probe_blocks, plan.longest, plan.one);
        // On CUDA one block more than the sequences' worst case: the decode graphs' padding
        // rows write into it, so a rollout whose budget covers everything still graphs.
        let pad = usize::from(model.device().is_cuda() && !host_sampler());
        let blocks = pool_blocks(pg.kv_budget, plan.worst + pad, block_bytes, model.device());
        if blocks < one {
            return Err(candle_core::Error::Msg(format!(
                "rollout kv_budget: {blocks} blocks of {bs} tokens ({:.3} GiB) cannot hold one sequence of {longest} tokens, which needs {one} blocks",
                (blocks * block_bytes) as f64 / f64::from(1u32 << 30)
            )));
        }
        let seqs: Vec<Seq> = prompts
            .iter()
            .enumerate()
            .flat_map(|(p, pr)| (0..g).map(move |i| (p, pr, i)))
            .map(|(p, pr, i)| Seq {
                p,
                row: Row::new(pr.id, i, sample_stream(seed, pr.id, i as u64)),
                table: BlockTable::default(),
                pending: vec![],
                logits: None,
                drawn: None,
                state: State::Waiting,
                owner: false,
            })
            .collect();
        let prefixes = prompts
            .iter()
            .map(|_| Prefix {
                left: g,
                ..Prefix::default()
            })
            .collect();
        let mut cache = model.new_paged_cache(bs, blocks, dtype)?;
        // Only with a block to spare beyond one longest sequence and a probe: the padding rows'.
        let graphs = if blocks > one + probe_blocks && !host_sampler() {
            let w = params.sampling.warpers();
            DecodeGraphs::new(model, &mut cache, pg.max_num_seqs, longest, w)?
        } else {
            None
        };
        Ok(Scheduler {
            model,
            snap: model.decode_weights(),
            prompts,
            params,
            detok,
            limit,
            probe_blocks,
            cache,
            graphs,
            waiting: (0..seqs.len()).collect(),
            seqs,
            prefixes,
            running: vec![],
            host_sampler: host_sampler(),
            stats: RolloutStats {
                pool_blocks: blocks,
                block_bytes,
                block_size: bs,
                ..RolloutStats::default()
            },
        })
    }

    /// Every running sequence that holds logits samples its next token (a Step-GRPO probe may
    /// end it there); a finished one frees its blocks, and its prompt's prefix once the
    /// prompt's last sample is done.
    fn sample_ready(&mut self) -> Result<()> {
        // Every ready row's draw at once, each with the next uniform of its own stream; a row
        // a decode graph fed has its draw already (made with that same next uniform).
        let (mut ready, mut rows, mut us) = (vec![], vec![], vec![]);
        for &s in &self.running {
            let seq = &mut self.seqs[s];
            if let Some(d) = seq.drawn.take() {
                ready.push((s, Some(d)));
            } else if let Some(logits) = seq.logits.take() {
                us.push(uniform(&mut seq.row.rng));
                rows.push(logits);
                ready.push((s, None));
            }
        }
        let warpers = self.params.sampling.warpers();
        let mut drawn = draw(&rows, &us, &warpers, self.host_sampler)?.into_iter();
        for (s, early) in ready {
            let Some(d) = early.or_else(|| drawn.next()) else {
                unreachable!("one draw per row with logits");
            };
            let plen = self.prompts[self.seqs[s].p].tokens.len();
            let seq = &mut self.seqs[s];
            let next = record_next(&mut seq.row, d, self.params, self.detok, plen, self.limit);
            let done = match next {
                Next::Done => true,
                Next::Feed(t) => {
                    seq.pending.push(t);
                    false
                }
                Next::Probe(t) => {
                    let se = self
                        .params
                        .step_exit
                        .as_ref()
                        .expect("probes need step_exit");
                    let pos = (plen + seq.row.out.tokens.len() - 1) as u32;
                    let exited = try_exit(
                        self.model,
                        &self.snap,
                        &mut self.cache,
                        &seq.table,
                        &mut seq.row,
                        pos,
                        se,
                        self.detok,
                    )?;
                    if !exited {
                        seq.pending.push(t);
                    }
                    exited
                }
            };
            if done {
                seq.state = State::Done;
                self.cache.release(&mut seq.table);
                let pre = &mut self.prefixes[seq.p];
                pre.left -= 1;
                if pre.left == 0 {
                    if let Some(mut t) = pre.table.take() {
                        self.cache.release(&mut t);
                    }
                }
            }
        }
        let seqs = &self.seqs;
        self.running
            .retain(|&s| matches!(seqs[s].state, State::Running));
        Ok(())
    }

    /// Admits waiting sequences in order while there is room: a sample of a prompt with a
    /// prefix forks it; the first of a prompt without one prefills the prompt; others of that
    /// prompt wait for its prefix.
    fn admit(&mut self) {
        let pg = &self.params.paging;
        let cache = &mut self.cache;
        let mut i = 0;
        while i < self.waiting.len() && self.running.len() < pg.max_num_seqs {
            let s = self.waiting[i];
            let p = self.seqs[s].p;
            // Headroom of two blocks per running sequence (each needs a new block every
            // `block_size` tokens): admitting into the last free blocks would only preempt the
            // newcomer again at its next block (recomputing it each time). Measured on the
            // bench's 1/8 budget: one block per sequence preempted 777 times, two 257.
            let room = cache
                .free_blocks()
                .saturating_sub(self.probe_blocks + 2 * self.running.len());
            if let Some(pre) = &self.prefixes[p].table {
                let mut t = cache.fork(pre);
                let first = self.seqs[s].pending.len().clamp(1, pg.prefill_chunk);
                if cache.blocks_needed(&t, first) > room {
                    cache.release(&mut t);
                    break;
                }
                let seq = &mut self.seqs[s];
                seq.table = t;
                if seq.pending.is_empty() {
                    seq.logits.clone_from(&self.prefixes[p].logits);
                }
            } else if self.prefixes[p].owner.is_none() {
                let plen = self.prompts[p].tokens.len();
                if plen.min(pg.prefill_chunk).div_ceil(cache.block_size()) > room {
                    break;
                }
                let seq = &mut self.seqs[s];
                let mut feed = self.prompts[p].tokens.clone();
                feed.extend_from_slice(&seq.row.out.tokens);
                seq.pending = feed;
                seq.owner = true;
                self.prefixes[p].owner = Some(s);
            } else {
                i += 1;
                continue;
            }
            self.seqs[s].state = State::Running;
            self.running.push(s);
            self.waiting.remove(i);
        }
    }

    /// The step's batch: each running sequence's next chunk, room reserved oldest first; the
    /// newest running sequence is preempted while there is none.
    fn reserve(&mut self) -> Result<Vec<(usize, usize)>> {
        let pg = &self.params.paging;
        let mut batch: Vec<(usize, usize)> = vec![];
        let mut i = 0;
        while i < self.running.len() {
            let s = self.running[i];
            let seq = &self.seqs[s];
            let plen = self.prompts[seq.p].tokens.len();
            let mut n = seq.pending.len().min(pg.prefill_chunk);
            if seq.owner {
                n = n.min(plen - seq.table.len());
            }
            if n == 0 {
                i += 1;
                continue;
            }
            let needed = self.cache.blocks_needed(&self.seqs[s].table, n);
            if needed + self.probe_blocks <= self.cache.free_blocks() {
                let ok = self.cache.reserve(&mut self.seqs[s].table, n)?;
                debug_assert!(ok);
                batch.push((s, n));
                i += 1;
                continue;
            }
            let victim = *self.running.last().expect("s is running");
            if victim != s || self.running.len() > 1 {
                self.preempt(victim);
                continue; // retry s (or move on, when s itself was the newest)
            }
            // s alone: give back the cached prompt prefixes (waiting samples re-prefill them).
            self.evict_prefix()?;
        }
        Ok(batch)
    }

    /// One `forward_paged` over the batch; a prompt's owner that has fed the whole prompt
    /// leaves a fork of its table (and the logits) as the prompt's prefix.
    fn forward(&mut self, batch: &[(usize, usize)]) -> Result<()> {
        // A pure decode step (each row feeds its one last token, no prompt prefix to keep) can
        // run as a graph, which also draws: each row's next uniform is taken now.
        let graphed = self.graphs.is_some()
            && batch.iter().all(|&(s, n)| {
                let seq = &self.seqs[s];
                n == 1 && seq.pending.len() == 1 && !seq.owner
            });
        let mut tables: Vec<(BlockTable, Vec<u32>)> = batch
            .iter()
            .map(|&(s, n)| {
                let seq = &mut self.seqs[s];
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
        if graphed && self.graphs.as_ref().is_some_and(|g| g.fits(&fw)) {
            let us: Vec<f64> = batch
                .iter()
                .map(|&(s, _)| uniform(&mut self.seqs[s].row.rng))
                .collect();
            let g = self.graphs.as_mut().expect("checked");
            let drawn = self
                .model
                .decode_graphed(g, &mut self.cache, &mut fw, &us)?;
            drop(fw);
            self.stats.steps += 1;
            for ((&(s, _), (t, _)), d) in batch.iter().zip(tables).zip(drawn) {
                let seq = &mut self.seqs[s];
                seq.table = t;
                seq.drawn = Some(d);
            }
            return Ok(());
        }
        let logits = self
            .model
            .forward_paged(&self.snap, &mut self.cache, &mut fw)?; // (B, V)
        drop(fw);
        self.stats.steps += 1;
        let rows = RowLogits::of_step(logits);
        for ((&(s, _), (t, _)), row) in batch.iter().zip(tables).zip(rows) {
            let seq = &mut self.seqs[s];
            seq.table = t;
            let plen = self.prompts[seq.p].tokens.len();
            if seq.owner && seq.table.len() == plen {
                let pre = &mut self.prefixes[seq.p];
                pre.table = Some(self.cache.fork(&seq.table));
                pre.logits = Some(row.own()?);
                pre.owner = None;
                seq.owner = false;
            }
            if seq.pending.is_empty() {
                seq.logits = Some(row);
            }
        }
        Ok(())
    }

    /// Frees sequence v's blocks and puts it at the front of the queue, to be recomputed.
    fn preempt(&mut self, v: usize) {
        let seq = &mut self.seqs[v];
        self.cache.release(&mut seq.table);
        seq.pending = seq.row.out.tokens.clone();
        seq.logits = None;
        // sample_ready records every graph's draw before anything can be preempted.
        debug_assert!(seq.drawn.is_none());
        if seq.owner {
            seq.owner = false;
            self.prefixes[seq.p].owner = None;
        }
        seq.state = State::Waiting;
        self.running.retain(|&s| s != v);
        self.waiting.push_front(v);
        self.stats.preemptions += 1;
    }

    /// Releases the last cached prompt prefix (its waiting samples will prefill the prompt
    /// again); an error when none is left, which the budget check at the start rules out.
    fn evict_prefix(&mut self) -> Result<()> {
        let cache = &mut self.cache;
        let Some(pre) = self.prefixes.iter_mut().rev().find(|p| p.table.is_some()) else {
            return Err(candle_core::Error::Msg(format!(
                "rollout: no kv block free and nothing left to free ({} of {} blocks in use)",
                cache.used_blocks(),
                cache.num_blocks()
            )));
        };
        let mut t = pre.table.take().expect("found");
        pre.logits = None;
        cache.release(&mut t);
        self.stats.evictions += 1;
        Ok(())
    }
}
