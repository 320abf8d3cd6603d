//! Differentiable building blocks of the Qwen3 forward: RMSNorm, rotary embeddings, masked softmax
//! attention with grouped KV heads. Composite candle ops only, so every one records a backward.
//!
//! candle-nn's fused `rms_norm`, `softmax_last_dim` and `rope` record no backward (the gradient is
//! silently missing), which is why these exist. Training in f32 on the CPU takes terse's own
//! fused RMSNorm and RoPE (`fused`, with their backward); the composite forms remain for f64
//! (gradient checks) and CUDA, and as the references the fused ops are tested against. Half-precision inputs are upcast to f32 where HF
//! does (norm statistics, softmax) and cast back afterwards.

use candle_core::{DType, Device, Result, Tensor, D};

/// The dtype numerically sensitive reductions run in: f32 for half types, else the input's own.
pub fn accum_dtype(dt: DType) -> DType {
    match dt {
        DType::BF16 | DType::F16 => DType::F32,
        other => other,
    }
}

/// HF Qwen3RMSNorm: `w * (x / sqrt(mean(x^2) + eps))`, statistics in f32, over the last dim.
/// Without a graph (inference) candle-nn's fused kernel does it in one op; with one, the
/// composite form records the backward (and serves f64, which the fused kernel lacks).
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if !(x.track_op() || weight.track_op()) && x.dtype() != DType::F64 {
        return candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32);
    }
    let f32_cpu = x.device().is_cpu() && x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    let cuda = x.device().is_cuda()
        && matches!(x.dtype(), DType::F32 | DType::BF16)
        && weight.dtype() == x.dtype();
    if f32_cpu || cuda {
        // Training: one custom op each way (`fused`; on CUDA the rmsnorm kernels, whose
        // backward is one pass over the rows) instead of seven composite ops and their graph
        // nodes.
        return crate::kernels::rms_norm(&x.contiguous()?, weight, eps as f32);
    }
    rms_norm_composite(x, weight, eps)
}

/// RMSNorm from composite candle ops (every one records its backward): the reference.
pub fn rms_norm_composite(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dt = x.dtype();
    let xf = x.to_dtype(accum_dtype(dt))?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dt)?;
    normed.broadcast_mul(weight)
}

/// Cos/sin tables for per-row position ids: positions (B, T) -> two (B, T, head_dim / 2)
/// tensors (the first half of HF's `cat(freqs, freqs)` layout). Computed in f32 (as
/// transformers does), then cast.
pub fn rope_tables(
    positions: &Tensor,
    head_dim: usize,
    theta: f64,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let (b, t) = positions.dims2()?;
    let inv: Vec<f32> = (0..head_dim / 2)
        .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect();
    let inv = Tensor::from_vec(inv, (1, 1, head_dim / 2), positions.device())?;
    let pos = positions.to_dtype(DType::F32)?.reshape((b, t, 1))?;
    let freqs = pos.broadcast_mul(&inv)?; // (B, T, hd/2)
    Ok((freqs.cos()?.to_dtype(dtype)?, freqs.sin()?.to_dtype(dtype)?))
}

/// Qwen's rotate-half rotary embedding: `x * cos + rotate_half(x) * sin`, x (B, H, T, hd), with
/// half tables (B, T, hd/2). Inference uses candle-nn's fused kernel; training the composite.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    if !x.track_op() {
        return candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin);
    }
    let fused = (x.device().is_cpu() && x.dtype() == DType::F32)
        || (x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::BF16));
    if fused && cos.dtype() == x.dtype() {
        // Training: the fused rotation (on CUDA the rope kernels; its backward is the inverse
        // rotation) instead of narrow / cat / neg / two broadcast products.
        return crate::kernels::rope(&x.contiguous()?, cos, sin);
    }
    rope_composite(x, cos, sin)
}

/// Rotate-half RoPE from composite candle ops: the reference.
pub fn rope_composite(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let full = |t: &Tensor| -> Result<Tensor> { Tensor::cat(&[t, t], D::Minus1)?.unsqueeze(1) }; // (B, 1, T, hd)
    let x1 = x.narrow(D::Minus1, 0, hd / 2)?;
    let x2 = x.narrow(D::Minus1, hd / 2, hd / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(&full(cos)?)? + rotated.broadcast_mul(&full(sin)?)?
}

/// Softmax over the last dim. The max is detached: subtracting any constant leaves the result
/// (and so the true gradient) unchanged, and it keeps `max`'s tie-breaking out of the graph.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&m)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

/// Additive attention bias (B, 1, 1, T, S) from a boolean "may attend" table laid out (B, T, S):
/// 0 where allowed, a large negative number elsewhere (finite, so fully masked pad rows stay
/// finite instead of NaN).
pub fn attention_bias(
    allowed: &[u8],
    b: usize,
    t: usize,
    s: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let bias: Vec<f32> = allowed
        .iter()
        .map(|&a| if a != 0 { 0.0 } else { -1e9 })
        .collect();
    Tensor::from_vec(bias, (b, 1, 1, t, s), device)?.to_dtype(dtype)
}

/// Scaled dot-product attention with grouped KV heads, without repeating K/V in memory.
/// q (B, Hq, T, hd), k/v (B, Hkv, S, hd), bias (B, 1, 1, T, S) -> (B, Hq, T, hd).
pub fn gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (b, hq, t, hd) = q.dims4()?;
    let (_, hkv, s, _) = k.dims4()?;
    let rep = hq / hkv;
    let dt = q.dtype();
    // Query heads h*rep..(h+1)*rep share KV head h (HF repeat_kv order).
    let scale = 1.0 / (hd as f64).sqrt();
    // Scaling q (T rows) is cheaper than scaling the scores (S columns).
    let q = (q.contiguous()? * scale)?.reshape((b, hkv, rep * t, hd))?; // (B, Hkv, rep*T, hd)
    let kt = k.transpose(2, 3)?; // (B, Hkv, hd, S), a strided view: no copy of the cache
    let scores = q.matmul(&kt)?; // (B, Hkv, rep*T, S)
    let scores = scores
        .reshape((b, hkv, rep, t, s))?
        .to_dtype(accum_dtype(dt))?;
    let scores = scores.broadcast_add(&bias.to_dtype(accum_dtype(dt))?)?;
    // Inference (no graph) may use candle-nn's fused softmax; training needs the composite one,
    // because the fused op records no backward.
    let probs = if scores.track_op() {
        softmax_last(&scores)?
    } else {
        candle_nn::ops::softmax_last_dim(&scores)?
    };
    let probs = probs.to_dtype(dt)?; // (B, Hkv, rep, T, S)
    let probs = probs.reshape((b, hkv, rep * t, s))?;
    let out = probs.matmul(v)?; // (B, Hkv, rep*T, hd)
    out.reshape((b, hq, t, hd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_matches_closed_form() {
        let x = Tensor::new(&[[1.0f64, 2.0, 3.0], [0.0, 0.0, -1e9]], &Device::Cpu).expect("t");
        let p = softmax_last(&x).expect("sm").to_vec2::<f64>().expect("v");
        let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
        assert!((p[0][2] - 3f64.exp() / z).abs() < 1e-12);
        assert!((p[1][0] - 0.5).abs() < 1e-12 && p[1][2] == 0.0);
    }

    #[test]
    fn rope_at_position_zero_is_identity() {
        let dev = Device::Cpu;
        let x = Tensor::arange(0f32, 8.0, &dev)
            .expect("x")
            .reshape((1, 1, 1, 8))
            .expect("r");
        let pos = Tensor::new(&[[0u32]], &dev).expect("p");
        let (c, s) = rope_tables(&pos, 8, 1e4, DType::F32).expect("tables");
        let y = rope(&x, &c, &s).expect("rope");
        let d = (y - &x).expect("d").abs().expect("a").max_all().expect("m");
        assert_eq!(d.to_scalar::<f32>().expect("s"), 0.0);
    }
}
