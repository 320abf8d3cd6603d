//! terse-optim: the update half of a training step. Gradients (by HF parameter name) ->
//! [`clip_grad_norm`] -> [`AdamW::step`] at the learning rate of [`Schedule::lr_at`].
//!
//! Parameters are keyed by name and always visited in sorted order, moments and master weights
//! are f32 whatever the compute dtype, and the whole state saves to and loads from safetensors,
//! so a resumed run is bit-identical to one that never stopped.
//!
//! ```
//! use candle_core::{Device, Tensor, Var};
//! use std::collections::BTreeMap;
//! use terse_optim::{clip_grad_norm, AdamW, AdamWConfig, Schedule};
//!
//! let w = Var::from_tensor(&Tensor::new(&[1.0f32, -2.0], &Device::Cpu)?)?;
//! let params = BTreeMap::from([("w".to_string(), w.clone())]);
//! let loss = w.as_tensor().sqr()?.sum_all()?;
//! let mut grads = terse_optim::collect_grads(&params, &loss.backward()?);
//! let norm = clip_grad_norm(&mut grads, 1.0)?;           // pre-clip norm
//! assert!(norm.is_finite());
//! let sched = Schedule { peak_lr: 1e-3, warmup_steps: 10, ..Default::default() };
//! let mut opt = AdamW::new(AdamWConfig::default(), &params)?;
//! opt.step(&params, &grads, sched.lr_at(opt.steps()))?;
//! # Ok::<(), candle_core::Error>(())
//! ```

mod adamw;
mod clip;
mod schedule;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{accumulate, clip_grad_norm, collect_grads, Grads};
pub use schedule::{Decay, Schedule};
