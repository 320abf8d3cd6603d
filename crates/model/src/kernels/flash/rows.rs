//! Flash attention in the projections' rows, for the written layer backward (no graph): q
//! (B, T, Hq, D) and k, v (B, T, Hkv, D) as the projections and RoPE leave them, the output in
//! the same layout and dtype, ready for the output projection, and the gradients back in it.
//! On CUDA, bf16 at head sizes 64 and 128 with FlashAttention-2's kernels, this is three
//! launches and no glue: the `_rows` entry points of kernels/flash_fa2.cu and flash_fa2_bwd.cu
//! read and write the rows in bf16, and the dQ kernel computes the backward's delta itself.
//! Elsewhere (the CPU, f32, other head sizes, `TERSE_FLASH_FA2=0`) it is the heads-layout op
//! of mod.rs between transposing copies: the same function, and the reference the tests and
//! gpu-check's parity rows hold the kernels to.
//!
//! Data flow: model/layer_grad.rs `layer_forward` -> `attention_rows` (out, lse) ...
//! `layer_grad_saved` -> `attention_rows_grad` (dq, dk, dv).

use super::{attention_grad, attention_saved, checked_dims, Dims, KeyRanges};
use candle_core::{DType, Result, Tensor};

/// Whether the `_rows` kernels serve a call on `all` (q first): on CUDA, bf16, a head size they
/// are built for, FlashAttention-2's kernels on, and every buffer starting 16-byte aligned
/// (cp.async).
fn kernels(dm: Dims, all: &[&Tensor]) -> bool {
    #[cfg(feature = "cuda")]
    {
        let q = all[0];
        q.device().is_cuda()
            && q.dtype() == DType::BF16
            && all
                .iter()
                .all(|x| x.layout().start_offset().is_multiple_of(8))
            && super::launch::flash_tc_covers(crate::kernels::describe::Storage::Bf16, dm.d)
            && super::tensor_cores()
            && super::cuda::fa2()
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (dm, all);
        false
    }
}

/// (B, T, H, D) <-> (B, H, T, D), contiguous.
fn swap(x: &Tensor) -> Result<Tensor> {
    x.transpose(1, 2)?.contiguous()
}

/// Causal grouped-query attention over key ranges in the projections' rows: (out (B, T, Hq, D)
/// in q's dtype, lse (B * Hq * T) f32, kept for `attention_rows_grad`).
pub fn attention_rows(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ranges: &KeyRanges,
) -> Result<(Tensor, Tensor)> {
    let dm = checked_dims([q, k, v], ranges, true)?;
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    if kernels(dm, &[&q, &k, &v]) && q.elem_count() > 0 {
        #[cfg(feature = "cuda")]
        return cuda::forward(&q, &k, &v, &ranges.tensor, dm);
    }
    let (o, res) = attention_saved(&swap(&q)?, &swap(&k)?, &swap(&v)?, ranges)?; // (B, Hq, T, D)
    let n = q.elem_count();
    let lse = res.narrow(0, n, res.elem_count() - n)?; // (B*Hq*T)
    Ok((swap(&o)?, lse))
}

/// The gradients (dq, dk, dv) of `attention_rows`' inputs in the rows layout and their dtype,
/// for dout (B, T, Hq, D), from its (out, lse).
pub fn attention_rows_grad(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ranges: &KeyRanges,
    (out, lse): (&Tensor, &Tensor),
    dout: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dm = checked_dims([q, k, v], ranges, true)?;
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let (out, dout) = (out.contiguous()?, dout.to_dtype(q.dtype())?.contiguous()?);
    if kernels(dm, &[&q, &k, &v, &out, &dout]) && q.elem_count() > 0 {
        #[cfg(feature = "cuda")]
        return cuda::backward([&q, &k, &v], &ranges.tensor, (&out, lse), &dout, dm);
    }
    // The heads op's saved [out; lse], out in f32 as its forward leaves it.
    let o = swap(&out)?.to_dtype(DType::F32)?.flatten_all()?;
    let res = Tensor::cat(&[&o, lse], 0)?;
    let (dq, dk, dv) = attention_grad(
        &swap(&q)?,
        &swap(&k)?,
        &swap(&v)?,
        ranges,
        &res,
        &swap(&dout)?,
    )?;
    Ok((swap(&dq)?, swap(&dk)?, swap(&dv)?))
}

/// The `_rows` kernels' launches: every buffer contiguous bf16 in the rows layout.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches into device buffers the kernels fill
mod cuda {
    use super::super::launch;
    use super::Dims;
    use crate::kernels::launching::{cuda_storage, func, locked_view, tensor_of, Described};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaStorage, Result, Tensor};
    use half::bf16;

    /// (q, k, v) -> (out (B, T, Hq, D) bf16, lse (B * Hq * T) f32): one launch.
    pub(super) fn forward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        starts: &Tensor,
        dm: Dims,
    ) -> Result<(Tensor, Tensor)> {
        let l = launch::flash_fa2_fwd_rows(dm);
        let ((qs, ql), (ks, kl), (vs, vl), (ss, sl)) = (
            q.storage_and_layout(),
            k.storage_and_layout(),
            v.storage_and_layout(),
            starts.storage_and_layout(),
        );
        let dev = cuda_storage(&qs, "q")?.device().clone();
        let rows = dm.b * dm.hq * dm.t;
        // SAFETY: the kernel writes every element of out and every lse entry.
        let mut out = unsafe { dev.alloc::<bf16>(rows * dm.d)? };
        let mut lse = unsafe { dev.alloc::<f32>(rows)? };
        let (qv, kv, vv, sv) = (
            locked_view::<bf16>(&qs, ql, "q")?,
            locked_view::<bf16>(&ks, kl, "k")?,
            locked_view::<bf16>(&vs, vl, "v")?,
            locked_view::<u32>(&ss, sl, "starts")?,
        );
        let f = func!(&dev, l)?;
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &qv)?
            .buf(1, &kv)?
            .buf(2, &vv)?
            .buf(3, &sv)?
            .buf(4, &mut out)?
            .buf(5, &mut lse)?;
        // SAFETY: q, out (B, T, Hq, D), k, v (B, T, Hkv, D), starts (B, T), lse (B, Hq, T).
        unsafe { d.launch() }?;
        let wrap = |s| CudaStorage::wrap_cuda_slice(s, dev.clone());
        Ok((
            tensor_of(wrap(out), (dm.b, dm.t, dm.hq, dm.d)),
            tensor_of(CudaStorage::wrap_cuda_slice(lse, dev.clone()), rows),
        ))
    }

    /// (dq, dk, dv) in the rows layout, bf16: the dQ kernel (which writes delta), then dK/dV.
    pub(super) fn backward(
        [q, k, v]: [&Tensor; 3],
        starts: &Tensor,
        (out, lse): (&Tensor, &Tensor),
        dout: &Tensor,
        dm: Dims,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let ((qs, ql), (ks, kl), (vs, vl), (ss, sl)) = (
            q.storage_and_layout(),
            k.storage_and_layout(),
            v.storage_and_layout(),
            starts.storage_and_layout(),
        );
        let ((ls, ll), (gs, gl), (os, ol)) = (
            lse.storage_and_layout(),
            dout.storage_and_layout(),
            out.storage_and_layout(),
        );
        let (qv, kv, vv, sv) = (
            locked_view::<bf16>(&qs, ql, "q")?,
            locked_view::<bf16>(&ks, kl, "k")?,
            locked_view::<bf16>(&vs, vl, "v")?,
            locked_view::<u32>(&ss, sl, "starts")?,
        );
        let (lv, gv, ov) = (
            locked_view::<f32>(&ls, ll, "lse")?,
            locked_view::<bf16>(&gs, gl, "dout")?,
            locked_view::<bf16>(&os, ol, "out")?,
        );
        let dev = cuda_storage(&qs, "q")?.device().clone();
        let rows = dm.b * dm.hq * dm.t;
        let (nq, nk) = (rows * dm.d, dm.b * dm.hkv * dm.t * dm.d);
        // SAFETY: the dQ kernel writes every delta entry and every element of dq; the dK/dV
        // kernel every element of dk and dv.
        let mut delta = unsafe { dev.alloc::<f32>(rows)? };
        let mut dq = unsafe { dev.alloc::<bf16>(nq)? };
        let mut dk = unsafe { dev.alloc::<bf16>(nk)? };
        let mut dv = unsafe { dev.alloc::<bf16>(nk)? };
        let l = launch::flash_fa2_bwd_dq_rows(dm);
        let f = func!(&dev, l)?;
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &qv)?
            .buf(1, &kv)?
            .buf(2, &vv)?
            .buf(3, &sv)?
            .buf(4, &lv)?
            .buf(5, &mut delta)?
            .buf(6, &gv)?
            .buf(7, &mut dq)?
            .buf(8, &ov)?;
        // SAFETY: the forward's shapes in rows; dq and out as q, delta (B, Hq, T).
        unsafe { d.launch() }?;
        let l = launch::flash_fa2_bwd_dkdv_rows(dm);
        let f = func!(&dev, l)?;
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &qv)?
            .buf(1, &kv)?
            .buf(2, &vv)?
            .buf(3, &sv)?
            .buf(4, &lv)?
            .buf(5, &delta)?
            .buf(6, &gv)?
            .buf(7, &mut dk)?
            .buf(8, &mut dv)?;
        // SAFETY: as above; dk and dv as k and v.
        unsafe { d.launch() }?;
        let (sq, sk) = ((dm.b, dm.t, dm.hq, dm.d), (dm.b, dm.t, dm.hkv, dm.d));
        let wrap = |s| CudaStorage::wrap_cuda_slice(s, dev.clone());
        Ok((
            tensor_of(wrap(dq), sq),
            tensor_of(wrap(dk), sk),
            tensor_of(wrap(dv), sk),
        ))
    }
}
