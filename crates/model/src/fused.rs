//! The CUDA kernels of kernels/*.cu as candle custom ops: on a CUDA device they launch the
//! kernel, on the CPU they run its reference in [`crate::kernels`] (f32), so the same call works
//! everywhere and `cargo xtask gpu-check` can compare the two. Training-path ops (RMSNorm, RoPE)
//! carry their backward; the log-prob epilogue and the decode attention are forward-only (the
//! epilogue's backward is its own op, as the chunked log-prob needs it).

use crate::kernels as cpu;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, InplaceOp2, Layout, Result, Shape, Tensor};

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => crate::fail!("{what}: expected a contiguous f32 tensor"),
    }
}

fn u32s<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::U32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => crate::fail!("{what}: expected a contiguous u32 tensor"),
    }
}

/// y = RMSNorm(x) * w over the last dim; x (.., C), w (C).
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    x.apply_op2(w, RmsNorm { eps })
}

/// Rotate-half RoPE; x (B, H, T, D), cos/sin (B, T, D/2).
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.apply_op3(cos, sin, Rope { inverse: false })
}

/// Per row of logits (n, V) f32 and targets (n) u32: (n, 3) = [log p(target), log Z, entropy].
pub fn logprob_stats(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    logits.apply_op2(targets, LogprobFwd)
}

/// g · (onehot(target) − softmax(logits)) for logits (n, V), targets (n) and `lse_g` (n, 2) =
/// [log Z, g] per row.
pub fn logprob_grad(logits: &Tensor, targets: &Tensor, lse_g: &Tensor) -> Result<Tensor> {
    logits.apply_op3(targets, lse_g, LogprobBwd)
}

/// Single-query attention for a decode step: q (B, Hq, D) over the first `len` slots of the
/// (B, Hkv, C, D) caches, skipping slots whose `valid` (B · C) flag is 0 -> (B, Hq, D).
pub fn decode_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    valid: Vec<u8>,
    len: usize,
) -> Result<Tensor> {
    q.apply_op3(k, v, DecodeAttention { valid, len })
}

struct RmsNorm {
    eps: f32,
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "terse-rmsnorm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let cols = l2.shape().elem_count();
        let (y, _) = cpu::rmsnorm_fwd(
            f32s(s1, l1, "rmsnorm x")?,
            f32s(s2, l2, "rmsnorm w")?,
            cols,
            self.eps,
        );
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::fused_cuda::rmsnorm_fwd(s1, l1, s2, l2, self.eps)
    }

    /// dx from the composite formula (one fused kernel on the GPU is future work), dw by a
    /// reduction over rows: both in f32, recomputing the row statistic.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        use candle_core::D;
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
        Ok((Some(dx), Some(dw)))
    }
}

struct Rope {
    inverse: bool,
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "terse-rope"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, h, t, d) = l1.shape().dims4()?;
        let y = cpu::rope(
            f32s(s1, l1, "rope x")?,
            f32s(s2, l2, "rope cos")?,
            f32s(s3, l3, "rope sin")?,
            [b, h, t, d],
            self.inverse,
        );
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::fused_cuda::rope(s1, l1, s2, l2, s3, l3, self.inverse)
    }

    /// The rotation is orthogonal: the gradient is the inverse rotation of dy.
    fn bwd(
        &self,
        _x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dx = dy.contiguous()?.apply_op3(
            cos,
            sin,
            Rope {
                inverse: !self.inverse,
            },
        )?;
        Ok((Some(dx), None, None))
    }
}

struct LogprobFwd;

impl CustomOp2 for LogprobFwd {
    fn name(&self) -> &'static str {
        "terse-logprob-fwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, v) = l1.shape().dims2()?;
        let (lp, lse, ent) = cpu::logprob_fwd(f32s(s1, l1, "logits")?, u32s(s2, l2, "targets")?, v);
        let out: Vec<f32> = (0..n).flat_map(|i| [lp[i], lse[i], ent[i]]).collect();
        Ok((CpuStorage::F32(out), Shape::from((n, 3))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::fused_cuda::logprob_fwd(s1, l1, s2, l2)
    }
}

struct LogprobBwd;

impl CustomOp3 for LogprobBwd {
    fn name(&self) -> &'static str {
        "terse-logprob-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, v) = l1.shape().dims2()?;
        let lg = f32s(s3, l3, "lse_g")?;
        let (lse, g): (Vec<f32>, Vec<f32>) = lg.chunks(2).map(|p| (p[0], p[1])).unzip();
        let d = cpu::logprob_bwd(
            f32s(s1, l1, "logits")?,
            u32s(s2, l2, "targets")?,
            &lse,
            &g,
            v,
        );
        Ok((CpuStorage::F32(d), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::fused_cuda::logprob_bwd(s1, l1, s2, l2, s3, l3)
    }
}

struct DecodeAttention {
    valid: Vec<u8>,
    len: usize,
}

impl CustomOp3 for DecodeAttention {
    fn name(&self) -> &'static str {
        "terse-decode-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, hq, d) = l1.shape().dims3()?;
        let (_, hkv, cap, _) = l2.shape().dims4()?;
        let out = cpu::decode_attention(
            f32s(s1, l1, "q")?,
            f32s(s2, l2, "k cache")?,
            f32s(s3, l3, "v cache")?,
            &self.valid,
            [hq, hkv],
            cap,
            self.len,
            d,
        );
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::fused_cuda::decode_attention(s1, l1, s2, l2, s3, l3, &self.valid, self.len)
    }
}

/// Writes src (B, Hkv, D) into slot `slot` of the cache (B, Hkv, C, D), in place.
pub fn kv_write(cache: &Tensor, src: &Tensor, slot: usize) -> Result<()> {
    cache.inplace_op2(src, &KvWrite { slot })
}

struct KvWrite {
    slot: usize,
}

impl InplaceOp2 for KvWrite {
    fn name(&self) -> &'static str {
        "terse-kv-write"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (b, hkv, cap, d) = l1.shape().dims4()?;
        if self.slot >= cap || l2.shape().dims() != [b, hkv, d] {
            crate::fail!(
                "kv write: slot {} / src {:?} do not fit cache {:?}",
                self.slot,
                l2.shape(),
                l1.shape()
            );
        }
        let src = f32s(s2, l2, "kv src")?.to_vec();
        match (s1, l1.is_contiguous() && l1.start_offset() == 0) {
            (CpuStorage::F32(c), true) => {
                cpu::kv_write(&src, c, [b, hkv, d], cap, self.slot);
                Ok(())
            }
            _ => crate::fail!("kv write: the cache must be a contiguous f32 tensor"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        crate::fused_cuda::kv_write(s1, l1, s2, l2, self.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops;
    use candle_core::{DType, Device, Var};

    fn vals(shape: &[usize], seed: usize) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).expect("t")
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .expect("d")
            .abs()
            .expect("a")
            .flatten_all()
            .expect("f")
            .max(0)
            .expect("m")
            .to_scalar()
            .expect("s")
    }

    /// The ops' forward (the CPU reference) and backward (recorded by the op) against the
    /// composite candle ops of the training path.
    #[test]
    fn fused_ops_and_their_backward_equal_the_composite_ops() {
        let x = Var::from_tensor(&vals(&[3, 4, 16], 1)).expect("x");
        let w = Var::from_tensor(&vals(&[16], 2)).expect("w");
        let g = vals(&[3, 4, 16], 3);
        let grads = |y: Tensor| {
            (y * &g)
                .expect("m")
                .sum_all()
                .expect("s")
                .backward()
                .expect("b")
        };
        let (a, b) = (
            rms_norm(&x, &w, 1e-6).expect("f"),
            ops::rms_norm(&x, &w, 1e-6).expect("c"),
        );
        assert!(max_diff(&a, &b) < 1e-5);
        let (ga, gb) = (grads(a), grads(b));
        for v in [&x, &w] {
            let d = max_diff(ga.get(v).expect("g"), gb.get(v).expect("g"));
            assert!(d < 1e-4, "rmsnorm grad {d}");
        }

        let x = Var::from_tensor(&vals(&[2, 3, 4, 8], 4)).expect("x");
        let pos =
            Tensor::from_vec(vec![0u32, 1, 2, 3, 7, 8, 9, 10], (2, 4), &Device::Cpu).expect("p");
        let (c, s) = ops::rope_tables(&pos, 8, 1e4, DType::F32).expect("t");
        let g = vals(&[2, 3, 4, 8], 5);
        let grads = |y: Tensor| {
            (y * &g)
                .expect("m")
                .sum_all()
                .expect("s")
                .backward()
                .expect("b")
        };
        let (a, b) = (
            rope(&x, &c, &s).expect("f"),
            ops::rope(&x, &c, &s).expect("c"),
        );
        assert!(max_diff(&a, &b) < 1e-6);
        let d = max_diff(grads(a).get(&x).expect("g"), grads(b).get(&x).expect("g"));
        assert!(d < 1e-6, "rope grad {d}");
    }

    #[test]
    fn kv_write_fills_one_slot_in_place() {
        let cache = Tensor::zeros((2, 1, 3, 2), DType::F32, &Device::Cpu).expect("c");
        kv_write(&cache, &vals(&[2, 1, 2], 6), 1).expect("write");
        let flat = cache.flatten_all().expect("f").to_vec1::<f32>().expect("v");
        let src = vals(&[2, 1, 2], 6)
            .flatten_all()
            .expect("f")
            .to_vec1::<f32>()
            .expect("v");
        assert_eq!(
            flat,
            [0.0, 0.0, src[0], src[1], 0.0, 0.0, 0.0, 0.0, src[2], src[3], 0.0, 0.0]
        );
        assert!(
            kv_write(&cache, &vals(&[2, 1, 2], 6), 3).is_err(),
            "slot out of range"
        );
    }
}
