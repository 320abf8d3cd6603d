//! Launches of kernels/flash_attn.cu behind the flash custom ops (the `cuda` feature only):
//! the forward (out, lse), then for the backward delta = rowsum(dO * O), dQ per query row and
//! dK/dV per key row. q/k/v f32 or bf16, contiguous; everything the kernels write is f32.

#![allow(unsafe_code)] // kernel launches into device buffers the kernels fill

use super::Dims;
use crate::fused_cuda::{ptx, view};
use crate::kernel_checks::{DECODE_MAX_HEAD_DIM, FLASH_WARPS};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

type In<'a> = (&'a CudaStorage, &'a Layout);

/// A function of the flash module (loaded once per device by candle's module cache).
macro_rules! func {
    ($dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func($name, "terse_flash", ptx::FLASH_ATTN)
    };
}

fn rows_grid(rows: usize, heads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(FLASH_WARPS as usize) as u32, heads as u32, 1),
        block_dim: (32 * FLASH_WARPS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn suffix(dt: DType) -> Result<&'static str> {
    match dt {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => crate::fail!("flash attention: no kernel for {other:?} (f32 or bf16)"),
    }
}

fn check(dm: Dims) -> Result<()> {
    if dm.d > DECODE_MAX_HEAD_DIM {
        crate::fail!(
            "flash attention: head_dim {} over the kernels' {DECODE_MAX_HEAD_DIM}",
            dm.d
        );
    }
    Ok(())
}

/// A contiguous f32 or u32 tensor's device buffer, read under its storage lock.
fn with_slice<T: CudaDType, R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&CudaStorage, &Layout) -> Result<R>,
) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cuda(c) => {
            let _ = view::<T>(c, l, what)?;
            f(c, l)
        }
        _ => crate::fail!("flash attention {what}: expected a CUDA tensor"),
    }
}

/// (q, k, v) -> flat f32 [out; lse].
pub(super) fn forward(
    q: In,
    k: In,
    v: In,
    starts: &Tensor,
    dm: Dims,
) -> Result<(CudaStorage, Shape)> {
    check(dm)?;
    fn go<T: CudaDType + DeviceRepr>(
        q: In,
        k: In,
        v: In,
        starts: &Tensor,
        dm: Dims,
        sfx: &str,
    ) -> Result<CudaSlice<f32>> {
        let dev: &CudaDevice = q.0.device();
        let f = func!(dev, &format!("flash_fwd_{sfx}"))?;
        let n = dm.b * dm.hq * dm.t * dm.d;
        let rows = dm.b * dm.hq * dm.t;
        // SAFETY: the kernel writes every output element and every lse entry.
        let mut both = unsafe { dev.alloc::<f32>(n + rows)? };
        with_slice::<u32, _>(starts, "starts", |sc, sl| {
            let (qv, kv, vv) = (
                view::<T>(q.0, q.1, "q")?,
                view::<T>(k.0, k.1, "k")?,
                view::<T>(v.0, v.1, "v")?,
            );
            let sv = view::<u32>(sc, sl, "starts")?;
            let (mut out, mut lse) = both.split_at_mut(n);
            let ints = [dm.hq as i32, dm.hkv as i32, dm.t as i32, dm.d as i32];
            let mut b = f.builder();
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&sv)
                .arg(&mut out)
                .arg(&mut lse);
            ints.iter().for_each(|x| {
                b.arg(x);
            });
            b.arg(&dm.scale);
            // SAFETY: argument types and counts match `flash_fwd_*`.
            unsafe { b.launch(rows_grid(dm.t, dm.b * dm.hq)) }.w()?;
            Ok(())
        })?;
        Ok(both)
    }
    let dev = q.0.device().clone();
    let out = match q.0.dtype() {
        DType::F32 => go::<f32>(q, k, v, starts, dm, "f32")?,
        DType::BF16 => go::<half::bf16>(q, k, v, starts, dm, "bf16")?,
        dt => suffix(dt).map(|_| unreachable!())?,
    };
    let len = out.len();
    Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(len)))
}

/// (q, k, v) with the forward's (out, lse) and dO (f32) -> flat f32 [dq; dk; dv].
pub(super) fn backward(
    q: In,
    k: In,
    v: In,
    saved: (&Tensor, &Tensor, &Tensor),
    starts: &Tensor,
    dm: Dims,
) -> Result<(CudaStorage, Shape)> {
    check(dm)?;
    let (out, lse, dout) = (
        saved.0.contiguous()?,
        saved.1.contiguous()?,
        saved.2.contiguous()?,
    );
    let dev: CudaDevice = q.0.device().clone();
    let sfx = suffix(q.0.dtype())?;
    let (nq, nk) = (dm.b * dm.hq * dm.t * dm.d, dm.b * dm.hkv * dm.t * dm.d);
    let rows = dm.b * dm.hq * dm.t;
    // SAFETY: the kernels write every element of dq, dk, dv and delta.
    let mut grads = unsafe { dev.alloc::<f32>(nq + 2 * nk)? };
    let mut delta = unsafe { dev.alloc::<f32>(rows)? };
    let ints = [dm.hq as i32, dm.hkv as i32, dm.t as i32, dm.d as i32];
    with_slice::<f32, _>(&out, "out", |oc, ol| {
        with_slice::<f32, _>(&dout, "dout", |gc, gl| {
            let (ov, gv) = (view::<f32>(oc, ol, "out")?, view::<f32>(gc, gl, "dout")?);
            let f = func!(dev, "flash_delta_f32")?;
            let (rows_u, d_i) = (rows, dm.d as i32);
            let mut b = f.builder();
            b.arg(&ov).arg(&gv).arg(&mut delta).arg(&rows_u).arg(&d_i);
            // SAFETY: argument types and counts match `flash_delta_f32`.
            unsafe { b.launch(rows_grid(rows, 1)) }.w()?;
            Ok(())
        })
    })?;
    with_slice::<f32, _>(&lse, "lse", |lc, ll| {
        with_slice::<f32, _>(&dout, "dout", |gc, gl| {
            with_slice::<u32, _>(starts, "starts", |sc, sl| {
                let (lv, gv, sv) = (
                    view::<f32>(lc, ll, "lse")?,
                    view::<f32>(gc, gl, "dout")?,
                    view::<u32>(sc, sl, "starts")?,
                );
                let (mut dq, mut rest) = grads.split_at_mut(nq);
                let (mut dk, mut dv) = rest.split_at_mut(nk);
                macro_rules! launch {
                    ($t:ty) => {{
                        let (qv, kv, vv) = (
                            view::<$t>(q.0, q.1, "q")?,
                            view::<$t>(k.0, k.1, "k")?,
                            view::<$t>(v.0, v.1, "v")?,
                        );
                        let f = func!(dev, &format!("flash_bwd_dq_{sfx}"))?;
                        let mut b = f.builder();
                        b.arg(&qv)
                            .arg(&kv)
                            .arg(&vv)
                            .arg(&sv)
                            .arg(&lv)
                            .arg(&delta)
                            .arg(&gv)
                            .arg(&mut dq);
                        ints.iter().for_each(|x| {
                            b.arg(x);
                        });
                        b.arg(&dm.scale);
                        // SAFETY: argument types and counts match `flash_bwd_dq_*`.
                        unsafe { b.launch(rows_grid(dm.t, dm.b * dm.hq)) }.w()?;
                        let f = func!(dev, &format!("flash_bwd_dkdv_{sfx}"))?;
                        let mut b = f.builder();
                        b.arg(&qv)
                            .arg(&kv)
                            .arg(&vv)
                            .arg(&sv)
                            .arg(&lv)
                            .arg(&delta)
                            .arg(&gv)
                            .arg(&mut dk)
                            .arg(&mut dv);
                        ints.iter().for_each(|x| {
                            b.arg(x);
                        });
                        b.arg(&dm.scale);
                        // SAFETY: argument types and counts match `flash_bwd_dkdv_*`.
                        unsafe { b.launch(rows_grid(dm.t, dm.b * dm.hkv)) }.w()?;
                    }};
                }
                match q.0.dtype() {
                    DType::BF16 => launch!(half::bf16),
                    _ => launch!(f32),
                }
                Ok(())
            })
        })
    })?;
    let len = grads.len();
    Ok((CudaStorage::wrap_cuda_slice(grads, dev), Shape::from(len)))
}
