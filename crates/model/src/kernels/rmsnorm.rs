//! RMSNorm (kernels/rmsnorm.cu), everything about it in one place: the candle op with its
//! backward, its shape check, its f32 CPU reference, its launch description and its CUDA launch.
//!
//! Data flow: `ops::rms_norm` (fused path) -> `rms_norm` -> CPU reference or CUDA kernel.

use super::cpu::f32s;
use super::op::{apply2, Arg, Kernel};
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

    /// In f32 (and always on CUDA) `rms_norm_grad`: the `rmsnorm_bwd` kernel, or on the CPU its
    /// reference loops; in f64 the composite formula: dx and, by a reduction over rows, dw, both
    /// recomputing the row statistic.
    fn bwd(&self, [x, w]: [&Tensor; 2], _y: &Tensor, dy: &Tensor) -> Result<[Option<Tensor>; 2]> {
        use candle_core::{DType, D};
        if x.device().is_cuda() || x.dtype() == DType::F32 {
            let (dx, dw) = rms_norm_grad(x, w, dy, self.eps, None)?;
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

/// The residual stream's add and the RMSNorm after it, without a graph: (s = x + res, y =
/// rms_norm(s, w)) for x, res (.., C) and w (C), in x's dtype. On CUDA one `rmsnorm_fwd_res`
/// launch; elsewhere the add and `rms_norm` (model/layer_grad.rs's forward).
pub(crate) fn rms_norm_residual(
    x: &Tensor,
    res: &Tensor,
    w: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    check::rmsnorm(x.dims(), w.dims())?;
    if res.dims() != x.dims() {
        crate::fail!(
            "rmsnorm with residual: x {:?}, residual {:?}",
            x.dims(),
            res.dims()
        );
    }
    if x.device().is_cuda() && x.elem_count() > 0 {
        #[cfg(feature = "cuda")]
        {
            let same = |t: &Tensor| t.to_dtype(x.dtype())?.contiguous();
            return cuda::rmsnorm_fwd_res(&x.contiguous()?, &same(res)?, &same(w)?, eps);
        }
    }
    let s = (x + res)?;
    let y = rms_norm(&s, w, eps)?;
    Ok((s, y))
}

/// RMSNorm's gradients for y = rms_norm(x, w) and dy, with `residual` (the gradient of a
/// residual stream that also feeds x, same shape) added into dx: (dx in x's dtype, dw in f32).
/// No graph: the op's backward and model/layer_grad.rs's written-out layer backward. On CUDA one
/// `rmsnorm_bwd` launch in x's dtype (f32 or bf16) after zeroing dw; on the CPU, f32 only, the
/// reference loops.
pub(crate) fn rms_norm_grad(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    eps: f32,
    residual: Option<&Tensor>,
) -> Result<(Tensor, Tensor)> {
    use candle_core::DType;
    check::rmsnorm(x.dims(), w.dims())?;
    if dy.dims() != x.dims() || residual.is_some_and(|r| r.dims() != x.dims()) {
        crate::fail!(
            "rmsnorm backward: x {:?}, dy {:?}, residual {:?}",
            x.dims(),
            dy.dims(),
            residual.map(|r| r.dims().to_vec())
        );
    }
    let dt = x.dtype();
    // Every input in x's dtype, contiguous (a no-op where they already are).
    let same = |t: &Tensor| t.to_dtype(dt)?.contiguous();
    let (x, w, dy) = (x.contiguous()?, same(w)?, same(dy)?);
    let residual = residual.map(same).transpose()?;
    if x.device().is_cuda() {
        #[cfg(feature = "cuda")]
        return cuda::rmsnorm_bwd(&x, &w, &dy, residual.as_ref(), eps);
    }
    if dt != DType::F32 {
        crate::fail!("rmsnorm backward on the CPU: f32 only, not {dt:?}");
    }
    let cols = w.elem_count();
    let v = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
    let (xs, ws) = (v(&x)?, v(&w)?);
    let (_, rstd) = refs::rmsnorm_fwd(&xs, &ws, cols, eps);
    let (mut dx, dw) = refs::rmsnorm_bwd(&xs, &ws, &rstd, &v(&dy)?, cols);
    if let Some(r) = &residual {
        for (d, r) in dx.iter_mut().zip(v(r)?) {
            *d += r;
        }
    }
    Ok((
        Tensor::from_vec(dx, x.shape(), x.device())?,
        Tensor::from_vec(dw, w.shape(), x.device())?,
    ))
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

    /// Buffers: x, res (rows, cols), w (cols), s = x + res and y (rows, cols).
    pub fn rmsnorm_fwd_res(s: Storage, rows: usize, cols: usize, eps: f32) -> Launch {
        let args = bufs(5)
            .chain([Arg::I32(cols as i32), Arg::F32(eps)])
            .collect();
        per_row(
            format!("rmsnorm_fwd_res_{}", s.suffix()),
            "rmsnorm",
            rows,
            RMSNORM_BLOCK,
            args,
        )
    }

    /// Buffers: x, w, dy, dres (rows, cols; read only with `residual`, else any buffer), dx
    /// (rows, cols), dw (cols, f32, zeroed: the kernel accumulates into it).
    pub fn rmsnorm_bwd(s: Storage, rows: usize, cols: usize, eps: f32, residual: bool) -> Launch {
        let args = bufs(6)
            .chain([
                Arg::I32(cols as i32),
                Arg::F32(eps),
                Arg::I32(residual as i32),
            ])
            .collect();
        per_row(
            format!("rmsnorm_bwd_{}", s.suffix()),
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
    use crate::kernels::launching::Described;
    use crate::kernels::launching::{by_dtype, cuda_storage, func, store, tensor_of, view};
    use crate::kernels::rmsnorm::launch;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr};
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Tensor};

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

    /// (s = x + res, y = RMSNorm(s) * w) in x's dtype: one `rmsnorm_fwd_res` launch.
    pub fn rmsnorm_fwd_res(
        x: &Tensor,
        res: &Tensor,
        w: &Tensor,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let cols = w.elem_count();
        let rows = x.elem_count() / cols.max(1);
        let st = store(x.dtype(), "rmsnorm with residual")?;
        let ((xs, xl), (rs, rl), (ws, wl)) = (
            x.storage_and_layout(),
            res.storage_and_layout(),
            w.storage_and_layout(),
        );
        let dev = cuda_storage(&xs, "rmsnorm x")?.device().clone();
        let l = launch::rmsnorm_fwd_res(st, rows, cols, eps);
        let f = func!(&dev, l)?;
        let (s, y) = by_dtype!(x.dtype(), "rmsnorm with residual", T => {
            let (xv, rv, wv) = (
                view::<T>(cuda_storage(&xs, "rmsnorm x")?, xl, "rmsnorm x")?,
                view::<T>(cuda_storage(&rs, "rmsnorm residual")?, rl, "rmsnorm residual")?,
                view::<T>(cuda_storage(&ws, "rmsnorm w")?, wl, "rmsnorm w")?,
            );
            // SAFETY: the kernel writes every element of s and y.
            let mut s = unsafe { dev.alloc::<T>(rows * cols)? };
            let mut y = unsafe { dev.alloc::<T>(rows * cols)? };
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &xv)?
                .buf(1, &rv)?
                .buf(2, &wv)?
                .buf(3, &mut s)?
                .buf(4, &mut y)?;
            // SAFETY: x, res, s and y hold rows x cols, w cols elements.
            unsafe { d.launch() }?;
            (
                CudaStorage::wrap_cuda_slice(s, dev.clone()),
                CudaStorage::wrap_cuda_slice(y, dev.clone()),
            )
        });
        Ok((tensor_of(s, x.shape()), tensor_of(y, x.shape())))
    }

    /// RMSNorm backward in x's dtype: dw zeroed, then one `rmsnorm_bwd` launch (the row
    /// statistic recomputed inside) -> (dx like x, dw (cols) f32).
    pub fn rmsnorm_bwd(
        x: &Tensor,
        w: &Tensor,
        dy: &Tensor,
        residual: Option<&Tensor>,
        eps: f32,
    ) -> Result<(Tensor, Tensor)> {
        let cols = w.elem_count();
        let rows = x.elem_count() / cols.max(1);
        let st = store(x.dtype(), "rmsnorm backward")?;
        let ((xs, xl), (ws, wl), (gs, gl)) = (
            x.storage_and_layout(),
            w.storage_and_layout(),
            dy.storage_and_layout(),
        );
        let res = residual.map(|r| r.storage_and_layout());
        let dev = cuda_storage(&xs, "rmsnorm x")?.device().clone();
        let l = launch::rmsnorm_bwd(st, rows, cols, eps, residual.is_some());
        let f = func!(&dev, l)?;
        // dw accumulates with atomics, so it starts at zero.
        let mut dw = dev.alloc_zeros::<f32>(cols)?;
        let dx = by_dtype!(x.dtype(), "rmsnorm backward", T => {
            let (xv, wv, gv) = (
                view::<T>(cuda_storage(&xs, "rmsnorm x")?, xl, "rmsnorm bwd x")?,
                view::<T>(cuda_storage(&ws, "rmsnorm w")?, wl, "rmsnorm bwd w")?,
                view::<T>(cuda_storage(&gs, "rmsnorm dy")?, gl, "rmsnorm bwd dy")?,
            );
            let rv = match &res {
                Some((rs, rl)) => {
                    let r = cuda_storage(rs, "rmsnorm residual")?;
                    Some(view::<T>(r, rl, "rmsnorm bwd residual")?)
                }
                None => None,
            };
            // SAFETY: the kernel writes every element of dx.
            let mut dx = unsafe { dev.alloc::<T>(rows * cols)? };
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &xv)?
                .buf(1, &wv)?
                .buf(2, &gv)?
                .buf(3, rv.as_ref().unwrap_or(&gv))?
                .buf(4, &mut dx)?
                .buf(5, &mut dw)?;
            // SAFETY: x, dy, dres and dx hold rows x cols, w and dw cols elements.
            unsafe { d.launch() }?;
            CudaStorage::wrap_cuda_slice(dx, dev.clone())
        });
        Ok((
            tensor_of(dx, x.shape()),
            tensor_of(CudaStorage::wrap_cuda_slice(dw, dev), w.shape()),
        ))
    }
}
