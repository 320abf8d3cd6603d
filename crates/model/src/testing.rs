//! For `cargo xtask gpu-check` and the tests, not a stable API: the device-vs-CPU parity of the
//! fused ops (their CUDA kernels) and of a whole model, and the relative difference the
//! gradient-equality tests measure. The fused ops and their CPU references themselves are
//! crate-private.

#[path = "parity.rs"]
pub mod parity;
#[path = "parity_paged.rs"]
mod parity_paged;

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
