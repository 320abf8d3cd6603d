//! The forward the rollout scheduler decodes through: `Qwen3::forward_paged` feeds each
//! sequence its new tokens (one when decoding, a chunk of a prompt or of a recomputed sequence
//! when prefilling), writes their K/V into the sequence's blocks of a `PagedKvCache` and
//! returns each sequence's last logits. Three paths compute the same function: the CPU step of
//! `decode::paged` (f32 on the CPU); elsewhere (CUDA), the fused paged ops over block tables,
//! every new token a row of one batch, decodes and prefill chunks alike (fused_step.rs:
//! kernels/paged_attention.cu); and the composite reference (any device), which runs one
//! sequence at a time through a gathered `KvCache` and `forward_cached`'s composite path,
//! writing the touched blocks back.
//!
//! Data flow: rollout scheduler -> `forward_paged` -> `decode::paged::step`,
//! `paged_kernels_step` or per-sequence `forward_cached_with(Composite)` -> logits (B, V).

use super::{BlockTable, PagedKvCache};
use crate::cache::DecodePath;
use crate::cache::KvCache;
use crate::decode::{self, paged::PagedRow, DecodeWeights};
use crate::model::Qwen3;
use candle_core::{DType, Result, Tensor};

/// One sequence of a paged forward: its table and the tokens it feeds this step (positions
/// continue from the table's length).
pub struct PagedSeq<'a> {
    pub table: &'a mut BlockTable,
    pub tokens: &'a [u32],
}

impl<'a> PagedSeq<'a> {
    /// One sequence per table, each feeding its row of `tokens`.
    pub(crate) fn zip<T: AsRef<[u32]>>(
        tables: &'a mut [BlockTable],
        tokens: &'a [T],
    ) -> Vec<PagedSeq<'a>> {
        tables
            .iter_mut()
            .zip(tokens)
            .map(|(table, t)| PagedSeq {
                table,
                tokens: t.as_ref(),
            })
            .collect()
    }
}

/// How `forward_paged` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PagedPath {
    /// `decode::paged_step`: f32 on the CPU.
    Cpu,
    /// Per sequence: gather its blocks, the composite cached forward, write back.
    Composite,
    /// Every new token a row of one batch through the fused paged ops.
    Kernels,
}

impl Qwen3 {
    /// An empty paged cache of `num_blocks` blocks of `block` tokens storing K and V in `dtype`.
    pub fn new_paged_cache(
        &self,
        block: usize,
        num_blocks: usize,
        dtype: DType,
    ) -> Result<PagedKvCache> {
        let c = &self.config;
        PagedKvCache::new(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            block,
            num_blocks,
            dtype,
            &self.device,
        )
    }

    /// Bytes of K/V one token takes in a cache of `dtype`, over all layers.
    pub fn kv_bytes_per_token(&self, dtype: DType) -> usize {
        let c = &self.config;
        PagedKvCache::bytes_per_block(
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            1,
            dtype,
        )
    }

    /// Feeds each sequence its tokens (at least one; room reserved with
    /// `PagedKvCache::reserve`) and returns the logits (B, V) of each one's last token. A
    /// sequence's result depends on its own tokens only, never on the other sequences.
    pub fn forward_paged(
        &self,
        weights: &DecodeWeights,
        cache: &mut PagedKvCache,
        seqs: &mut [PagedSeq],
    ) -> Result<Tensor> {
        let path = if decode::supported(&self.device, self.compute_dtype, cache.dtype()) {
            PagedPath::Cpu
        } else if cache.dtype() == self.compute_dtype {
            PagedPath::Kernels
        } else {
            PagedPath::Composite
        };
        self.forward_paged_with(path, weights, cache, seqs)
    }

    pub(crate) fn forward_paged_with(
        &self,
        path: PagedPath,
        weights: &DecodeWeights,
        cache: &mut PagedKvCache,
        seqs: &mut [PagedSeq],
    ) -> Result<Tensor> {
        if let Some(i) = seqs.iter().position(|s| s.tokens.is_empty()) {
            crate::fail!("forward_paged: sequence {i} feeds no token");
        }
        let limit = self.config.max_position_embeddings;
        if let Some(s) = seqs.iter().find(|s| s.table.len + s.tokens.len() > limit) {
            crate::fail!(
                "forward_paged: {} tokens exceed the model's max_position_embeddings ({limit})",
                s.table.len + s.tokens.len()
            );
        }
        {
            let tables: Vec<&BlockTable> = seqs.iter().map(|s| &*s.table).collect();
            let new: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
            cache.check_writable(&tables, &new)?;
        }
        let logits = match path {
            PagedPath::Cpu => {
                let c = &self.config;
                let ws = self.cpu_step_weights()?;
                let mut ids = vec![];
                let mut pos = vec![];
                for s in seqs.iter() {
                    ids.extend_from_slice(s.tokens);
                    pos.extend((0..s.tokens.len()).map(|j| (s.table.len + j) as u32));
                }
                let rows: Vec<PagedRow> = seqs
                    .iter()
                    .map(|s| PagedRow {
                        blocks: &s.table.blocks,
                        start: s.table.len,
                        new: s.tokens.len(),
                    })
                    .collect();
                decode::paged_step(c, &ws, weights, cache, &rows, &ids, &pos)?
            }
            PagedPath::Kernels => {
                let rows: Vec<(&BlockTable, &[u32])> =
                    seqs.iter().map(|s| (&*s.table, s.tokens)).collect();
                self.paged_kernels_step(cache, &rows)?
            }
            PagedPath::Composite => {
                let rows = seqs
                    .iter()
                    .map(|s| self.composite_paged(weights, cache, s.table, s.tokens))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&rows, 0)? // (B, V)
            }
        };
        for s in seqs.iter_mut() {
            s.table.len += s.tokens.len();
        }
        Ok(logits)
    }

    /// The reference path for one sequence: its blocks gathered into a one-row `KvCache`, the
    /// composite cached forward over the new tokens, then the blocks they touched written back.
    fn composite_paged(
        &self,
        weights: &DecodeWeights,
        cache: &PagedKvCache,
        table: &BlockTable,
        tokens: &[u32],
    ) -> Result<Tensor> {
        let dev = &self.device;
        let bs = cache.block_size();
        let nb = table.blocks.len();
        let idx = Tensor::from_slice(&table.blocks, nb, dev)?;
        let (mut k, mut v) = (vec![], vec![]);
        for l in 0..cache.layers() {
            let (pk, pv) = cache.layer(l);
            // (NB, Hkv, bs, D) -> (nb, Hkv, bs, D) -> (1, Hkv, nb * bs, D)
            let gather = |p: &Tensor| -> Result<Tensor> {
                let g = p.index_select(&idx, 0)?.transpose(0, 1)?;
                let (h, n, s, d) = g.dims4()?;
                g.contiguous()?.reshape((1, h, n * s, d))
            };
            k.push(gather(pk)?);
            v.push(gather(pv)?);
        }
        let cap = nb * bs;
        let mut valid = vec![0u8; cap];
        valid[..table.len].fill(1);
        let mut one = KvCache::from_parts(k, v, valid, 1, cap, table.len);
        let n = tokens.len();
        let ids = Tensor::from_slice(tokens, (1, n), dev)?;
        let pos: Vec<u32> = (table.len..table.len + n).map(|p| p as u32).collect();
        let pos = Tensor::from_vec(pos, (1, n), dev)?;
        let logits = self.forward_cached_with(
            DecodePath::Composite,
            weights,
            &mut one,
            &ids,
            &pos,
            &vec![1; n],
        )?;
        // Write back the blocks holding the new tokens.
        for l in 0..cache.layers() {
            let (ok, ov) = one.layer(l);
            let (pk, pv) = cache.layer(l);
            for i in table.len / bs..=(table.len + n - 1) / bs {
                let blk = table.blocks[i] as usize;
                // (1, Hkv, cap, D) -> (1, Hkv, bs, D)
                pk.slice_set(&ok.narrow(2, i * bs, bs)?.contiguous()?, 0, blk)?;
                pv.slice_set(&ov.narrow(2, i * bs, bs)?.contiguous()?, 0, blk)?;
            }
        }
        Ok(logits)
    }
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
