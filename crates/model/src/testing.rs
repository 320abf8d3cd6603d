//! For `cargo xtask gpu-check` and the tests, not a stable API: the device-vs-CPU parity of the
//! fused ops (their CUDA kernels) and of a whole model, and the relative difference the
//! gradient-equality tests measure, and (`references`) the CPU references the SIMT shim's
//! tests run the kernels against. The fused ops themselves are crate-private.

#[path = "parity/mod.rs"]
pub mod parity;

/// The CPU references of the CUDA kernels (plain f32 loops) and of flash attention, for the
/// SIMT shim's tests (crates/simt), which run kernels/*.cu on the CPU against them.
pub mod references {
    pub use crate::kernels::references::*;

    /// Flash attention's forward on the CPU: (out, lse), as `flash::cpu` computes them.
    pub fn flash_forward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        starts: &[u32],
        dm: crate::kernels::launch::FlashDims,
    ) -> (Vec<f32>, Vec<f32>) {
        crate::kernels::flash::cpu::forward(q, k, v, starts, dm)
    }

    /// Flash attention's backward on the CPU: (dq, dk, dv).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_backward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &[f32],
        lse: &[f32],
        dout: &[f32],
        starts: &[u32],
        dm: crate::kernels::launch::FlashDims,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        crate::kernels::flash::cpu::backward(q, k, v, out, lse, dout, starts, dm)
    }
}

/// ||a − b|| / ||a|| (Frobenius, in f32): how far `b` is from the reference `a`, relative to
/// its size. 0 when both are zero.
pub fn relative_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> candle_core::Result<f32> {
    let norm = |t: &candle_core::Tensor| -> candle_core::Result<f32> {
        Ok(t.to_dtype(candle_core::DType::F32)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f32>()?
            .sqrt())
    };
    Ok(norm(&(a - b)?)? / norm(a)?.max(1e-12))
}
