//! The CPU decode step over a paged KV cache: like `cpu::step`, but each row is one sequence
//! with its own block table, context length and number of new tokens (a decode step's one, a
//! prefill chunk's many), so one step mixes prefill chunks and decodes. No padding exists, so
//! no slot is masked and position = slot index.
//!
//! Data flow: `Qwen3::forward_paged` (CPU path) -> here -> (B, V) logits of each row's last new
//! token. The threads share each layer's pools as raw pointers (`PoolPtr`): a thread writes
//! only the blocks its rows hold alone (`PagedKvCache::check_writable`, run by the caller) and
//! reads blocks no thread writes in the step.

use super::access::{pool_ptr, with_all_mut, write_paged};
use super::common::PoolPtr;
use super::layer::{attend_mlp, check_ids, finish, qkv, run_parts, scratch, with_weights, Rows};
use super::rows::{CacheRow, RowKv};
use crate::config::Config;
use crate::paged::PagedKvCache;
use candle_core::{Result, Tensor};

/// One sequence of a paged step: its block ids, the tokens already stored, and how many new
/// tokens it feeds (their ids and positions lie in the step's flattened lists, in row order).
pub(crate) struct PagedRow<'a> {
    pub blocks: &'a [u32],
    pub start: usize,
    pub new: usize,
}

/// One forward over each row's new tokens (already reserved and checked writable), `weights`
/// in `weight_names` order -> logits (B, V) of each row's last new token.
pub(crate) fn step(
    c: &Config,
    weights: &[Tensor],
    snapshot: &super::DecodeWeights,
    cache: &PagedKvCache,
    rows: &[PagedRow],
    ids: &[u32],
    positions: &[u32],
) -> Result<Tensor> {
    check_ids(ids, c.vocab_size)?;
    let b = rows.len();
    let bs = cache.block_size();
    // Token offsets of each row in the flattened lists.
    let mut first = Vec::with_capacity(b + 1);
    first.push(0);
    for r in rows {
        first.push(first[first.len() - 1] + r.new);
    }
    with_weights(c, weights, snapshot, |sw| {
        let dm = &sw.dm;
        let parts = b.clamp(1, sw.max_parts);
        let bounds = |i: usize| {
            let (lo, hi) = (i * b / parts, (i + 1) * b / parts);
            let ends = (lo..hi).map(|r| first[r + 1] - first[lo]).collect();
            (lo, first[lo], ends)
        };
        let mut chunks = scratch(parts, bounds, dm);
        let tensors: Vec<&Tensor> = (0..cache.layers())
            .flat_map(|l| {
                let (k, v) = cache.layer(l);
                [k, v]
            })
            .collect();
        with_all_mut(&tensors, Vec::new(), &mut |mut all| {
            let pools: Vec<PoolPtr> = all
                .chunks_exact_mut(2)
                .map(|kv| {
                    let (k, v) = kv.split_at_mut(1);
                    pool_ptr(&mut k[0], &mut v[0])
                })
                .collect();
            let part = |r: &mut Rows, _: &mut ()| {
                r.embed(sw.w[0], ids, positions, dm.theta, dm);
                // (row, slot) of each of the part's tokens.
                let mut at = Vec::with_capacity(r.tokens());
                for (i, row) in rows[r.start..r.start + r.n].iter().enumerate() {
                    at.extend((0..row.new).map(|j| (r.start + i, row.start + j)));
                }
                for (l, pool) in pools.iter().enumerate() {
                    let (lw, lt) = sw.layer(l);
                    qkv(r, lw, lt, dm, sw.par);
                    for (i, &(row, slot)) in at.iter().enumerate() {
                        let blk = rows[row].blocks[slot / bs] as usize;
                        let geo = [blk, slot % bs, bs, dm.d];
                        // SAFETY: the caller checked that this row holds the block alone and no
                        // other row of the step writes it; this thread handles the row.
                        #[allow(unsafe_code)]
                        unsafe {
                            let kv = &r.k[i * dm.kvd..][..dm.kvd];
                            write_paged(pool.k, pool.n, pool.f16, kv, geo);
                            let vv = &r.v[i * dm.kvd..][..dm.kvd];
                            write_paged(pool.v, pool.n, pool.f16, vv, geo);
                        }
                    }
                    // Token at slot s sees slots 0..=s of its sequence.
                    let views: Vec<CacheRow> = at
                        .iter()
                        .map(|&(row, slot)| CacheRow {
                            kv: RowKv::Paged {
                                pool: *pool,
                                blocks: rows[row].blocks,
                                block: bs,
                            },
                            masked: &[],
                            len: slot + 1,
                            hkv: dm.hkv,
                        })
                        .collect();
                    attend_mlp(r, lw, lt, &views, dm, sw.par);
                }
                r.head(sw.w[1], sw.w[2], sw.t[2], dm, sw.par);
            };
            let mut work: Vec<_> = chunks.iter_mut().map(|r| (r, ())).collect();
            run_parts(&mut work, part);
            Ok(())
        })?;
        finish(chunks, dm)
    })
}
