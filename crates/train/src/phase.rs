//! Where the run loop stands, its step and phase (start, rollout, score, train, checkpoint,
//! eval), for two readers. An error leaves the loop as one line that begins
//! "step S (phase): " (run/run_loop.rs), and an out-of-memory on a GPU adds what the memory
//! plan predicted beside what the device held. A profiler's timeline shows each phase as an NVTX
//! range "step S phase" (libnvToolsExt.so.1, loaded when it is there: Nsight Systems shows the
//! phases, and the emulated device's fault switches aim at one, docs/gpu.md).

#![allow(unsafe_code)] // the two NVTX calls, through a library loaded at run time

use anyhow::{Context, Result};
use std::ffi::CString;
use std::sync::OnceLock;

/// A part of the run loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Loading the model or a checkpoint (a fresh run's SFT warm-up and step 0's checkpoint
    /// with it), the handoff to the other ranks.
    Start,
    Rollout,
    /// Rewards and advantages (on the host).
    Score,
    /// Log-probs, the backward and the optimizer step.
    Train,
    Checkpoint,
    Eval,
}

impl Phase {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Start => "start",
            Phase::Rollout => "rollout",
            Phase::Score => "score",
            Phase::Train => "train",
            Phase::Checkpoint => "checkpoint",
            Phase::Eval => "eval",
        }
    }
}

/// Runs `f` as `phase` of `step`: inside an NVTX range, its error prefixed with where it
/// happened. Phases do not nest, so an error names exactly one.
pub(crate) fn within<T>(step: u64, phase: Phase, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _range = Range::push(step, phase);
    f().with_context(|| format!("step {step} ({})", phase.name()))
}

/// One NVTX range, popped when dropped.
struct Range(bool);

impl Range {
    fn push(step: u64, phase: Phase) -> Range {
        let Some(n) = nvtx() else {
            return Range(false);
        };
        let Ok(text) = CString::new(format!("step {step} {}", phase.name())) else {
            return Range(false);
        };
        // SAFETY: nvtxRangePushA copies the NUL-terminated string, which outlives the call.
        unsafe { (n.push)(text.as_ptr()) };
        Range(true)
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        if let (true, Some(n)) = (self.0, nvtx()) {
            // SAFETY: pops the range this value pushed on this thread.
            unsafe { (n.pop)() };
        }
    }
}

/// libnvToolsExt's two entry points terse uses.
struct Nvtx {
    push: unsafe extern "C" fn(*const std::ffi::c_char) -> i32,
    pop: unsafe extern "C" fn() -> i32,
}

/// The library when this process can load it (the CUDA toolkit's or a Python environment's
/// NVIDIA packages on LD_LIBRARY_PATH); None otherwise, and then ranges cost nothing.
fn nvtx() -> Option<&'static Nvtx> {
    static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();
    NVTX.get_or_init(|| {
        // SAFETY: NVTX's library runs no code on load that depends on the caller; it stays
        // loaded for the life of the process (leaked), so the function pointers stay valid.
        unsafe {
            let lib = libloading::Library::new("libnvToolsExt.so.1").ok()?;
            let lib: &'static libloading::Library = Box::leak(Box::new(lib));
            let push = *lib
                .get::<unsafe extern "C" fn(*const std::ffi::c_char) -> i32>(b"nvtxRangePushA\0")
                .ok()?;
            let pop = *lib
                .get::<unsafe extern "C" fn() -> i32>(b"nvtxRangePop\0")
                .ok()?;
            Some(Nvtx { push, pop })
        }
    })
    .as_ref()
}

/// `err` with, when the device ran out of memory, what the memory plan predicted for the run
/// (`planned`, check_fits's figure) and what the device held when the error reached the loop.
pub(crate) fn explain(
    err: anyhow::Error,
    planned: Option<u64>,
    dev: &candle_core::Device,
) -> anyhow::Error {
    if !format!("{err:#}").contains("CUDA_ERROR_OUT_OF_MEMORY") {
        return err;
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let plan = planned.map_or("no memory plan was made".to_string(), |p| {
        format!("the memory plan predicted {:.3} GiB for the run", gib(p))
    });
    let held = match terse_model::device::memory(dev) {
        Some((free, total)) => format!(
            "the device holds {:.3} GiB of its {:.2} GiB once the failed phase let go of its tensors",
            gib(total.saturating_sub(free)),
            gib(total)
        ),
        None => "the device cannot say what it holds".to_string(),
    };
    err.context(format!(
        "the GPU ran out of memory ({plan}; {held}; an allocation beyond that failed)"
    ))
}

/// Whether `dev` is a GPU whose context no longer answers (a sticky error such as a kernel
/// fault: every later call fails with it). The probe is cuMemGetInfo, as gpu-check's.
pub(crate) fn context_lost(dev: &candle_core::Device) -> bool {
    dev.is_cuda() && terse_model::device::memory(dev).is_none()
}

/// What an error that stops the run on `dev` becomes: `explain`ed, and, when the context is
/// lost, one handle to the device kept for the rest of the process (which ends with this
/// error, as after a crash). Tearing the device down would call it again in the destructors
/// of its cuBLAS and cuRAND handles, which cudarc unwraps: a panic in a drop, an abort instead
/// of one line. Its tensors still go (their frees fail quietly).
pub(crate) fn stopped(
    err: anyhow::Error,
    planned: Option<u64>,
    dev: &candle_core::Device,
) -> anyhow::Error {
    if context_lost(dev) {
        let _kept: &'static candle_core::Device = Box::leak(Box::new(dev.clone()));
    }
    explain(err, planned, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error names the step and phase; an out-of-memory on the CPU says what it can.
    #[test]
    fn an_error_names_its_step_and_phase() {
        let e = within(3, Phase::Checkpoint, || -> Result<()> {
            anyhow::bail!("disk full")
        })
        .expect_err("the closure fails");
        assert_eq!(format!("{e:#}"), "step 3 (checkpoint): disk full");
        assert_eq!(within(1, Phase::Train, || Ok(7)).expect("it succeeds"), 7);
        let cpu = candle_core::Device::Cpu;
        assert!(!context_lost(&cpu));
        let plain = explain(anyhow::anyhow!("x"), Some(1 << 30), &cpu);
        assert_eq!(format!("{plain:#}"), "x");
        let oom = anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")")
            .context("step 2 (train)");
        let line = format!("{:#}", explain(oom, Some(3 << 29), &cpu));
        assert!(
            line.starts_with("the GPU ran out of memory (the memory plan predicted 1.500 GiB"),
            "{line}"
        );
        assert!(line.contains("step 2 (train): DriverError"), "{line}");
    }
}
