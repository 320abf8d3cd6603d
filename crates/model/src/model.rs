//! The Qwen3 decoder: trainable f32 master weights under HF key names, a training forward that
//! ends in fused token log-probs, and a KV-cache forward for rollout.
//!
//! Data flow: `Batch` -> embed -> N x (attention block, MLP block) -> final norm -> either
//! `token_logprobs` (training, only the selected rows touch the vocabulary) or `logits`
//! (evaluation, small vocabularies). Attention is flash attention over key ranges where the
//! device and dtype have it (`flash/`), else the composite reference. `logprob_backward`
//! (backward.rs) is the training step's forward+backward, with layer checkpointing;
//! `forward_cached` (cache/forward.rs) runs the same blocks over new slots of a `KvCache`.

use crate::batch::Batch;
use crate::checkpoint::{read_weights, write_checkpoint, SaveOptions};
use crate::config::Config;
use crate::kernels as fused;
use crate::kernels::flash::{self, KeyRanges};
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
    pub(crate) compute_dtype: DType,
    /// The dtype the checkpoint was stored in; saving uses it unless told otherwise.
    pub storage_dtype: DType,
    pub(crate) device: Device,
    /// How the training forward runs (attention, checkpointing).
    pub options: ForwardOptions,
    /// LoRA adapters (lora.rs): when present, the only trainable variables, the base frozen.
    pub(crate) lora: Option<crate::lora::Lora>,
}

/// How the full-sequence forward and the training backward run. Every choice computes the
/// same function (to float rounding); they trade memory and speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOptions {
    /// Flash attention (O(T) memory) where the device and dtype have it; else, and when false,
    /// the composite attention with its (B, H, T, T) scores.
    pub flash: bool,
    /// With `flash`: batches of fewer tokens per row take the composite attention, which is
    /// faster at short lengths on a GPU (its matmuls run at cuBLAS speed and its (B, H, T, T)
    /// scores are small); 0 runs flash at every length.
    pub flash_min_tokens: usize,
    /// Layer checkpointing in `logprob_backward`: keep each decoder layer's input only and
    /// recompute one layer at a time in the backward.
    pub checkpoint_layers: bool,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        Self {
            flash: true,
            flash_min_tokens: 0,
            checkpoint_layers: false,
        }
    }
}

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

/// Which attention a layer runs: the composite ops with an additive bias (B, 1, 1, T, S), or
/// flash attention over key ranges (full sequences only, no cache).
#[derive(Clone, Copy)]
pub(crate) enum Mask<'a> {
    Bias(&'a Tensor),
    Ranges(&'a KeyRanges),
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
        let tensors = tensors
            .into_iter()
            .map(|(k, t)| Ok((k, t.to_dtype(master)?)))
            .collect::<Result<_>>()?;
        Self::wrap(config, tensors, compute_dtype, device)
    }

    /// The tensors as they are (no dtype conversion) as the model's variables.
    pub(crate) fn wrap(
        config: Config,
        tensors: BTreeMap<String, Tensor>,
        compute_dtype: DType,
        device: Device,
    ) -> Result<Self> {
        let vars = tensors
            .into_iter()
            .map(|(k, t)| Ok((k, Var::from_tensor(&t)?)))
            .collect::<Result<_>>()?;
        Ok(Self {
            config,
            vars,
            compute_dtype,
            storage_dtype: DType::F32,
            device,
            options: ForwardOptions::default(),
            lora: None,
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

    /// The trainable variables by key, in sorted order (what an optimizer walks): the weights
    /// by HF key, or with LoRA the adapters by PEFT key.
    pub fn vars(&self) -> &BTreeMap<String, Var> {
        match &self.lora {
            Some(l) => &l.vars,
            None => &self.vars,
        }
    }

    /// The base weights by HF key (the same as `vars` without LoRA; frozen with it).
    pub fn base_vars(&self) -> &BTreeMap<String, Var> {
        &self.vars
    }

    /// The master dtype of trainable variables (f32; f64 in gradient checks).
    pub(crate) fn master_dtype(&self) -> DType {
        master_dtype(self.compute_dtype)
    }

    /// Freezes the base weights for LoRA: kept in the compute dtype (bf16 on CUDA), off the
    /// graph (`w` detaches them).
    pub(crate) fn freeze_base(&mut self) -> Result<()> {
        let dt = self.compute_dtype;
        for v in self.vars.values_mut() {
            if v.dtype() != dt {
                *v = Var::from_tensor(&v.as_tensor().to_dtype(dt)?)?;
            }
        }
        Ok(())
    }

    /// Detached base tensors by HF key (they share storage with the variables).
    pub fn tensors(&self) -> BTreeMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
            .collect()
    }

    /// The first trainable variable (by key; the adapters with LoRA) holding a NaN or an
    /// infinity, if any: what an update can change, checked after each.
    pub fn first_non_finite(&self) -> Result<Option<String>> {
        first_non_finite_in(self.vars())
    }

    /// The first base weight holding a NaN or an infinity (the same as `first_non_finite`
    /// without LoRA): checked once when the weights are loaded.
    pub fn first_non_finite_base(&self) -> Result<Option<String>> {
        first_non_finite_in(&self.vars)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// A weight in the compute dtype; part of the graph only when `train`.
    pub(crate) fn w(&self, name: &str, train: bool) -> Result<Tensor> {
        let v = match self.vars.get(name) {
            Some(v) => v,
            None => crate::fail!("internal: weight `{name}` missing"),
        };
        let Some(lora) = &self.lora else {
            let t = if train {
                v.as_tensor().clone()
            } else {
                v.as_tensor().detach()
            };
            return t.to_dtype(self.compute_dtype);
        };
        // LoRA: the frozen base plus the adapters' delta (with its graph when training).
        let base = v.as_tensor().detach();
        match lora.delta(name, train) {
            None => base.to_dtype(self.compute_dtype),
            Some(d) => {
                let d = d?; // (Out, In), master dtype
                (base.to_dtype(d.dtype())? + d)?.to_dtype(self.compute_dtype)
            }
        }
    }

    /// The weights the CPU decode step reads (`decode::weight_names` order), detached, with an
    /// empty tensor where the architecture has none.
    pub(crate) fn cpu_step_weights(&self) -> Result<Vec<Tensor>> {
        crate::decode::weight_names(&self.config, self.head_name())
            .iter()
            .map(|n| match n {
                Some(n) => self.w(n, false),
                None => Tensor::zeros(0, self.compute_dtype, self.device()),
            })
            .collect()
    }

    pub(crate) fn head_name(&self) -> &'static str {
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

    /// A q/k/v projection `{name}.weight`, plus `{name}.bias` where the architecture has one
    /// (Qwen2) -> (B, T, Out).
    fn qkv_proj(&self, x: &Tensor, name: &str, train: bool) -> Result<Tensor> {
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
        rms_norm(x, &self.w(name, train)?, self.config.rms_norm_eps)
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
            .qkv_proj(&h, &format!("{p}.self_attn.q_proj"), train)?
            .reshape((b, t, hq, hd))?;
        let k = self
            .qkv_proj(&h, &format!("{p}.self_attn.k_proj"), train)?
            .reshape((b, t, hkv, hd))?;
        let v = self
            .qkv_proj(&h, &format!("{p}.self_attn.v_proj"), train)?
            .reshape((b, t, hkv, hd))?;
        let q = self
            .head_norm(&q, &format!("{p}.self_attn.q_norm.weight"), train)?
            .transpose(1, 2)?; // (B, Hq, T, hd)
        let k = self
            .head_norm(&k, &format!("{p}.self_attn.k_norm.weight"), train)?
            .transpose(1, 2)?; // (B, Hkv, T, hd)
        let v = v.transpose(1, 2)?.contiguous()?; // (B, Hkv, T, hd)
        let q = rope(&q, cos, sin)?;
        let k = rope(&k, cos, sin)?.contiguous()?;
        let (k, v) = match cache {
            None => (k, v),
            Some(LayerKv::Paged(pk, pv, meta)) => {
                // One new token per sequence, into its block; attention over its block table.
                fused::paged_kv_write(pk, &k.squeeze(2)?, meta)?;
                fused::paged_kv_write(pv, &v.squeeze(2)?, meta)?;
                let attn = fused::paged_decode_attention(&q.squeeze(2)?, pk, pv, meta)?; // (B, Hq, hd)
                let attn = attn.reshape((b, 1, hq * hd))?;
                let x =
                    (x + self.linear(&attn, &format!("{p}.self_attn.o_proj.weight"), train)?)?;
                return self.mlp_block(&p, x, train);
            }
            Some(LayerKv::Flat(ck, cv, off, Some(valid))) if t == 1 => {
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
            Some(Mask::Ranges(r)) if cache.is_none() => flash::attention(&q, &k, &v, r)?,
            _ => crate::fail!(
                "layer {l}: the attention needs a bias or (without a cache) key ranges"
            ),
        };
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
            &self.w(self.head_name(), train)?,
            &tg,
            logprob::DEFAULT_CHUNK_ROWS,
        )
    }
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

/// The first of `vars` (by key) holding a NaN or an infinity: x·0 is NaN exactly for those, so
/// one reduction per tensor tells, on any device; one device sync for all of them (the trainer
/// checks after every update), then a tensor at a time only on a miss.
fn first_non_finite_in(vars: &BTreeMap<String, Var>) -> Result<Option<String>> {
    let probe = |v: &Var| {
        v.as_tensor()
            .affine(0.0, 0.0)?
            .to_dtype(DType::F32)?
            .sum_all()
    };
    let sums = vars.values().map(probe).collect::<Result<Vec<_>>>()?;
    if sums.is_empty()
        || Tensor::stack(&sums, 0)?
            .sum_all()?
            .to_scalar::<f32>()?
            .is_finite()
    {
        return Ok(None);
    }
    for (k, s) in vars.keys().zip(&sums) {
        if !s.to_scalar::<f32>()?.is_finite() {
            return Ok(Some(k.clone()));
        }
    }
    Ok(None)
}
