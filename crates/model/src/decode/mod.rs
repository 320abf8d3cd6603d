//! The CPU decode path of `Qwen3::forward_cached` (`DecodePath::Cpu`) and of
//! `Qwen3::forward_paged`, one folder: `cpu.rs` (the step over the preallocated cache),
//! `paged.rs` (the step over block tables), `layer.rs` (what both steps share: weights, scratch,
//! the layer bodies, one fork-join per step), `access.rs` (in-place cache access), `rows.rs` (row-local loops
//! compiled for AVX2/AVX-512 at run time, the attention dispatch), `avx2.rs` and `avx512.rs`
//! (the grouped-query attention kernels), `matmul.rs` (the projections' dispatcher),
//! `panels.rs` (the projections over packed weight panels), `common.rs` (e^x, the cache views).
//! This file is the dispatcher: which models and caches the path takes, the weights it reads,
//! and the one CPU-feature detection every kernel asks.

use crate::config::Config;
use candle_core::DType;
use std::sync::{Arc, OnceLock};

mod access;
mod avx2;
mod avx512;
mod common;
mod cpu;
mod layer;
pub(crate) mod matmul;
pub(crate) mod paged;
mod panels;
mod rows;

pub(crate) use cpu::step;
pub(crate) use paged::step as paged_step;

/// The decode step's view of the weights, separate from any K/V cache: on the CPU the
/// projections packed into panels at the first step that reads them, so each row's sums run in
/// one order whatever the batch. A snapshot belongs to the weights it first read: after an
/// optimizer step, take a new one (`Qwen3::decode_weights`). Cheap to clone (shared) and to
/// make (nothing is packed until a step needs it); other paths ignore it.
#[derive(Debug, Clone, Default)]
pub struct DecodeWeights {
    pub(crate) packed: Arc<OnceLock<Arc<panels::Packed>>>,
}

/// The SIMD features the kernels need, detected once per process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    /// AVX2, FMA and F16C (every AVX2 CPU has it): the `wide` loops, the AVX2 attention (f32 or
    /// f16 cache) and projections.
    pub avx2_fma: bool,
    /// AVX-512F and DQ: the `wider` loops, the AVX-512 attention and packed projections.
    pub avx512: bool,
}

/// `TERSE_CPU_ISA=avx2` (or `portable`) caps the kernels the CPU paths pick below what the CPU
/// has: how an AVX2-only (or a non-x86) machine runs, measured on this one.
pub(crate) fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let cap = std::env::var("TERSE_CPU_ISA").unwrap_or_default();
            let (no512, none) = (cap == "avx2" || cap == "portable", cap == "portable");
            Features {
                avx2_fma: !none
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c"),
                avx512: !no512
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Features {
                avx2_fma: false,
                avx512: false,
            }
        }
    })
}

/// Whether `step` serves this model and cache: f32 weights on the CPU, an f32 or f16 cache.
pub(crate) fn supported(device: &candle_core::Device, dtype: DType, cache: DType) -> bool {
    device.is_cpu() && dtype == DType::F32 && matches!(cache, DType::F32 | DType::F16)
}

/// The HF names of the weights `step` reads, in the order it reads them; None where the
/// architecture has no such weight (the step reads an empty slice there).
pub(crate) fn weight_names(c: &Config, head: &str) -> Vec<Option<String>> {
    // Called every decode step: presence follows the architecture's two flags.
    let present = |n: &str| {
        if n.ends_with("_norm.weight") && n.starts_with("self_attn.") {
            c.qk_norm
        } else if n.ends_with(".bias") {
            c.qkv_bias
        } else {
            true
        }
    };
    let mut names = vec![
        Some("model.embed_tokens.weight".to_string()),
        Some("model.norm.weight".to_string()),
        Some(head.to_string()),
    ];
    for l in 0..c.num_hidden_layers {
        names.extend(
            layer::PER_LAYER
                .iter()
                .map(|n| present(n).then(|| format!("model.layers.{l}.{n}"))),
        );
    }
    names
}
