//! The plumbing every CUDA launch goes through (the `cuda` feature only): the PTX modules
//! build.rs compiled from kernels/*.cu (loaded once per device by candle's module cache,
//! `func!`), contiguous device views of candle storage, and `Described`, the cudarc launch
//! that follows its launch description (crate::launch) argument by argument.

#![allow(unsafe_code)] // kernel launches

use super::describe::{Arg, Launch, Storage as Store};
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaStorage, DType, Layout, Result};

pub(crate) mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

pub(crate) fn view<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(s.as_cuda_slice::<T>()?.slice(a..b)),
        None => crate::fail!("{what}: expected a contiguous tensor"),
    }
}

/// The CUDA storage under a tensor's storage lock (`what` names the tensor in the error).
pub(crate) fn cuda_storage<'a>(s: &'a candle_core::Storage, what: &str) -> Result<&'a CudaStorage> {
    match s {
        candle_core::Storage::Cuda(c) => Ok(c),
        _ => crate::fail!("{what}: expected a CUDA tensor"),
    }
}

/// The contiguous view, as `T`, of a tensor's storage under its lock (`what` names it).
pub(crate) fn locked_view<'a, T: CudaDType>(
    s: &'a candle_core::Storage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    view::<T>(cuda_storage(s, what)?, l, what)
}

/// A device buffer launches filled, as a fresh tensor of `shape`: no copy and no graph (the
/// graph-free ops that return several buffers, each its own tensor).
pub(crate) fn tensor_of(
    s: CudaStorage,
    shape: impl Into<candle_core::Shape>,
) -> candle_core::Tensor {
    let op = candle_core::op::BackpropOp::none();
    candle_core::Tensor::from_storage(candle_core::Storage::Cuda(s), shape, op, false)
}

/// The storage type of a kernel instantiation.
pub(crate) fn store(dt: DType, what: &str) -> Result<Store> {
    match dt {
        DType::F32 => Ok(Store::F32),
        DType::BF16 => Ok(Store::Bf16),
        other => crate::fail!("{what}: no kernel for {other:?} (f32 or bf16)"),
    }
}

/// `by_dtype!(dtype, what, T => body)`: `body` with the type alias `T` set to the storage type
/// of `dtype` (f32 or bf16, the two a kernel is instantiated for; another fails naming `what`).
/// The one dtype dispatch of the launches: a body that views buffers as `T`, allocates `T` and
/// pushes them into a `Described` launch is written once for both instantiations.
macro_rules! by_dtype {
    ($dt:expr, $what:expr, $t:ident => $body:expr) => {
        match $dt {
            candle_core::DType::F32 => {
                type $t = f32;
                $body
            }
            candle_core::DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            other => crate::fail!("{}: no kernel for {other:?} (f32 or bf16)", $what),
        }
    };
}
pub(crate) use by_dtype;

/// The PTX module of a kernels/ file, as build.rs compiled it (its `MODULES` table, one row per
/// kernels/*.cu).
pub(crate) fn module_ptx(module: &str) -> Result<&'static str> {
    match ptx::MODULES.iter().find(|(stem, _)| *stem == module) {
        Some((_, ptx)) => Ok(ptx),
        None => crate::fail!("no PTX module for kernels/{module}.cu"),
    }
}

/// The function a launch description names, loaded once per device by candle's cache (a
/// macro: candle does not export the function type), with its dynamic shared memory limit
/// raised when the description asks for more than the default 48 KB.
macro_rules! func {
    ($dev:expr, $l:expr) => {
        $dev.get_or_load_custom_func(
            &$l.kernel,
            &format!("terse_{}", $l.module),
            crate::kernels::launching::module_ptx($l.module)?,
        )
        .and_then(|f| {
            crate::kernels::launching::allow_shared(&f, &$l)?;
            Ok(f)
        })
    };
}

/// Dynamic shared memory above 48 KB needs the function's attribute first
/// (cuFuncSetAttribute, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
pub(crate) fn allow_shared(
    f: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
    l: &Launch,
) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    if l.shared > 48 * 1024 {
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            l.shared as i32,
        )
        .w()?;
    }
    Ok(())
}
pub(crate) use func;

/// A cudarc launch that follows its description (crate::launch, which the CPU shim runs too):
/// scalars and geometry come from the description, and each buffer the caller pushes is
/// checked against the position the description gives it, so the two cannot disagree.
pub(crate) struct Described<'a> {
    args: LaunchArgs<'a>,
    l: &'a Launch,
    at: usize,
}

impl<'a> Described<'a> {
    /// `args`: the function's builder (`func!(dev, l)?.builder()`).
    pub(crate) fn new(args: LaunchArgs<'a>, l: &'a Launch) -> Self {
        Self { args, l, at: 0 }
    }

    /// The scalars up to the next buffer.
    fn scalars(&mut self) {
        while let Some(a) = self.l.args.get(self.at) {
            match a {
                Arg::I32(v) => self.args.arg(v),
                Arg::U32(v) => self.args.arg(v),
                Arg::F32(v) => self.args.arg(v),
                Arg::U64(v) => self.args.arg(v),
                Arg::Buf(_) => break,
            };
            self.at += 1;
        }
    }

    /// Buffer `i` of the description, next in order.
    pub(crate) fn buf<A>(&mut self, i: usize, a: A) -> Result<&mut Self>
    where
        LaunchArgs<'a>: PushKernelArg<A>,
    {
        self.scalars();
        match self.l.args.get(self.at) {
            Some(Arg::Buf(j)) if *j == i => {}
            other => crate::fail!(
                "{}: argument {} is {other:?} in its launch description, the launch pushes buffer {i}",
                self.l.kernel,
                self.at
            ),
        }
        self.args.arg(a);
        self.at += 1;
        Ok(self)
    }

    /// Launches with the description's grid and block, once every argument is pushed.
    ///
    /// # Safety
    /// The buffers are those the description documents, each as long as the kernel indexes.
    pub(crate) unsafe fn launch(&mut self) -> Result<()> {
        self.scalars();
        if self.at != self.l.args.len() {
            crate::fail!(
                "{}: {} of its {} arguments pushed",
                self.l.kernel,
                self.at,
                self.l.args.len()
            );
        }
        let cfg = LaunchConfig {
            grid_dim: self.l.grid,
            block_dim: self.l.block,
            shared_mem_bytes: self.l.shared,
        };
        // SAFETY: the argument kinds and order are the description's (checked above), which
        // the shim's tests run against the kernels' signatures; sizes are the caller's promise.
        unsafe { self.args.launch(cfg) }.w()?;
        Ok(())
    }
}
