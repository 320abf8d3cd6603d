//! gpu-check's `grpo_step` (issue 57's item 1): one whole GRPO step of the Qwen3-0.6B shape with
//! random weights on the device, timed by phase (rollout, scoring, log-probs, update) from the
//! step's own report: 32 prompts x 8 samples of the testbed task (prompts well under 256
//! tokens), up to 1,024 new tokens each (random weights almost never sample the end token, so
//! nearly every sample runs the full length), one optimizer step, no KL reference. The first
//! step loads the kernels and captures the decode graphs, so it is reported apart and the
//! second is the figure. The same code runs a tiny shape on the CPU in its test.

use anyhow::Result;
use candle_core::Device;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;
use terse_model::{Config, Qwen3};
use terse_train::{GrpoTrainer, RunConfig};

/// The step's size: prompts, samples a prompt, new tokens at most.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    pub prompts: usize,
    pub group: usize,
    pub max_new: usize,
}

/// Issue 57's configuration.
pub const ISSUE_SHAPE: StepShape = StepShape {
    prompts: 32,
    group: 8,
    max_new: 1024,
};

/// The device's name as the config writes it ("cpu", "cuda:N").
fn device_name(dev: &Device) -> String {
    match dev.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        _ => "cpu".into(),
    }
}

/// One GRPO step of `shape` (random weights) at `step`'s size on `dev`, with the repository
/// at `root`: the seconds of the first step and of the second, the second's phases, and the
/// tokens it generated.
pub fn grpo_step_of(root: &Path, dev: &Device, shape: Config, step: StepShape) -> Result<Value> {
    let mut cfg = RunConfig::from_file(&root.join("configs/default.toml"))?;
    cfg.run.device = device_name(dev);
    // The testbed's tokenizer and task; the weights are the shape's, random.
    cfg.model.path = root.join("models/testbed");
    cfg.sft.steps = 0;
    cfg.grpo.prompts_per_step = step.prompts;
    cfg.grpo.group_size = step.group;
    cfg.grpo.max_new_tokens = step.max_new;
    cfg.grpo.kl_coef = 0.0;
    let (d, dtype) = cfg.run.device_and_dtype()?;
    let policy = Qwen3::random(shape, cfg.run.seed, &d, dtype)?;
    let mut trainer = GrpoTrainer::builder(cfg).model(policy).build()?;
    let t0 = Instant::now();
    trainer.step()?;
    let first_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let r = trainer.step()?;
    let s = t1.elapsed().as_secs_f64();
    let t = &r.time;
    let other = s - (t.rollout_s + t.score_s + t.logprob_s + t.update_s);
    println!(
        "grpo step ({} x {}, up to {} new): {s:.2} s (rollout {:.2}, scoring {:.2}, log-probs {:.2}, update {:.2}, other {other:.2}); first step {first_s:.2} s",
        step.prompts, step.group, step.max_new, t.rollout_s, t.score_s, t.logprob_s, t.update_s
    );
    Ok(json!({
        "prompts": step.prompts,
        "group": step.group,
        "max_new_tokens": step.max_new,
        "s_per_step": s,
        "first_step_s": first_s,
        "rollout_s": t.rollout_s,
        "score_s": t.score_s,
        "logprob_s": t.logprob_s,
        "update_s": t.update_s,
        "other_s": other,
        "rollout_tokens_per_s": t.tokens_per_s,
        "mean_completion_tokens": r.len_mean,
        "truncated": r.truncated,
    }))
}

/// gpu-check's step: the Qwen3-0.6B shape at issue 57's size.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn grpo_step(dev: &Device) -> Result<Value> {
    grpo_step_of(Path::new("."), dev, Config::qwen3_0_6b(), ISSUE_SHAPE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny shape for two small steps on the CPU: every phase is timed, the figure is the
    /// second step, and the completions are no longer than asked.
    #[test]
    fn a_grpo_step_is_timed_by_phase() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let shape = Config::synthetic(30, 32, 64, 2, 2, 1, 16, true).expect("shape");
        let step = StepShape {
            prompts: 2,
            group: 2,
            max_new: 6,
        };
        let v = grpo_step_of(&root, &Device::Cpu, shape, step).expect("step");
        for k in ["s_per_step", "first_step_s", "rollout_s", "update_s"] {
            let x = v[k].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite() && x > 0.0, "{k} {x} in {v}");
        }
        let len = v["mean_completion_tokens"].as_f64().unwrap_or(f64::NAN);
        assert!(len > 0.0 && len <= 6.0, "{v}");
        assert_eq!(v["prompts"], 2);
    }
}
