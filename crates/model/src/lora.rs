//! LoRA adapters (Hu et al. 2021, arXiv:2106.09685) in PEFT's layout: each targeted linear W
//! (Out, In) gains A (r, In) and B (Out, r), and the model computes with W + (α / r) · B A. The
//! base weights are frozen (stored in the compute dtype: bf16 on CUDA); the adapters are the
//! model's only trainable variables (`Qwen3::vars`), so the optimizer, the gradients, ZeRO and
//! the checkpoints see them alone. `Qwen3::w` adds the delta (with its graph when training);
//! the rollout decodes a merged copy (`Qwen3::merged`, adapters.rs), made once per GRPO step;
//! `adapter_off` turns the delta off, which makes the policy its own KL reference.
//!
//! Files are PEFT's: adapter_config.json and adapter_model.safetensors with the keys
//! `base_model.model.<module>.lora_A.weight` / `lora_B.weight`.

use candle_core::{Result, Tensor, Var};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// The projections LoRA can target, by PEFT's module names.
pub const TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// How A is initialised (B starts at zero, so the adapted model starts as the base).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraInit {
    /// PEFT's default: Kaiming-uniform with a = √5, i.e. U(−1/√In, 1/√In).
    Kaiming,
    /// PEFT's `init_lora_weights = "gaussian"`: N(0, 1/r).
    Gaussian,
}

/// The adapters' shape.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// PEFT module names (`TARGETS`), in `TARGETS` order.
    pub targets: Vec<String>,
    pub init: LoraInit,
}

impl LoraConfig {
    /// α / r, the delta's scale.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// The adapters' parameters on model shape `c`: r · (In + Out) per targeted projection.
    pub fn parameters(&self, c: &crate::Config) -> usize {
        c.expected_tensors()
            .iter()
            .filter(|(n, _)| {
                self.targets
                    .iter()
                    .any(|t| n.ends_with(&format!(".{t}.weight")))
            })
            .map(|(_, s)| self.rank.saturating_mul(s[0] + s[1]))
            .fold(0, usize::saturating_add)
    }

    /// Checks the shape: rank ≥ 1, α > 0, known and non-empty targets (q/k/v/o/gate/up/down
    /// or their `_proj` names), normalised to PEFT's names in `TARGETS` order.
    pub fn new(rank: usize, alpha: f64, targets: &[String], init: LoraInit) -> Result<Self> {
        if rank == 0 {
            crate::fail!("lora rank must be >= 1");
        }
        if !(alpha.is_finite() && alpha > 0.0) {
            crate::fail!("lora alpha must be positive, got {alpha}");
        }
        let mut named = vec![];
        for t in targets {
            let full = if t.ends_with("_proj") {
                t.clone()
            } else {
                format!("{t}_proj")
            };
            if !TARGETS.contains(&full.as_str()) {
                crate::fail!("lora target `{t}` is not one of q, k, v, o, gate, up, down");
            }
            named.push(full);
        }
        if named.is_empty() {
            crate::fail!("lora targets must name at least one projection");
        }
        let targets = TARGETS
            .iter()
            .filter(|t| named.iter().any(|n| n == *t))
            .map(|t| t.to_string())
            .collect();
        Ok(Self {
            rank,
            alpha,
            targets,
            init,
        })
    }
}

/// A model's adapters: the variables by PEFT key, and whether the delta is on.
pub(crate) struct Lora {
    pub config: LoraConfig,
    pub vars: BTreeMap<String, Var>,
    pub enabled: AtomicBool,
}

/// PEFT's key of weight `name`'s A ("A") or B ("B") matrix.
pub(crate) fn peft_key(name: &str, ab: &str) -> String {
    let module = name.trim_end_matches(".weight");
    format!("base_model.model.{module}.lora_{ab}.weight")
}

impl Lora {
    /// (α / r) · B A of weight `name` (Out, In), in f32, with its graph when `train`; None
    /// for a weight without an adapter or with the delta off.
    pub fn delta(&self, name: &str, train: bool) -> Option<Result<Tensor>> {
        if !self.enabled.load(Ordering::Relaxed) {
            return None;
        }
        let a = self.vars.get(&peft_key(name, "A"))?;
        let b = self.vars.get(&peft_key(name, "B"))?;
        let t = |v: &Var| {
            if train {
                v.as_tensor().clone()
            } else {
                v.as_tensor().detach()
            }
        };
        Some(t(b).matmul(&t(a)).and_then(|d| d * self.config.scale())) // (Out, In)
    }
}

/// Turns the adapters off while it lives (the KL reference: the base model).
pub struct AdapterOff<'a>(pub(crate) Option<&'a AtomicBool>);

impl Drop for AdapterOff<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.0 {
            e.store(true, Ordering::Relaxed);
        }
    }
}
