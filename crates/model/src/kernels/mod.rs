//! The CUDA kernels of kernels/*.cu as candle custom ops, one file per kernel family (one per
//! .cu file): adamw.rs, rmsnorm.rs, rope.rs, swiglu.rs, logprob.rs, kv_cache.rs, paged_attention.rs (with paged_split.rs, its flash-decoding launch), paged_qkv.rs (a decode step's query, key and value), sample/ and flash/. Each
//! holds the family's op (its [`op::Kernel`] impl: the CPU path runs the family's f32 reference,
//! the CUDA path launches the kernel), its shape checks (run before every launch, on every
//! device, so a wrong shape is an error, never an out-of-bounds read), its reference, its launch
//! description and its CUDA launch. The same call works everywhere and `cargo xtask gpu-check`
//! compares the two paths. Shared: op.rs (candle's custom-op plumbing), describe.rs (the launch
//! description's vocabulary), geometry.rs (the block sizes nvcc is given), cpu.rs and
//! launching.rs (reading CPU inputs, driving a CUDA launch).
//!
//! Data flow: ops.rs, model/forward.rs (the cached and paged layers), logprob.rs -> a family's
//! op -> its reference (CPU) or its kernel (CUDA); terse-optim's AdamW -> adamw.rs's `step`.

pub mod adamw;
mod cpu;
mod describe;
pub mod flash;
pub(crate) mod gemm;
pub(crate) mod geometry;
pub(crate) mod kv_cache;
#[cfg(feature = "cuda")]
mod launching;
pub(crate) mod logprob;
pub(crate) mod op;
pub(crate) mod paged_attention;
pub(crate) mod paged_qkv;
pub(crate) mod paged_split;
pub(crate) mod rmsnorm;
pub(crate) mod rope;
pub mod sample;
pub(crate) mod swiglu;

pub(crate) use kv_cache::{decode_attention, kv_write};
pub(crate) use logprob::{
    logprob_grad, logprob_grad_of_checked, logprob_stats, logprob_stats_of_checked,
};
pub(crate) use paged_attention::{paged_decode_attention, paged_kv_write, PagedMeta};
pub(crate) use paged_qkv::paged_qkv;
pub(crate) use rmsnorm::{rms_norm, rms_norm_grad, rms_norm_residual};
pub(crate) use rope::{rope, rope_laid_out};
pub(crate) use swiglu::{swiglu, swiglu_grad, swiglu_stacked};

/// One launch description per kernel entry point of kernels/*.cu: the kernel's name, its grid
/// and block, and its argument list in order (buffers by their position in the caller's list,
/// scalars by value). The CUDA launches push exactly these arguments with exactly this
/// geometry, and crates/simt runs the same descriptions on the CPU through the SIMT shim, so a
/// swapped argument or a wrong grid fails a CPU test. Each family's file holds its own; this is
/// the one list of them.
pub mod launch {
    pub use crate::kernels::adamw::launch::*;
    pub use crate::kernels::describe::{Arg, Launch, Storage};
    pub use crate::kernels::flash::launch::*;
    pub use crate::kernels::kv_cache::launch::*;
    pub use crate::kernels::logprob::launch::*;
    pub use crate::kernels::paged_attention::launch::*;
    pub use crate::kernels::paged_qkv::launch::*;
    pub use crate::kernels::paged_split::launch::*;
    pub use crate::kernels::paged_split::{SplitPlan, MAX_SPLITS, SPLIT_CHUNK};
    pub use crate::kernels::rmsnorm::launch::*;
    pub use crate::kernels::rope::launch::*;
    pub use crate::kernels::sample::launch::*;
    pub use crate::kernels::swiglu::launch::*;
}

/// The f32 CPU references of every kernel family (testing.rs re-exports them for crates/simt).
pub(crate) mod references {
    pub use crate::kernels::adamw::reference::*;
    pub use crate::kernels::kv_cache::reference::*;
    pub use crate::kernels::logprob::reference::*;
    pub use crate::kernels::paged_attention::reference::*;
    pub use crate::kernels::paged_qkv::reference::*;
    pub use crate::kernels::rmsnorm::reference::*;
    pub use crate::kernels::rope::reference::*;
    pub use crate::kernels::swiglu::reference::*;
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;

#[cfg(test)]
mod ops_tests;

#[cfg(test)]
mod reference_tests;
