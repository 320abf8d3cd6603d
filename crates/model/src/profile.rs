//! Where a training step's or a decode step's device time goes, by category (issue 57's
//! `profile`): while a profile is on (`start` ... `finish`, on one thread: the profile is the
//! calling thread's), each span the written layer backward, the log-prob head, the layers'
//! forward (model/forward.rs) and the sampler mark (`span`) is bracketed by two CUDA
//! events on the device's stream, or by the host clock on the CPU, where ops run synchronously.
//! Off (the default) a span is one thread-local read and no event, so the training path pays
//! nothing. Spans do not nest: each marks one op's launches.
//!
//! Data flow: gpu-check's `profile` -> `start` -> model/layer_grad.rs, model/forward.rs,
//! logprob.rs, kernels/sample/ and terse-optim's `span`s during one step -> `finish` (synchronises once, then reads every pair) -> per-category
//! milliseconds and span counts; the step's wall time less their sum is what no span covers.

use candle_core::{Device, Result};
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// What a span's launches do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Category {
    /// cuBLAS GEMMs of the projections (forward and the two of each backward).
    Matmul,
    FlashForward,
    FlashBackward,
    /// The log-prob head's chunked forward (its GEMMs and kernels together).
    HeadForward,
    HeadBackward,
    /// RMSNorm forward and backward (with the residual add when fused in).
    Norm,
    Rope,
    /// SwiGLU and the gradients' adds.
    Elementwise,
    /// dtype casts: the weights once a step, the gradients to the master dtype.
    Cast,
    /// Clipping's norm and the AdamW update (terse-optim).
    Optimizer,
    /// A decode step's cache writes and attention over the cache (with the fused query and
    /// key on CUDA: their norms and RoPE).
    DecodeAttention,
    /// The device sampler's draws.
    Sample,
}

impl Category {
    /// Every category, in order.
    pub const ALL: [Category; 12] = [
        Category::Matmul,
        Category::FlashForward,
        Category::FlashBackward,
        Category::HeadForward,
        Category::HeadBackward,
        Category::Norm,
        Category::Rope,
        Category::Elementwise,
        Category::Cast,
        Category::Optimizer,
        Category::DecodeAttention,
        Category::Sample,
    ];

    /// The report's key.
    pub fn name(self) -> &'static str {
        match self {
            Category::Matmul => "matmul",
            Category::FlashForward => "flash_forward",
            Category::FlashBackward => "flash_backward",
            Category::HeadForward => "head_forward",
            Category::HeadBackward => "head_backward",
            Category::Norm => "norm",
            Category::Rope => "rope",
            Category::Elementwise => "elementwise",
            Category::Cast => "cast",
            Category::Optimizer => "optimizer",
            Category::DecodeAttention => "decode_attention",
            Category::Sample => "sample",
        }
    }
}

/// One end of a span.
enum Mark {
    Host(Instant),
    #[cfg(feature = "cuda")]
    Event(candle_core::cuda_backend::cudarc::driver::CudaEvent),
}

thread_local! {
    /// Whether this thread's profile is on.
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Its spans, in order.
    static SPANS: RefCell<Vec<(Category, Mark, Mark)>> = const { RefCell::new(Vec::new()) };
}

/// Starts this thread's profile (dropping any unfinished one).
pub fn start() {
    SPANS.with(|s| s.borrow_mut().clear());
    ON.with(|on| on.set(true));
}

/// One category's total of a finished profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Total {
    pub category: Category,
    pub ms: f64,
    pub spans: usize,
}

/// Ends this thread's profile: synchronises `device` once and returns each category's milliseconds and
/// span count, in `Category` order (categories without a span left out).
pub fn finish(device: &Device) -> Result<Vec<Total>> {
    ON.with(|on| on.set(false));
    device.synchronize()?;
    let taken = SPANS.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let mut totals: std::collections::BTreeMap<Category, (f64, usize)> = Default::default();
    for (c, a, b) in taken {
        let ms = match (a, b) {
            (Mark::Host(a), Mark::Host(b)) => (b - a).as_secs_f64() * 1e3,
            #[cfg(feature = "cuda")]
            (Mark::Event(a), Mark::Event(b)) => f64::from(a.elapsed_ms(&b).map_err(cuda_err)?),
            #[cfg(feature = "cuda")]
            _ => crate::fail!("profile: a span began and ended on different clocks"),
        };
        let e = totals.entry(c).or_default();
        e.0 += ms;
        e.1 += 1;
    }
    Ok(totals
        .into_iter()
        .map(|(category, (ms, spans))| Total {
            category,
            ms,
            spans,
        })
        .collect())
}

#[cfg(feature = "cuda")]
fn cuda_err(e: candle_core::cuda_backend::cudarc::driver::DriverError) -> candle_core::Error {
    candle_core::Error::Msg(format!("profile: CUDA event: {e:?}"))
}

/// The current point of `device`'s work: an event recorded on its stream (timing on), or now.
fn mark(device: &Device) -> Result<Mark> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let flags =
                candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
            Ok(Mark::Event(
                d.cuda_stream()
                    .record_event(Some(flags))
                    .map_err(cuda_err)?,
            ))
        }
        _ => Ok(Mark::Host(Instant::now())),
    }
}

/// Runs `f`, timed as `category` on `device` while this thread's profile is on (terse-optim
/// marks its own; research code may mark its ops the same way).
pub fn span<R>(device: &Device, category: Category, f: impl FnOnce() -> Result<R>) -> Result<R> {
    if !ON.with(Cell::get) {
        return f();
    }
    let a = mark(device)?;
    let r = f()?;
    let b = mark(device)?;
    SPANS.with(|s| s.borrow_mut().push((category, a, b)));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off, a span records nothing; on, each span lands in its category on the host clock, and
    /// `finish` turns the profile off again.
    #[test]
    fn spans_count_only_while_a_profile_is_on() {
        let dev = Device::Cpu;
        let nap = || {
            std::thread::sleep(std::time::Duration::from_millis(2));
            Ok(())
        };
        span(&dev, Category::Norm, nap).expect("off");
        start();
        span(&dev, Category::Matmul, nap).expect("on");
        span(&dev, Category::Matmul, nap).expect("on");
        span(&dev, Category::Rope, || Ok(())).expect("on");
        let t = finish(&dev).expect("finish");
        let by = |c: Category| t.iter().find(|x| x.category == c).cloned();
        let m = by(Category::Matmul).expect("matmul");
        assert_eq!(m.spans, 2);
        assert!(m.ms >= 4.0, "{m:?}");
        assert_eq!(by(Category::Rope).map(|r| r.spans), Some(1));
        assert!(by(Category::Norm).is_none(), "{t:?}");
        span(&dev, Category::Norm, nap).expect("off again");
        assert!(finish(&dev).expect("empty").is_empty());
    }
}
