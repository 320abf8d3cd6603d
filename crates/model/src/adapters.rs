//! `Qwen3`'s LoRA methods (the adapters themselves are lora.rs): adding fresh adapters,
//! turning them off for the KL reference, the merged copy the rollout decodes, and PEFT's files
//! (save, load). Saved through `crate::disk` (each file written atomically and durably).

use crate::lora::{peft_key, AdapterOff, Lora, LoraConfig, LoraInit, TARGETS};
use crate::model::Qwen3;
use candle_core::{DType, Result, Tensor, Var};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

impl Qwen3 {
    /// Adds fresh adapters (A by `config.init` from `seed`, B zero) and freezes the base,
    /// which is kept in the compute dtype.
    pub fn add_lora(&mut self, config: LoraConfig, seed: u64) -> Result<()> {
        if self.lora.is_some() {
            crate::fail!("the model already has LoRA adapters");
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let r = config.rank;
        let mut vars = BTreeMap::new();
        for (name, shape) in self.config.expected_tensors() {
            let targeted = config
                .targets
                .iter()
                .any(|t| name.ends_with(&format!(".{t}.weight")));
            if !targeted {
                continue;
            }
            let (out, inp) = (shape[0], shape[1]);
            let a: Vec<f32> = match config.init {
                LoraInit::Kaiming => {
                    let bound = 1.0 / (inp as f32).sqrt();
                    (0..r * inp)
                        .map(|_| rng.random_range(-bound..bound))
                        .collect()
                }
                LoraInit::Gaussian => (0..r * inp)
                    .map(|_| {
                        let (u1, u2): (f32, f32) = (1.0 - rng.random::<f32>(), rng.random::<f32>());
                        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
                            / (r as f32).sqrt()
                    })
                    .collect(),
            };
            let master = self.master_dtype();
            let a = Tensor::from_vec(a, (r, inp), &self.device)?.to_dtype(master)?;
            let b = Tensor::zeros((out, r), master, &self.device)?;
            vars.insert(peft_key(&name, "A"), Var::from_tensor(&a)?);
            vars.insert(peft_key(&name, "B"), Var::from_tensor(&b)?);
        }
        self.freeze_base()?;
        self.lora = Some(Lora {
            config,
            vars,
            enabled: AtomicBool::new(true),
        });
        Ok(())
    }

    /// The adapters' shape, when the model has them.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.lora.as_ref().map(|l| &l.config)
    }

    /// The base model while the guard lives (no-op without adapters).
    pub fn adapter_off(&self) -> AdapterOff<'_> {
        let e = self.lora.as_ref().map(|l| &l.enabled);
        if let Some(e) = e {
            e.store(false, Ordering::Relaxed);
        }
        AdapterOff(e)
    }

    /// A model without adapters whose weights are the adapted ones (W + (α / r) B A), in the
    /// compute dtype: what the rollout decodes (once per step) and what `export` saves. Without
    /// adapters, the weights cast to the compute dtype (the same tensors where they are in it).
    pub fn merged(&self) -> Result<Qwen3> {
        let mut tensors = BTreeMap::new();
        for name in self.base_vars().keys() {
            tensors.insert(name.clone(), self.w(name, false)?);
        }
        // Kept in the compute dtype (bf16 on CUDA), like a LoRA base: no f32 copy of the model.
        let mut m = Qwen3::wrap(
            self.config.clone(),
            tensors,
            self.compute_dtype,
            self.device.clone(),
        )?;
        m.storage_dtype = self.storage_dtype;
        m.options = self.options;
        Ok(m)
    }

    /// Runs `f` on what decoding should use: a copy of the weights in the compute dtype (with
    /// adapters, merged), made here once per call, where reading the model itself would cast a
    /// weight at every use: with adapters, or f32 masters under bf16 compute (CUDA). Else the
    /// model itself. The rollout makes one per GRPO step (`generate` makes one per call for
    /// callers that did not); `TERSE_DECODE_CASTS=1` keeps the old per-use casts of unadapted
    /// masters (the baseline `bench decode` measures in the same run). On CUDA the copy's
    /// q/k/v and gate/up weights are stacked (model/stacked.rs): one GEMM each.
    pub fn with_decoding_weights<T, E: From<candle_core::Error>>(
        &self,
        f: impl FnOnce(&Qwen3) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let casts_per_use = self
            .base_vars()
            .values()
            .any(|v| v.dtype() != self.compute_dtype);
        let old_path = std::env::var("TERSE_DECODE_CASTS").is_ok_and(|v| v == "1");
        if self.lora.is_some() || (casts_per_use && !old_path) {
            let mut copy = self.merged()?;
            copy.stack_projections()?;
            f(&copy)
        } else {
            f(self)
        }
    }

    /// Writes the adapters as PEFT does: adapter_config.json and adapter_model.safetensors.
    pub fn save_adapter(&self, dir: &Path, base: &str) -> Result<()> {
        let Some(l) = &self.lora else {
            crate::fail!("the model has no LoRA adapters to save");
        };
        crate::disk::create_dir_all(dir).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let c = &l.config;
        let cfg = serde_json::json!({
            "base_model_name_or_path": base,
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": c.rank,
            "lora_alpha": c.alpha,
            "lora_dropout": 0.0,
            "target_modules": c.targets,
            "bias": "none",
            "fan_in_fan_out": false,
            "init_lora_weights": match c.init {
                LoraInit::Kaiming => serde_json::json!(true),
                LoraInit::Gaussian => serde_json::json!("gaussian"),
            },
            "inference_mode": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        });
        let text = serde_json::to_string_pretty(&cfg)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        crate::checkpoint::atomic_write(&dir.join("adapter_config.json"), text.as_bytes())?;
        let tensors: BTreeMap<String, Tensor> = l
            .vars
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.clone(),
                    v.as_tensor()
                        .to_dtype(DType::F32)?
                        .to_device(&candle_core::Device::Cpu)?,
                ))
            })
            .collect::<Result<_>>()?;
        let bytes = safetensors::serialize(tensors.iter().map(|(k, t)| (k.as_str(), t)), None)
            .map_err(|e| crate::checkpoint::io_err(dir, e))?;
        crate::checkpoint::atomic_write(&dir.join("adapter_model.safetensors"), &bytes)
    }

    /// Loads PEFT adapters (written by `save_adapter` or by PEFT) onto this base model, which
    /// must have none yet; every adapter of the config must be present with its shape.
    pub fn load_adapter(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("adapter_config.json");
        let text =
            std::fs::read_to_string(&path).map_err(|e| crate::checkpoint::io_err(&path, e))?;
        let raw: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let field = |k: &str| {
            raw.get(k).ok_or_else(|| {
                candle_core::Error::Msg(format!("{}: missing `{k}`", path.display()))
            })
        };
        let rank = field("r")?.as_u64().unwrap_or(0) as usize;
        let alpha = field("lora_alpha")?.as_f64().unwrap_or(0.0);
        let targets: Vec<String> = match field("target_modules")? {
            serde_json::Value::Array(a) => a
                .iter()
                .filter_map(|t| t.as_str().map(String::from))
                .collect(),
            serde_json::Value::String(s) if s == "all-linear" => {
                TARGETS.iter().map(|t| t.to_string()).collect()
            }
            other => crate::fail!("{}: target_modules {other} is not a list", path.display()),
        };
        for (k, want) in [("use_dora", false), ("use_rslora", false)] {
            if raw.get(k).and_then(|v| v.as_bool()).unwrap_or(false) != want {
                crate::fail!("{}: `{k}: true` is not supported", path.display());
            }
        }
        let init = match raw.get("init_lora_weights").and_then(|v| v.as_str()) {
            Some("gaussian") => LoraInit::Gaussian,
            _ => LoraInit::Kaiming,
        };
        let config = LoraConfig::new(rank, alpha, &targets, init)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", path.display())))?;
        let file = dir.join("adapter_model.safetensors");
        let loaded = candle_core::safetensors::load(&file, &self.device)?;
        // The rank is checked against the file's A matrices before `add_lora` allocates r x In
        // per projection: a corrupt `r` (fuzzing found 2^32) asked for terabytes.
        let a_rank = loaded
            .iter()
            .find(|(k, _)| k.ends_with(".lora_A.weight"))
            .map(|(_, t)| t.dims().first().copied().unwrap_or(0));
        if a_rank != Some(rank) {
            crate::fail!(
                "{}: r = {rank}, but {} holds {}",
                path.display(),
                file.display(),
                a_rank.map_or("no lora_A matrix".into(), |r| format!(
                    "A matrices of rank {r}"
                ))
            );
        }
        self.add_lora(config, 0)?;
        let Some(l) = &mut self.lora else {
            crate::fail!("internal: adapters missing after add_lora");
        };
        for (k, v) in &l.vars {
            let t = match loaded.get(k) {
                Some(t) => t,
                None => crate::fail!("{}: adapter `{k}` missing", file.display()),
            };
            if t.dims() != v.dims() {
                crate::fail!(
                    "{}: `{k}` has shape {:?}, expected {:?}",
                    file.display(),
                    t.dims(),
                    v.dims()
                );
            }
            v.set(&t.to_dtype(v.dtype())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fuzzing (terse-fuzz, target checkpoint): adapter_config.json with `r` = 2^32 made
    /// `load_adapter` allocate r x In floats per projection (an abort); a rank the file does not
    /// hold is an error naming both files.
    #[test]
    fn a_rank_the_adapter_file_does_not_hold_is_an_error_not_an_allocation() {
        let c = crate::Config::synthetic(32, 16, 24, 1, 2, 1, 8, true).expect("config");
        let dev = candle_core::Device::Cpu;
        let mut m = Qwen3::random(c.clone(), 0, &dev, DType::F32).expect("model");
        let lora = LoraConfig::new(2, 4.0, &["q".into()], LoraInit::Kaiming).expect("lora");
        m.add_lora(lora, 1).expect("add");
        let dir = std::env::temp_dir().join(format!("terse-rank-{}", std::process::id()));
        m.save_adapter(&dir, "base").expect("save");
        let path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&path).expect("read");
        let mut fresh = Qwen3::random(c.clone(), 0, &dev, DType::F32).expect("model");
        fresh.load_adapter(&dir).expect("the saved rank loads");
        std::fs::write(&path, text.replace("\"r\": 2", "\"r\": 4294967296")).expect("write");
        let mut fresh = Qwen3::random(c, 0, &dev, DType::F32).expect("model");
        let err = fresh.load_adapter(&dir).expect_err("a rank the file lacks");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            err.to_string().contains("holds A matrices of rank 2"),
            "{err}"
        );
        assert!(fresh.lora.is_none(), "nothing was added");
    }
}
