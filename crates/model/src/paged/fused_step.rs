//! `forward_paged`'s step off the CPU step (CUDA, or any model whose cache is in its compute
//! dtype): every new token of every sequence is one row of a batch (decodes and prefill chunks
//! alike), each layer writing the rows' K/V into their blocks and attending over their block
//! tables through the fused paged ops (`kernels::paged_attention`: kernels/paged_attention.cu on CUDA,
//! their references on the CPU). The tables, lengths and write slots are uploaded once per
//! step (`PagedMeta`).
//!
//! Data flow: `forward_paged` (`PagedPath::Kernels`) -> here -> `Qwen3::layer_stream` with
//! `LayerKv::Paged` -> the head (its norm takes the last pending residual add) -> logits (B, V).

use super::{BlockTable, PagedKvCache};
use crate::kernels::PagedMeta;
use crate::model::forward::{LayerKv, Stream};
use crate::model::Qwen3;
use crate::ops::rope_tables;
use candle_core::{Result, Tensor};

impl Qwen3 {
    /// One step: each sequence (its table, room reserved) feeds its tokens -> (B, V) logits of
    /// each one's last token. Every token is a row of the batch (its own position and key range
    /// over its table), so prefill chunks and decodes run together; within a layer all rows
    /// write their K/V before any attends, so a chunk's tokens see each other causally.
    pub(crate) fn paged_kernels_step(
        &self,
        cache: &PagedKvCache,
        seqs: &[(&BlockTable, &[u32])],
    ) -> Result<Tensor> {
        let dev = &self.device;
        let mut rows = vec![];
        let (mut ids, mut last) = (vec![], vec![]);
        for &(t, toks) in seqs {
            for (j, &id) in toks.iter().enumerate() {
                rows.push((t, t.len + j));
                ids.push(id);
            }
            last.push((rows.len() - 1) as u32);
        }
        let n = rows.len();
        let meta = std::sync::Arc::new(PagedMeta::new(cache, &rows, dev)?);
        let pos: Vec<u32> = rows.iter().map(|&(_, p)| p as u32).collect();
        let pos = Tensor::from_vec(pos, (n, 1), dev)?;
        let ids = Tensor::from_vec(ids, (n, 1), dev)?;
        let x = self.paged_rows(cache, &meta, &ids, &pos)?; // (N, H)
                                                            // Each sequence's last token only: (N, H) -> (B, H).
        let last = Tensor::from_vec(last, seqs.len(), dev)?;
        self.paged_head(x.map(|t| t.index_select(&last, 0))?)
    }

    /// The layers over a step's rows: token ids and positions (N, 1) u32 (their K/V written
    /// where `meta` says) -> the last layer's residual stream (N, H), its last add left to the
    /// head's norm on CUDA. Reads its inputs from the tensors it is given and uploads nothing,
    /// so a decode graph can capture it (graphs.rs).
    pub(crate) fn paged_rows(
        &self,
        cache: &PagedKvCache,
        meta: &std::sync::Arc<PagedMeta>,
        ids: &Tensor,
        pos: &Tensor,
    ) -> Result<Stream> {
        let c = &self.config;
        let (cos, sin) = rope_tables(pos, c.head_dim, c.rope_theta, self.compute_dtype)?;
        let mut x = Stream::of(self.embed(ids, false)?);
        for l in 0..c.num_hidden_layers {
            let (pk, pv) = cache.layer(l);
            let kv = Some(LayerKv::Paged(pk, pv, meta));
            x = self.layer_stream(l, x, &cos, &sin, None, kv, false)?;
        }
        x.map(|t| t.squeeze(1)) // (N, 1, H) -> (N, H)
    }

    /// The residual stream (B, H) -> logits (B, V) in the accumulation dtype (a pending add
    /// joins the final norm).
    pub(crate) fn paged_head(&self, x: Stream) -> Result<Tensor> {
        use crate::profile::{span, Category as C};
        let dev = &self.device;
        let (_, h) = self.norm_stream(x, "model.norm.weight", false)?;
        let wh = self.w(self.head_name(), false)?;
        let logits = span(dev, C::HeadForward, || h.matmul(&wh.t()?))?;
        span(dev, C::Cast, || {
            logits.to_dtype(crate::ops::accum_dtype(self.compute_dtype)) // (B, V)
        })
    }
}
