//! Log-probabilities of chosen target tokens under the LM head, without a (B, T, V) log-softmax.
//!
//! Sits at the end of the training forward: final hidden rows (N, H) of the completion positions
//! and the head weight (V, H) -> log p(target) (N). Rows are processed in chunks: the forward keeps
//! only the (N) result, and the backward recomputes each chunk's softmax instead of storing it, so
//! peak memory is one (chunk, V) block instead of (N, V) -- for Qwen3's 151,936-token vocabulary
//! the difference between megabytes and gigabytes. Accumulation is in f32 for half inputs.
//!
//! On CUDA (unless `TERSE_FUSED=0`) the head is written out: the logits stay in the GEMM's dtype
//! (bf16 for bf16 compute, never an f32 tensor), the kernels read and write them as they are,
//! the forward's log Z is kept for the backward, and the weight gradient accumulates in one f32
//! buffer inside the GEMM (kernels/gemm.rs, beta = 1) where the composite path re-adds a whole
//! (V, H) gradient per chunk. The weight may be the f32 master itself: the op casts it to the
//! compute dtype once and hands back an f32 gradient, with no bf16 round trip.

use crate::kernels::op::{apply2, Arg, Kernel};
use crate::ops::accum_dtype;
use crate::profile::Category::{HeadBackward, HeadForward};
use candle_core::{CpuStorage, Result, Shape, Storage, Tensor, D};

/// Rows per chunk by default: 512 rows x 151,936 x 4 bytes = 311 MB per block at Qwen3 scale.
pub const DEFAULT_CHUNK_ROWS: usize = 512;

/// log p(targets[n] | hidden[n]) for hidden (N, H), weight (V, H), targets (N) u32 -> (N) f32/f64.
/// Differentiable in `hidden` and `weight` when they carry a graph. The weight may be wider than
/// the hidden rows (the f32 master of bf16 compute): the GEMMs read it cast to hidden's dtype,
/// and its gradient comes back in its own dtype.
pub fn token_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk_rows: usize,
) -> Result<Tensor> {
    logprobs_by(hidden, weight, targets, chunk_rows, Path::of(hidden))
}

/// How the chunks are computed. The CPU runs `Composite` (its numbers are the reference and
/// stay as they were); CUDA runs `Written` (`Kernels` under `TERSE_FUSED=0`, the baseline).
/// Tests run every path on the CPU, where the kernels are their f32 references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// candle ops on accumulation-dtype logits (max, exp, sum, log, gather; softmax and
    /// scatter_add back), the weight gradient re-added per chunk.
    Composite,
    /// The log-prob kernels (kernels/logprob.cu) on accumulation-dtype logits, in place of five
    /// to seven (n, V) passes each way; the rest as `Composite`.
    Kernels,
    /// The kernels on the GEMM's own logits, log Z kept from the forward, and the weight
    /// gradient accumulated in one f32 buffer by the GEMM (kernels/gemm.rs).
    Written,
}

impl Path {
    fn of(hidden: &Tensor) -> Path {
        let on_kernels =
            hidden.device().is_cuda() && accum_dtype(hidden.dtype()) == candle_core::DType::F32;
        match (on_kernels, crate::device::fused()) {
            (false, _) => Path::Composite,
            (true, false) => Path::Kernels,
            (true, true) => Path::Written,
        }
    }
}

fn logprobs_by(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk_rows: usize,
    path: Path,
) -> Result<Tensor> {
    let (n, h) = hidden.dims2()?;
    let (_, hw) = weight.dims2()?;
    if h != hw || targets.dims1()? != n {
        crate::fail!(
            "token_logprobs: hidden {:?}, weight {:?}, targets {:?} do not agree",
            hidden.shape(),
            weight.shape(),
            targets.shape()
        );
    }
    let chunk = chunk_rows.max(1);
    let hd = hidden.detach();
    let wd = weight.detach().to_dtype(hidden.dtype())?; // (V, H), the GEMMs' dtype
    if path != Path::Composite {
        check_targets(targets, weight.dim(0)?)?;
    }
    let mut parts = Vec::with_capacity(n.div_ceil(chunk));
    let mut lse_parts = Vec::new();
    for start in (0..n).step_by(chunk) {
        let len = chunk.min(n - start);
        let hc = hd.narrow(0, start, len)?;
        let tg = targets.narrow(0, start, len)?;
        if path == Path::Written {
            // The GEMM's own output, read by the kernel as it is; log Z kept for the backward.
            let stats = crate::profile::span(hc.device(), HeadForward, || {
                let logits = hc.matmul(&wd.t()?)?; // (n, V)
                crate::kernels::logprob_stats_of_checked(&logits, &tg) // (n, 3)
            })?;
            parts.push(stats.narrow(1, 0, 1)?.squeeze(1)?);
            lse_parts.push(stats.narrow(1, 1, 1)?.squeeze(1)?);
            continue;
        }
        let logits = chunk_logits(&hc, &wd)?; // (n, V)
        if path == Path::Kernels {
            // One pass of the logprob_fwd kernel: [log p(target), log Z, entropy] per row.
            let stats = crate::kernels::logprob_stats_of_checked(&logits, &tg)?; // (n, 3)
            parts.push(stats.narrow(1, 0, 1)?.squeeze(1)?);
            continue;
        }
        let m = logits.max_keepdim(D::Minus1)?;
        let lse = (logits
            .broadcast_sub(&m)?
            .exp()?
            .sum_keepdim(D::Minus1)?
            .log()?
            + m)?; // (n, 1)
        let tgt = logits.gather(&tg.unsqueeze(1)?, 1)?; // (n, 1)
        parts.push((tgt - lse)?.squeeze(1)?);
    }
    let values = if parts.is_empty() {
        Tensor::zeros(0, accum_dtype(hidden.dtype()), hidden.device())?
    } else {
        Tensor::cat(&parts, 0)?
    };
    if !(hidden.track_op() || weight.track_op()) {
        return Ok(values);
    }
    // The op hands over `values`' storage as an (N) tensor, so it must be laid out as one: the
    // fused path's single chunk is a column of the (n, 3) stats (a strided view), whose
    // storage read as (N) interleaves log Z and the entropy with the log-probs.
    let values = values.contiguous()?;
    let lse = match lse_parts.is_empty() {
        true => None,
        false => Some(Tensor::cat(&lse_parts, 0)?), // (N)
    };
    apply2(
        hidden,
        weight,
        FusedLogProb {
            targets: targets.clone(),
            values,
            chunk,
            weight: wd,
            lse,
            path,
        },
    )
}

/// Every target below the vocabulary size, read once per call (the kernels index with them).
fn check_targets(targets: &Tensor, v: usize) -> Result<()> {
    let ids = targets.to_vec1::<u32>()?;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= v) {
        crate::fail!("token_logprobs: target {bad} is not below the vocabulary size {v}");
    }
    Ok(())
}

/// One chunk's logits in the accumulation dtype: h (n, H) @ W^T -> (n, V).
fn chunk_logits(h: &Tensor, w: &Tensor) -> Result<Tensor> {
    h.matmul(&w.t()?)?.to_dtype(accum_dtype(h.dtype()))
}

/// The reference path the fused op replaces: full logits, full log-softmax, gather. Used by
/// tests and by `bench model` to show the memory it costs.
pub fn naive_token_logprobs(hidden: &Tensor, weight: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = chunk_logits(hidden, weight)?; // (N, V)
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let logz = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logp = shifted.broadcast_sub(&logz)?; // (N, V)
    logp.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)
}

/// The custom op carrying the chunked backward. Its forward result is computed beforehand with
/// ordinary (detached) tensor ops on the right device; the op only hands that result to the graph.
struct FusedLogProb {
    targets: Tensor,
    values: Tensor,
    chunk: usize,
    /// The weight in the GEMMs' dtype (hidden's), cast once in the forward.
    weight: Tensor,
    /// log Z per row (N) f32 from the forward (`Path::Written` only).
    lse: Option<Tensor>,
    path: Path,
}

impl Kernel<2> for FusedLogProb {
    const NAME: &'static str = "fused-token-logprob";

    fn cpu(&self, _: [Arg<CpuStorage>; 2]) -> Result<(CpuStorage, Shape)> {
        let (s, l) = self.values.storage_and_layout();
        match &*s {
            Storage::Cpu(c) if l.is_contiguous() && l.start_offset() == 0 => {
                Ok((c.clone(), l.shape().clone()))
            }
            _ => crate::fail!(
                "fused-token-logprob: precomputed values are not a contiguous cpu tensor"
            ),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        _: [Arg<candle_core::CudaStorage>; 2],
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let (s, l) = self.values.storage_and_layout();
        match &*s {
            Storage::Cuda(c) if l.is_contiguous() && l.start_offset() == 0 => {
                Ok((c.try_clone(l)?, l.shape().clone()))
            }
            _ => crate::fail!(
                "fused-token-logprob: precomputed values are not a contiguous cuda tensor"
            ),
        }
    }

    /// d logp_n / d logits_n = onehot(target_n) - softmax(logits_n); chained into h and W chunk
    /// by chunk, recomputing the softmax.
    fn bwd(
        &self,
        [hidden, weight]: [&Tensor; 2],
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<[Option<Tensor>; 2]> {
        // A frozen head (LoRA) needs no (V, H) gradient: skip its matmul per chunk.
        let head_grad = weight.track_op();
        if let (Path::Written, Some(lse)) = (self.path, &self.lse) {
            let h = hidden.detach();
            let (dh, dw) = crate::profile::span(h.device(), HeadBackward, || {
                self.written_bwd(&h, lse, grad, head_grad)
            })?;
            return Ok([
                Some(dh),
                dw.map(|d| d.to_dtype(weight.dtype())).transpose()?,
            ]);
        }
        let (h, w) = (hidden.detach(), self.weight.clone());
        let (n, _) = h.dims2()?;
        let acc = accum_dtype(h.dtype());
        let grad = grad.detach().to_dtype(acc)?;
        let wa = w.to_dtype(acc)?;
        let mut dh_parts = Vec::new();
        let mut dw: Option<Tensor> = None;
        let fused = self.path == Path::Kernels;
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let hc = h.narrow(0, start, len)?;
            let g = grad.narrow(0, start, len)?.unsqueeze(1)?; // (n, 1)
            let tgt = self.targets.narrow(0, start, len)?.unsqueeze(1)?;
            // dlogits = g * (onehot - softmax), built with as few (n, V) temporaries as possible.
            let dlogits = if fused {
                // The kernels: log Z from logprob_fwd, then logprob_bwd's one pass.
                let logits = chunk_logits(&hc, &w)?; // (n, V)
                let tg = self.targets.narrow(0, start, len)?;
                let stats = crate::kernels::logprob_stats_of_checked(&logits, &tg)?; // (n, 3)
                let lse_g = Tensor::cat(&[&stats.narrow(1, 1, 1)?, &g], 1)?; // (n, 2)
                crate::kernels::logprob_grad_of_checked(&logits, &tg, &lse_g.contiguous()?)?
            } else {
                let logits = chunk_logits(&hc, &w)?; // (n, V)
                let m = logits.max_keepdim(D::Minus1)?;
                let e = logits.broadcast_sub(&m)?.exp()?;
                let scale = (g.neg()? / e.sum_keepdim(D::Minus1)?)?; // (n, 1)
                e.broadcast_mul(&scale)?.scatter_add(&tgt, &g, 1)? // (n, V)
            };
            dh_parts.push(dlogits.matmul(&wa)?); // (n, H)
            if !head_grad {
                continue;
            }
            let dwc = dlogits.t()?.matmul(&hc.to_dtype(acc)?)?; // (V, H)
            dw = Some(match dw {
                None => dwc,
                Some(d) => (d + dwc)?,
            });
        }
        let dh = if dh_parts.is_empty() {
            h.zeros_like()?
        } else {
            Tensor::cat(&dh_parts, 0)?.to_dtype(h.dtype())?
        };
        if !head_grad {
            return Ok([Some(dh), None]);
        }
        let dw = match dw {
            Some(d) => d,
            None => wa.zeros_like()?,
        };
        Ok([Some(dh), Some(dw.to_dtype(weight.dtype())?)])
    }
}

impl FusedLogProb {
    /// The written-out backward (CUDA): per chunk the logits again in the GEMMs' dtype, one
    /// kernel for d logits from the forward's log Z, one GEMM for dh and one accumulating GEMM
    /// for the weight gradient into a single f32 (V, H) buffer. Returns dh in hidden's dtype and
    /// the f32 weight gradient when the head trains.
    fn written_bwd(
        &self,
        h: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
        head_grad: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (n, hs) = h.dims2()?;
        let w = &self.weight; // (V, H)
        let lse_g = Tensor::stack(&[lse, &grad.detach().to_dtype(lse.dtype())?], 1)?; // (N, 2)
        let dw = match head_grad {
            true => Some(Tensor::zeros(
                (w.dim(0)?, hs),
                candle_core::DType::F32,
                h.device(),
            )?),
            false => None,
        };
        let mut dh_parts = Vec::with_capacity(n.div_ceil(self.chunk));
        for start in (0..n).step_by(self.chunk) {
            let len = self.chunk.min(n - start);
            let hc = h.narrow(0, start, len)?; // (n, H)
            let tg = self.targets.narrow(0, start, len)?;
            let logits = hc.matmul(&w.t()?)?; // (n, V)
            let dl = crate::kernels::logprob_grad_of_checked(
                &logits,
                &tg,
                &lse_g.narrow(0, start, len)?,
            )?; // (n, V)
            dh_parts.push(dl.matmul(w)?); // (n, H)
            if let Some(dw) = &dw {
                crate::kernels::gemm::accumulate_at_b(dw, &dl, &hc)?; // (V, H) += dlᵀ h
            }
        }
        let dh = match dh_parts.is_empty() {
            true => h.zeros_like()?,
            false => Tensor::cat(&dh_parts, 0)?,
        };
        Ok((dh, dw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn data(n: usize, h: usize, v: usize) -> (Var, Var, Tensor) {
        let dev = Device::Cpu;
        let hid: Vec<f64> = (0..n * h)
            .map(|i| (i * 37 % 101) as f64 / 50.0 - 1.0)
            .collect();
        let w: Vec<f64> = (0..v * h)
            .map(|i| (i * 53 % 97) as f64 / 40.0 - 1.2)
            .collect();
        let tg: Vec<u32> = (0..n).map(|i| (i * 7 % v) as u32).collect();
        (
            Var::from_tensor(&Tensor::from_vec(hid, (n, h), &dev).expect("h")).expect("var"),
            Var::from_tensor(&Tensor::from_vec(w, (v, h), &dev).expect("w")).expect("var"),
            Tensor::from_vec(tg, n, &dev).expect("t"),
        )
    }

    #[test]
    fn fused_equals_naive_in_value_and_gradient() {
        let (h, w, t) = data(7, 5, 11);
        for chunk in [1, 3, 7, 100] {
            let fused = token_logprobs(&h, &w, &t, chunk).expect("fused");
            let naive = naive_token_logprobs(&h, &w, &t).expect("naive");
            let diff = (&fused - &naive)
                .expect("d")
                .abs()
                .expect("a")
                .max_all()
                .expect("m");
            assert!(diff.to_scalar::<f64>().expect("s") < 1e-12);
            // A weighted sum so each row's gradient is scaled differently.
            let wts = Tensor::arange(1f64, 8.0, &Device::Cpu).expect("w");
            let gf = (fused * &wts)
                .expect("x")
                .sum_all()
                .expect("s")
                .backward()
                .expect("bwd");
            let gn = (naive * &wts)
                .expect("x")
                .sum_all()
                .expect("s")
                .backward()
                .expect("bwd");
            for v in [&h, &w] {
                let a = gf.get(v.as_tensor()).expect("grad");
                let b = gn.get(v.as_tensor()).expect("grad");
                let d = (a - b).expect("d").abs().expect("a").max_all().expect("m");
                assert!(d.to_scalar::<f64>().expect("s") < 1e-12, "chunk {chunk}");
            }
        }
    }

    /// Every path on the CPU (the kernels as their f32 references, the accumulating GEMM as its
    /// loops) against the composite one, at chunk sizes that split the rows unevenly, with the
    /// head trained and frozen.
    #[test]
    fn every_path_agrees_in_value_and_gradient() {
        let (h, w, t) = data(7, 5, 11);
        let f32var = |v: &Var| {
            Var::from_tensor(
                &v.as_tensor()
                    .to_dtype(candle_core::DType::F32)
                    .expect("f32"),
            )
            .expect("var")
        };
        let (h, w) = (f32var(&h), f32var(&w));
        let wts = Tensor::arange(1f32, 8.0, &Device::Cpu).expect("w");
        let run = |path: Path, chunk: usize, frozen: bool| {
            let wt = match frozen {
                true => w.as_tensor().detach(),
                false => w.as_tensor().clone(),
            };
            let lp = logprobs_by(h.as_tensor(), &wt, &t, chunk, path).expect("logprobs");
            let g = (&lp * &wts)
                .expect("x")
                .sum_all()
                .expect("s")
                .backward()
                .expect("bwd");
            let dh = g.get(h.as_tensor()).expect("dh").clone();
            (lp, dh, g.get(&wt).cloned())
        };
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let d = (a - b).expect("d").abs().expect("a").max_all().expect("m");
            let d = d.to_scalar::<f32>().expect("s");
            assert!(d < 1e-5, "{what}: {d:e}");
        };
        for frozen in [false, true] {
            let (lp0, dh0, dw0) = run(Path::Composite, 100, frozen);
            for path in [Path::Kernels, Path::Written] {
                for chunk in [1, 3, 7, 100] {
                    let (lp, dh, dw) = run(path, chunk, frozen);
                    let what = format!("{path:?} chunk {chunk} frozen {frozen}");
                    close(&lp, &lp0, &format!("{what} log p"));
                    close(&dh, &dh0, &format!("{what} dh"));
                    match (&dw, &dw0) {
                        (Some(a), Some(b)) => close(a, b, &format!("{what} dw")),
                        (None, None) => assert!(frozen, "{what}: no weight gradient"),
                        _ => panic!("{what}: weight gradient on one path only"),
                    }
                }
            }
        }
    }
}
