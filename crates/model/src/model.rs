//! The Qwen3 decoder: trainable f32 master weights under HF key names, a training forward that
//! ends in fused token log-probs, and a KV-cache forward for rollout.
//!
//! Data flow: `Batch` -> embed -> N x (attention block, MLP block) -> final norm -> either
//! `token_logprobs` (training, only the selected rows touch the vocabulary) or `logits`
//! (evaluation, small vocabularies). `forward_cached` runs the same blocks over new slots of a
//! `KvCache` and returns the last slot's logits.

use crate::batch::Batch;
use crate::cache::KvCache;
use crate::checkpoint::{read_weights, write_checkpoint, SaveOptions};
use crate::config::Config;
use crate::decode;
use crate::decode::DecodeWeights;
use crate::fused;
use crate::logprob;
use crate::ops::{attention_bias, gqa_attention, rms_norm, rope, rope_tables};
use candle_core::{DType, Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

/// A Qwen3ForCausalLM whose parameters are candle `Var`s keyed by their HF names.
pub struct Qwen3 {
    pub config: Config,
    /// f32 (or f64 in gradient checks) master weights, in sorted key order.
    vars: BTreeMap<String, Var>,
    /// The dtype the forward computes in (f32 on CPU; bf16 on CUDA).
    compute_dtype: DType,
    /// The dtype the checkpoint was stored in; saving uses it unless told otherwise.
    pub storage_dtype: DType,
    device: Device,
}

impl std::fmt::Debug for Qwen3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Qwen3({} params, {:?} on {:?})",
            self.config.num_parameters(),
            self.compute_dtype,
            self.device
        )
    }
}

impl Qwen3 {
    /// Loads config.json and the weights of an HF checkpoint directory.
    pub fn load(dir: &Path, device: &Device, compute_dtype: DType) -> Result<Self> {
        if !dir.is_dir() {
            crate::fail!("model directory {} does not exist", dir.display());
        }
        let config = Config::from_file(&dir.join("config.json"))?;
        let master = master_dtype(compute_dtype);
        let (tensors, storage_dtype) = read_weights(dir, &config, master, device)?;
        let mut m = Self::from_tensors(config, tensors, compute_dtype)?;
        m.storage_dtype = storage_dtype;
        Ok(m)
    }

    /// Wraps already-loaded tensors (exact HF keys) as trainable variables.
    pub fn from_tensors(
        config: Config,
        tensors: BTreeMap<String, Tensor>,
        compute_dtype: DType,
    ) -> Result<Self> {
        let device = match tensors.values().next() {
            Some(t) => t.device().clone(),
            None => crate::fail!("no tensors"),
        };
        let master = master_dtype(compute_dtype);
        let vars = tensors
            .into_iter()
            .map(|(k, t)| Ok((k, Var::from_tensor(&t.to_dtype(master)?)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            config,
            vars,
            compute_dtype,
            storage_dtype: DType::F32,
            device,
        })
    }

    /// Random weights (normal, std 0.02; norms at 1) from a seed: benchmarks and tests.
    pub fn random(
        config: Config,
        seed: u64,
        device: &Device,
        compute_dtype: DType,
    ) -> Result<Self> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut tensors = BTreeMap::new();
        for (name, shape) in config.expected_tensors() {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else {
                (0..n)
                    .map(|_| {
                        // Box-Muller from two uniforms in (0, 1].
                        let (u1, u2): (f32, f32) = (1.0 - rng.random::<f32>(), rng.random::<f32>());
                        0.02 * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
                    })
                    .collect()
            };
            tensors.insert(name, Tensor::from_vec(data, shape, device)?);
        }
        Self::from_tensors(config, tensors, compute_dtype)
    }

    /// Writes the checkpoint in HF layout (config.json + safetensors, sharded above the limit).
    pub fn save(&self, dir: &Path, opts: &SaveOptions) -> Result<()> {
        write_checkpoint(dir, &self.config, &self.tensors(), opts)
    }

    /// The trainable variables by HF key, in sorted order (what an optimizer walks).
    pub fn vars(&self) -> &BTreeMap<String, Var> {
        &self.vars
    }

    /// Detached master tensors by HF key (they share storage with the variables).
    pub fn tensors(&self) -> BTreeMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
            .collect()
    }

    /// The first weight (by HF key) holding a NaN or an infinity, if any: x·0 is NaN exactly
    /// for those, so one reduction per tensor tells, on any device.
    pub fn first_non_finite(&self) -> Result<Option<String>> {
        for (k, v) in &self.vars {
            let probe = v
                .as_tensor()
                .affine(0.0, 0.0)?
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            if !probe.is_finite() {
                return Ok(Some(k.clone()));
            }
        }
        Ok(None)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// A weight in the compute dtype; part of the graph only when `train`.
    fn w(&self, name: &str, train: bool) -> Result<Tensor> {
        let v = match self.vars.get(name) {
            Some(v) => v,
            None => crate::fail!("internal: weight `{name}` missing"),
        };
        let t = if train {
            v.as_tensor().clone()
        } else {
            v.as_tensor().detach()
        };
        t.to_dtype(self.compute_dtype)
    }

    fn head_name(&self) -> &'static str {
        if self.config.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        }
    }

    /// x (B, T, In) @ W^T with W (Out, In) -> (B, T, Out).
    fn linear(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
        let (b, t, i) = x.dims3()?;
        let w = self.w(name, train)?;
        let out = w.dim(0)?;
        x.reshape((b * t, i))?.matmul(&w.t()?)?.reshape((b, t, out))
    }

    /// One decoder layer. `cache` = (layer cache k/v, slot offset, slot validity (B * capacity),
    /// use the fused one-slot ops) on the inference path.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        l: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        bias: Option<&Tensor>,
        cache: Option<(&Tensor, &Tensor, usize, Option<&Tensor>)>,
        train: bool,
    ) -> Result<Tensor> {
        let c = &self.config;
        let p = format!("model.layers.{l}");
        let (b, t, _) = x.dims3()?;
        let (hq, hkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;

        let h = rms_norm(
            x,
            &self.w(&format!("{p}.input_layernorm.weight"), train)?,
            eps,
        )?;
        let q = self
            .linear(&h, &format!("{p}.self_attn.q_proj.weight"), train)?
            .reshape((b, t, hq, hd))?;
        let k = self
            .linear(&h, &format!("{p}.self_attn.k_proj.weight"), train)?
            .reshape((b, t, hkv, hd))?;
        let v = self
            .linear(&h, &format!("{p}.self_attn.v_proj.weight"), train)?
            .reshape((b, t, hkv, hd))?;
        let q = rms_norm(
            &q,
            &self.w(&format!("{p}.self_attn.q_norm.weight"), train)?,
            eps,
        )?
        .transpose(1, 2)?; // (B, Hq, T, hd)
        let k = rms_norm(
            &k,
            &self.w(&format!("{p}.self_attn.k_norm.weight"), train)?,
            eps,
        )?
        .transpose(1, 2)?; // (B, Hkv, T, hd)
        let v = v.transpose(1, 2)?.contiguous()?; // (B, Hkv, T, hd)
        let q = rope(&q, cos, sin)?;
        let k = rope(&k, cos, sin)?.contiguous()?;
        let (k, v) = match cache {
            None => (k, v),
            Some((ck, cv, off, Some(valid))) if t == 1 => {
                // One new slot: write it in place and attend over the valid slots only, with
                // no bias tensor and no (B, Hq, 1, S) score matrix. `valid` is on the device
                // already: uploaded once per step, not once per layer.
                fused::kv_write(ck, &k.squeeze(2)?, off)?;
                fused::kv_write(cv, &v.squeeze(2)?, off)?;
                let attn = fused::decode_attention(&q.squeeze(2)?, ck, cv, valid, off + 1)?; // (B, Hq, hd)
                let attn = attn.reshape((b, 1, hq * hd))?;
                let x =
                    (x + self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?)?;
                return self.mlp_block(&p, x, train);
            }
            Some((ck, cv, off, _)) => {
                // A cache in another dtype (f16) stores rounded K/V and hands them back
                // converted.
                let dt = k.dtype();
                ck.slice_set(&k.to_dtype(ck.dtype())?, 2, off)?;
                cv.slice_set(&v.to_dtype(cv.dtype())?, 2, off)?;
                let (k, v) = (ck.narrow(2, 0, off + t)?, cv.narrow(2, 0, off + t)?); // (B, Hkv, S, hd)
                (k.to_dtype(dt)?, v.to_dtype(dt)?)
            }
        };
        let Some(bias) = bias else {
            crate::fail!("layer {l}: the composite attention needs the attention bias");
        };
        let attn = gqa_attention(&q, &k, &v, bias)?; // (B, Hq, T, hd)
        let attn = attn
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, hq * hd))?;
        let x = (x + self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?)?;
        self.mlp_block(&p, x, train)
    }

    /// The second half of a decoder layer: x + MLP(RMSNorm(x)).
    fn mlp_block(&self, p: &str, x: Tensor, train: bool) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps;
        let h = rms_norm(
            &x,
            &self.w(&format!("{p}.post_attention_layernorm.weight"), train)?,
            eps,
        )?;
        let gate = self
            .linear(&h, &format!("{p}.mlp.gate_proj.weight"), train)?
            .silu()?;
        let up = self.linear(&h, &format!("{p}.mlp.up_proj.weight"), train)?;
        x + self.linear(&(gate * up)?, &format!("{p}.mlp.down_proj.weight"), train)?
    }

    fn embed(&self, ids: &Tensor, train: bool) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let e = self.w("model.embed_tokens.weight", train)?;
        e.index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, self.config.hidden_size)) // (B, T, H)
    }

    /// Final-norm hidden states (B, T, H) of a padded batch; differentiable when `train`.
    pub fn hidden_states(&self, batch: &Batch, train: bool) -> Result<Tensor> {
        let c = &self.config;
        let dt = self.compute_dtype;
        let (cos, sin) = rope_tables(&batch.position_ids, c.head_dim, c.rope_theta, dt)?;
        let bias = attention_bias(
            &batch.causal_allowed(),
            batch.b,
            batch.t,
            batch.t,
            dt,
            &self.device,
        )?;
        let mut x = self.embed(&batch.input_ids, train)?;
        for l in 0..c.num_hidden_layers {
            x = self.layer(l, &x, &cos, &sin, Some(&bias), None, train)?;
        }
        rms_norm(&x, &self.w("model.norm.weight", train)?, c.rms_norm_eps)
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
        let (b, t, hs) = h.dims3()?;
        let idx = Tensor::from_slice(rows, rows.len(), &self.device)?;
        let sel = h.reshape((b * t, hs))?.index_select(&idx, 0)?; // (N, H)
        let tg = Tensor::from_slice(targets, targets.len(), &self.device)?;
        logprob::token_logprobs(
            &sel,
            &self.w(self.head_name(), train)?,
            &tg,
            logprob::DEFAULT_CHUNK_ROWS,
        )
    }

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
            let ws = decode::weight_names(c, self.head_name())
                .iter()
                .map(|n| self.w(n, false))
                .collect::<Result<Vec<_>>>()?;
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
            let slots = Some((k, v, off, valid_dev.as_ref()));
            x = self.layer(l, &x, &cos, &sin, bias.as_ref(), slots, false)?;
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

/// Master weights stay in full precision whatever the compute dtype (bf16 moments and weights
/// lose updates); f64 compute keeps f64 masters for gradient checks.
fn master_dtype(compute: DType) -> DType {
    if compute == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}
