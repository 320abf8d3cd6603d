//! terse-model: a trainable Qwen3 on candle that loads and saves HF checkpoints and matches
//! transformers. Knows nothing about RL: the trainer asks it for token log-probs, the sampler
//! drives its KV-cache forward.
//!
//! ```no_run
//! use terse_model::{Batch, Padding, Qwen3, device::select};
//! let (device, dtype) = select("cpu")?;
//! let model = Qwen3::load(std::path::Path::new("models/testbed"), &device, dtype)?;
//! let batch = Batch::from_rows(&[vec![1, 5, 9], vec![1, 7]], 0, Padding::Right, &device)?;
//! let (rows, targets) = batch.next_token_selection();
//! let logp = model.token_logprobs(&batch, &rows, &targets, true)?; // (N), differentiable
//! let grads = logp.sum_all()?.backward()?;
//! # Ok::<(), candle_core::Error>(())
//! ```

/// Returns a plain one-line error (candle's `bail!` attaches a backtrace when RUST_BACKTRACE is
/// set, which would break the one-line error promise of the CLI).
#[macro_export]
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err(candle_core::Error::Msg(format!($($arg)*)))
    };
}

mod adapters;
pub mod backward;
pub mod batch;
pub mod cache;
pub mod checkpoint;
pub mod config;
mod decode;
pub mod device;
pub mod disk;
pub(crate) mod kernels;
pub mod logprob;
pub mod lora;
pub mod model;
pub mod ops;
pub mod paged;
pub mod profile;
pub mod reference;
pub mod testing;

pub use batch::{Batch, Padding};
pub use cache::KvCache;
pub use checkpoint::{resolve, SaveOptions};
pub use config::Config;
pub use decode::DecodeWeights;
pub use lora::{LoraConfig, LoraInit};
pub use model::{keep, ForwardOptions, KeepLayers, Qwen3};
pub use paged::PagedSeq;
pub use paged::{BlockTable, PagedKvCache};

pub use kernels::{adamw, flash, launch, sample};
