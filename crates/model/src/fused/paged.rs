//! The paged cache's decode-step ops as candle custom ops: `paged_kv_write` (a new token's K or
//! V into its block, in place) and `paged_decode_attention` (one query per sequence over its
//! block table). CPU: the plain loops of kernels.rs (the reference); CUDA: the kernels of
//! kernels/paged_attention.cu (fused/cuda.rs launches them). `PagedMeta` holds a step's block
//! tables, lengths and write slots, checked on the host and uploaded once for every layer.
//!
//! Data flow: `forward_paged` (one token per sequence, off the CPU step) -> `Qwen3::layer`
//! with `LayerKv::Paged` -> here.

use crate::custom_op::{apply3, apply_inplace, Arg, InplaceKernel, Kernel};
use crate::kernel_checks as check;
pub use crate::paged::PagedMeta;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use std::sync::Arc;

/// Writes src (B, Hkv, D), row r at `meta.slots[r]`, into the pool (NB, Hkv, BS, D), in place.
pub fn paged_kv_write(pool: &Tensor, src: &Tensor, meta: &PagedMeta) -> Result<()> {
    let [b, ..] = check::paged_kv_write(pool.dims(), src.dims())?;
    if b != meta.slots.len() {
        crate::fail!("paged kv write: {b} rows for {} slots", meta.slots.len());
    }
    apply_inplace(pool, src, &PagedKvWrite { meta })
}

/// q (B, Hq, D) over each row's block table in the pools (NB, Hkv, BS, D) -> (B, Hq, D).
pub fn paged_decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &Arc<PagedMeta>,
) -> Result<Tensor> {
    check::paged_decode_attention(q.dims(), k.dims(), v.dims(), meta.lens.len())?;
    apply3(
        q,
        k,
        v,
        PagedAttention {
            meta: Arc::clone(meta),
        },
    )
}

struct PagedKvWrite<'a> {
    meta: &'a PagedMeta,
}

impl InplaceKernel for PagedKvWrite<'_> {
    const NAME: &'static str = "terse-paged-kv-write";

    fn cpu(&self, (s1, l1): (&mut CpuStorage, &Layout), (s2, l2): Arg<CpuStorage>) -> Result<()> {
        let (_, hkv, bs, d) = l1.shape().dims4()?;
        let src = super::cpu::f32s(s2, l2, "paged kv src")?;
        match (s1, l1.is_contiguous() && l1.start_offset() == 0) {
            (CpuStorage::F32(p), true) => {
                crate::kernels::paged_kv_write(src, p, &self.meta.slots, hkv, bs, d);
                Ok(())
            }
            _ => crate::fail!("paged kv write: the pool must be a contiguous f32 tensor"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        (s1, l1): (&mut candle_core::CudaStorage, &Layout),
        (s2, l2): Arg<candle_core::CudaStorage>,
    ) -> Result<()> {
        super::cuda::paged_kv_write(s1, l1, s2, l2, self.meta)
    }
}

/// Shares the step's tables: candle keeps a custom op in the graph, so it owns what it reads.
struct PagedAttention {
    meta: Arc<PagedMeta>,
}

impl Kernel<3> for PagedAttention {
    const NAME: &'static str = "terse-paged-decode-attention";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (_, hq, d) = l1.shape().dims3()?;
        let (_, hkv, bs, _) = l2.shape().dims4()?;
        let m = &self.meta;
        let out = crate::kernels::paged_decode_attention(
            super::cpu::f32s(s1, l1, "q")?,
            super::cpu::f32s(s2, l2, "k pool")?,
            super::cpu::f32s(s3, l3, "v pool")?,
            &m.tables,
            m.maxb,
            &m.lens,
            [hq, hkv, bs, d],
        );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<candle_core::CudaStorage>; 3],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::paged_decode_attention(s1, l1, s2, l2, s3, l3, &self.meta)
    }
}
