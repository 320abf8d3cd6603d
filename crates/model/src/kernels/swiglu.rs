//! SwiGLU, the MLP's gate silu(g) * u (kernels/swiglu.cu), everything about it in one place:
//! the candle op with its own one-kernel backward, its shape check, its f32 CPU reference, its
//! launch descriptions and its CUDA launches. The model uses it on CUDA only (unless
//! `TERSE_FUSED=0`): on the CPU the composite `silu()? * up` stays, since the reference does not
//! round as candle's two ops do.
//!
//! `swiglu_stacked` is the forward of a decoding copy's stacked gate and up projection (each
//! row [g | u], model/stacked.rs): one GEMM and this one kernel where there were two and one.
//!
//! Data flow: model/forward.rs's `mlp_block` (CUDA) -> `swiglu` or `swiglu_stacked` -> CUDA
//! kernel (or, in tests, the CPU reference); its backward -> `SwigluBwd` -> [dg; du] in one
//! buffer.

use super::cpu::f32s;
use super::op::{apply1, apply2, apply3, Arg, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use reference as refs;

/// silu(g) * u, elementwise; g and u of one shape.
pub fn swiglu(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    if g.dims() != u.dims() {
        crate::fail!(
            "swiglu: gate {:?} and up {:?} must have one shape",
            g.dims(),
            u.dims()
        );
    }
    if g.elem_count() == 0 {
        return Ok(g.clone());
    }
    apply2(&g.contiguous()?, &u.contiguous()?, Swiglu)
}

struct Swiglu;

/// silu(g) * u from `gu` (.., 2I), each row [g | u] -> (.., I); forward only (inference).
pub(crate) fn swiglu_stacked(gu: &Tensor) -> Result<Tensor> {
    let w = gu.dims().last().copied().unwrap_or(0);
    if w % 2 != 0 {
        crate::fail!(
            "swiglu stacked: rows of {w} values do not split into gate and up {:?}",
            gu.dims()
        );
    }
    if gu.elem_count() == 0 {
        return gu.narrow(gu.rank() - 1, 0, w / 2);
    }
    apply1(&gu.contiguous()?, SwigluStacked)
}

/// The output shape of `swiglu_stacked`: the last dimension halved.
fn half_shape(s: &Shape) -> Shape {
    let mut d = s.dims().to_vec();
    if let Some(w) = d.last_mut() {
        *w /= 2;
    }
    Shape::from(d)
}

struct SwigluStacked;

impl Kernel<1> for SwigluStacked {
    const NAME: &'static str = "terse-swiglu-stacked";

    fn cpu(&self, [(s, l)]: [Arg<CpuStorage>; 1]) -> Result<(CpuStorage, Shape)> {
        let width = l.shape().dims().last().copied().unwrap_or(0) / 2;
        let y = refs::swiglu_stacked(f32s(s, l, "swiglu stacked")?, width);
        Ok((CpuStorage::F32(y), half_shape(l.shape())))
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, [(s, l)]: [Arg<CudaStorage>; 1]) -> Result<(CudaStorage, Shape)> {
        cuda::stacked(s, l)
    }
}

impl Kernel<2> for Swiglu {
    const NAME: &'static str = "terse-swiglu";

    fn cpu(&self, [(s1, l1), (s2, l2)]: [Arg<CpuStorage>; 2]) -> Result<(CpuStorage, Shape)> {
        let y = refs::swiglu_fwd(f32s(s1, l1, "swiglu gate")?, f32s(s2, l2, "swiglu up")?);
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, [(s1, l1), (s2, l2)]: [Arg<CudaStorage>; 2]) -> Result<(CudaStorage, Shape)> {
        cuda::fwd(s1, l1, s2, l2)
    }

    /// One op (`SwigluBwd`, one kernel on CUDA) writes both gradients: [dg; du], (2, ..).
    fn bwd(&self, [g, u]: [&Tensor; 2], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 2]> {
        let (dg, du) = swiglu_grad(g, u, dy)?;
        Ok([Some(dg), Some(du)])
    }
}

/// SwiGLU's gradients (dg, du) for dy, in g's dtype: one `SwigluBwd` launch (the op's
/// backward, and model/layer_grad.rs's written-out layer backward).
pub(crate) fn swiglu_grad(g: &Tensor, u: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
    let dy = dy.to_dtype(g.dtype())?.contiguous()?;
    let both = apply3(&g.contiguous()?, &u.contiguous()?, &dy, SwigluBwd)?; // (2, ..g)
    Ok((both.get(0)?, both.get(1)?))
}

/// The backward: (g, u, dy) -> [dg; du] of shape (2, ..g).
pub(crate) struct SwigluBwd;

impl Kernel<3> for SwigluBwd {
    const NAME: &'static str = "terse-swiglu-bwd";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let out = refs::swiglu_bwd(
            f32s(s1, l1, "swiglu bwd gate")?,
            f32s(s2, l2, "swiglu bwd up")?,
            f32s(s3, l3, "swiglu bwd dy")?,
        );
        Ok((CpuStorage::F32(out), both_shape(l1.shape())))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        cuda::bwd(s1, l1, s2, l2, s3, l3)
    }
}

/// (2, ..dims): the backward's [dg; du].
fn both_shape(s: &Shape) -> Shape {
    let mut d = vec![2];
    d.extend_from_slice(s.dims());
    Shape::from(d)
}

/// The f32 CPU reference, plain loops: the CPU path of the op (tests), and the ground truth of
/// gpu-check's parity rows and of the SIMT shim's tests.
pub mod reference {
    fn sigmoid(a: f32) -> f32 {
        1.0 / (1.0 + (-a).exp())
    }

    /// y = silu(g) u. kernels/swiglu.cu `swiglu_fwd_*`.
    pub fn swiglu_fwd(g: &[f32], u: &[f32]) -> Vec<f32> {
        g.iter().zip(u).map(|(&a, &b)| a * sigmoid(a) * b).collect()
    }

    /// y = silu(g) u from rows [g | u] of 2 `width` values -> rows of `width`.
    /// kernels/swiglu.cu `swiglu_stacked_*`.
    pub fn swiglu_stacked(gu: &[f32], width: usize) -> Vec<f32> {
        gu.chunks(2 * width.max(1))
            .flat_map(|r| swiglu_fwd(&r[..width], &r[width..]))
            .collect()
    }

    /// [dg; du] from g, u and dy: dg = dy u s (1 + g (1 - s)), du = dy g s.
    /// kernels/swiglu.cu `swiglu_bwd_*`.
    pub fn swiglu_bwd(g: &[f32], u: &[f32], dy: &[f32]) -> Vec<f32> {
        let n = g.len();
        let mut out = vec![0f32; 2 * n];
        for k in 0..n {
            let (a, b, d) = (g[k], u[k], dy[k]);
            let s = sigmoid(a);
            out[k] = d * b * s * (1.0 + a * (1.0 - s));
            out[n + k] = d * a * s;
        }
        out
    }
}

/// The launch descriptions (one thread per element).
pub mod launch {
    use crate::kernels::describe::{bufs, elementwise, Arg, Launch, Storage};

    /// Buffers: g, u, y (n elements each).
    pub fn swiglu_fwd(s: Storage, n: usize) -> Launch {
        let args = bufs(3).chain([Arg::U64(n as u64)]).collect();
        elementwise(format!("swiglu_fwd_{}", s.suffix()), "swiglu", n, args)
    }

    /// Buffers: gu (n / width rows of 2 width), y (n elements).
    pub fn swiglu_stacked(s: Storage, n: usize, width: usize) -> Launch {
        let args = bufs(2)
            .chain([Arg::U64(n as u64), Arg::U64(width as u64)])
            .collect();
        elementwise(format!("swiglu_stacked_{}", s.suffix()), "swiglu", n, args)
    }

    /// Buffers: g, u, dy (n elements each), [dg; du] (2n).
    pub fn swiglu_bwd(s: Storage, n: usize) -> Launch {
        let args = bufs(4).chain([Arg::U64(n as u64)]).collect();
        elementwise(format!("swiglu_bwd_{}", s.suffix()), "swiglu", n, args)
    }
}

/// The CUDA launches (the `cuda` feature only), each through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
mod cuda {
    use crate::kernels::launching::{by_dtype, func, store, view, Described};
    use crate::kernels::swiglu::{both_shape, half_shape, launch};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

    pub fn fwd(
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = g.device();
        let n = lg.shape().elem_count();
        let l = launch::swiglu_fwd(store(g.dtype(), "swiglu")?, n);
        let f = func!(dev, l)?;
        let out = by_dtype!(g.dtype(), "swiglu", T => {
            let (gv, uv) = (view::<T>(g, lg, "swiglu gate")?, view::<T>(u, lu, "swiglu up")?);
            // SAFETY: every element is written by the kernel.
            let mut y = unsafe { dev.alloc::<T>(n)? };
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &gv)?.buf(1, &uv)?.buf(2, &mut y)?;
            // SAFETY: g, u and y hold n elements.
            unsafe { d.launch() }?;
            CudaStorage::wrap_cuda_slice(y, dev.clone())
        });
        Ok((out, lg.shape().clone()))
    }

    pub fn stacked(gu: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = gu.device();
        let shape = half_shape(l.shape());
        let (n, width) = (
            shape.elem_count(),
            shape.dims().last().copied().unwrap_or(0),
        );
        let ld = launch::swiglu_stacked(store(gu.dtype(), "swiglu stacked")?, n, width);
        let f = func!(dev, ld)?;
        let out = by_dtype!(gu.dtype(), "swiglu stacked", T => {
            let src = view::<T>(gu, l, "swiglu stacked")?;
            // SAFETY: every element is written by the kernel.
            let mut y = unsafe { dev.alloc::<T>(n)? };
            let mut d = Described::new(f.builder(), &ld);
            d.buf(0, &src)?.buf(1, &mut y)?;
            // SAFETY: gu holds 2n elements, y n.
            unsafe { d.launch() }?;
            CudaStorage::wrap_cuda_slice(y, dev.clone())
        });
        Ok((out, shape))
    }

    pub fn bwd(
        g: &CudaStorage,
        lg: &Layout,
        u: &CudaStorage,
        lu: &Layout,
        dy: &CudaStorage,
        ldy: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = g.device();
        let n = lg.shape().elem_count();
        let l = launch::swiglu_bwd(store(g.dtype(), "swiglu bwd")?, n);
        let f = func!(dev, l)?;
        let out = by_dtype!(g.dtype(), "swiglu bwd", T => {
            let (gv, uv, dv) = (
                view::<T>(g, lg, "swiglu bwd gate")?,
                view::<T>(u, lu, "swiglu bwd up")?,
                view::<T>(dy, ldy, "swiglu bwd dy")?,
            );
            // SAFETY: every element of both halves is written by the kernel.
            let mut both = unsafe { dev.alloc::<T>(2 * n)? };
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &gv)?.buf(1, &uv)?.buf(2, &dv)?.buf(3, &mut both)?;
            // SAFETY: g, u and dy hold n elements, the output 2n.
            unsafe { d.launch() }?;
            CudaStorage::wrap_cuda_slice(both, dev.clone())
        });
        Ok((out, both_shape(lg.shape())))
    }
}
