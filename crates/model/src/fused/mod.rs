//! The CUDA kernels of kernels/*.cu as candle custom ops: on a CUDA device they launch the
//! kernel, on the CPU they run its reference in [`crate::kernels`] (f32), so the same call works
//! everywhere and `cargo xtask gpu-check` can compare the two. Training-path ops (RMSNorm, RoPE)
//! carry their backward; the log-prob epilogue and the decode attention are forward-only (the
//! epilogue's backward is its own op, as the chunked log-prob needs it). Every op checks its
//! shapes (and log-prob targets their bounds) through kernel_checks.rs before it runs, and an
//! empty input returns at once: nothing is launched that could read past a buffer.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cuda")]
pub(crate) mod launching;
pub(crate) mod paged;

use crate::custom_op::{apply2, apply3, apply_inplace, Arg, InplaceKernel, Kernel};
use crate::kernel_checks as check;
use crate::kernels as refs;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use cpu::{f32s, u32s};

/// y = RMSNorm(x) * w over the last dim; x (.., C), w (C).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    check::rmsnorm(x.dims(), w.dims())?;
    if x.elem_count() == 0 {
        return Ok(x.clone());
    }
    apply2(x, w, RmsNorm { eps })
}

/// Rotate-half RoPE; x (B, H, T, D), cos/sin (B, T, D/2).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    check::rope(x.dims(), cos.dims(), sin.dims())?;
    if x.elem_count() == 0 {
        return Ok(x.clone());
    }
    apply3(x, cos, sin, Rope { inverse: false })
}

/// Per row of logits (n, V) f32 and targets (n) u32: (n, 3) = [log p(target), log Z, entropy].
/// The targets are read back to the host for the bounds check (N ids: small beside the logits).
pub fn logprob_stats(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (n, _) = check::logprob(logits.dims(), targets.dims(), &target_ids(targets)?)?;
    if n == 0 {
        return Tensor::zeros((0, 3), candle_core::DType::F32, logits.device());
    }
    apply2(logits, targets, LogprobFwd)
}

/// `logprob_stats` for a caller that checked every target against V itself (token_logprobs
/// checks a whole call's targets once, not each chunk's: a host read per chunk would stall the
/// device); the shapes are still checked.
pub(crate) fn logprob_stats_of_checked(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (n, _) = logits.dims2()?;
    if targets.dims1()? != n {
        crate::fail!(
            "logprob: logits {:?} vs targets {:?}",
            logits.shape(),
            targets.shape()
        );
    }
    apply2(logits, targets, LogprobFwd)
}

/// `logprob_grad` for a caller that checked the targets (see `logprob_stats_of_checked`).
pub(crate) fn logprob_grad_of_checked(
    logits: &Tensor,
    targets: &Tensor,
    lse_g: &Tensor,
) -> Result<Tensor> {
    let (n, _) = logits.dims2()?;
    if targets.dims1()? != n || lse_g.dims() != [n, 2] {
        crate::fail!(
            "logprob grad: logits {:?}, targets {:?}, lse_g {:?}",
            logits.shape(),
            targets.shape(),
            lse_g.shape()
        );
    }
    apply3(logits, targets, lse_g, LogprobBwd)
}

fn target_ids(targets: &Tensor) -> Result<Vec<u32>> {
    if targets.dtype() != candle_core::DType::U32 {
        crate::fail!("logprob: targets must be u32, got {:?}", targets.dtype());
    }
    targets.flatten_all()?.to_vec1::<u32>()
}

/// g · (onehot(target) − softmax(logits)) for logits (n, V), targets (n) and `lse_g` (n, 2) =
/// [log Z, g] per row.
pub fn logprob_grad(logits: &Tensor, targets: &Tensor, lse_g: &Tensor) -> Result<Tensor> {
    let ids = target_ids(targets)?;
    check::logprob_grad(logits.dims(), targets.dims(), &ids, lse_g.dims())?;
    if logits.elem_count() == 0 {
        return Ok(logits.clone());
    }
    apply3(logits, targets, lse_g, LogprobBwd)
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
            let f = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
            let both = apply3(&f(x)?, &f(w)?, &f(dy)?, RmsNormBwd { eps: self.eps })?; // (rows + 1, C)
            let rows = both.dim(0)? - 1;
            let dx = both
                .narrow(0, 0, rows)?
                .reshape(x.shape())?
                .to_dtype(x.dtype())?;
            let dw = both
                .narrow(0, rows, 1)?
                .reshape(w.shape())?
                .to_dtype(w.dtype())?;
            return Ok([Some(dx), Some(dw)]);
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

struct Rope {
    inverse: bool,
}

impl Kernel<3> for Rope {
    const NAME: &'static str = "terse-rope";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h, t, d) = l1.shape().dims4()?;
        let y = refs::rope(
            f32s(s1, l1, "rope x")?,
            f32s(s2, l2, "rope cos")?,
            f32s(s3, l3, "rope sin")?,
            [b, h, t, d],
            self.inverse,
        );
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        cuda::rope(s1, l1, s2, l2, s3, l3, self.inverse)
    }

    /// The rotation is orthogonal: the gradient is the inverse rotation of dy.
    fn bwd(
        &self,
        [_, cos, sin]: [&Tensor; 3],
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<[Option<Tensor>; 3]> {
        let inverse = !self.inverse;
        let dx = apply3(&dy.contiguous()?, cos, sin, Rope { inverse })?;
        Ok([Some(dx), None, None])
    }
}

struct LogprobFwd;

impl Kernel<2> for LogprobFwd {
    const NAME: &'static str = "terse-logprob-fwd";

    fn cpu(&self, [(s1, l1), (s2, l2)]: [Arg<CpuStorage>; 2]) -> Result<(CpuStorage, Shape)> {
        let (n, v) = l1.shape().dims2()?;
        let (lp, lse, ent) =
            refs::logprob_fwd(f32s(s1, l1, "logits")?, u32s(s2, l2, "targets")?, v);
        let out: Vec<f32> = (0..n).flat_map(|i| [lp[i], lse[i], ent[i]]).collect();
        Ok((CpuStorage::F32(out), Shape::from((n, 3))))
    }

    #[cfg(feature = "cuda")]
    fn cuda(&self, [(s1, l1), (s2, l2)]: [Arg<CudaStorage>; 2]) -> Result<(CudaStorage, Shape)> {
        cuda::logprob_fwd(s1, l1, s2, l2)
    }
}

struct LogprobBwd;

impl Kernel<3> for LogprobBwd {
    const NAME: &'static str = "terse-logprob-bwd";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (_, v) = l1.shape().dims2()?;
        let lg = f32s(s3, l3, "lse_g")?;
        let (lse, g): (Vec<f32>, Vec<f32>) = lg.chunks(2).map(|p| (p[0], p[1])).unzip();
        let d = refs::logprob_bwd(
            f32s(s1, l1, "logits")?,
            u32s(s2, l2, "targets")?,
            &lse,
            &g,
            v,
        );
        Ok((CpuStorage::F32(d), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CudaStorage>; 3],
    ) -> Result<(CudaStorage, Shape)> {
        cuda::logprob_bwd(s1, l1, s2, l2, s3, l3)
    }
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

#[cfg(test)]
mod tests;
