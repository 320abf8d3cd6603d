//! AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction, eps added after
//! the square root), with f32 moments and f32 master weights, state serialisable to safetensors.

use crate::clip::Grads;
use candle_core::{DType, Device, Error, Result, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
            let zeros = Tensor::zeros(t.shape(), DType::F32, t.device())?;
            let master = (t.dtype() != DType::F32)
                .then(|| t.to_dtype(DType::F32))
                .transpose()?;
            state.insert(
                k.clone(),
                ParamState {
                    exp_avg: zeros.clone(),
                    exp_avg_sq: zeros,
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
    /// without a gradient are left alone (as torch does).
    pub fn step(&mut self, params: &BTreeMap<String, Var>, grads: &Grads, lr: f64) -> Result<()> {
        let c = &self.config;
        if let Some(k) = grads.keys().find(|k| !params.contains_key(*k)) {
            return Err(Error::Msg(format!("gradient for unknown parameter `{k}`")));
        }
        for (name, var) in params {
            let Some(g) = grads.get(name) else { continue };
            let st = self
                .state
                .get_mut(name)
                .ok_or_else(|| Error::Msg(format!("parameter `{name}` has no optimizer state")))?;
            let g = g.to_dtype(DType::F32)?;
            st.step += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: &[(&str, &[f32])]) -> BTreeMap<String, Var> {
        v.iter()
            .map(|(k, x)| (k.to_string(), Var::new(*x, &Device::Cpu).expect("var")))
            .collect()
    }

    fn grads(p: &BTreeMap<String, Var>, step: usize) -> Grads {
        p.iter()
            .map(|(k, v)| {
                let n = v.elem_count();
                let g: Vec<f32> = (0..n).map(|i| ((i + 3 * step) % 7) as f32 - 3.0).collect();
                (k.clone(), Tensor::from_vec(g, n, &Device::Cpu).expect("g"))
            })
            .collect()
    }

    fn values(p: &BTreeMap<String, Var>) -> Vec<u32> {
        p.values()
            .flat_map(|v| v.as_tensor().to_vec1::<f32>().expect("v"))
            .map(f32::to_bits)
            .collect()
    }

    #[test]
    fn save_after_k_steps_then_continue_is_bit_identical() {
        let init: &[(&str, &[f32])] = &[("b", &[1.0, 2.0, 3.0]), ("a", &[-1.0, 0.5])];
        let cfg = AdamWConfig::default();
        let p1 = params(init);
        let mut o1 = AdamW::new(cfg.clone(), &p1).expect("opt");
        for s in 0..6 {
            o1.step(&p1, &grads(&p1, s), 1e-2).expect("step");
        }
        let p2 = params(init);
        let mut o2 = AdamW::new(cfg.clone(), &p2).expect("opt");
        for s in 0..3 {
            o2.step(&p2, &grads(&p2, s), 1e-2).expect("step");
        }
        let bytes = o2.to_safetensors().expect("save");
        let mut o3 = AdamW::from_safetensors(cfg, &p2, &bytes).expect("load");
        assert_eq!(o3.steps(), 3);
        for s in 3..6 {
            o3.step(&p2, &grads(&p2, s), 1e-2).expect("step");
        }
        assert_eq!(values(&p1), values(&p2));
    }

    #[test]
    fn bf16_parameters_keep_f32_master_weights() {
        let p: BTreeMap<String, Var> = [(
            "w".to_string(),
            Var::from_tensor(
                &Tensor::new(&[1.0f32], &Device::Cpu)
                    .expect("t")
                    .to_dtype(DType::BF16)
                    .expect("bf16"),
            )
            .expect("var"),
        )]
        .into();
        let mut o = AdamW::new(
            AdamWConfig {
                weight_decay: 0.0,
                ..Default::default()
            },
            &p,
        )
        .expect("opt");
        // Updates of 1e-4 are below bf16 resolution at 1.0 but must accumulate in the master.
        for _ in 0..100 {
            let g = [(
                "w".to_string(),
                Tensor::new(&[1.0f32], &Device::Cpu).expect("g"),
            )]
            .into();
            o.step(&p, &g, 1e-4).expect("step");
        }
        let master = o.state["w"]
            .master
            .as_ref()
            .expect("master")
            .to_vec1::<f32>()
            .expect("v")[0];
        assert!((master - 0.99).abs() < 1e-5, "{master}");
        let w = p["w"]
            .as_tensor()
            .to_dtype(DType::F32)
            .expect("f32")
            .to_vec1::<f32>()
            .expect("v")[0];
        assert!((w - 0.99).abs() < 4e-3, "{w}");
    }

    #[test]
    fn load_rejects_mismatched_names_and_shapes() {
        let p = params(&[("a", &[1.0, 2.0])]);
        let bytes = AdamW::new(AdamWConfig::default(), &p)
            .expect("opt")
            .to_safetensors()
            .expect("save");
        let other = params(&[("z", &[1.0, 2.0])]);
        let e = AdamW::from_safetensors(AdamWConfig::default(), &other, &bytes)
            .expect_err("names")
            .to_string();
        assert!(e.contains("`z.exp_avg`"), "{e}");
        let wider = params(&[("a", &[1.0, 2.0, 3.0])]);
        let e = AdamW::from_safetensors(AdamWConfig::default(), &wider, &bytes)
            .expect_err("shape")
            .to_string();
        assert!(
            e.contains("`a.exp_avg`") && e.contains("[2]") && e.contains("[3]"),
            "{e}"
        );
        let two = params(&[("a", &[1.0, 2.0]), ("b", &[1.0])]);
        let bytes2 = AdamW::new(AdamWConfig::default(), &two)
            .expect("opt")
            .to_safetensors()
            .expect("save");
        let e = AdamW::from_safetensors(AdamWConfig::default(), &p, &bytes2)
            .expect_err("extra")
            .to_string();
        assert!(e.contains("`b.exp_avg"), "{e}");
        assert!(AdamW::from_safetensors(AdamWConfig::default(), &p, b"garbage").is_err());
    }
}
