//! `forward_paged`'s batched decode step where the CPU step does not serve (CUDA; an f16 or bf16
//! model): every sequence's blocks gathered into one contiguous (B, Hkv, L + 1, D) copy per
//! layer, the new token written at slot L of the copy and attended by the fused one-slot ops
//! (on CUDA the kernels of kernels/kv_cache.cu; validity flags skip each row's unused slots),
//! then the new K/V scattered back into its block of the pool. The copy costs two extra passes
//! over the context per layer: a native paged-attention kernel would read the blocks in place.
//!
//! Data flow: `forward_paged` (one token per sequence, not the CPU step) -> here -> logits (B, V).

use crate::model::Qwen3;
use crate::ops::{rms_norm, rope_tables};
use crate::paged::{BlockTable, PagedKvCache};
use candle_core::{Result, Tensor};

impl Qwen3 {
    /// One decode step: `ids[i]` fed after `tables[i]`'s tokens (blocks reserved) -> (B, V).
    pub(crate) fn gathered_decode(
        &self,
        cache: &PagedKvCache,
        tables: &[&BlockTable],
        ids: &[u32],
    ) -> Result<Tensor> {
        let c = &self.config;
        let dev = &self.device;
        let (b, bs) = (tables.len(), cache.block_size());
        let (hkv, d) = (c.num_key_value_heads, c.head_dim);
        // Blocks per row, padded with the row's first block (read but masked).
        let nb = tables
            .iter()
            .map(|t| t.len.div_ceil(bs))
            .max()
            .unwrap_or(0)
            .max(1);
        let cap = nb * bs + 1; // the new token at slot nb * bs
        let mut idx = Vec::with_capacity(b * nb);
        let mut valid = vec![0u8; b * cap];
        // Pool rows ((blk * Hkv + h) * bs + off) of each row's new token, per head.
        let mut dst = Vec::with_capacity(b * hkv);
        for (r, t) in tables.iter().enumerate() {
            let used = t.len.div_ceil(bs);
            for i in 0..nb {
                idx.push(if i < used { t.blocks[i] } else { t.blocks[0] });
            }
            valid[r * cap..r * cap + t.len].fill(1);
            valid[r * cap + cap - 1] = 1;
            let (blk, off) = (t.blocks[t.len / bs] as usize, t.len % bs);
            dst.extend((0..hkv).map(|h| ((blk * hkv + h) * bs + off) as u32));
        }
        let idx = Tensor::from_vec(idx, b * nb, dev)?;
        let valid = Tensor::from_vec(valid, b * cap, dev)?;
        // (B * Hkv) pool rows, broadcast over D for scatter_set.
        let dst = Tensor::from_vec(dst, (b * hkv, 1), dev)?
            .broadcast_as((b * hkv, d))?
            .contiguous()?;
        let pos: Vec<u32> = tables.iter().map(|t| t.len as u32).collect();
        let pos = Tensor::from_vec(pos, (b, 1), dev)?;
        let (cos, sin) = rope_tables(&pos, d, c.rope_theta, self.compute_dtype)?;
        let mut x = self.embed(&Tensor::from_slice(ids, (b, 1), dev)?, false)?;
        for l in 0..c.num_hidden_layers {
            let (pk, pv) = cache.layer(l);
            // (NB, Hkv, bs, D) -> (B, nb, Hkv, bs, D) -> (B, Hkv, nb * bs + 1, D)
            let gather = |p: &Tensor| -> Result<Tensor> {
                let g = p
                    .index_select(&idx, 0)?
                    .reshape((b, nb, hkv, bs, d))?
                    .permute((0, 2, 1, 3, 4))?
                    .reshape((b, hkv, nb * bs, d))?;
                Tensor::cat(
                    &[&g, &Tensor::zeros((b, hkv, 1, d), p.dtype(), p.device())?],
                    2,
                )
            };
            let (gk, gv) = (gather(pk)?, gather(pv)?);
            let slots = Some((&gk, &gv, cap - 1, Some(&valid)));
            x = self.layer(l, &x, &cos, &sin, None, slots, false)?;
            // The new token's K/V (B, Hkv, D) into the pool, viewed as (NB * Hkv * bs, D).
            for (p, g) in [(pk, &gk), (pv, &gv)] {
                let new = g.narrow(2, cap - 1, 1)?.reshape((b * hkv, d))?; // (B * Hkv, D)
                let n = p.elem_count() / d;
                p.reshape((n, d))?.scatter_set(&dst, &new, 0)?;
            }
        }
        let last = x.squeeze(1)?; // (B, H)
        let h = rms_norm(&last, &self.w("model.norm.weight", false)?, c.rms_norm_eps)?;
        h.matmul(&self.w(self.head_name(), false)?.t()?)?
            .to_dtype(crate::ops::accum_dtype(self.compute_dtype)) // (B, V)
    }
}
