//! The single integration-test binary: golden checks against HF transformers, gradient checks,
//! checkpoint round trips and bad-input errors, KV-cache parity.

mod architecture;
mod checklists;
mod checkpoint;
mod crash_consistency;
mod crash_model;
mod docs;
mod eval_protocol;
mod examples;
mod faults;
mod file_sizes;
mod golden;
mod gpu;
mod gradients;
mod kv_cache;
mod layers;
mod lora;
mod losses;
mod module_docs;
mod optim;
mod paged_rollout;
mod paper_configs;
mod plugins;
mod public_items;
mod public_surface;
mod ranks;
mod rollout;
mod run_config;
mod run_faults;
mod run_lock;
mod step_exit;
mod tasks;
mod train;
mod train_modes;

use std::path::PathBuf;

/// A fixture directory under tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// A fresh scratch directory under the target dir (removed first if a previous run left it).
pub fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// max |a - b| of two f32 tensors of the same shape.
pub fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .expect("d")
        .abs()
        .expect("a")
        .max_all()
        .expect("m")
        .to_scalar::<f32>()
        .expect("s")
}

/// A short GRPO run from the committed SFT checkpoint.
pub fn from_sft(dir: &std::path::Path, name: &str, steps: u64) -> terse_train::RunConfig {
    let mut c = terse_train::RunConfig::default();
    c.run.dir = dir.to_path_buf();
    c.run.name = name.into();
    c.model.path = crate::fixture("testbed-sft");
    c.model.init = terse_train::config::Init::Checkpoint;
    c.sft.steps = 0;
    c.grpo.steps = steps;
    c.grpo.prompts_per_step = 4;
    c.grpo.group_size = 4;
    c.grpo.max_new_tokens = 64;
    c.checkpoint.every = 1;
    c.eval.per_level = 2;
    c.eval.samples = 1;
    c
}
