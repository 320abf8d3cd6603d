//! RMSNorm (kernels/rmsnorm.cu), everything about it in one place: the candle op with its
//! backward, its shape check, its f32 CPU reference, its launch description and its CUDA launch.
//!
//! Data flow: `ops::rms_norm` (fused path) -> `rms_norm` -> CPU reference or CUDA kernel.

use super::cpu::f32s;
use super::op::{apply2, apply3, Arg, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use reference as refs;

/// y = RMSNorm(x) * w over the last dim; x (.., C), w (C).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    check::rmsnorm(x.dims(), w.dims())?;
    if x.elem_count() == 0 {
        return Ok(x.clone());
    }
    apply2(x, w, RmsNorm { eps })
}

struct RmsNorm {
    eps: f32,
}

impl Kernel<2> for RmsNorm {
    const NAME: &'static str = "terse-rmsnorm";

    fn cpu(&self, [(s1, l1), (s2, l2)]: [Arg<CpuStorage>; 2]) -> Result<(CpuStorage, Shape)> {
        let cols = l2.shape().elem_count();
        let (y, _) = refs::rmsnorm_fwd(
            f32s(s1, l1, "rmsnorm x")?,
            f32s(s2, l2, "rmsnorm w")?,
            cols,
            self.eps,
        );
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, [(s1, l1), (s2, l2)]: [Arg<CudaStorage>; 2]) -> Result<(CudaStorage, Shape)> {
        cuda::rmsnorm_fwd(s1, l1, s2, l2, self.eps)
    }

    /// In f32 (and always on CUDA) `RmsNormBwd`: the `rmsnorm_bwd` kernel, or on the CPU its
    /// reference loops; in f64 the composite formula: dx and, by a reduction over rows, dw, both
    /// recomputing the row statistic.
    fn bwd(&self, [x, w]: [&Tensor; 2], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 2]> {
        use candle_core::{DType, D};
        if x.device().is_cuda() || x.dtype() == DType::F32 {
            let (dx, dw) = rms_norm_grad(x, w, dy, self.eps)?;
            return Ok([Some(dx), Some(dw.to_dtype(w.dtype())?)]);
        }
        let cols = w.elem_count() as f64;
        let rstd = ((x.sqr()?.mean_keepdim(D::Minus1)? + f64::from(self.eps))?.sqrt()?).recip()?; // (.., 1)
        let gw = dy.broadcast_mul(w)?; // (.., C)
        let dot = (&gw * x)?.sum_keepdim(D::Minus1)?; // (.., 1)
        let c = (dot * rstd.powf(3.0)?)?.affine(1.0 / cols, 0.0)?;
        let dx = (gw.broadcast_mul(&rstd)? - x.broadcast_mul(&c)?)?;
        let rows = x.elem_count() / w.elem_count();
        let dw = (dy * x.broadcast_mul(&rstd)?)?
            .reshape((rows, w.elem_count()))?
            .sum(0)?;
        Ok([Some(dx), Some(dw)])
    }
}

/// RMSNorm's gradients for y = rms_norm(x, w) and dy: (dx in x's dtype, dw in f32), by
/// `RmsNormBwd` (the op's backward, and model/layer_grad.rs's written-out layer backward).
pub(crate) fn rms_norm_grad(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    use candle_core::DType;
    let f = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
    let both = apply3(&f(x)?, &f(w)?, &f(dy)?, RmsNormBwd { eps })?; // (rows + 1, C)
    let rows = both.dim(0)? - 1;
    let dx = both
        .narrow(0, 0, rows)?
        .reshape(x.shape())?
        .to_dtype(x.dtype())?;
    let dw = both.narrow(0, rows, 1)?.reshape(w.shape())?;
    Ok((dx, dw))
}

/// RMSNorm backward in one op: f32 x (.., C), w (C), dy (.., C) -> (rows + 1, C) = [dx rows;
/// dw]. CPU: the reference; CUDA: `rmsnorm_fwd` for the row statistic, then `rmsnorm_bwd`.
pub(crate) struct RmsNormBwd {
    pub eps: f32,
}

impl Kernel<3> for RmsNormBwd {
    const NAME: &'static str = "terse-rmsnorm-bwd";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let cols = l2.shape().elem_count();
        let x = f32s(s1, l1, "rmsnorm bwd x")?;
        let w = f32s(s2, l2, "rmsnorm bwd w")?;
        let (_, rstd) = refs::rmsnorm_fwd(x, w, cols, self.eps);
        let (mut dx, dw) = refs::rmsnorm_bwd(x, w, &rstd, f32s(s3, l3, "rmsnorm bwd dy")?, cols);
        dx.extend_from_slice(&dw);
        Ok((CpuStorage::F32(dx), Shape::from((x.len() / cols + 1, cols))))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        cuda::rmsnorm_bwd(s1, l1, s2, l2, s3, l3, self.eps)
    }
}

/// Shape and bounds checks run before every launch, on every device (the kernels index raw
/// buffers: a wrong shape is an error naming the op and the shapes, never a launch).
pub(crate) mod check {
    use candle_core::Result;
    /// RMSNorm: x (.., C) and w (C). Returns (rows, cols).
    pub fn rmsnorm(x: &[usize], w: &[usize]) -> Result<(usize, usize)> {
        let cols = x.last().copied().unwrap_or(0);
        if w.len() != 1 || w[0] != cols || cols == 0 {
            crate::fail!("rmsnorm: weight {w:?} does not match the last dim of x {x:?}");
        }
        Ok((x.iter().product::<usize>() / cols, cols))
    }
}

/// The f32 CPU reference, written as plain loops with the kernel's layouts and accumulation
/// order in mind: the CPU path of the op, and the ground truth of `cargo xtask gpu-check` and
/// of the SIMT shim's tests.
pub mod reference {
    /// RMSNorm forward over rows of `cols`: y = w * x * rstd with rstd = 1/sqrt(mean(x²) + eps);
    /// returns (y, rstd per row). kernels/rmsnorm.cu `rmsnorm_fwd_*`.
    pub fn rmsnorm_fwd(x: &[f32], w: &[f32], cols: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
        let mut y = vec![0f32; x.len()];
        let mut rstd = vec![0f32; x.len() / cols];
        for (r, (xr, yr)) in x.chunks(cols).zip(y.chunks_mut(cols)).enumerate() {
            let ss: f32 = xr.iter().map(|v| v * v).sum();
            let s = 1.0 / (ss / cols as f32 + eps).sqrt();
            rstd[r] = s;
            for ((yv, xv), wv) in yr.iter_mut().zip(xr).zip(w) {
                *yv = xv * s * wv;
            }
        }
        (y, rstd)
    }

    /// RMSNorm backward: dx = r·(dy⊙w) − x·r³/cols·Σ(dy⊙w⊙x) per row, dw = Σ_rows dy⊙x·r.
    /// kernels/rmsnorm.cu `rmsnorm_bwd_*`.
    pub fn rmsnorm_bwd(
        x: &[f32],
        w: &[f32],
        rstd: &[f32],
        dy: &[f32],
        cols: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut dx = vec![0f32; x.len()];
        let mut dw = vec![0f32; cols];
        for (r, ((xr, gr), dxr)) in x
            .chunks(cols)
            .zip(dy.chunks(cols))
            .zip(dx.chunks_mut(cols))
            .enumerate()
        {
            let s = rstd[r];
            let dot: f32 = (0..cols).map(|i| gr[i] * w[i] * xr[i]).sum();
            let c = dot * s * s * s / cols as f32;
            for i in 0..cols {
                dxr[i] = s * gr[i] * w[i] - xr[i] * c;
                dw[i] += gr[i] * xr[i] * s;
            }
        }
        (dx, dw)
    }
}

/// The launch description of each entry point (kernel name, grid, block, arguments in order):
/// the CUDA launch below pushes exactly these, and crates/simt runs them on the CPU.
pub mod launch {
    use crate::kernels::describe::{bufs, per_row, Arg, Launch, Storage};
    use crate::kernels::geometry::RMSNORM_BLOCK;

    /// Buffers: x (rows, cols), w (cols), y (rows, cols), rstd (rows, f32).
    pub fn rmsnorm_fwd(s: Storage, rows: usize, cols: usize, eps: f32) -> Launch {
        let args = bufs(4)
            .chain([Arg::I32(cols as i32), Arg::F32(eps)])
            .collect();
        per_row(
            format!("rmsnorm_fwd_{}", s.suffix()),
            "rmsnorm",
            rows,
            RMSNORM_BLOCK,
            args,
        )
    }

    /// f32 only. Buffers: x, w, rstd (from `rmsnorm_fwd`), dy, dx (rows, cols), dw (cols, zeroed:
    /// the kernel accumulates into it).
    pub fn rmsnorm_bwd(rows: usize, cols: usize) -> Launch {
        let args = bufs(6).chain([Arg::I32(cols as i32)]).collect();
        per_row(
            "rmsnorm_bwd_f32".into(),
            "rmsnorm",
            rows,
            RMSNORM_BLOCK,
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
    use crate::kernels::rmsnorm::launch;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape};

    /// Launches `rmsnorm_fwd_{sfx}` on contiguous x (rows, cols) and w (cols) -> (y, rstd).
    fn rmsnorm_fwd_launch<T: CudaDType + DeviceRepr>(
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        eps: f32,
        s: Store,
    ) -> Result<(CudaSlice<T>, CudaSlice<f32>)> {
        let dev: &CudaDevice = x.device();
        let cols = lw.shape().elem_count();
        let n = lx.shape().elem_count();
        let rows = n / cols;
        let l = launch::rmsnorm_fwd(s, rows, cols, eps);
        let f = func!(dev, l)?;
        let (xv, wv) = (
            view::<T>(x, lx, "rmsnorm x")?,
            view::<T>(w, lw, "rmsnorm w")?,
        );
        // SAFETY: every element is written by the kernel.
        let mut y = unsafe { dev.alloc::<T>(n)? };
        let mut rstd = unsafe { dev.alloc::<f32>(rows)? };
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &xv)?
            .buf(1, &wv)?
            .buf(2, &mut y)?
            .buf(3, &mut rstd)?;
        // SAFETY: x and y hold rows x cols, w cols and rstd rows elements.
        unsafe { d.launch() }?;
        Ok((y, rstd))
    }

    pub fn rmsnorm_fwd(
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        eps: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device().clone();
        let s = match x.dtype() {
            DType::F32 => CudaStorage::wrap_cuda_slice(
                rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, Store::F32)?.0,
                dev,
            ),
            DType::BF16 => CudaStorage::wrap_cuda_slice(
                rmsnorm_fwd_launch::<half::bf16>(x, lx, w, lw, eps, Store::Bf16)?.0,
                dev,
            ),
            dt => store(dt, "rmsnorm").map(|_| unreachable!())?,
        };
        Ok((s, lx.shape().clone()))
    }

    /// RMSNorm backward, f32: the row statistic from `rmsnorm_fwd` (its output is scratch), then
    /// `rmsnorm_bwd` writing dx into rows 0..rows and accumulating dw into the zeroed last row.
    pub fn rmsnorm_bwd(
        x: &CudaStorage,
        lx: &Layout,
        w: &CudaStorage,
        lw: &Layout,
        dy: &CudaStorage,
        ldy: &Layout,
        eps: f32,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = x.device();
        let cols = lw.shape().elem_count();
        let n = lx.shape().elem_count();
        let rows = n / cols;
        let (_, rstd) = rmsnorm_fwd_launch::<f32>(x, lx, w, lw, eps, Store::F32)?;
        let (xv, wv, gv) = (
            view::<f32>(x, lx, "rmsnorm bwd x")?,
            view::<f32>(w, lw, "rmsnorm bwd w")?,
            view::<f32>(dy, ldy, "rmsnorm bwd dy")?,
        );
        let l = launch::rmsnorm_bwd(rows, cols);
        let bwd = func!(dev, l)?;
        // dw accumulates with atomics, so its row starts at zero.
        let mut out = dev.alloc_zeros::<f32>(n + cols)?;
        {
            let (mut dx, mut dw) = out.split_at_mut(n);
            let mut d = Described::new(bwd.builder(), &l);
            d.buf(0, &xv)?
                .buf(1, &wv)?
                .buf(2, &rstd)?
                .buf(3, &gv)?
                .buf(4, &mut dx)?
                .buf(5, &mut dw)?;
            // SAFETY: x, dy and dx hold rows x cols, w and dw cols, rstd rows elements.
            unsafe { d.launch() }?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((rows + 1, cols)),
        ))
    }
}
