//! The forward pass of `Qwen3`: its blocks (projections, the attention block over the
//! composite or flash attention or a KV cache, the MLP block), the full-sequence forward of a
//! `Batch` to hidden states, and its two ends, `logits` and the fused `token_logprobs`.
//!
//! Data flow: `Batch` -> `sequence_inputs` (ids, positions, mask) -> `embed` -> N x `layer` ->
//! final norm -> `logits` or `token_logprobs`; `forward_cached` and `forward_paged` run `layer`
//! over their caches (`LayerKv`).

use super::Qwen3;
use crate::batch::Batch;
use crate::kernels as fused;
use crate::kernels::flash::{self, KeyRanges};
use crate::logprob;
use crate::ops::{attention_bias, gqa_attention, rope, rope_tables};
use crate::profile::{span, Category as C};
use candle_core::{Result, Tensor};

/// The KV cache a decoder layer writes and attends over: the preallocated cache (K, V, the
/// slot the new tokens start at, and for a one-slot step the validity flags on the device), or
/// a paged pool's K and V with one decode step's block tables.
pub(crate) enum LayerKv<'a> {
    Flat(&'a Tensor, &'a Tensor, usize, Option<&'a Tensor>),
    Paged(
        &'a Tensor,
        &'a Tensor,
        &'a std::sync::Arc<crate::kernels::PagedMeta>,
    ),
}

/// The residual stream between decoder layers: x, plus the last MLP block's output where the
/// sum is left to the next norm, which adds and normalises in one kernel (`rmsnorm_fwd_res`, the
/// inference path on CUDA: one launch a layer less).
pub(crate) struct Stream {
    pub(crate) x: Tensor,
    pub(crate) add: Option<Tensor>,
}

impl Stream {
    pub(crate) fn of(x: Tensor) -> Self {
        Stream { x, add: None }
    }

    /// Both parts through `f` (a reshape or a row selection).
    pub(crate) fn map(self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let add = match &self.add {
            Some(a) => Some(f(a)?),
            None => None,
        };
        Ok(Stream {
            x: f(&self.x)?,
            add,
        })
    }
}

/// Which attention a layer runs: the composite ops with an additive bias (B, 1, 1, T, S), or
/// flash attention over key ranges (full sequences only, no cache).
#[derive(Clone, Copy)]
pub(crate) enum Mask<'a> {
    Bias(&'a Tensor),
    Ranges(&'a KeyRanges),
}

impl Qwen3 {
    /// x (B, T, In) @ W^T with W (Out, In) -> (B, T, Out).
    pub(super) fn linear(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
        let (b, t, i) = x.dims3()?;
        let w = self.w(name, train)?;
        let out = w.dim(0)?;
        let y = span(&self.device, C::Matmul, || {
            x.reshape((b * t, i))?.matmul(&w.t()?)
        })?;
        y.reshape((b, t, out))
    }

    /// RMSNorm of x with the weight `name`, a `Norm` span of the profile.
    pub(crate) fn norm(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
        let w = self.w(name, train)?;
        let eps = self.config.rms_norm_eps;
        span(&self.device, C::Norm, || crate::ops::rms_norm(x, &w, eps))
    }

    /// The stream summed and its RMSNorm with the weight `name` -> (sum, normalised): one
    /// `rmsnorm_fwd_res` launch where the sum is pending, else the plain norm. The sum is the
    /// plain add's bits; the fused norm rounds as HF and the training path do (the normalised
    /// value to bf16 before the weight), where candle's inference norm rounds once.
    pub(crate) fn norm_stream(
        &self,
        s: Stream,
        name: &str,
        train: bool,
    ) -> Result<(Tensor, Tensor)> {
        let Some(add) = s.add else {
            let h = self.norm(&s.x, name, train)?;
            return Ok((s.x, h));
        };
        let (w, eps) = (self.w(name, train)?, self.config.rms_norm_eps as f32);
        span(&self.device, C::Norm, || {
            fused::rms_norm_residual(&add, &s.x, &w, eps)
        })
    }

    /// x + y, the residual stream's add (an `Elementwise` span).
    fn residual(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        span(&self.device, C::Elementwise, || x + y)
    }

    /// A q/k/v projection `{name}.weight`, plus `{name}.bias` where the architecture has one
    /// (Qwen2) -> (B, T, Out).
    pub(super) fn qkv_proj(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
        let y = self.linear(x, &format!("{name}.weight"), train)?;
        if !self.config.qkv_bias {
            return Ok(y);
        }
        let b = self.w(&format!("{name}.bias"), train)?; // (Out)
        y.broadcast_add(&b)
    }

    /// RMSNorm over each head (Qwen3's q_norm / k_norm); Qwen2 has none.
    fn head_norm(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
        if !self.config.qk_norm {
            return Ok(x.clone());
        }
        self.norm(x, name, train)
    }

    /// One decoder layer. `cache` = (layer cache k/v, slot offset, slot validity (B * capacity),
    /// use the fused one-slot ops) on the inference path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer(
        &self,
        l: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<Mask>,
        cache: Option<LayerKv>,
        train: bool,
    ) -> Result<Tensor> {
        let s = Stream::of(x.clone());
        let out = self.layer_stream(l, s, cos, sin, mask, cache, train)?;
        match out.add {
            Some(add) => self.residual(&out.x, &add),
            None => Ok(out.x),
        }
    }

    /// `layer` over the residual stream: its input's pending sum joins the input norm, and
    /// with `inference_kernels` its own MLP output is left pending for the next norm.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer_stream(
        &self,
        l: usize,
        x: Stream,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<Mask>,
        cache: Option<LayerKv>,
        train: bool,
    ) -> Result<Stream> {
        let c = &self.config;
        let p = format!("model.layers.{l}");
        let (b, t, _) = x.x.dims3()?;
        let (hq, hkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;

        let (x, h) = self.norm_stream(x, &format!("{p}.input_layernorm.weight"), train)?;
        let x = &x;
        let proj = self.projections(&p, &h, train)?;
        if let Some(LayerKv::Paged(pk, pv, meta)) = &cache {
            let (pk, pv, meta) = (*pk, *pv, *meta);
            if self.paged_qkv_serves(&h, train) {
                // One kernel normalises and rotates q and k and writes k and v into their slots.
                let qkv = proj.stacked()?.squeeze(1)?; // (N, (Hq + 2 Hkv) hd)
                let norms = match c.qk_norm {
                    true => Some((
                        self.w(&format!("{p}.self_attn.q_norm.weight"), train)?,
                        self.w(&format!("{p}.self_attn.k_norm.weight"), train)?,
                    )),
                    false => None,
                };
                let tables = (&cos.squeeze(1)?, &sin.squeeze(1)?); // (N, hd/2)
                let q = span(&self.device, C::DecodeAttention, || {
                    fused::paged_qkv(
                        &qkv,
                        norms.as_ref().map(|(a, b)| (a, b)),
                        eps as f32,
                        tables,
                        (pk, pv),
                        meta,
                    ) // (N, Hq, hd)
                })?;
                return self.paged_attention_block(&p, x, &q, (pk, pv, meta), train);
            }
        }
        let (q, k, v) = proj.split([hq, hkv, hd])?; // (B, T, H, hd) each
        let q = self
            .head_norm(&q, &format!("{p}.self_attn.q_norm.weight"), train)?
            .transpose(1, 2)?; // (B, Hq, T, hd)
        let k = self
            .head_norm(&k, &format!("{p}.self_attn.k_norm.weight"), train)?
            .transpose(1, 2)?; // (B, Hkv, T, hd)
        let v = v.transpose(1, 2)?.contiguous()?; // (B, Hkv, T, hd)
        let (q, k) = span(&self.device, C::Rope, || {
            Ok((rope(&q, cos, sin)?, rope(&k, cos, sin)?.contiguous()?))
        })?;
        let (k, v) = match cache {
            None => (k, v),
            Some(LayerKv::Paged(pk, pv, meta)) => {
                // One new token per sequence, into its block; attention over its block table.
                span(&self.device, C::DecodeAttention, || {
                    fused::paged_kv_write(pk, &k.squeeze(2)?, meta)?;
                    fused::paged_kv_write(pv, &v.squeeze(2)?, meta)
                })?;
                return self.paged_attention_block(&p, x, &q.squeeze(2)?, (pk, pv, meta), train);
            }
            Some(LayerKv::Flat(ck, cv, off, Some(valid))) if t == 1 => {
                // One new slot: write it in place and attend over the valid slots only, with
                // no bias tensor and no (B, Hq, 1, S) score matrix. `valid` is on the device
                // already: uploaded once per step, not once per layer.
                let attn = span(&self.device, C::DecodeAttention, || {
                    fused::kv_write(ck, &k.squeeze(2)?, off)?;
                    fused::kv_write(cv, &v.squeeze(2)?, off)?;
                    fused::decode_attention(&q.squeeze(2)?, ck, cv, valid, off + 1)
                    // (B, Hq, hd)
                })?;
                let attn = attn.reshape((b, 1, hq * hd))?;
                let o = self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?;
                return self.mlp_block(&p, x, &o, train);
            }
            Some(LayerKv::Flat(ck, cv, off, _)) => {
                // A cache in another dtype (f16) stores rounded K/V and hands them back
                // converted.
                let dt = k.dtype();
                ck.slice_set(&k.to_dtype(ck.dtype())?, 2, off)?;
                cv.slice_set(&v.to_dtype(cv.dtype())?, 2, off)?;
                let (k, v) = (ck.narrow(2, 0, off + t)?, cv.narrow(2, 0, off + t)?); // (B, Hkv, S, hd)
                (k.to_dtype(dt)?, v.to_dtype(dt)?)
            }
        };
        let attn = match mask {
            Some(Mask::Bias(bias)) => gqa_attention(&q, &k, &v, bias)?, // (B, Hq, T, hd)
            Some(Mask::Ranges(r)) if cache.is_none() => {
                span(&self.device, C::FlashForward, || {
                    flash::attention(&q, &k, &v, r)
                })?
            }
            _ => crate::fail!(
                "layer {l}: the attention needs a bias or (without a cache) key ranges"
            ),
        };
        let attn = attn
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, hq * hd))?;
        let o = self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?;
        self.mlp_block(&p, x, &o, train)
    }

    /// Whether the inference-only fused kernels run: on CUDA, outside training, unless
    /// `TERSE_FUSED=0` (the CPU keeps the plain ops, so its numbers do not move).
    fn inference_kernels(&self, train: bool) -> bool {
        self.device.is_cuda() && crate::device::fused() && !train
    }

    /// Whether a paged step's query, key and value go through the one `paged_qkv` kernel, from
    /// the layer's normalised input h (B, T, hidden): on CUDA (unless `TERSE_FUSED=0`), outside
    /// training, one token per row, f32 or bf16. Elsewhere the plain norms, rotations and cache
    /// writes run (the CPU's numbers do not move).
    fn paged_qkv_serves(&self, h: &Tensor, train: bool) -> bool {
        self.inference_kernels(train)
            && h.dim(1).is_ok_and(|t| t == 1)
            && matches!(
                h.dtype(),
                candle_core::DType::F32 | candle_core::DType::BF16
            )
    }

    /// The rest of a paged layer once its K/V are in the pools: attention of q (N, Hq, hd) over
    /// the block tables, the output projection, the residual add and the MLP block.
    fn paged_attention_block(
        &self,
        p: &str,
        x: &Tensor,
        q: &Tensor,
        (pk, pv, meta): (&Tensor, &Tensor, &std::sync::Arc<crate::kernels::PagedMeta>),
        train: bool,
    ) -> Result<Stream> {
        let (n, hq, hd) = q.dims3()?;
        let attn = span(&self.device, C::DecodeAttention, || {
            fused::paged_decode_attention(q, pk, pv, meta) // (N, Hq, hd)
        })?;
        let attn = attn.reshape((n, 1, hq * hd))?;
        let o = self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?;
        self.mlp_block(p, x, &o, train)
    }

    /// The second half of a decoder layer, from the residual stream `x` and the attention
    /// block's output `o`: s = x + o, then s + MLP(RMSNorm(s)). With `inference_kernels` the add
    /// and the norm are one `rmsnorm_fwd_res` launch (HF's rounding, as the training path's
    /// norm), and the last add is left to the next norm (`Stream`); elsewhere plain ops.
    fn mlp_block(&self, p: &str, x: &Tensor, o: &Tensor, train: bool) -> Result<Stream> {
        let name = format!("{p}.post_attention_layernorm.weight");
        let s = match self.inference_kernels(train) {
            true => Stream {
                x: x.clone(),
                add: Some(o.clone()),
            },
            false => Stream::of(self.residual(x, o)?),
        };
        let (x, h) = self.norm_stream(s, &name, train)?;
        let act = match self.stacked_swiglu(p, &h, train)? {
            Some(act) => act,
            None => {
                let gate = self.linear(&h, &format!("{p}.mlp.gate_proj.weight"), train)?;
                let up = self.linear(&h, &format!("{p}.mlp.up_proj.weight"), train)?;
                // On CUDA one kernel each way (kernels/swiglu.cu); the CPU keeps candle's two
                // ops, whose rounding the fused reference does not repeat (`TERSE_FUSED=0`:
                // CUDA too).
                span(&self.device, C::Elementwise, || {
                    if h.device().is_cuda() && crate::device::fused() {
                        crate::kernels::swiglu(&gate, &up)
                    } else {
                        gate.silu()? * up
                    }
                })?
            }
        };
        let down = self.linear(&act, &format!("{p}.mlp.down_proj.weight"), train)?;
        if self.inference_kernels(train) {
            return Ok(Stream { x, add: Some(down) });
        }
        Ok(Stream::of(self.residual(&x, &down)?))
    }

    pub(crate) fn embed(&self, ids: &Tensor, train: bool) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let e = self.w("model.embed_tokens.weight", train)?;
        e.index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, self.config.hidden_size)) // (B, T, H)
    }

    /// Whether full-sequence forwards run flash attention (asked for, and the device and
    /// dtype have it): then packed batches cost O(T) too.
    pub fn flash_active(&self) -> bool {
        self.options.flash && flash::supported(&self.device, self.compute_dtype)
    }

    /// The rotary tables and the attention mask of a full-sequence forward over `batch`:
    /// key ranges for flash attention where it serves, else the composite's bias.
    pub(crate) fn sequence_inputs(&self, batch: &Batch) -> Result<(Tensor, Tensor, MaskOwned)> {
        let c = &self.config;
        let dt = self.compute_dtype;
        let (cos, sin) = rope_tables(&batch.position_ids, c.head_dim, c.rope_theta, dt)?;
        let ranges = match &batch.segments {
            _ if !self.flash_active() || batch.t < self.options.flash_min_tokens => None,
            Some(lens) => Some(KeyRanges::packed(lens, batch.t, &self.device)?),
            None => KeyRanges::from_mask(&batch.mask, batch.b, batch.t, &self.device)?,
        };
        let mask = match ranges {
            Some(r) => MaskOwned::Ranges(r),
            None => MaskOwned::Bias(attention_bias(
                &batch.causal_allowed(),
                batch.b,
                batch.t,
                batch.t,
                dt,
                &self.device,
            )?),
        };
        Ok((cos, sin, mask))
    }

    /// Final-norm hidden states (B, T, H) of a padded or packed batch; differentiable when
    /// `train`.
    pub fn hidden_states(&self, batch: &Batch, train: bool) -> Result<Tensor> {
        let c = &self.config;
        let (cos, sin, mask) = self.sequence_inputs(batch)?;
        let mut x = self.embed(&batch.input_ids, train)?;
        for l in 0..c.num_hidden_layers {
            x = self.layer(l, &x, &cos, &sin, Some(mask.as_mask()), None, train)?;
        }
        self.norm(&x, "model.norm.weight", train)
    }

    /// Full logits (B, T, V) in the accumulation dtype, no graph. Only for small vocabularies
    /// (evaluation, tests): training goes through `token_logprobs`.
    pub fn logits(&self, batch: &Batch) -> Result<Tensor> {
        let h = self.hidden_states(batch, false)?;
        let (b, t, hs) = h.dims3()?;
        let w = self.w(self.head_name(), false)?;
        let logits = h.reshape((b * t, hs))?.matmul(&w.t()?)?; // (B*T, V)
        logits
            .to_dtype(crate::ops::accum_dtype(self.compute_dtype))?
            .reshape((b, t, ()))
    }

    /// log p(targets) at the flat rows `rows` (r * T + t) of the batch -> (N), f32 for half
    /// compute. With `train` the result is differentiable in every parameter.
    pub fn token_logprobs(
        &self,
        batch: &Batch,
        rows: &[u32],
        targets: &[u32],
        train: bool,
    ) -> Result<Tensor> {
        if rows.len() != targets.len() {
            crate::fail!(
                "token_logprobs: {} rows but {} targets",
                rows.len(),
                targets.len()
            );
        }
        let h = self.hidden_states(batch, train)?;
        self.head_logprobs(&h, rows, targets, train)
    }

    /// log p(targets) at flat rows of final-norm hidden states h (B, T, H) -> (N).
    pub(crate) fn head_logprobs(
        &self,
        h: &Tensor,
        rows: &[u32],
        targets: &[u32],
        train: bool,
    ) -> Result<Tensor> {
        let (b, t, hs) = h.dims3()?;
        let idx = Tensor::from_slice(rows, rows.len(), &self.device)?;
        let sel = h.reshape((b * t, hs))?.index_select(&idx, 0)?; // (N, H)
        let tg = Tensor::from_slice(targets, targets.len(), &self.device)?;
        logprob::token_logprobs(
            &sel,
            &self.head_weight(train)?,
            &tg,
            logprob::DEFAULT_CHUNK_ROWS,
        )
    }
}

/// The mask a full-sequence forward owns (see `Mask`).
pub(crate) enum MaskOwned {
    Bias(Tensor),
    Ranges(KeyRanges),
}

impl MaskOwned {
    pub(crate) fn as_mask(&self) -> Mask<'_> {
        match self {
            MaskOwned::Bias(b) => Mask::Bias(b),
            MaskOwned::Ranges(r) => Mask::Ranges(r),
        }
    }
}
