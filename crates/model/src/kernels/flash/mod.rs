//! Attention with O(T) memory for the training forward and backward (FlashAttention-2): the
//! forward keeps only each query row's log-sum-exp, the backward recomputes the scores tile by
//! tile. One candle custom op with `bwd`: on the CPU `cpu.rs` (tiled, multi-threaded f32), on
//! CUDA kernels/flash_attn.cu (`cuda.rs`; bf16 or f32 in, f32 accumulation). The composite
//! `ops::gqa_attention` stays the reference the tests compare against.
//!
//! Masking is one number per query row, its key-range start: query i attends keys
//! [start_i, i]. That covers causal attention with left or right padding (a padding row's range
//! is empty) and packed rows (each sequence's rows start at its first token), and it is what
//! lets a tile skip every key block outside its rows' ranges.
//!
//! Data flow: `Qwen3::hidden_states` -> `attention` -> `FlashFwd` (out, lse) ... backward:
//! `FlashFwd::bwd` -> `FlashBwd` (dq, dk, dv). The written layer backward (no graph) calls
//! `attention_rows` and `attention_rows_grad` instead (rows.rs: the projections' layout, its own
//! kernels on CUDA).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
pub mod launch;
mod rows;
#[cfg(test)]
#[path = "flash_tests.rs"]
mod tests;

use crate::kernels::cpu::f32s;
use crate::kernels::op::{apply3, Arg, Kernel};
use candle_core::{CpuStorage, DType, Device, Result, Shape, Tensor};
use std::sync::Arc;

pub use rows::{attention_rows, attention_rows_grad};

/// Whether bf16 calls at head sizes 64 and 128 take the tensor-core kernels or the scalar
/// ones. The default comes from `TERSE_FLASH_TC` (`0` turns them off for the whole process: a
/// run or a gpu-check that faults in them goes on with the scalar kernels); gpu-check's
/// `flash_kernel` benchmark switches it to compare the two.
fn tensor_core_flag() -> &'static std::sync::atomic::AtomicBool {
    static FLAG: std::sync::OnceLock<std::sync::atomic::AtomicBool> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        std::sync::atomic::AtomicBool::new(tensor_cores_by_default(
            std::env::var("TERSE_FLASH_TC").ok().as_deref(),
        ))
    })
}

/// `TERSE_FLASH_TC`'s reading: unset or anything but `0` keeps the tensor-core kernels on.
pub fn tensor_cores_by_default(var: Option<&str>) -> bool {
    var.is_none_or(|v| v.trim() != "0")
}

/// Routes CUDA bf16 flash attention to the tensor-core kernels (`true`) or to the scalar
/// ones; for benchmarks, which put back `tensor_cores_by_default` after.
pub fn set_tensor_cores(on: bool) {
    tensor_core_flag().store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the tensor-core kernels are selected (`set_tensor_cores`, `TERSE_FLASH_TC`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn tensor_cores() -> bool {
    tensor_core_flag().load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tensor_core_switch {
    /// TERSE_FLASH_TC=0 (with or without spaces) turns the kernels off; unset or 1 keeps them.
    #[test]
    fn only_zero_turns_the_tensor_cores_off() {
        for (v, on) in [
            (None, true),
            (Some("1"), true),
            (Some("0"), false),
            (Some(" 0\n"), false),
        ] {
            assert_eq!(super::tensor_cores_by_default(v), on, "{v:?}");
        }
    }
}

/// The shape of one attention call (the launch descriptions' `FlashDims`, one type for both).
pub(crate) use launch::FlashDims as Dims;

/// Per query row of a (B, T) batch, the first key it may attend (it attends [start, i]); a
/// row whose start is i + 1 attends nothing (padding). Starts never decrease along a row and
/// never pass i + 1: the shape padded and packed rows have, and what the backward's tile walk
/// relies on.
#[derive(Debug, Clone)]
pub struct KeyRanges {
    starts: Arc<Vec<u32>>,
    /// The same starts on the device the attention runs on (read by the CUDA kernels).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tensor: Tensor,
    b: usize,
    t: usize,
}

impl KeyRanges {
    /// From explicit starts (B * T); an error names the first row that breaks the rules.
    pub fn new(starts: Vec<u32>, b: usize, t: usize, device: &Device) -> Result<Self> {
        if starts.len() != b * t {
            crate::fail!("key ranges: {} starts for {b} rows of {t}", starts.len());
        }
        for r in 0..b {
            let row = &starts[r * t..(r + 1) * t];
            for (i, &s) in row.iter().enumerate() {
                if s as usize > i + 1 || (i > 0 && s < row[i - 1]) {
                    crate::fail!("key ranges: row {r} position {i} starts at {s}, out of order");
                }
            }
        }
        let tensor = Tensor::from_slice(&starts, (b, t), device)?;
        Ok(Self {
            starts: Arc::new(starts),
            tensor,
            b,
            t,
        })
    }

    /// Causal attention over a padded batch's real tokens (mask B * T, 1 = real): None when a
    /// row's real tokens are not one contiguous run (the composite path serves those).
    pub fn from_mask(mask: &[u8], b: usize, t: usize, device: &Device) -> Result<Option<Self>> {
        let mut starts = vec![0u32; b * t];
        for r in 0..b {
            let row = &mask[r * t..(r + 1) * t];
            let first = row.iter().position(|&m| m != 0).unwrap_or(t);
            let last = row.iter().rposition(|&m| m != 0).map_or(0, |p| p + 1);
            if row[first.min(last)..last].contains(&0) {
                return Ok(None);
            }
            for (i, s) in starts[r * t..(r + 1) * t].iter_mut().enumerate() {
                *s = if row[i] != 0 {
                    first as u32
                } else {
                    i as u32 + 1
                };
            }
        }
        Self::new(starts, b, t, device).map(Some)
    }

    /// Packed sequences in one row of `t` slots: sequence n holds `lens[n]` tokens after the
    /// previous ones; slots after the last sequence are padding.
    pub fn packed(lens: &[usize], t: usize, device: &Device) -> Result<Self> {
        let total: usize = lens.iter().sum();
        if total > t {
            crate::fail!("key ranges: {total} packed tokens in a row of {t}");
        }
        let mut starts = Vec::with_capacity(t);
        let mut at = 0;
        for &n in lens {
            starts.extend(std::iter::repeat_n(at as u32, n));
            at += n;
        }
        starts.extend((total..t).map(|i| i as u32 + 1));
        Self::new(starts, 1, t, device)
    }

    pub fn starts(&self) -> &[u32] {
        &self.starts
    }
}

/// Causal grouped-query attention over key ranges: q (B, Hq, T, D), k/v (B, Hkv, T, D) ->
/// (B, Hq, T, D) in q's dtype; rows with an empty range give 0. Differentiable in q, k, v.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, ranges: &KeyRanges) -> Result<Tensor> {
    let op = forward_op(q, k, v, ranges)?;
    if q.elem_count() == 0 {
        return q.zeros_like();
    }
    let prep = |x: &Tensor| x.contiguous();
    let both = apply3(&prep(q)?, &prep(k)?, &prep(v)?, op)?; // (B*Hq*T*D + B*Hq*T) f32
    both.narrow(0, 0, q.elem_count())?
        .reshape(q.shape())?
        .to_dtype(q.dtype())
}

/// `attention` without a graph, keeping what its backward reads: (out in q's dtype, the
/// forward's flat f32 [out; lse]) for `attention_grad` (rows.rs's path off the kernels).
pub(crate) fn attention_saved(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ranges: &KeyRanges,
) -> Result<(Tensor, Tensor)> {
    let op = forward_op(q, k, v, ranges)?;
    if q.elem_count() == 0 {
        return Ok((q.zeros_like()?, Tensor::zeros(0, DType::F32, q.device())?));
    }
    let prep = |x: &Tensor| x.detach().contiguous();
    let res = apply3(&prep(q)?, &prep(k)?, &prep(v)?, op)?; // (B*Hq*T*D + B*Hq*T) f32
    let out = res
        .narrow(0, 0, q.elem_count())?
        .reshape(q.shape())?
        .to_dtype(q.dtype())?;
    Ok((out, res))
}

/// The gradients (dq, dk, dv), in their inputs' dtypes, of `attention_saved`'s inputs for the
/// output gradient `dout`, from its saved `res`: the op's backward, called directly.
pub(crate) fn attention_grad(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    ranges: &KeyRanges,
    res: &Tensor,
    dout: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = forward_op(q, k, v, ranges)?;
    if q.elem_count() == 0 {
        return Ok((q.zeros_like()?, k.zeros_like()?, v.zeros_like()?));
    }
    let prep = |x: &Tensor| x.detach().contiguous();
    let (q, k, v) = (prep(q)?, prep(k)?, prep(v)?);
    let [dq, dk, dv] = op.bwd([&q, &k, &v], res, &dout.flatten_all()?)?;
    let need = |t: Option<Tensor>| {
        t.ok_or_else(|| candle_core::Error::Msg("internal: flash backward gave no gradient".into()))
    };
    Ok((need(dq)?, need(dk)?, need(dv)?))
}

/// The checked forward op for q, k, v over `ranges`.
fn forward_op(q: &Tensor, k: &Tensor, v: &Tensor, ranges: &KeyRanges) -> Result<FlashFwd> {
    Ok(FlashFwd {
        ranges: ranges.clone(),
        dims: checked_dims([q, k, v], ranges, false)?,
    })
}

/// The call's shape from q, k, v in attention's layout (B, H, T, D), or with `tokens` in the
/// projections' rows (B, T, H, D) (rows.rs); an error names the shapes when they do not fit
/// (q heads a multiple of kv heads) or the key ranges are another batch's.
fn checked_dims([q, k, v]: [&Tensor; 3], ranges: &KeyRanges, tokens: bool) -> Result<Dims> {
    let bhtd = |x: &Tensor| -> Result<(usize, usize, usize, usize)> {
        let (b, p, r, d) = x.dims4()?;
        Ok(if tokens { (b, r, p, d) } else { (b, p, r, d) })
    };
    let ((b, hq, t, d), (bk, hkv, tk, dk)) = (bhtd(q)?, bhtd(k)?);
    if (bk, tk, dk) != (b, t, d) || v.dims() != k.dims() || hkv == 0 || hq % hkv != 0 {
        crate::fail!(
            "flash attention: q {:?}, k {:?}, v {:?} (q heads a multiple of kv heads)",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if (ranges.b, ranges.t) != (b, t) {
        crate::fail!(
            "flash attention: key ranges for ({}, {}), q has ({b}, {t})",
            ranges.b,
            ranges.t
        );
    }
    Ok(Dims::new(b, hq, hkv, t, d))
}

/// Whether `attention` serves these inputs: f32 on the CPU; f32 or bf16 on CUDA (with the
/// `cuda` feature).
pub fn supported(device: &Device, dtype: DType) -> bool {
    match device {
        Device::Cpu => dtype == DType::F32,
        Device::Cuda(_) => cfg!(feature = "cuda") && matches!(dtype, DType::F32 | DType::BF16),
        _ => false,
    }
}

/// The forward: (q, k, v) -> flat f32 [out (B, Hq, T, D); lse (B, Hq, T)].
struct FlashFwd {
    ranges: KeyRanges,
    dims: Dims,
}

impl Kernel<3> for FlashFwd {
    const NAME: &'static str = "terse-flash-attn";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            f32s(s1, l1, "flash q")?,
            f32s(s2, l2, "flash k")?,
            f32s(s3, l3, "flash v")?,
        );
        let (mut out, lse) = cpu::forward(q, k, v, &self.ranges.starts, self.dims);
        out.extend_from_slice(&lse);
        let n = out.len();
        Ok((CpuStorage::F32(out), Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<candle_core::CudaStorage>; 3],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda::forward((s1, l1), (s2, l2), (s3, l3), &self.ranges.tensor, self.dims)
    }

    fn bwd(
        &self,
        [q, k, v]: [&Tensor; 3],
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<[Option<Tensor>; 3]> {
        let n = q.elem_count();
        let f = |x: &Tensor| x.to_dtype(DType::F32)?.contiguous();
        let op = FlashBwd {
            ranges: self.ranges.clone(),
            dims: self.dims,
            out: res.narrow(0, 0, n)?,
            lse: res.narrow(0, n, res.elem_count() - n)?,
            dout: f(&grad_res.narrow(0, 0, n)?)?,
        };
        let all = apply3(q, k, v, op)?; // flat f32 [dq; dk; dv]
        let nk = k.elem_count();
        let part = |off: usize, like: &Tensor| -> Result<Tensor> {
            all.narrow(0, off, like.elem_count())?
                .reshape(like.shape())?
                .to_dtype(like.dtype())
        };
        Ok([Some(part(0, q)?), Some(part(n, k)?), Some(part(n + nk, v)?)])
    }
}

/// The backward: (q, k, v) with the forward's out and lse and the output gradient -> flat
/// f32 [dq; dk; dv].
struct FlashBwd {
    ranges: KeyRanges,
    dims: Dims,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
}

impl Kernel<3> for FlashBwd {
    const NAME: &'static str = "terse-flash-attn-bwd";

    fn cpu(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<CpuStorage>; 3],
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            f32s(s1, l1, "flash q")?,
            f32s(s2, l2, "flash k")?,
            f32s(s3, l3, "flash v")?,
        );
        // The saved tensors are read in place (out and lse are views of the forward's output).
        let saved = [&self.out, &self.lse, &self.dout].map(|t| t.storage_and_layout());
        let slice = |i: usize, what: &str| match &*saved[i].0 {
            candle_core::Storage::Cpu(st) => f32s(st, saved[i].1, what),
            _ => crate::fail!("flash attention {what}: expected a CPU tensor"),
        };
        let (out, lse, dout) = (slice(0, "out")?, slice(1, "lse")?, slice(2, "dout")?);
        let (mut dq, dk, dv) =
            cpu::backward(q, k, v, out, lse, dout, &self.ranges.starts, self.dims);
        dq.extend_from_slice(&dk);
        dq.extend_from_slice(&dv);
        let n = dq.len();
        Ok((CpuStorage::F32(dq), Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        [(s1, l1), (s2, l2), (s3, l3)]: [Arg<candle_core::CudaStorage>; 3],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let saved = (&self.out, &self.lse, &self.dout);
        cuda::backward(
            (s1, l1),
            (s2, l2),
            (s3, l3),
            saved,
            &self.ranges.tensor,
            self.dims,
        )
    }
}
