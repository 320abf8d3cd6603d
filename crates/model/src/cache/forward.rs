//! The KV-cache forward the rollout decodes through: `Qwen3::forward_cached` appends slots to
//! a `KvCache` and returns the last slot's logits, along one of three paths that compute the
//! same function (`DecodePath`): candle's composite ops, the fused one-slot ops (CUDA kernels),
//! or the CPU decode step of `decode/` (f32 on the CPU, reading a `DecodeWeights` snapshot).
//!
//! Data flow: rollout `generate` -> `forward_cached` -> `Qwen3::layer` per layer (composite
//! and kernels paths) or `decode::step` (CPU path) -> logits (B, V).

use crate::cache::KvCache;
use crate::decode::{self, DecodeWeights};
use crate::model::forward::{LayerKv, Mask};
use crate::model::Qwen3;
use crate::ops::{attention_bias, rms_norm, rope_tables};
use candle_core::{DType, Result, Tensor};

impl Qwen3 {
    /// An empty KV cache for `b` rows and up to `capacity` slots, in the compute dtype.
    pub fn new_cache(&self, b: usize, capacity: usize) -> Result<KvCache> {
        self.new_cache_in(b, capacity, self.compute_dtype)
    }

    /// An empty KV cache storing K and V in `dtype` (F16 on an f32 model halves the bytes each
    /// decode step reads, at the price of rounding K and V to f16 before attention).
    pub fn new_cache_in(&self, b: usize, capacity: usize, dtype: DType) -> Result<KvCache> {
        let c = &self.config;
        KvCache::new(
            c.num_hidden_layers,
            b,
            c.num_key_value_heads,
            capacity,
            c.head_dim,
            dtype,
            &self.device,
        )
    }

    /// A decode snapshot of the current weights for `forward_cached` (packed on first use).
    pub fn decode_weights(&self) -> DecodeWeights {
        DecodeWeights::default()
    }

    /// Appends S new slots per row to the cache and returns the logits of the last new slot
    /// (B, V). ids/positions are (B, S); `valid` (B*S) marks real tokens (0 = padding slot).
    /// `weights` is a snapshot of this model's current weights (`decode_weights`), shared by
    /// every cache decoded with them.
    pub fn forward_cached(
        &self,
        weights: &DecodeWeights,
        cache: &mut KvCache,
        ids: &Tensor,
        positions: &Tensor,
        valid: &[u8],
    ) -> Result<Tensor> {
        let path = if decode::supported(&self.device, self.compute_dtype, cache.dtype()) {
            DecodePath::Cpu
        } else if ids.dim(1)? != 1 || cache.dtype() != self.compute_dtype {
            DecodePath::Composite
        } else if self.device.is_cuda() {
            DecodePath::Kernels
        } else {
            DecodePath::Composite
        };
        self.forward_cached_with(path, weights, cache, ids, positions, valid)
    }

    /// `forward_cached` along a chosen path (tests compare the paths on one device).
    pub(crate) fn forward_cached_with(
        &self,
        path: DecodePath,
        snapshot: &DecodeWeights,
        cache: &mut KvCache,
        ids: &Tensor,
        positions: &Tensor,
        valid: &[u8],
    ) -> Result<Tensor> {
        let c = &self.config;
        let dt = self.compute_dtype;
        let (b, s) = ids.dims2()?;
        let off = cache.len();
        cache.append_slots(valid, b, s)?;
        if path == DecodePath::Cpu {
            let ws = self.cpu_step_weights()?;
            let ids = ids.flatten_all()?.to_vec1::<u32>()?;
            let pos = positions.flatten_all()?.to_vec1::<u32>()?;
            return decode::step(c, &ws, snapshot, cache, &ids, &pos, s);
        }
        // The kernels path needs the validity flags on the device (once per step) and no bias;
        // the composite path the bias.
        let kernels = path == DecodePath::Kernels && s == 1;
        let valid_dev = if kernels {
            let flags = cache.valid();
            Some(Tensor::from_slice(flags, flags.len(), &self.device)?)
        } else {
            None
        };
        let bias = if kernels {
            None
        } else {
            Some(attention_bias(
                &cache.allowed(s),
                b,
                s,
                off + s,
                dt,
                &self.device,
            )?)
        };
        let (cos, sin) = rope_tables(positions, c.head_dim, c.rope_theta, dt)?;
        let mut x = self.embed(ids, false)?;
        for l in 0..c.num_hidden_layers {
            let (k, v) = cache.layer(l);
            let slots = Some(LayerKv::Flat(k, v, off, valid_dev.as_ref()));
            x = self.layer(
                l,
                &x,
                &cos,
                &sin,
                bias.as_ref().map(Mask::Bias),
                slots,
                false,
            )?;
        }
        let last = x.narrow(1, s - 1, 1)?.squeeze(1)?; // (B, H)
        let h = rms_norm(&last, &self.w("model.norm.weight", false)?, c.rms_norm_eps)?;
        h.matmul(&self.w(self.head_name(), false)?.t()?)?
            .to_dtype(crate::ops::accum_dtype(dt)) // (B, V)
    }
}

/// How `forward_cached` runs: candle's composite ops (any device, any slot count), the fused
/// custom ops of `fused` for a one-slot step (on CUDA: the kernels of kernels/*.cu), or the CPU
/// step of `decode::cpu` (f32 on the CPU: prefill and decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodePath {
    Composite,
    Kernels,
    Cpu,
}
