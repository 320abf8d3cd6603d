//! The Qwen3 decoder: trainable f32 master weights under HF key names (this file: loading,
//! saving, the variables and their finiteness), a training forward that ends in fused token
//! log-probs (forward.rs), and a KV-cache forward for rollout.
//!
//! Data flow: `Batch` -> embed -> N x (attention block, MLP block) -> final norm -> either
//! `token_logprobs` (training, only the selected rows touch the vocabulary) or `logits`
//! (evaluation, small vocabularies). Attention is flash attention over key ranges where the
//! device and dtype have it (`kernels/flash/`), else the composite reference. `logprob_backward`
//! (backward.rs) is the training step's forward+backward, with layer checkpointing;
//! `forward_cached` (cache/forward.rs) runs the same blocks over new slots of a `KvCache`.

use crate::checkpoint::{read_weights, write_checkpoint, SaveOptions};
use crate::config::Config;
use candle_core::{DType, Device, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) mod forward;
pub mod keep;
mod layer_grad;
mod stacked;

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
#[non_exhaustive]
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
    /// With `checkpoint_layers`, where the layer backward is written out (CUDA, model/
    /// layer_grad.rs): how many of the last layers keep their forward's state instead of
    /// recomputing it.
    pub keep_layers: KeepLayers,
}

/// How many decoder layers a checkpointed step keeps rather than recomputes (from the last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeepLayers {
    /// As many as the device's free memory holds at the step's start, beside what the rest of
    /// the step needs (`kept_layers`).
    Auto,
    /// This many (at most every layer).
    Count(usize),
}

impl Default for ForwardOptions {
    fn default() -> Self {
        Self {
            flash: true,
            flash_min_tokens: 0,
            checkpoint_layers: false,
            keep_layers: KeepLayers::Count(0),
        }
    }
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

    /// The LM head's weight as `logprob::token_logprobs` takes it. On CUDA without LoRA (unless
    /// `TERSE_FUSED=0`) that is the master itself: the op casts it to the compute dtype once and
    /// writes its gradient in the master's dtype, where a cast node would take a compute-dtype
    /// gradient and cast it back. Elsewhere `w`'s cast, as every other weight.
    pub(crate) fn head_weight(&self, train: bool) -> Result<Tensor> {
        let name = self.head_name();
        if !(self.device.is_cuda() && self.lora.is_none() && crate::device::fused()) {
            return self.w(name, train);
        }
        match self.vars.get(name) {
            Some(v) if train => Ok(v.as_tensor().clone()),
            Some(v) => Ok(v.as_tensor().detach()),
            None => crate::fail!("internal: weight `{name}` missing"),
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
