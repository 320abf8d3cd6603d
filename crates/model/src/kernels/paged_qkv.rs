//! A paged decode step's query, key and value in one kernel (kernels/paged_qkv.cu), everything
//! about it in one place: from the stacked projection's row [q | k | v], each head's RMSNorm
//! (Qwen3's q_norm / k_norm, none for Qwen2) and RoPE at the row's position, the query
//! returned, the key and the value written into their cache slots in place. It stands for the
//! plain sequence `rms_norm` -> `rope` -> `paged_kv_write` x 2 (six launches, each a node of the
//! captured decode step), which stays the reference (`TERSE_FUSED=0`, the CPU). Here: the op,
//! its shape check, its f32 CPU reference, its launch description and its launch.
//!
//! Data flow: model/forward.rs's paged layer (CUDA) -> `paged_qkv` -> kernel (or, in tests, the
//! reference) -> q (N, Hq, D) for `paged_decode_attention`, K and V in the pools.

use super::cpu::f32s;
use super::op::{apply_inplace_pair, Arg, InplacePairKernel};
use super::paged_attention::PagedMeta;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use std::cell::RefCell;

/// From `qkv` (N, (Hq + 2 Hkv) D), each row the query's heads, then the key's, then the
/// value's: normalises (with `norms` = (q_norm, k_norm) weights (D)) and rotates q and k with
/// the half tables cos, sin (N, D/2) (any leading shape of N rows), writes k's and v's rows
/// into `kpool` and `vpool` (NB, Hkv, BS, D) at `meta.slots`, and returns q's (N, Hq, D).
pub(crate) fn paged_qkv(
    qkv: &Tensor,
    norms: Option<(&Tensor, &Tensor)>,
    eps: f32,
    (cos, sin): (&Tensor, &Tensor),
    (kpool, vpool): (&Tensor, &Tensor),
    meta: &PagedMeta,
) -> Result<Tensor> {
    let dims = check::paged_qkv(
        qkv.dims(),
        kpool.dims(),
        vpool.dims(),
        [cos.elem_count(), sin.elem_count()],
        norms.map(|(a, b)| [a.elem_count(), b.elem_count()]),
    )?;
    if dims[0] != meta.slots.len() {
        crate::fail!("paged qkv: {} rows for {} slots", dims[0], meta.slots.len());
    }
    let dt = qkv.dtype();
    let all = [Some(cos), Some(sin), Some(kpool), Some(vpool)]
        .into_iter()
        .chain(norms.map(|n| Some(n.0)))
        .chain(norms.map(|n| Some(n.1)))
        .flatten();
    if let Some(t) = all.into_iter().find(|t| t.dtype() != dt) {
        crate::fail!(
            "paged qkv: every input in qkv's dtype {dt:?}, one is {:?}",
            t.dtype()
        );
    }
    let (cos, sin) = (cos.contiguous()?, sin.contiguous()?);
    let norms = match norms {
        Some((a, b)) => Some((a.contiguous()?, b.contiguous()?)),
        None => None,
    };
    let op = PagedQkv {
        norms: norms.as_ref().map(|(a, b)| (a, b)),
        cos: &cos,
        sin: &sin,
        meta,
        eps,
        dims,
        out: RefCell::new(None),
    };
    apply_inplace_pair(kpool, vpool, &qkv.contiguous()?, &op)?;
    match op.out.into_inner() {
        Some(out) => Ok(out),
        None => crate::fail!("internal: paged qkv wrote no query"),
    }
}

/// The op runs in place on the key and value pools (candle holds their write locks), reading
/// qkv as its source and the rest under read locks of their own; the query it makes is left in
/// `out`.
struct PagedQkv<'a> {
    norms: Option<(&'a Tensor, &'a Tensor)>,
    cos: &'a Tensor,
    sin: &'a Tensor,
    meta: &'a PagedMeta,
    eps: f32,
    /// [N, Hq, Hkv, BS, D].
    dims: [usize; 5],
    out: RefCell<Option<Tensor>>,
}

impl InplacePairKernel for PagedQkv<'_> {
    const NAME: &'static str = "terse-paged-qkv";

    fn cpu(
        &self,
        [(ks, kl), (vs, vl)]: [(&mut CpuStorage, &Layout); 2],
        (s, l): Arg<CpuStorage>,
    ) -> Result<()> {
        let vals = |t: &Tensor| t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>();
        let norms = match self.norms {
            Some((a, b)) => Some((vals(a)?, vals(b)?)),
            None => None,
        };
        let (cos, sin) = (vals(self.cos)?, vals(self.sin)?);
        let qkv = f32s(s, l, "paged qkv")?;
        let [n, hq, hkv, bs, d] = self.dims;
        let (kp, vp) = (f32_pool(ks, kl)?, f32_pool(vs, vl)?);
        let qout = reference::paged_qkv(
            qkv,
            norms.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice())),
            (&cos, &sin),
            &self.meta.slots,
            (kp, vp),
            [hq, hkv, bs, d],
            self.eps,
        );
        let out = Tensor::from_vec(qout, (n, hq, d), &candle_core::Device::Cpu)?;
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        pools: [(&mut candle_core::CudaStorage, &Layout); 2],
        src: Arg<candle_core::CudaStorage>,
    ) -> Result<()> {
        let out = cuda::paged_qkv(self, pools, src)?;
        *self.out.borrow_mut() = Some(out);
        Ok(())
    }
}

/// A pool's values, which the CPU path writes in place.
fn f32_pool<'a>(s: &'a mut CpuStorage, l: &Layout) -> Result<&'a mut Vec<f32>> {
    match (s, l.is_contiguous() && l.start_offset() == 0) {
        (CpuStorage::F32(p), true) => Ok(p),
        _ => crate::fail!("paged qkv: the pools must be contiguous f32 tensors"),
    }
}

pub(crate) mod check {
    use crate::kernels::geometry::DECODE_MAX_HEAD_DIM;
    use candle_core::Result;

    /// qkv (N, (Hq + 2 Hkv) D), the pools (NB, Hkv, BS, D) each, tables of N·D/2 each, norm
    /// weights of D each; Hq a positive multiple of Hkv, D even and at most
    /// [`DECODE_MAX_HEAD_DIM`] -> [N, Hq, Hkv, BS, D].
    pub fn paged_qkv(
        qkv: &[usize],
        kpool: &[usize],
        vpool: &[usize],
        tables: [usize; 2],
        norms: Option<[usize; 2]>,
    ) -> Result<[usize; 5]> {
        let (&[n, width], &[_, hkv, bs, d]) = (qkv, kpool) else {
            crate::fail!("paged qkv: qkv must be (N, (Hq + 2 Hkv) D) and the pools (NB, Hkv, BS, D), got {qkv:?} and {kpool:?}");
        };
        if kpool != vpool {
            crate::fail!("paged qkv: the key pool {kpool:?} and the value pool {vpool:?} differ");
        }
        if d == 0 || d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
            crate::fail!("paged qkv: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}");
        }
        let hq = (width / d).saturating_sub(2 * hkv);
        if hkv == 0 || width % d != 0 || hq == 0 || hq % hkv != 0 {
            crate::fail!("paged qkv: rows of {width} values do not hold whole query heads beside {hkv} key and value heads of {d}");
        }
        if tables != [n * d / 2; 2] {
            crate::fail!(
                "paged qkv: rope tables of {tables:?} values, not {} each",
                n * d / 2
            );
        }
        if norms.is_some_and(|w| w != [d; 2]) {
            crate::fail!("paged qkv: norm weights of {norms:?} values, not {d} each");
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

    /// From `qkv` (N, (Hq + 2 Hkv) D): q and k normalised (with `norms`) and rotated; k's and
    /// v's rows written into `kpool` and `vpool` (NB, Hkv, BS, D) at `slots`; q's (N, Hq, D)
    /// returned. kernels/paged_qkv.cu `paged_qkv_*`.
    pub fn paged_qkv(
        qkv: &[f32],
        norms: Option<(&[f32], &[f32])>,
        (cos, sin): (&[f32], &[f32]),
        slots: &[u32],
        (kpool, vpool): (&mut [f32], &mut [f32]),
        [hq, hkv, bs, d]: [usize; 4],
        eps: f32,
    ) -> Vec<f32> {
        let (n, width) = (slots.len(), (hq + 2 * hkv) * d);
        // One of the three parts of every row: heads [from, from + heads).
        let part = |from: usize, heads: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|r| &qkv[r * width + from * d..r * width + (from + heads) * d])
                .copied()
                .collect()
        };
        let head = |x: &[f32], w: Option<&[f32]>, heads: usize| {
            let x = match w {
                Some(w) => rmsnorm_fwd(x, w, d, eps).0,
                None => x.to_vec(),
            };
            rope(&x, cos, sin, [n, heads, 1, d], false) // (N, H, 1, D)
        };
        let (q, k, v) = (part(0, hq), part(hq, hkv), part(hq + hkv, hkv));
        paged_kv_write(&head(&k, norms.map(|w| w.1), hkv), kpool, slots, hkv, bs, d);
        paged_kv_write(&v, vpool, slots, hkv, bs, d);
        head(&q, norms.map(|w| w.0), hq)
    }
}

/// The launch description (kernels/paged_qkv.cu).
pub mod launch {
    use crate::kernels::describe::{bufs, ints, per_row, Arg, Launch, Storage};

    /// One block per (row, head slot) of D/2 threads rounded up to a warp. Buffers: qkv (N,
    /// (Hq + 2 Hkv) D), q_norm and k_norm (D; any buffer of the dtype when `norm` is off), cos,
    /// sin (N, D/2), slots (N, i32), the key and value pools (NB, Hkv, BS, D), q out (N, Hq,
    /// D).
    pub fn paged_qkv(s: Storage, [n, hq, hkv, bs, d]: [usize; 5], norm: bool, eps: f32) -> Launch {
        let args = bufs(9)
            .chain(ints(&[hq, hkv, bs, d, norm as usize]))
            .chain([Arg::F32(eps)])
            .collect();
        let block = (d / 2).div_ceil(32).max(1) * 32;
        per_row(
            format!("paged_qkv_{}", s.suffix()),
            "paged_qkv",
            n * (hq + 2 * hkv),
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
    use crate::kernels::paged_qkv::{launch, PagedQkv};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaStorage, Layout, Result, Tensor};

    /// Launches `op` with the pools (written) and qkv its source -> q out.
    pub(super) fn paged_qkv(
        op: &PagedQkv,
        [(kpool, kl), (vpool, vl)]: [(&mut CudaStorage, &Layout); 2],
        (qkv, lqkv): (&CudaStorage, &Layout),
    ) -> Result<Tensor> {
        for l in [kl, vl] {
            if !l.is_contiguous() || l.start_offset() != 0 {
                crate::fail!("paged qkv: the pool {:?} must be contiguous", l.shape());
            }
        }
        let [n, hq, _, _, d] = op.dims;
        let dev = kpool.device().clone();
        let l = launch::paged_qkv(
            store(kpool.dtype(), "paged qkv")?,
            op.dims,
            op.norms.is_some(),
            op.eps,
        );
        let f = func!(&dev, l)?;
        let ((cs, cl), (ss, sl)) = (op.cos.storage_and_layout(), op.sin.storage_and_layout());
        // Without norms the kernel reads no weight: cos stands in for both buffers.
        let (qn, kn) = op.norms.unwrap_or((op.cos, op.cos));
        let ((as_, al), (bs_, bl)) = (qn.storage_and_layout(), kn.storage_and_layout());
        let (slots_s, slots_l) = op.meta.dev[2].storage_and_layout();
        let slots = view::<u32>(
            cuda_storage(&slots_s, "write slots")?,
            slots_l,
            "write slots",
        )?;
        let out = by_dtype!(kpool.dtype(), "paged qkv", T => {
            let src = view::<T>(qkv, lqkv, "qkv")?;
            let (qnv, knv) = (locked_view::<T>(&as_, al, "q_norm")?, locked_view::<T>(&bs_, bl, "k_norm")?);
            let (cv, sv) = (locked_view::<T>(&cs, cl, "cos")?, locked_view::<T>(&ss, sl, "sin")?);
            // SAFETY: the kernel writes every element of q out.
            let mut qout = unsafe { dev.alloc::<T>(n * hq * d)? };
            let kp = kpool.as_cuda_slice_mut::<T>()?;
            let vp = vpool.as_cuda_slice_mut::<T>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &src)?
                .buf(1, &qnv)?
                .buf(2, &knv)?
                .buf(3, &cv)?
                .buf(4, &sv)?
                .buf(5, &slots)?
                .buf(6, kp)?
                .buf(7, vp)?
                .buf(8, &mut qout)?;
            // SAFETY: the shapes were checked (`check::paged_qkv`) and every slot lies in the
            // pools (`check::paged_tables`).
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(qout, dev.clone())
        });
        Ok(tensor_of(out, (n, hq, d)))
    }
}
