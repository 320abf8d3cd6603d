//! The preallocated KV cache's decode-step kernels (kernels/kv_cache.cu), everything about them
//! in one place: `kv_write` (a new token's K or V into one slot, in place) and
//! `decode_attention` (one query per row over the cache), with their shape checks, f32 CPU
//! references, launch descriptions and CUDA launches.
//!
//! Data flow: `forward_cached` (kernels path) -> `Qwen3::layer` with `LayerKv::Flat` -> here.

use super::cpu::f32s;
use super::op::{apply3, apply_inplace, Arg, InplaceKernel, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use reference as refs;

/// Writes src (B, Hkv, D) into slot `slot` of the cache (B, Hkv, C, D), in place.
pub fn kv_write(cache: &Tensor, src: &Tensor, slot: usize) -> Result<()> {
    check::kv_write(cache.dims(), src.dims(), slot)?;
    if src.elem_count() == 0 {
        return Ok(());
    }
    apply_inplace(cache, src, &KvWrite { slot })
}

struct KvWrite {
    slot: usize,
}

impl InplaceKernel for KvWrite {
    const NAME: &'static str = "terse-kv-write";

    fn cpu(&self, (s1, l1): (&mut CpuStorage, &Layout), (s2, l2): Arg<CpuStorage>) -> Result<()> {
        let (b, hkv, cap, d) = l1.shape().dims4()?;
        if self.slot >= cap || l2.shape().dims() != [b, hkv, d] {
            crate::fail!(
                "kv write: slot {} / src {:?} do not fit cache {:?}",
                self.slot,
                l2.shape(),
                l1.shape()
            );
        }
        let src = f32s(s2, l2, "kv src")?;
        match (s1, l1.is_contiguous() && l1.start_offset() == 0) {
            (CpuStorage::F32(c), true) => {
                refs::kv_write(src, c, [b, hkv, d], cap, self.slot);
                Ok(())
            }
            _ => crate::fail!("kv write: the cache must be a contiguous f32 tensor"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        (s1, l1): (&mut CudaStorage, &Layout),
        (s2, l2): Arg<CudaStorage>,
    ) -> Result<()> {
        cuda::kv_write(s1, l1, s2, l2, self.slot)
    }
}

/// Single-query attention for a decode step: q (B, Hq, D) over the first `len` slots of the
/// (B, Hkv, C, D) caches, skipping slots whose `valid` (B · C, u8, on q's device) flag is 0
/// -> (B, Hq, D). The flags are a tensor so a step uploads them once for all its layers.
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    valid: &Tensor,
    len: usize,
) -> Result<Tensor> {
    check::decode_attention(q.dims(), k.dims(), v.dims(), valid.elem_count(), len)?;
    if valid.dtype() != candle_core::DType::U8 || !valid.device().same_device(q.device()) {
        crate::fail!("decode attention: the validity flags must be u8 on q's device");
    }
    if q.elem_count() == 0 {
        return Ok(q.clone());
    }
    let valid = valid.flatten_all()?.contiguous()?;
    apply3(q, k, v, DecodeAttention { valid, len })
}

struct DecodeAttention {
    /// (B · C) u8 flags, contiguous, on the op's device.
    valid: Tensor,
    len: usize,
}

impl Kernel<3> for DecodeAttention {
    const NAME: &'static str = "terse-decode-attention";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (_, hq, d) = l1.shape().dims3()?;
        let (_, hkv, cap, _) = l2.shape().dims4()?;
        let valid = self.valid.to_vec1::<u8>()?;
        let out = refs::decode_attention(
            f32s(s1, l1, "q")?,
            f32s(s2, l2, "k cache")?,
            f32s(s3, l3, "v cache")?,
            &valid,
            [hq, hkv],
            cap,
            self.len,
            d,
        );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        let (storage, layout) = self.valid.storage_and_layout();
        let candle_core::Storage::Cuda(valid) = &*storage else {
            crate::fail!("decode attention: the validity flags are not on the GPU");
        };
        cuda::decode_attention(s1, l1, s2, l2, s3, l3, (valid, layout), self.len)
    }
}

/// Shape and bounds checks run before every launch, on every device (the kernels index raw
/// buffers: a wrong shape is an error naming the op and the shapes, never a launch).
pub(crate) mod check {
    use candle_core::Result;
    /// A KV-cache write: cache (B, Hkv, C, D), src (B, Hkv, D), slot < C.
    pub fn kv_write(cache: &[usize], src: &[usize], slot: usize) -> Result<[usize; 4]> {
        let &[b, hkv, cap, d] = cache else {
            crate::fail!("kv write: the cache must be (B, Hkv, C, D), got {cache:?}");
        };
        if src != [b, hkv, d] || slot >= cap {
            crate::fail!("kv write: slot {slot} / src {src:?} do not fit cache {cache:?}");
        }
        Ok([b, hkv, cap, d])
    }

    use crate::kernels::geometry::DECODE_MAX_HEAD_DIM;

    /// Decode attention: q (B, Hq, D), k and v (B, Hkv, C, D) with Hq a multiple of Hkv, D even and
    /// at most [`DECODE_MAX_HEAD_DIM`], `len` ≤ C slots attended, one validity flag per (row, slot).
    pub fn decode_attention(
        q: &[usize],
        k: &[usize],
        v: &[usize],
        valid: usize,
        len: usize,
    ) -> Result<[usize; 5]> {
        let (&[b, hq, d], &[kb, hkv, cap, kd]) = (q, k) else {
            crate::fail!(
                "decode attention: q must be (B, Hq, D) and k (B, Hkv, C, D), got {q:?} and {k:?}"
            );
        };
        if k != v {
            crate::fail!("decode attention: k {k:?} and v {v:?} differ");
        }
        if kb != b || kd != d || hkv == 0 || hq % hkv != 0 {
            crate::fail!(
                "decode attention: q {q:?} does not fit the cache {k:?} (rows, heads or head size)"
            );
        }
        if d % 2 != 0 || d > DECODE_MAX_HEAD_DIM {
            crate::fail!(
                "decode attention: head size {d} must be even and at most {DECODE_MAX_HEAD_DIM}"
            );
        }
        if len > cap || valid != b * cap {
            crate::fail!("decode attention: len {len} over a capacity of {cap}, or {valid} validity flags for {b} x {cap}");
        }
        Ok([b, hq, hkv, cap, d])
    }
}

/// The f32 CPU reference, written as plain loops with the kernel's layouts and accumulation
/// order in mind: the CPU path of the op, and the ground truth of `cargo xtask gpu-check` and
/// of the SIMT shim's tests.
pub mod reference {
    /// Writes new (B, Hkv, D) into slot `slot` of a (B, Hkv, C, D) cache. kernels/kv_cache.cu
    /// `kv_write_*`.
    pub fn kv_write(src: &[f32], cache: &mut [f32], dims: [usize; 3], cap: usize, slot: usize) {
        let [b, hkv, d] = dims;
        for bh in 0..b * hkv {
            cache[(bh * cap + slot) * d..(bh * cap + slot + 1) * d]
                .copy_from_slice(&src[bh * d..(bh + 1) * d]);
        }
    }

    /// Single-query attention over the first `len` slots of a (B, Hkv, C, D) cache, skipping slots
    /// whose `valid` (B, C) flag is 0; q (B, Hq, D) -> (B, Hq, D); a row with no valid slot gives 0.
    /// kernels/kv_cache.cu `decode_attention_*`.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        valid: &[u8],
        heads: [usize; 2],
        cap: usize,
        len: usize,
        d: usize,
    ) -> Vec<f32> {
        let [hq, hkv] = heads;
        let b = q.len() / (hq * d);
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; q.len()];
        for bi in 0..b {
            for h in 0..hq {
                let g = h / (hq / hkv);
                let qr = &q[(bi * hq + h) * d..(bi * hq + h + 1) * d];
                let slot = |t: usize| ((bi * hkv + g) * cap + t) * d;
                let scores: Vec<(usize, f32)> = (0..len)
                    .filter(|&t| valid[bi * cap + t] != 0)
                    .map(|t| {
                        let kr = &k[slot(t)..slot(t) + d];
                        (t, qr.iter().zip(kr).map(|(a, b)| a * scale * b).sum())
                    })
                    .collect();
                let m = scores.iter().map(|s| s.1).fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                let o = &mut out[(bi * hq + h) * d..(bi * hq + h + 1) * d];
                for &(t, s) in &scores {
                    let p = (s - m).exp() / z;
                    for (oi, vi) in o.iter_mut().zip(&v[slot(t)..slot(t) + d]) {
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

    /// One slot of the preallocated cache. Buffers: src (B, Hkv, 1, D), cache (B, Hkv, cap, D).
    pub fn kv_write(s: Storage, [b, hkv, cap, d]: [usize; 4], slot: usize) -> Launch {
        let args = bufs(2).chain(ints(&[b, hkv, cap, d, slot])).collect();
        elementwise(
            format!("kv_write_{}", s.suffix()),
            "kv_cache",
            b * hkv * d,
            args,
        )
    }

    /// Single-query attention over the preallocated cache. Buffers: q (B, Hq, D), k and v caches
    /// (B, Hkv, cap, D), valid (B, cap, u8), out (B, Hq, D).
    pub fn decode_attention(s: Storage, [b, hq, hkv, cap, d]: [usize; 5], len: usize) -> Launch {
        let scale = 1.0f32 / (d as f32).sqrt();
        let args = bufs(5)
            .chain(ints(&[hq, hkv, cap, len, d]))
            .chain([Arg::F32(scale)])
            .collect();
        per_row(
            format!("decode_attention_{}", s.suffix()),
            "kv_cache",
            b * hq,
            32 * DECODE_WARPS,
            args,
        )
    }
}

/// The CUDA launches (the `cuda` feature only), each through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
mod cuda {
    use crate::kernels::kv_cache::launch;
    use crate::kernels::launching::{by_dtype, func, store, view, Described};
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

    pub fn kv_write(
        cache: &mut CudaStorage,
        lc: &Layout,
        src: &CudaStorage,
        ls: &Layout,
        slot: usize,
    ) -> Result<()> {
        let [b, hkv, cap, d] =
            crate::kernels::kv_cache::check::kv_write(lc.dims(), ls.dims(), slot)?;
        if !lc.is_contiguous() || lc.start_offset() != 0 {
            crate::fail!("kv write: the cache {:?} must be contiguous", lc.shape());
        }
        let dev = cache.device().clone();
        let l = launch::kv_write(store(cache.dtype(), "kv write")?, [b, hkv, cap, d], slot);
        let f = func!(&dev, l)?;
        by_dtype!(cache.dtype(), "kv write", T => {
            let sv = view::<T>(src, ls, "kv src")?;
            let c = cache.as_cuda_slice_mut::<T>()?;
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &sv)?.buf(1, c)?;
            // SAFETY: src holds B x Hkv x D elements and the cache B x Hkv x cap x D, slot < cap
            // (checked).
            unsafe { dsc.launch() }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention(
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
        (valid, lvalid): (&CudaStorage, &Layout),
        len: usize,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = q.device();
        let (b, hq, d) = lq.shape().dims3()?;
        let (_, hkv, cap, _) = lk.shape().dims4()?;
        crate::kernels::kv_cache::check::decode_attention(
            lq.dims(),
            lk.dims(),
            lv.dims(),
            lvalid.shape().elem_count(),
            len,
        )?;
        let st = store(q.dtype(), "decode attention")?;
        let l = launch::decode_attention(st, [b, hq, hkv, cap, d], len);
        let f = func!(dev, l)?;
        let valid_d = view::<u8>(valid, lvalid, "validity flags")?;
        let out = by_dtype!(q.dtype(), "decode attention", T => {
            let (qv, kv, vv) = (
                view::<T>(q, lq, "q")?,
                view::<T>(k, lk, "k cache")?,
                view::<T>(v, lv, "v cache")?,
            );
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<T>(b * hq * d)? };
            let mut dsc = Described::new(f.builder(), &l);
            dsc.buf(0, &qv)?
                .buf(1, &kv)?
                .buf(2, &vv)?
                .buf(3, &valid_d)?
                .buf(4, &mut out)?;
            // SAFETY: the shapes were checked by `check::decode_attention`.
            unsafe { dsc.launch() }?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        });
        Ok((out, lq.shape().clone()))
    }
}
