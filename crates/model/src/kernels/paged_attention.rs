//! The paged cache's decode-step kernels (kernels/paged_attention.cu), everything about them in
//! one place: `paged_kv_write` (a new token's K or V into its block, in place) and
//! `paged_decode_attention` (one query per row over its block table; on CUDA through
//! paged_split.rs's flash-decoding kernels unless `TERSE_FLASH_DECODING=0`, then through the
//! one-block-per-head reference kernel here), with `PagedMeta` (a step's
//! block tables, lengths and write slots, checked on the host and uploaded once for every
//! layer), their shape checks, f32 CPU references, launch descriptions and CUDA launches.
//!
//! Data flow: `forward_paged` (off the CPU step) -> `Qwen3::layer` with `LayerKv::Paged` -> here.

use super::cpu::f32s;
use super::op::{apply3, apply_inplace, Arg, InplaceKernel, Kernel};
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use std::sync::Arc;

/// One step's block tables, a row per new token: row r attends `lens[r]` slots of its
/// sequence's blocks (`tables[r * maxb..]`, padded with block 0) and writes its token's K/V at
/// `slots[r]`.
pub struct PagedMeta {
    pub(crate) tables: Vec<u32>,
    pub(crate) maxb: usize,
    pub(crate) lens: Vec<u32>,
    pub(crate) slots: Vec<u32>,
    /// The same three on the pools' device (u32, read as i32 by the kernels).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) dev: [Tensor; 3],
}

impl PagedMeta {
    /// A step's meta from its flat tables (`maxb` per row), lengths and write slots, checked
    /// against a pool of `nb` blocks of `bs` slots and uploaded to `device` (tests and gpu-check
    /// build steps this way, without a `PagedKvCache`).
    pub(crate) fn from_tables(
        tables: Vec<u32>,
        maxb: usize,
        lens: Vec<u32>,
        slots: Vec<u32>,
        [nb, bs]: [usize; 2],
        device: &candle_core::Device,
    ) -> Result<Self> {
        check::paged_tables(&tables, maxb, &lens, &slots, [nb, bs])?;
        let up = |v: &[u32]| Tensor::from_slice(v, v.len(), device);
        let dev = [up(&tables)?, up(&lens)?, up(&slots)?];
        Ok(Self {
            tables,
            maxb,
            lens,
            slots,
            dev,
        })
    }
}

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
        let src = f32s(s2, l2, "paged kv src")?;
        match (s1, l1.is_contiguous() && l1.start_offset() == 0) {
            (CpuStorage::F32(p), true) => {
                reference::paged_kv_write(src, p, &self.meta.slots, hkv, bs, d);
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
        cuda::paged_kv_write(s1, l1, s2, l2, self.meta)
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
        let out = reference::paged_decode_attention(
            f32s(s1, l1, "q")?,
            f32s(s2, l2, "k pool")?,
            f32s(s3, l3, "v pool")?,
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
        cuda::paged_decode_attention(s1, l1, s2, l2, s3, l3, &self.meta)
    }
}

/// Shape and bounds checks run before every launch, on every device (the kernels index raw
/// buffers: a wrong shape is an error naming the op and the shapes, never a launch).
pub(crate) mod check {
    use candle_core::Result;
    /// The block tables of a paged decode step: each row's blocks (padded to `maxb` per row),
    /// slots attended (`lens`, its new token included) and where its new token goes (`slots`), all
    /// inside a pool of `nb` blocks of `bs` slots; every value fits an i32 (the kernels' type).
    pub fn paged_tables(
        tables: &[u32],
        maxb: usize,
        lens: &[u32],
        slots: &[u32],
        [nb, bs]: [usize; 2],
    ) -> Result<()> {
        let b = lens.len();
        if tables.len() != b * maxb || slots.len() != b || nb * bs > i32::MAX as usize {
            crate::fail!(
            "paged tables: {} table entries, {} slots for {b} rows of {maxb} blocks (pool {nb} x {bs})",
            tables.len(),
            slots.len()
        );
        }
        if let Some(t) = tables.iter().find(|&&t| t as usize >= nb) {
            crate::fail!("paged tables: block {t} outside a pool of {nb} blocks");
        }
        for (r, (&len, &slot)) in lens.iter().zip(slots).enumerate() {
            let row = &tables[r * maxb..(r + 1) * maxb];
            let (len, slot) = (len as usize, slot as usize);
            if len == 0
                || len > maxb * bs
                || slot / bs >= nb
                || row[(len - 1) / bs] as usize != slot / bs
                || slot % bs != (len - 1) % bs
            {
                crate::fail!("paged tables: row {r} attends {len} slots and writes slot {slot}, which its table does not hold");
            }
        }
        Ok(())
    }

    use crate::kernels::geometry::DECODE_MAX_HEAD_DIM;

    /// Paged decode attention's shapes: q (B, Hq, D), pools (NB, Hkv, BS, D) alike, Hq a multiple of
    /// Hkv, D even and at most [`DECODE_MAX_HEAD_DIM`], B rows of tables -> [B, Hq, Hkv, NB, BS, D].
    pub fn paged_decode_attention(
        q: &[usize],
        k: &[usize],
        v: &[usize],
        rows: usize,
    ) -> Result<[usize; 6]> {
        let (&[b, hq, d], &[nb, hkv, bs, kd]) = (q, k) else {
            crate::fail!(
            "paged attention: q must be (B, Hq, D) and the pools (NB, Hkv, BS, D), got {q:?} and {k:?}"
        );
        };
        if k != v || kd != d || hkv == 0 || hq % hkv != 0 || b != rows {
            crate::fail!(
            "paged attention: q {q:?} does not fit the pools {k:?} / {v:?} and {rows} table rows"
        );
        }
        if d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
            crate::fail!(
                "paged attention: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}"
            );
        }
        Ok([b, hq, hkv, nb, bs, d])
    }

    /// A paged KV write: pool (NB, Hkv, BS, D), src (B, Hkv, D) -> [B, Hkv, NB, BS, D].
    pub fn paged_kv_write(pool: &[usize], src: &[usize]) -> Result<[usize; 5]> {
        let (&[nb, hkv, bs, d], &[b, sh, sd]) = (pool, src) else {
            crate::fail!("paged kv write: pool must be (NB, Hkv, BS, D) and src (B, Hkv, D), got {pool:?} and {src:?}");
        };
        if sh != hkv || sd != d {
            crate::fail!("paged kv write: src {src:?} does not fit the pool {pool:?}");
        }
        Ok([b, hkv, nb, bs, d])
    }
}

/// The f32 CPU reference, written as plain loops with the kernel's layouts and accumulation
/// order in mind: the CPU path of the op, and the ground truth of `cargo xtask gpu-check` and
/// of the SIMT shim's tests.
pub mod reference {
    /// Writes new (B, Hkv, D) into a paged pool (NB, Hkv, BS, D): row b's token at slot
    /// `slots[b]` (block id · BS + offset). kernels/paged_attention.cu `paged_kv_write_*`.
    pub fn paged_kv_write(
        src: &[f32],
        pool: &mut [f32],
        slots: &[u32],
        hkv: usize,
        bs: usize,
        d: usize,
    ) {
        for (b, &slot) in slots.iter().enumerate() {
            let (blk, off) = (slot as usize / bs, slot as usize % bs);
            for h in 0..hkv {
                let at = ((blk * hkv + h) * bs + off) * d;
                pool[at..at + d].copy_from_slice(&src[(b * hkv + h) * d..][..d]);
            }
        }
    }

    /// Single-query attention of q (B, Hq, D) over the first `lens[b]` slots of row b's blocks
    /// (`tables`, `maxb` per row) in paged pools (NB, Hkv, BS, D) -> (B, Hq, D).
    /// kernels/paged_attention.cu `paged_decode_attention_*`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_attention(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        tables: &[u32],
        maxb: usize,
        lens: &[u32],
        [hq, hkv, bs, d]: [usize; 4],
    ) -> Vec<f32> {
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        for (bi, &len) in lens.iter().enumerate() {
            for h in 0..hq {
                let g = h / (hq / hkv);
                let qr = &q[(bi * hq + h) * d..][..d];
                let at =
                    |t: usize| ((tables[bi * maxb + t / bs] as usize * hkv + g) * bs + t % bs) * d;
                let scores: Vec<f32> = (0..len as usize)
                    .map(|t| {
                        qr.iter()
                            .zip(&k[at(t)..at(t) + d])
                            .map(|(a, b)| a * scale * b)
                            .sum()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = scores.iter().map(|s| (s - m).exp()).sum();
                let o = &mut out[(bi * hq + h) * d..][..d];
                for (t, &s) in scores.iter().enumerate() {
                    let p = (s - m).exp() / z;
                    for (oi, vi) in o.iter_mut().zip(&v[at(t)..at(t) + d]) {
                        *oi += p * vi;
                    }
                }
            }
        }
        out
    }
}

/// The launch description of each entry point (kernel name, grid, block, arguments in order):
/// the CUDA launch below pushes exactly these, and crates/simt runs them on the CPU.
pub mod launch {
    use crate::kernels::describe::{bufs, elementwise, ints, per_row, Arg, Launch, Storage};
    use crate::kernels::geometry::DECODE_WARPS;

    /// Each new token's K or V row into its slot of the block pool. Buffers: src (B, Hkv, D),
    /// pool (blocks, Hkv, bs, D), slots (B, i32: block * bs + offset).
    pub fn paged_kv_write(s: Storage, [b, hkv, bs, d]: [usize; 4]) -> Launch {
        let args = bufs(3).chain(ints(&[b, hkv, bs, d])).collect();
        elementwise(
            format!("paged_kv_write_{}", s.suffix()),
            "paged_attention",
            b * hkv * d,
            args,
        )
    }

    /// Single-query attention over block tables. Buffers: q (B, Hq, D), k and v pools, tables
    /// (B, maxb, i32), lens (B, i32), out (B, Hq, D).
    pub fn paged_decode_attention(s: Storage, [b, hq, hkv, bs, maxb, d]: [usize; 6]) -> Launch {
        let scale = 1.0f32 / (d as f32).sqrt();
        let args = bufs(6)
            .chain(ints(&[hq, hkv, bs, maxb, d]))
            .chain([Arg::F32(scale)])
            .collect();
        per_row(
            format!("paged_decode_attention_{}", s.suffix()),
            "paged_attention",
            b * hq,
            32 * DECODE_WARPS,
            args,
        )
    }
}

/// The CUDA launches (the `cuda` feature only), each through its launch description; decode
/// attention hands its checked step to paged_split.rs's split kernels (flash-decoding, the
/// default) unless `TERSE_FLASH_DECODING=0`.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
mod cuda {
    use crate::kernels::launching::{by_dtype, func, store, view, Described};
    use crate::kernels::paged_attention::launch;
    use crate::kernels::paged_attention::PagedMeta;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::CudaView;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

    /// One of a paged step's u32 tensors (tables, lengths, slots) as a device view.
    fn meta_view<'a>(
        storage: &'a candle_core::Storage,
        layout: &Layout,
        what: &str,
    ) -> Result<CudaView<'a, u32>> {
        match storage {
            candle_core::Storage::Cuda(s) => view::<u32>(s, layout, what),
            _ => crate::fail!("paged step: the {what} are not on the GPU"),
        }
    }

    pub fn paged_kv_write(
        pool: &mut CudaStorage,
        lp: &Layout,
        src: &CudaStorage,
        ls: &Layout,
        meta: &PagedMeta,
    ) -> Result<()> {
        let [b, hkv, _, bs, d] =
            crate::kernels::paged_attention::check::paged_kv_write(lp.dims(), ls.dims())?;
        if !lp.is_contiguous() || lp.start_offset() != 0 {
            crate::fail!(
                "paged kv write: the pool {:?} must be contiguous",
                lp.shape()
            );
        }
        let dev = pool.device().clone();
        let l = launch::paged_kv_write(store(pool.dtype(), "paged kv write")?, [b, hkv, bs, d]);
        let f = func!(&dev, l)?;
        let guard = meta.dev[2].storage_and_layout();
        let slots = meta_view(&guard.0, guard.1, "write slots")?;
        by_dtype!(pool.dtype(), "paged kv write", T => {
            let sv = view::<T>(src, ls, "paged kv src")?;
            let p = pool.as_cuda_slice_mut::<T>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &sv)?.buf(1, p)?.buf(2, &slots)?;
            // SAFETY: every slot was checked to lie in the pool (`check::paged_tables`).
            unsafe { dsc.launch() }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_attention(
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
        meta: &PagedMeta,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = q.device();
        let [b, hq, hkv, _, bs, d] =
            crate::kernels::paged_attention::check::paged_decode_attention(
                lq.dims(),
                lk.dims(),
                lv.dims(),
                meta.lens.len(),
            )?;
        let (gt, gl) = (
            meta.dev[0].storage_and_layout(),
            meta.dev[1].storage_and_layout(),
        );
        let tables = meta_view(&gt.0, gt.1, "block tables")?;
        let lens = meta_view(&gl.0, gl.1, "lengths")?;
        let dims = [b, hq, hkv, bs, meta.maxb, d];
        if crate::kernels::paged_split::flash_decoding() {
            let out = crate::kernels::paged_split::cuda::paged_decode_attention(
                (q, lq),
                (k, lk),
                (v, lv),
                dims,
                &tables,
                &lens,
            )?;
            return Ok((out, lq.shape().clone()));
        }
        let st = store(q.dtype(), "paged attention")?;
        let l = launch::paged_decode_attention(st, dims);
        let f = func!(dev, l)?;
        let out = by_dtype!(q.dtype(), "paged attention", T => {
            let (qv, kv, vv) = (
                view::<T>(q, lq, "q")?,
                view::<T>(k, lk, "k pool")?,
                view::<T>(v, lv, "v pool")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<T>(b * hq * d)? };
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, &tables)?
                .buf(4, &lens)?
                .buf(5, &mut out)?;
            // SAFETY: the tables were checked to hold blocks of the pool and lengths within
            // them.
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        });
        Ok((out, lq.shape().clone()))
    }
}
