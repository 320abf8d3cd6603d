//! Rotate-half RoPE (kernels/rope.cu), everything about it in one place: the candle op (its
//! backward is the inverse rotation), its shape check, its f32 CPU reference, its launch
//! description and its CUDA launch. Either side may be in attention's layout (B, H, T, D) or in
//! the projections' (B, T, H, D) (`rope_laid_out`): the written layer backward rotates q and k
//! in their rows, where its flash attention reads them, and back.
//!
//! Data flow: `ops::rope` (fused path) -> `rope` -> CPU reference or CUDA kernel;
//! model/layer_grad.rs -> `rope_laid_out`.

use super::cpu::f32s;
use super::op::{apply3, Arg, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use reference as refs;

/// Rotate-half RoPE; x (B, H, T, D), cos/sin (B, T, D/2).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    check::rope(x.dims(), cos.dims(), sin.dims())?;
    if x.elem_count() == 0 {
        return Ok(x.clone());
    }
    apply3(x, cos, sin, Rope::new(false, [false; 2]))
}

/// RoPE (`inverse`: the inverse rotation) between layouts, without a graph: `tokens[0]` says x
/// is in the projections' rows (B, T, H, D) rather than attention's layout (B, H, T, D),
/// `tokens[1]` the same of the result. The written layer backward rotates q and k in their rows
/// and back (both `true`: model/layer_grad.rs); a transposing copy comes free with the other
/// pairs.
pub(crate) fn rope_laid_out(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    inverse: bool,
    tokens: [bool; 2],
) -> Result<Tensor> {
    let op = Rope::new(inverse, tokens);
    let [b, h, t, d] = op.dims(x.shape())?;
    check::rope(&[b, h, t, d], cos.dims(), sin.dims())?;
    if x.elem_count() == 0 {
        return Tensor::zeros(op.out_shape([b, h, t, d]), x.dtype(), x.device());
    }
    apply3(&x.contiguous()?, cos, sin, op)
}

/// The rotation (`inverse`: its transpose) with each side's layout: `tokens[0]` x, `tokens[1]`
/// y in (B, T, H, D), else (B, H, T, D).
struct Rope {
    inverse: bool,
    tokens: [bool; 2],
}

impl Rope {
    fn new(inverse: bool, tokens: [bool; 2]) -> Self {
        Self { inverse, tokens }
    }

    /// (B, H, T, D) from x's shape, whichever its layout.
    fn dims(&self, x: &Shape) -> Result<[usize; 4]> {
        let (b, p, q, d) = x.dims4()?;
        Ok(if self.tokens[0] {
            [b, q, p, d]
        } else {
            [b, p, q, d]
        })
    }

    /// y's shape for (B, H, T, D).
    fn out_shape(&self, [b, h, t, d]: [usize; 4]) -> Shape {
        if self.tokens[1] {
            Shape::from((b, t, h, d))
        } else {
            Shape::from((b, h, t, d))
        }
    }
}

impl Kernel<3> for Rope {
    const NAME: &'static str = "terse-rope";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let dims = self.dims(l1.shape())?;
        let y = refs::rope_laid_out(
            f32s(s1, l1, "rope x")?,
            f32s(s2, l2, "rope cos")?,
            f32s(s3, l3, "rope sin")?,
            dims,
            self.inverse,
            self.tokens,
        );
        Ok((CpuStorage::F32(y), self.out_shape(dims)))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        let dims = self.dims(l1.shape())?;
        let y = cuda::rope(s1, l1, s2, l2, s3, l3, self.inverse, self.tokens, dims)?;
        Ok((y, self.out_shape(dims)))
    }

    /// The rotation is orthogonal: the gradient is the inverse rotation of dy, from y's layout
    /// back to x's.
    fn bwd(
        &self,
        [_, cos, sin]: [&Tensor; 3],
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<[Option<Tensor>; 3]> {
        let back = Rope::new(!self.inverse, [self.tokens[1], self.tokens[0]]);
        let dx = apply3(&dy.contiguous()?, cos, sin, back)?;
        Ok([Some(dx), None, None])
    }
}

/// Shape and bounds checks run before every launch, on every device (the kernels index raw
/// buffers: a wrong shape is an error naming the op and the shapes, never a launch).
pub(crate) mod check {
    use candle_core::Result;
    /// RoPE: x (B, H, T, D) with D even, cos and sin (B, T, D/2).
    pub fn rope(x: &[usize], cos: &[usize], sin: &[usize]) -> Result<[usize; 4]> {
        let &[b, h, t, d] = x else {
            crate::fail!("rope: x must be (B, H, T, D), got {x:?}");
        };
        if d % 2 != 0 {
            crate::fail!("rope: head size {d} is odd (x {x:?}); rotate-half needs an even size");
        }
        let want = [b, t, d / 2];
        if cos != want || sin != want {
            crate::fail!(
                "rope: cos {cos:?} and sin {sin:?} must be (B, T, D/2) = {want:?} for x {x:?}"
            );
        }
        Ok([b, h, t, d])
    }
}

/// The f32 CPU reference, written as plain loops with the kernel's layouts and accumulation
/// order in mind: the CPU path of the op, and the ground truth of `cargo xtask gpu-check` and
/// of the SIMT shim's tests.
pub mod reference {
    /// Rotate-half RoPE on x (B, H, T, D) with half tables cos/sin (B, T, D/2); `inverse` applies
    /// the transposed rotation (the backward: dy -> dx). kernels/rope.cu `rope_fwd_*`/`rope_bwd_*`.
    pub fn rope(x: &[f32], cos: &[f32], sin: &[f32], dims: [usize; 4], inverse: bool) -> Vec<f32> {
        rope_laid_out(x, cos, sin, dims, inverse, [false; 2])
    }

    /// `rope` with x (`tokens[0]`) and y (`tokens[1]`) each in (B, T, H, D) rather than
    /// (B, H, T, D); `dims` are (B, H, T, D) either way.
    pub fn rope_laid_out(
        x: &[f32],
        cos: &[f32],
        sin: &[f32],
        dims: [usize; 4],
        inverse: bool,
        tokens: [bool; 2],
    ) -> Vec<f32> {
        let [b, heads, t, d] = dims;
        let h = d / 2;
        let sign = if inverse { -1.0 } else { 1.0 };
        let at = |by_tokens: bool, bi: usize, hi: usize, ti: usize| match by_tokens {
            true => ((bi * t + ti) * heads + hi) * d,
            false => ((bi * heads + hi) * t + ti) * d,
        };
        let mut y = vec![0f32; x.len()];
        for bi in 0..b {
            for hi in 0..heads {
                for ti in 0..t {
                    let (xb, yb) = (at(tokens[0], bi, hi, ti), at(tokens[1], bi, hi, ti));
                    for i in 0..h {
                        let tab = (bi * t + ti) * h + i;
                        let (c, s) = (cos[tab], sign * sin[tab]);
                        let (x1, x2) = (x[xb + i], x[xb + i + h]);
                        y[yb + i] = x1 * c - x2 * s;
                        y[yb + i + h] = x2 * c + x1 * s;
                    }
                }
            }
        }
        y
    }
}

/// The launch description of each entry point (kernel name, grid, block, arguments in order):
/// the CUDA launch below pushes exactly these, and crates/simt runs them on the CPU.
pub mod launch {
    use crate::kernels::describe::{bufs, elementwise, ints, Launch, Storage};

    /// Rotate-half RoPE over (B, H, T, D) = `dims` (`inverse`: the backward), x (`tokens[0]`)
    /// and y (`tokens[1]`) each in (B, T, H, D) where set. Buffers: x, cos, sin (B, T, D/2), y.
    pub fn rope(s: Storage, inverse: bool, [b, h, t, d]: [usize; 4], tokens: [bool; 2]) -> Launch {
        let dir = if inverse { "bwd" } else { "fwd" };
        let flags = tokens.map(usize::from);
        let args = bufs(4)
            .chain(ints(&[b, h, t, d, flags[0], flags[1]]))
            .collect();
        elementwise(
            format!("rope_{dir}_{}", s.suffix()),
            "rope",
            b * h * t * d / 2,
            args,
        )
    }
}

/// The CUDA launches (the `cuda` feature only), each through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
mod cuda {
    use crate::kernels::describe::Storage as Store;
    use crate::kernels::launching::{func, store, view, Described};
    use crate::kernels::rope::launch;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result};

    /// (B, H, T, D) = `dims`; x and y laid out by `tokens` (launch::rope).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        x: &CudaStorage,
        lx: &Layout,
        c: &CudaStorage,
        lc: &Layout,
        s: &CudaStorage,
        ls: &Layout,
        inverse: bool,
        tokens: [bool; 2],
        dims: [usize; 4],
    ) -> Result<CudaStorage> {
        #[allow(clippy::too_many_arguments)]
        fn go<T: CudaDType + DeviceRepr>(
            x: &CudaStorage,
            lx: &Layout,
            c: &CudaStorage,
            lc: &Layout,
            s: &CudaStorage,
            ls: &Layout,
            l: crate::kernels::describe::Launch,
        ) -> Result<CudaStorage> {
            let dev: &CudaDevice = x.device();
            let f = func!(dev, l)?;
            let (xv, cv, sv) = (
                view::<T>(x, lx, "rope x")?,
                view::<T>(c, lc, "rope cos")?,
                view::<T>(s, ls, "rope sin")?,
            );
            let n = lx.shape().elem_count();
            // SAFETY: every element is written by the kernel.
            let mut y = unsafe { dev.alloc::<T>(n)? };
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &xv)?.buf(1, &cv)?.buf(2, &sv)?.buf(3, &mut y)?;
            // SAFETY: x and y hold B x H x T x D elements, cos and sin B x T x D/2.
            unsafe { dsc.launch() }?;
            Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
        }
        let l = |st: Store| launch::rope(st, inverse, dims, tokens);
        match x.dtype() {
            DType::F32 => go::<f32>(x, lx, c, lc, s, ls, l(Store::F32)),
            DType::BF16 => go::<half::bf16>(x, lx, c, lc, s, ls, l(Store::Bf16)),
            dt => store(dt, "rope").map(|_| unreachable!()),
        }
    }
}
