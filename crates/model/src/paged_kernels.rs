//! `forward_paged`'s decode step off the CPU step (CUDA, or any model whose cache is in its
//! compute dtype): one token per sequence, batched, each layer writing the new K/V into the
//! sequences' blocks and attending over their block tables through the fused paged ops
//! (`fused_paged`: kernels/paged_attention.cu on CUDA, kernels.rs' loops on the CPU). The
//! tables, lengths and write slots are uploaded once per step (`PagedMeta`).
//!
//! Data flow: `forward_paged` (`PagedPath::Kernels`) -> here -> `Qwen3::layer` with
//! `LayerKv::Paged` -> logits (B, V).

use crate::fused_paged::PagedMeta;
use crate::model::{LayerKv, Qwen3};
use crate::ops::{rms_norm, rope_tables};
use crate::paged::{BlockTable, PagedKvCache};
use candle_core::{Result, Tensor};

impl Qwen3 {
    /// One decode step: `ids[i]` fed after `tables[i]`'s tokens (room reserved) -> (B, V).
    pub(crate) fn paged_kernels_decode(
        &self,
        cache: &PagedKvCache,
        tables: &[&BlockTable],
        ids: &[u32],
    ) -> Result<Tensor> {
        let c = &self.config;
        let dev = &self.device;
        let b = tables.len();
        let meta = std::sync::Arc::new(PagedMeta::new(cache, tables, dev)?);
        let pos: Vec<u32> = tables.iter().map(|t| t.len as u32).collect();
        let pos = Tensor::from_vec(pos, (b, 1), dev)?;
        let (cos, sin) = rope_tables(&pos, c.head_dim, c.rope_theta, self.compute_dtype)?;
        let mut x = self.embed(&Tensor::from_slice(ids, (b, 1), dev)?, false)?;
        for l in 0..c.num_hidden_layers {
            let (pk, pv) = cache.layer(l);
            let kv = Some(LayerKv::Paged(pk, pv, &meta));
            x = self.layer(l, &x, &cos, &sin, None, kv, false)?;
        }
        let last = x.squeeze(1)?; // (B, H)
        let h = rms_norm(&last, &self.w("model.norm.weight", false)?, c.rms_norm_eps)?;
        h.matmul(&self.w(self.head_name(), false)?.t()?)?
            .to_dtype(crate::ops::accum_dtype(self.compute_dtype)) // (B, V)
    }
}
