//! GPU parity, in groups of rows (name, max |difference|, tolerance): each kernel family's op (kernels/)
//! on a device against its CPU reference (kernels/), forward and backward, in f32 and in bf16
//! (the dtype the model computes in on CUDA: inputs rounded to bf16, the reference run in f32
//! on the rounded values; `ops.rs`), the paged ops (`paged.rs`), decode graphs against the
//! uncaptured step (`graphs.rs`), flash attention forward and
//! backward against its CPU implementation (`flash.rs`), a small random Qwen3 decoding 16 steps
//! through the kernels against the composite path on the same device and the training path's
//! log-probs and gradients in bf16 against f32 (`model.rs`), and the multi-tensor AdamW against
//! its reference bit for bit (`adamw.rs`). `cargo xtask gpu-check` runs the
//! groups one at a time (a failing row is recorded and the check goes on,
//! xtask/src/gpu_plan.rs); the `cuda` integration test runs them all. On the CPU every group
//! runs too, its "device" side on the CPU, so the code stays exercised.

mod adamw;
mod common;
mod flash;
mod graphs;
mod model;
mod ops;
mod paged;

use adamw::{adamw_bf16, adamw_f32};
use candle_core::{Device, Result};
pub use common::{bf16_tolerance, diff, Group, Row};
use flash::{flash_bf16, flash_f32};
use graphs::decode_graphs;
use model::{model_decode, model_decode_qwen2, model_training};
use ops::{
    kv_cache_bf16, kv_cache_f32, logprob_bf16, logprob_f32, rmsnorm_bf16, rmsnorm_f32, rope_bf16,
    rope_f32, sample_f32, swiglu_bf16, swiglu_f32,
};
use paged::{paged_bf16, paged_f32};

/// Every group, in the order gpu-check runs them: first what a training run executes (bf16
/// flash attention, the paged rollout, a whole model decoding and training), then the rest.
pub fn groups() -> Vec<Group> {
    vec![
        ("flash attention bf16", flash_bf16),
        ("paged attention bf16", paged_bf16),
        ("decode graphs bf16", decode_graphs),
        ("model decode bf16", model_decode),
        ("qwen2 model decode bf16", model_decode_qwen2),
        ("model training bf16 vs f32", model_training),
        ("adamw bf16", adamw_bf16),
        ("kv cache bf16", kv_cache_bf16),
        ("rmsnorm bf16", rmsnorm_bf16),
        ("rope bf16", rope_bf16),
        ("swiglu bf16", swiglu_bf16),
        ("logprob bf16", logprob_bf16),
        ("flash attention f32", flash_f32),
        ("paged attention f32", paged_f32),
        ("kv cache f32", kv_cache_f32),
        ("rmsnorm f32", rmsnorm_f32),
        ("rope f32", rope_f32),
        ("logprob f32", logprob_f32),
        ("sample f32", sample_f32),
        ("swiglu f32", swiglu_f32),
        ("adamw f32", adamw_f32),
    ]
}

/// Every row of every group (the integration test's view).
pub fn check(dev: &Device) -> Result<Vec<Row>> {
    let mut out = vec![];
    for (_, g) in groups() {
        out.extend(g(dev)?);
    }
    Ok(out)
}
