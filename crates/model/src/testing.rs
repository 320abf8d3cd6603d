//! For `cargo xtask gpu-check` and the GPU tests, not a stable API: the device-vs-CPU parity
//! of the fused ops (their CUDA kernels) and of a whole model. The fused ops and their CPU
//! references themselves are crate-private.

#[path = "parity.rs"]
pub mod parity;
