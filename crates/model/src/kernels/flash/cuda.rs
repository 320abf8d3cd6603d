//! Launches of kernels/flash_attn.cu behind the flash custom ops (the `cuda` feature only):
//! the forward (out, lse), then for the backward delta = rowsum(dO * O), dQ per query row and
//! dK/dV per key row. q/k/v f32 or bf16, contiguous; everything the kernels write is f32.
//! bf16 at head sizes 64 and 128 takes the tensor-core kernels (`super::tensor_cores`):
//! FlashAttention-2's structure, kernels/flash_fa2.cu's forward and flash_fa2_bwd.cu's backward
//! (dQ by its own deterministic kernel, or with `TERSE_FLASH_DQ_ATOMIC=1` by f32 atomics inside
//! the dK/dV pass); `TERSE_FLASH_FA2=0` takes flash_tc.cu's instead, the kernels they replace.

#![allow(unsafe_code)] // kernel launches into device buffers the kernels fill

use super::launch;
use super::Dims;
use crate::kernels::describe::Storage as Store;
use crate::kernels::geometry::DECODE_MAX_HEAD_DIM;
use crate::kernels::launching::{by_dtype, func, store, view, Described};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, Storage, Tensor};

type In<'a> = (&'a CudaStorage, &'a Layout);

fn check(dm: Dims) -> Result<()> {
    if dm.d > DECODE_MAX_HEAD_DIM {
        crate::fail!(
            "flash attention: head_dim {} over the kernels' {DECODE_MAX_HEAD_DIM}",
            dm.d
        );
    }
    Ok(())
}

/// Whether the tensor-core kernels are FlashAttention-2's, kernels/flash_fa2.cu and
/// flash_fa2_bwd.cu (the default), or flash_tc.cu's (`TERSE_FLASH_FA2=0`, read once: the
/// fallback if the new kernels fault on a device).
pub(super) fn fa2() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        super::tensor_cores_by_default(std::env::var("TERSE_FLASH_FA2").ok().as_deref())
    })
}

/// Whether FlashAttention-2's backward adds dQ with f32 atomics inside its dK/dV pass
/// (`TERSE_FLASH_DQ_ATOMIC=1`: five matmuls instead of seven, but dQ's sums then depend on
/// the order the blocks run in) rather than in its own kernel (the default: bit-identical
/// runs). Read once.
fn dq_atomic() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TERSE_FLASH_DQ_ATOMIC").is_ok_and(|v| v.trim() == "1"))
}

/// cp.async copies 16 bytes: rows of bf16 views must start 16-byte aligned (candle's
/// allocations are; a view starting at a multiple of 8 elements keeps them so).
fn aligned(xs: &[&Layout]) -> bool {
    xs.iter().all(|l| l.start_offset().is_multiple_of(8))
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
        st: Store,
    ) -> Result<CudaSlice<f32>> {
        let dev: &CudaDevice = q.0.device();
        // Tensor cores for bf16 at head sizes 64 and 128; the scalar kernel otherwise.
        let l = if launch::flash_tc_covers(st, dm.d) && super::tensor_cores() {
            if fa2() && aligned(&[k.1, v.1]) {
                launch::flash_fa2_fwd(dm)
            } else {
                launch::flash_tc_fwd(dm)
            }
        } else {
            launch::flash_fwd(st, dm)
        };
        let f = func!(dev, l)?;
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
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, &sv)?
                .buf(4, &mut out)?
                .buf(5, &mut lse)?;
            // SAFETY: q, out (B, Hq, T, D), k, v (B, Hkv, T, D), starts (B, T), lse (B, Hq, T).
            unsafe { d.launch() }
        })?;
        Ok(both)
    }
    let dev = q.0.device().clone();
    let st = store(q.0.dtype(), "flash attention")?;
    let out = by_dtype!(q.0.dtype(), "flash attention", T => go::<T>(q, k, v, starts, dm, st)?);
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
    let st = store(q.0.dtype(), "flash attention")?;
    let tc = launch::flash_tc_covers(st, dm.d) && super::tensor_cores();
    let fa2 = tc && fa2() && aligned(&[q.1, k.1, v.1]);
    let atomic = fa2 && dq_atomic();
    let (nq, nk) = (dm.b * dm.hq * dm.t * dm.d, dm.b * dm.hkv * dm.t * dm.d);
    let rows = dm.b * dm.hq * dm.t;
    let mut grads = if atomic {
        // The dK/dV pass adds dQ into zeros.
        dev.alloc_zeros::<f32>(nq + 2 * nk)?
    } else {
        // SAFETY: the kernels write every element of dq, dk and dv.
        unsafe { dev.alloc::<f32>(nq + 2 * nk)? }
    };
    // SAFETY: the delta kernel writes every row.
    let mut delta = unsafe { dev.alloc::<f32>(rows)? };
    with_slice::<f32, _>(&out, "out", |oc, ol| {
        with_slice::<f32, _>(&dout, "dout", |gc, gl| {
            let (ov, gv) = (view::<f32>(oc, ol, "out")?, view::<f32>(gc, gl, "dout")?);
            let l = launch::flash_delta(rows, dm.d);
            let f = func!(&dev, l)?;
            let mut d = Described::new(f.builder(), &l);
            d.buf(0, &ov)?.buf(1, &gv)?.buf(2, &mut delta)?;
            // SAFETY: out and dout hold rows x D elements, delta rows.
            unsafe { d.launch() }
        })
    })?;
    // FlashAttention-2's kernels read dO as bf16 (cp.async tiles and mma fragments): candle's
    // cast, once, instead of a conversion at every restage.
    let dout = if fa2 {
        dout.to_dtype(DType::BF16)?
    } else {
        dout
    };
    with_slice::<f32, _>(&lse, "lse", |lc, ll| {
        with_slice::<u32, _>(starts, "starts", |sc, sl| {
            let (lv, sv) = (view::<f32>(lc, ll, "lse")?, view::<u32>(sc, sl, "starts")?);
            let (mut dq, mut rest) = grads.split_at_mut(nq);
            let (mut dk, mut dv) = rest.split_at_mut(nk);
            // The kernels' inputs in their order: q, k, v as T, dO as G (bf16 for
            // FlashAttention-2's kernels, cast above; f32 for the others).
            by_dtype!(q.0.dtype(), "flash attention", T => {
                by_dtype!(dout.dtype(), "flash attention dO", G => {
                    let (qv, kv, vv) = (
                        view::<T>(q.0, q.1, "q")?,
                        view::<T>(k.0, k.1, "k")?,
                        view::<T>(v.0, v.1, "v")?,
                    );
                    with_slice::<G, _>(&dout, "dout", |gc, gl| {
                        let gv = view::<G>(gc, gl, "dout")?;
                        macro_rules! inputs {
                            ($d:expr) => {
                                $d.buf(0, &qv)?
                                    .buf(1, &kv)?
                                    .buf(2, &vv)?
                                    .buf(3, &sv)?
                                    .buf(4, &lv)?
                                    .buf(5, &delta)?
                                    .buf(6, &gv)?
                            };
                        }
                        let dq_kernel = if fa2 {
                            (!atomic).then(|| launch::flash_fa2_bwd_dq(dm))
                        } else if tc {
                            Some(launch::flash_tc_bwd_dq(dm))
                        } else {
                            Some(launch::flash_bwd_dq(st, dm))
                        };
                        if let Some(l) = dq_kernel {
                            let f = func!(&dev, l)?;
                            let mut d = Described::new(f.builder(), &l);
                            inputs!(d).buf(7, &mut dq)?;
                            // SAFETY: the forward's shapes; dq as q.
                            unsafe { d.launch() }?;
                        }
                        if fa2 {
                            let l = launch::flash_fa2_bwd_dkdv(dm, atomic);
                            let f = func!(&dev, l)?;
                            let mut d = Described::new(f.builder(), &l);
                            inputs!(d)
                                .buf(7, &mut dq)?
                                .buf(8, &mut dk)?
                                .buf(9, &mut dv)?;
                            // SAFETY: the forward's shapes; dq as q (added to only with
                            // `atomic`, into the zeros allocated above), dk and dv as k and v.
                            unsafe { d.launch() }
                        } else {
                            let l = if tc {
                                launch::flash_tc_bwd_dkdv(dm)
                            } else {
                                launch::flash_bwd_dkdv(st, dm)
                            };
                            let f = func!(&dev, l)?;
                            let mut d = Described::new(f.builder(), &l);
                            inputs!(d).buf(7, &mut dk)?.buf(8, &mut dv)?;
                            // SAFETY: the forward's shapes; dk and dv as k and v.
                            unsafe { d.launch() }
                        }
                    })
                })
            })
        })
    })?;
    let len = grads.len();
    Ok((CudaStorage::wrap_cuda_slice(grads, dev), Shape::from(len)))
}
