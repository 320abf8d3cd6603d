//! A paged decode step's query and key in one kernel (kernels/paged_qk.cu), everything about it
//! in one place: each head's RMSNorm (Qwen3's q_norm / k_norm, none for Qwen2), RoPE at the
//! row's position, the query returned and the key written into its cache slot, in place. It
//! stands for the plain sequence `rms_norm` -> `rope` -> `paged_kv_write` (five launches, each a
//! node of the captured decode step), which stays the reference (`TERSE_FUSED=0`, the CPU).
//! Here: the op, its shape check, its f32 CPU reference, its launch description and its launch.
//!
//! Data flow: model/forward.rs's paged layer (CUDA) -> `paged_qk` -> kernel (or, in tests, the
//! reference) -> q (N, Hq, D) for `paged_decode_attention`, K in the pool.

use super::cpu::f32s;
use super::op::{apply_inplace, Arg, InplaceKernel};
use super::paged_attention::PagedMeta;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use std::cell::RefCell;

/// Normalises (with `norms` = (q_norm, k_norm) weights (D)) and rotates q (N, Hq, D) and k
/// (N, Hkv, D) with the half tables cos, sin (N, D/2) (any leading shape of N rows), writes k's
/// rows into `kpool` (NB, Hkv, BS, D) at `meta.slots`, and returns q's (N, Hq, D).
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_qk(
    q: &Tensor,
    k: &Tensor,
    norms: Option<(&Tensor, &Tensor)>,
    eps: f32,
    (cos, sin): (&Tensor, &Tensor),
    kpool: &Tensor,
    meta: &PagedMeta,
) -> Result<Tensor> {
    let dims = check::paged_qk(
        q.dims(),
        k.dims(),
        kpool.dims(),
        [cos.elem_count(), sin.elem_count()],
        norms.map(|(a, b)| [a.elem_count(), b.elem_count()]),
    )?;
    if dims[0] != meta.slots.len() {
        crate::fail!("paged qk: {} rows for {} slots", dims[0], meta.slots.len());
    }
    let dt = q.dtype();
    let all = [Some(k), Some(cos), Some(sin), Some(kpool)]
        .into_iter()
        .chain(norms.map(|n| Some(n.0)))
        .chain(norms.map(|n| Some(n.1)))
        .flatten();
    if let Some(t) = all.into_iter().find(|t| t.dtype() != dt) {
        crate::fail!(
            "paged qk: every input in q's dtype {dt:?}, one is {:?}",
            t.dtype()
        );
    }
    let (q, cos, sin) = (q.contiguous()?, cos.contiguous()?, sin.contiguous()?);
    let norms = match norms {
        Some((a, b)) => Some((a.contiguous()?, b.contiguous()?)),
        None => None,
    };
    let op = PagedQk {
        q: &q,
        norms: norms.as_ref().map(|(a, b)| (a, b)),
        cos: &cos,
        sin: &sin,
        meta,
        eps,
        dims,
        out: RefCell::new(None),
    };
    apply_inplace(kpool, &k.contiguous()?, &op)?;
    match op.out.into_inner() {
        Some(out) => Ok(out),
        None => crate::fail!("internal: paged qk wrote no query"),
    }
}

/// The op runs in place on the key pool (candle holds its write lock), reading k as its source
/// and the rest under read locks of their own; the query it makes is left in `out`.
struct PagedQk<'a> {
    q: &'a Tensor,
    norms: Option<(&'a Tensor, &'a Tensor)>,
    cos: &'a Tensor,
    sin: &'a Tensor,
    meta: &'a PagedMeta,
    eps: f32,
    /// [N, Hq, Hkv, BS, D].
    dims: [usize; 5],
    out: RefCell<Option<Tensor>>,
}

impl InplaceKernel for PagedQk<'_> {
    const NAME: &'static str = "terse-paged-qk";

    fn cpu(&self, (s1, l1): (&mut CpuStorage, &Layout), (s2, l2): Arg<CpuStorage>) -> Result<()> {
        let vals = |t: &Tensor| t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>();
        let norms = match self.norms {
            Some((a, b)) => Some((vals(a)?, vals(b)?)),
            None => None,
        };
        let (q, cos, sin) = (vals(self.q)?, vals(self.cos)?, vals(self.sin)?);
        let k = f32s(s2, l2, "paged qk k")?;
        let [n, hq, hkv, bs, d] = self.dims;
        let pool = match (s1, l1.is_contiguous() && l1.start_offset() == 0) {
            (CpuStorage::F32(p), true) => p,
            _ => crate::fail!("paged qk: the pool must be a contiguous f32 tensor"),
        };
        let qout = reference::paged_qk(
            &q,
            k,
            norms.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice())),
            (&cos, &sin),
            &self.meta.slots,
            pool,
            [hq, hkv, bs, d],
            self.eps,
        );
        let out = Tensor::from_vec(qout, (n, hq, d), self.q.device())?;
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        (s1, l1): (&mut candle_core::CudaStorage, &Layout),
        (s2, l2): Arg<candle_core::CudaStorage>,
    ) -> Result<()> {
        let out = cuda::paged_qk(self, (s1, l1), (s2, l2))?;
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }
}

pub(crate) mod check {
    use crate::kernels::geometry::DECODE_MAX_HEAD_DIM;
    use candle_core::Result;

    /// q (N, Hq, D), k (N, Hkv, D), the pool (NB, Hkv, BS, D), tables of N·D/2 each, norm
    /// weights of D each; Hq a multiple of Hkv, D even and at most [`DECODE_MAX_HEAD_DIM`]
    /// -> [N, Hq, Hkv, BS, D].
    pub fn paged_qk(
        q: &[usize],
        k: &[usize],
        pool: &[usize],
        tables: [usize; 2],
        norms: Option<[usize; 2]>,
    ) -> Result<[usize; 5]> {
        let (&[n, hq, d], &[kn, hkv, kd], &[_, ph, bs, pd]) = (q, k, pool) else {
            crate::fail!("paged qk: q must be (N, Hq, D), k (N, Hkv, D) and the pool (NB, Hkv, BS, D), got {q:?}, {k:?} and {pool:?}");
        };
        if kn != n || kd != d || ph != hkv || pd != d || hkv == 0 || hq % hkv != 0 {
            crate::fail!("paged qk: q {q:?}, k {k:?} and the pool {pool:?} do not fit");
        }
        if d == 0 || d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
            crate::fail!("paged qk: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}");
        }
        if tables != [n * d / 2; 2] {
            crate::fail!(
                "paged qk: rope tables of {tables:?} values, not {} each",
                n * d / 2
            );
        }
        if norms.is_some_and(|w| w != [d; 2]) {
            crate::fail!("paged qk: norm weights of {norms:?} values, not {d} each");
        }
        Ok([n, hq, hkv, bs, d])
    }
}

/// The f32 CPU reference: the plain sequence's own references (rmsnorm.rs, rope.rs,
/// paged_attention.rs) one after the other, the ground truth of the SIMT shim's tests.
pub mod reference {
    use crate::kernels::paged_attention::reference::paged_kv_write;
    use crate::kernels::rmsnorm::reference::rmsnorm_fwd;
    use crate::kernels::rope::reference::rope;

    /// q (N, Hq, D) and k (N, Hkv, D) normalised (with `norms`) and rotated; k's rows written
    /// into `kpool` (NB, Hkv, BS, D) at `slots`; q's returned. kernels/paged_qk.cu `paged_qk_*`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_qk(
        q: &[f32],
        k: &[f32],
        norms: Option<(&[f32], &[f32])>,
        (cos, sin): (&[f32], &[f32]),
        slots: &[u32],
        kpool: &mut [f32],
        [hq, hkv, bs, d]: [usize; 4],
        eps: f32,
    ) -> Vec<f32> {
        let n = slots.len();
        let head = |x: &[f32], w: Option<&[f32]>, heads: usize| {
            let x = match w {
                Some(w) => rmsnorm_fwd(x, w, d, eps).0,
                None => x.to_vec(),
            };
            rope(&x, cos, sin, [n, heads, 1, d], false) // (N, H, 1, D)
        };
        let kr = head(k, norms.map(|w| w.1), hkv);
        paged_kv_write(&kr, kpool, slots, hkv, bs, d);
        head(q, norms.map(|w| w.0), hq)
    }
}

/// The launch description (kernels/paged_qk.cu).
pub mod launch {
    use crate::kernels::describe::{bufs, ints, per_row, Arg, Launch, Storage};

    /// One block per (row, head slot) of D/2 threads rounded up to a warp. Buffers: q (N, Hq,
    /// D), k (N, Hkv, D), q_norm and k_norm (D; any buffer of the dtype when `norm` is off),
    /// cos, sin (N, D/2), slots (N, i32), the key pool (NB, Hkv, BS, D), q out (N, Hq, D).
    pub fn paged_qk(s: Storage, [n, hq, hkv, bs, d]: [usize; 5], norm: bool, eps: f32) -> Launch {
        let args = bufs(9)
            .chain(ints(&[hq, hkv, bs, d, norm as usize]))
            .chain([Arg::F32(eps)])
            .collect();
        let block = (d / 2).div_ceil(32).max(1) * 32;
        per_row(
            format!("paged_qk_{}", s.suffix()),
            "paged_qk",
            n * (hq + hkv),
            block as u32,
            args,
        )
    }
}

/// The CUDA launch (the `cuda` feature only), through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // a kernel launch into device buffers it fills
mod cuda {
    use crate::kernels::launching::{
        by_dtype, cuda_storage, func, locked_view, store, tensor_of, view, Described,
    };
    use crate::kernels::paged_qk::{launch, PagedQk};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaStorage, Layout, Result, Tensor};

    /// Launches `op` with the key pool `pool` (written) and k its source -> q out.
    pub(super) fn paged_qk(
        op: &PagedQk,
        (pool, lp): (&mut CudaStorage, &Layout),
        (k, lk): (&CudaStorage, &Layout),
    ) -> Result<Tensor> {
        if !lp.is_contiguous() || lp.start_offset() != 0 {
            crate::fail!("paged qk: the pool {:?} must be contiguous", lp.shape());
        }
        let [n, hq, _, _, d] = op.dims;
        let dev = pool.device().clone();
        let l = launch::paged_qk(
            store(pool.dtype(), "paged qk")?,
            op.dims,
            op.norms.is_some(),
            op.eps,
        );
        let f = func!(&dev, l)?;
        let ((qs, ql), (cs, cl), (ss, sl)) = (
            op.q.storage_and_layout(),
            op.cos.storage_and_layout(),
            op.sin.storage_and_layout(),
        );
        // Without norms the kernel reads no weight: cos stands in for both buffers.
        let (qn, kn) = op.norms.unwrap_or((op.cos, op.cos));
        let ((as_, al), (bs_, bl)) = (qn.storage_and_layout(), kn.storage_and_layout());
        let (slots_s, slots_l) = op.meta.dev[2].storage_and_layout();
        let slots = view::<u32>(
            cuda_storage(&slots_s, "write slots")?,
            slots_l,
            "write slots",
        )?;
        let out = by_dtype!(pool.dtype(), "paged qk", T => {
            let (qv, kv) = (locked_view::<T>(&qs, ql, "q")?, view::<T>(k, lk, "k")?);
            let (qnv, knv) = (locked_view::<T>(&as_, al, "q_norm")?, locked_view::<T>(&bs_, bl, "k_norm")?);
            let (cv, sv) = (locked_view::<T>(&cs, cl, "cos")?, locked_view::<T>(&ss, sl, "sin")?);
            // SAFETY: the kernel writes every element of q out.
            let mut qout = unsafe { dev.alloc::<T>(n * hq * d)? };
            let p = pool.as_cuda_slice_mut::<T>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &qnv)?
                .buf(3, &knv)?
                .buf(4, &cv)?
                .buf(5, &sv)?
                .buf(6, &slots)?
                .buf(7, p)?
                .buf(8, &mut qout)?;
            // SAFETY: the shapes were checked (`check::paged_qk`) and every slot lies in the
            // pool (`check::paged_tables`).
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(qout, dev.clone())
        });
        Ok(tensor_of(out, (n, hq, d)))
    }
}
