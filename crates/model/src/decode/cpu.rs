//! The CPU decode step: one new token per row through every layer, over raw f32 slices.
//!
//! Data flow: rollout's `generate` -> `Qwen3::forward_cached` (one slot, f32, CPU) -> here ->
//! (B, V) logits. The composite candle forward spends a decode step of a small model in ~25
//! allocating ops per layer, an attention bias over the whole cache and a (B, Hq, 1, S) score
//! matrix. This path splits the batch's rows into parts (one per thread when the weights fit in
//! cache); each part runs every layer on its own (rows never interact in a forward), so a
//! step is one fork-join with every layer's cache locked for it: projections (`matmul`), norm /
//! RoPE / SiLU loops (`rows`), K/V written into the cache slot in place, attention over the
//! unmasked slots (`avx512`, else `avx2`), scratch reused. Same math as `Qwen3::layer` (tested).

use super::access::{with_all_mut, KvMut};
use super::layer::{attend_mlp, check_ids, finish, qkv, run_parts, scratch, with_weights, Rows};
use super::rows::{self as rows, CacheRow, RowKv};
use crate::cache::KvCache;
use crate::config::Config;
use candle_core::{Result, Tensor};

/// One forward over `slots` new slots per row (1 when decoding, the prompt in a prefill):
/// ids/positions (B, slots) for the cache's last `slots` slots (already appended), `weights`
/// in `weight_names` order -> logits (B, V) of each row's last slot.
pub(crate) fn step(
    c: &Config,
    weights: &[Tensor],
    snapshot: &super::DecodeWeights,
    cache: &KvCache,
    ids: &[u32],
    positions: &[u32],
    slots: usize,
) -> Result<Tensor> {
    let b = ids.len() / slots;
    check_ids(ids, c.vocab_size)?;
    with_weights(c, weights, snapshot, |sw| {
        let dm = &sw.dm;
        let (hkv, d) = (dm.hkv, dm.d);
        let parts = b.clamp(1, sw.max_parts);
        let chunks = scratch(
            parts,
            |i| {
                let (lo, hi) = (i * b / parts, (i + 1) * b / parts);
                (lo, lo * slots, (1..=hi - lo).map(|r| r * slots).collect())
            },
            dm,
        );
        let (off, len, cap) = (cache.len() - slots, cache.len(), cache.capacity());
        let layers = c.num_hidden_layers;
        let block = hkv * cap * d;
        // Rows never interact in a forward, so each part runs every layer (projections, its
        // rows' cache slots, attention, MLP) on its own: one fork-join per step, with every
        // layer's cache locked for the step.
        let part = |r: &mut Rows, kv: &mut Vec<(KvMut, KvMut)>| {
            r.embed(sw.w[0], ids, positions, dm.theta, dm);
            let valid = &cache.valid()[r.start * cap..(r.start + r.n) * cap];
            // Taken out of the scratch for the step (the views borrow it while the layers
            // write the rest), put back after.
            let (mut masked, mut masked_at) = (
                std::mem::take(&mut r.masked),
                std::mem::take(&mut r.masked_at),
            );
            masked.clear();
            masked_at.clear();
            masked_at.push(0);
            for row in valid.chunks_exact(cap) {
                rows::masked_slots(row, len, &mut masked);
                masked_at.push(masked.len());
            }
            for (l, (kp, vp)) in kv.iter_mut().enumerate() {
                let (lw, lt) = sw.layer(l);
                qkv(r, lw, lt, dm, sw.par);
                kp.write_slots(&r.k, [slots, hkv, cap, d], off);
                vp.write_slots(&r.v, [slots, hkv, cap, d], off);
                let (k, v) = (kp.view(), vp.view());
                // Token j of a row: causal, it sees the slots up to its own.
                let views: Vec<CacheRow> = (0..r.tokens())
                    .map(|i| {
                        let (row, j) = (i / slots, i % slots);
                        CacheRow {
                            kv: RowKv::Flat {
                                k: k.slice(row * block, block),
                                v: v.slice(row * block, block),
                                cap,
                            },
                            masked: &masked[masked_at[row]..masked_at[row + 1]],
                            len: len - slots + j + 1,
                            hkv,
                        }
                    })
                    .collect();
                attend_mlp(r, lw, lt, &views, dm, sw.par);
            }
            (r.masked, r.masked_at) = (masked, masked_at);
            r.head(sw.w[1], sw.w[2], sw.t[2], dm, sw.par);
        };
        let tensors: Vec<&Tensor> = (0..layers)
            .flat_map(|l| {
                let (k, v) = cache.layer(l);
                [k, v]
            })
            .collect();
        let mut chunks = chunks;
        with_all_mut(&tensors, Vec::new(), &mut |all| {
            // all = [k0, v0, k1, v1, ...], each (B, Hkv, C, D): per part, its rows of each layer.
            let sizes: Vec<usize> = chunks.iter().map(|r| r.n).collect();
            let mut per_part: Vec<Vec<(KvMut, KvMut)>> =
                (0..parts).map(|_| Vec::with_capacity(layers)).collect();
            let mut it = all.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                let (ks, vs) = (k.split_rows(&sizes, block), v.split_rows(&sizes, block));
                for (p, kv) in per_part.iter_mut().zip(ks.into_iter().zip(vs)) {
                    p.push(kv);
                }
            }
            let mut work: Vec<_> = chunks.iter_mut().zip(per_part).collect();
            run_parts(&mut work, part);
            Ok(())
        })?;
        finish(chunks, dm)
    })
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
mod tests;
