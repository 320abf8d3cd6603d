//! AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction, eps added after
//! the square root), with f32 moments and f32 master weights, state serialisable to safetensors.
//! On CUDA the update runs as terse_model's multi-tensor `adamw::step` (one launch per dtype);
//! `TERSE_FUSED=0` and the CPU keep the per-tensor update of candle ops (`update`).

use crate::clip::Grads;
use candle_core::{DType, Device, Error, Result, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use terse_model::adamw::{self, Slot};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// torch's defaults except weight decay 0.01 (torch's own AdamW default as well).
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    pub fn validate(&self) -> Result<()> {
        for (k, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(Error::Msg(format!("adamw.{k} must be in [0, 1), got {v}")));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(Error::Msg(format!(
                "adamw.eps must be a finite number > 0, got {}",
                self.eps
            )));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(Error::Msg(format!(
                "adamw.weight_decay must be a finite number >= 0, got {}",
                self.weight_decay
            )));
        }
        Ok(())
    }
}

/// Per-parameter state: moments, the f32 master copy when the parameter itself is not f32, and
/// the parameter's own step count (torch counts per parameter).
#[derive(Debug, Clone)]
struct ParamState {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    master: Option<Tensor>,
    step: u64,
}

#[derive(Debug, Clone)]
pub struct AdamW {
    pub config: AdamWConfig,
    state: BTreeMap<String, ParamState>,
    steps: u64,
}

impl AdamW {
    /// Zero moments for every parameter (f32), and an f32 master copy for non-f32 parameters.
    pub fn new(config: AdamWConfig, params: &BTreeMap<String, Var>) -> Result<Self> {
        config.validate()?;
        let mut state = BTreeMap::new();
        for (k, v) in params {
            let t = v.as_tensor();
            // Two storages: the device update writes each moment in place.
            let zeros = || Tensor::zeros(t.shape(), DType::F32, t.device());
            let master = (t.dtype() != DType::F32)
                .then(|| t.to_dtype(DType::F32))
                .transpose()?;
            state.insert(
                k.clone(),
                ParamState {
                    exp_avg: zeros()?,
                    exp_avg_sq: zeros()?,
                    master,
                    step: 0,
                },
            );
        }
        Ok(Self {
            config,
            state,
            steps: 0,
        })
    }

    /// Keeps the state of the parameters `keep` accepts and drops the rest (a ZeRO shard).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.state.retain(|k, _| keep(k));
    }

    /// Parameters this optimizer holds state for.
    pub fn num_params(&self) -> usize {
        self.state.len()
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One AdamW update at learning rate `lr`, parameters in sorted name order. Parameters
    /// without a gradient are left alone (as torch does). On CUDA (unless `TERSE_FUSED=0`) the
    /// parameters whose gradient has their dtype update in place in one launch per dtype
    /// (terse_model's `adamw::step`), bit-identical to the per-tensor update of the rest and of
    /// the CPU.
    pub fn step(&mut self, params: &BTreeMap<String, Var>, grads: &Grads, lr: f64) -> Result<()> {
        let Some(dev) = params.values().next().map(|v| v.device().clone()) else {
            return self.update(params, grads, lr);
        };
        use terse_model::profile::{span, Category};
        span(&dev, Category::Optimizer, || self.update(params, grads, lr))
    }

    /// `step`'s update (a profile's `Optimizer` span around it).
    fn update(&mut self, params: &BTreeMap<String, Var>, grads: &Grads, lr: f64) -> Result<()> {
        let c = self.config.clone();
        if let Some(k) = grads.keys().find(|k| !params.contains_key(*k)) {
            return Err(Error::Msg(format!("gradient for unknown parameter `{k}`")));
        }
        let fused = params.values().next().is_some_and(|v| v.device().is_cuda())
            && terse_model::device::fused();
        let mut batch: Vec<(&String, &Var, Tensor)> = vec![];
        for (name, var) in params {
            let Some(g) = grads.get(name) else { continue };
            let st = self
                .state
                .get_mut(name)
                .ok_or_else(|| Error::Msg(format!("parameter `{name}` has no optimizer state")))?;
            st.step += 1;
            if fused && g.dtype() == var.dtype() {
                batch.push((name, var, g.contiguous()?));
            } else {
                update(&c, st, var, g, lr)?;
            }
        }
        if !batch.is_empty() {
            let slots: Vec<Slot> = batch
                .iter()
                .map(|(name, var, g)| {
                    let st = &self.state[*name];
                    Slot {
                        name: name.as_str(),
                        param: var.as_tensor(),
                        master: st.master.as_ref(),
                        exp_avg: &st.exp_avg,
                        exp_avg_sq: &st.exp_avg_sq,
                        grad: g,
                        scalars: adamw::step_scalars(lr, c.beta1, c.beta2, st.step),
                    }
                })
                .collect();
            let h = adamw::Scalars::new(lr, c.beta1, c.beta2, c.eps, c.weight_decay);
            adamw::step(&slots, &h)?;
        }
        self.steps += 1;
        Ok(())
    }

    /// The state as safetensors bytes: `<name>.exp_avg`, `<name>.exp_avg_sq`, `<name>.step`
    /// and `<name>.master` (non-f32 parameters), plus the step count in the metadata.
    pub fn to_safetensors(&self) -> Result<Vec<u8>> {
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (k, s) in &self.state {
            tensors.push((format!("{k}.exp_avg"), s.exp_avg.to_device(&Device::Cpu)?));
            tensors.push((
                format!("{k}.exp_avg_sq"),
                s.exp_avg_sq.to_device(&Device::Cpu)?,
            ));
            tensors.push((
                format!("{k}.step"),
                Tensor::new(&[s.step as i64], &Device::Cpu)?,
            ));
            if let Some(m) = &s.master {
                tensors.push((format!("{k}.master"), m.to_device(&Device::Cpu)?));
            }
        }
        let meta = std::collections::HashMap::from([
            ("format".to_string(), "terse-adamw".to_string()),
            ("steps".to_string(), self.steps.to_string()),
        ]);
        safetensors::serialize(tensors.iter().map(|(k, t)| (k.as_str(), t)), Some(meta))
            .map_err(|e| Error::Msg(e.to_string()))
    }

    /// Restores the state of `params` from ZeRO shards (each saved by `to_safetensors` on one
    /// rank, any number of them): entries of other parameters are skipped, so a run resumes on
    /// a different number of ranks. The shards must agree on the step count; a parameter no
    /// shard holds is an error naming it.
    pub fn from_shards(
        config: AdamWConfig,
        params: &BTreeMap<String, Var>,
        shards: &[Vec<u8>],
    ) -> Result<Self> {
        let mut merged: Vec<(String, Tensor)> = vec![];
        let mut steps: Option<String> = None;
        for (i, bytes) in shards.iter().enumerate() {
            let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| {
                Error::Msg(format!("optimizer shard {i}: corrupt safetensors: {e}"))
            })?;
            let s = meta
                .metadata()
                .as_ref()
                .and_then(|m| m.get("steps"))
                .cloned();
            match (&steps, s) {
                (_, None) => {
                    return Err(Error::Msg(format!(
                        "optimizer shard {i}: metadata `steps` missing"
                    )))
                }
                (Some(a), Some(b)) if *a != b => {
                    return Err(Error::Msg(format!(
                        "optimizer shards disagree on the step count ({a} vs {b} in shard {i})"
                    )))
                }
                (_, Some(b)) => steps = Some(b),
            }
            for (k, t) in candle_core::safetensors::load_buffer(bytes, &Device::Cpu)? {
                let owner = k.rsplit_once('.').map_or(k.as_str(), |(n, _)| n);
                if params.contains_key(owner) {
                    merged.push((k, t));
                }
            }
        }
        let meta = std::collections::HashMap::from([
            ("format".to_string(), "terse-adamw".to_string()),
            ("steps".to_string(), steps.unwrap_or_else(|| "0".into())),
        ]);
        let bytes = safetensors::serialize(merged.iter().map(|(k, t)| (k.as_str(), t)), Some(meta))
            .map_err(|e| Error::Msg(e.to_string()))?;
        Self::from_safetensors(config, params, &bytes)
    }

    /// Restores state saved by `to_safetensors` for exactly these parameters; an extra, missing
    /// or mis-shaped entry is an error naming it.
    pub fn from_safetensors(
        config: AdamWConfig,
        params: &BTreeMap<String, Var>,
        bytes: &[u8],
    ) -> Result<Self> {
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| Error::Msg(format!("optimizer state: corrupt safetensors: {e}")))?;
        let steps = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("steps"))
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| Error::Msg("optimizer state: metadata `steps` missing".into()))?;
        let mut opt = Self::new(config, params)?;
        let dev = params
            .values()
            .next()
            .map(|v| v.device().clone())
            .unwrap_or(Device::Cpu);
        let mut loaded = candle_core::safetensors::load_buffer(bytes, &dev)?;
        for (name, st) in opt.state.iter_mut() {
            let mut take = |suffix: &str, like: Option<&Tensor>| -> Result<Option<Tensor>> {
                let key = format!("{name}.{suffix}");
                let t = loaded.remove(&key);
                match (t, like) {
                    (Some(t), Some(like)) if t.dims() != like.dims() => Err(Error::Msg(format!(
                        "optimizer state `{key}` has shape {:?}, the parameter has {:?}",
                        t.dims(),
                        like.dims()
                    ))),
                    (None, Some(_)) => Err(Error::Msg(format!(
                        "optimizer state has no `{key}` for parameter `{name}`"
                    ))),
                    (t, _) => Ok(t),
                }
            };
            st.exp_avg = take("exp_avg", Some(&st.exp_avg))?.unwrap_or_else(|| st.exp_avg.clone());
            st.exp_avg_sq =
                take("exp_avg_sq", Some(&st.exp_avg_sq))?.unwrap_or_else(|| st.exp_avg_sq.clone());
            let step = take("step", None)?
                .ok_or_else(|| Error::Msg(format!("optimizer state has no `{name}.step`")))?;
            st.step = step
                .flatten_all()?
                .to_vec1::<i64>()?
                .first()
                .copied()
                .unwrap_or(0) as u64;
            if let Some(m) = st.master.clone() {
                st.master = take("master", Some(&m))?;
            }
        }
        if let Some(extra) = loaded.keys().min() {
            return Err(Error::Msg(format!(
                "optimizer state has `{extra}`, which matches no model parameter"
            )));
        }
        opt.steps = steps;
        Ok(opt)
    }
}

/// One parameter's update by candle ops (its `step` already counted): the CPU's path, the
/// per-tensor baseline on CUDA (`TERSE_FUSED=0`), and the reference `adamw::step` equals.
fn update(c: &AdamWConfig, st: &mut ParamState, var: &Var, g: &Tensor, lr: f64) -> Result<()> {
    let g = g.to_dtype(DType::F32)?;
    let master = match &st.master {
        Some(m) => m.clone(),
        None => var.as_tensor().detach(),
    };
    let master = (master * (1.0 - lr * c.weight_decay))?;
    // torch: exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    st.exp_avg = (&st.exp_avg + ((&g - &st.exp_avg)? * (1.0 - c.beta1))?)?;
    st.exp_avg_sq = ((&st.exp_avg_sq * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
    let bc1 = 1.0 - c.beta1.powi(st.step as i32);
    let bc2_sqrt = (1.0 - c.beta2.powi(st.step as i32)).sqrt();
    let denom = ((st.exp_avg_sq.sqrt()? / bc2_sqrt)? + c.eps)?;
    let master = (master - ((&st.exp_avg / denom)? * (lr / bc1))?)?;
    if st.master.is_some() {
        var.set(&master.to_dtype(var.dtype())?)?;
        st.master = Some(master);
    } else {
        var.set(&master)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "adamw_tests.rs"]
mod tests;
