//! The log-prob epilogue (kernels/logprob.cu), everything about it in one place: the candle ops
//! (per row of logits: log p(target), log Z and entropy; and the gradient as its own op, which
//! the chunked log-prob needs), their shape and target-bounds checks, their f32 CPU references,
//! their launch descriptions and their CUDA launches. On CUDA the logits may be f32 or bf16 (the
//! head GEMM's own output); the stats are f32 and the gradient has the logits' dtype.
//!
//! Data flow: `logprob::token_logprobs` (chunked) -> `logprob_stats_of_checked` /
//! `logprob_grad_of_checked` -> CPU reference or CUDA kernel.

use super::cpu::{f32s, u32s};
use super::op::{apply2, apply3, Arg, Kernel};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, Result, Shape, Tensor};
use reference as refs;

/// Per row of logits (n, V) (f32; bf16 too on CUDA) and targets (n) u32: (n, 3) f32 =
/// [log p(target), log Z, entropy].
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

/// g · (onehot(target) − softmax(logits)) for logits (n, V), targets (n) and `lse_g` (n, 2) f32 =
/// [log Z, g] per row, in the logits' dtype.
pub fn logprob_grad(logits: &Tensor, targets: &Tensor, lse_g: &Tensor) -> Result<Tensor> {
    let ids = target_ids(targets)?;
    check::logprob_grad(logits.dims(), targets.dims(), &ids, lse_g.dims())?;
    if logits.elem_count() == 0 {
        return Ok(logits.clone());
    }
    apply3(logits, targets, lse_g, LogprobBwd)
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

/// Shape and bounds checks run before every launch, on every device (the kernels index raw
/// buffers: a wrong shape is an error naming the op and the shapes, never a launch).
pub(crate) mod check {
    use candle_core::Result;
    /// The log-prob epilogue: logits (N, V), targets (N) with every target < V. Returns (N, V).
    pub fn logprob(logits: &[usize], targets: &[usize], values: &[u32]) -> Result<(usize, usize)> {
        let &[n, v] = logits else {
            crate::fail!("logprob: logits must be (N, V), got {logits:?}");
        };
        if targets != [n] {
            crate::fail!("logprob: targets {targets:?} must be ({n}) for logits {logits:?}");
        }
        if let Some((i, t)) = values.iter().enumerate().find(|(_, t)| **t as usize >= v) {
            crate::fail!(
            "logprob: target {t} at row {i} is outside the vocabulary of {v} (logits {logits:?})"
        );
        }
        Ok((n, v))
    }

    /// The log-prob gradient: logits (N, V), targets (N), lse_g (N, 2).
    pub fn logprob_grad(
        logits: &[usize],
        targets: &[usize],
        values: &[u32],
        lse_g: &[usize],
    ) -> Result<(usize, usize)> {
        let (n, v) = logprob(logits, targets, values)?;
        if lse_g != [n, 2] {
            crate::fail!("logprob grad: lse_g {lse_g:?} must be ({n}, 2) for logits {logits:?}");
        }
        Ok((n, v))
    }
}

/// The f32 CPU reference, written as plain loops with the kernel's layouts and accumulation
/// order in mind: the CPU path of the op, and the ground truth of `cargo xtask gpu-check` and
/// of the SIMT shim's tests.
pub mod reference {
    /// The log-prob epilogue over logits (n, V): (log p(target), log Z, entropy) per row.
    /// kernels/logprob.cu `logprob_fwd_*` (bf16: the same on the logits as f32).
    pub fn logprob_fwd(
        logits: &[f32],
        targets: &[u32],
        v: usize,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = targets.len();
        let (mut logp, mut lse, mut ent) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        for (r, row) in logits.chunks(v).enumerate() {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (s, t) = row.iter().fold((0f32, 0f32), |(s, t), &x| {
                let e = (x - m).exp();
                (s + e, t + e * x)
            });
            let z = m + s.ln();
            lse[r] = z;
            logp[r] = row[targets[r] as usize] - z;
            ent[r] = z - t / s;
        }
        (logp, lse, ent)
    }

    /// The epilogue's backward: g · (onehot(target) − softmax) per row. kernels/logprob.cu
    /// `logprob_bwd_*` (bf16: the same on the logits as f32, each output rounded once).
    pub fn logprob_bwd(
        logits: &[f32],
        targets: &[u32],
        lse: &[f32],
        g: &[f32],
        v: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; logits.len()];
        for (r, (row, o)) in logits.chunks(v).zip(out.chunks_mut(v)).enumerate() {
            for (i, (x, y)) in row.iter().zip(o.iter_mut()).enumerate() {
                let onehot = if i == targets[r] as usize { 1.0 } else { 0.0 };
                *y = g[r] * (onehot - (x - lse[r]).exp());
            }
        }
        out
    }
}

/// The launch description of each entry point (kernel name, grid, block, arguments in order):
/// the CUDA launch below pushes exactly these, and crates/simt runs them on the CPU.
pub mod launch {
    use crate::kernels::describe::{bufs, per_row, Arg, Launch, Storage};
    use crate::kernels::geometry::LOGPROB_BLOCK;

    /// Buffers: logits (n, v) of `s`, targets (n, u32), stats (n, 3) f32.
    pub fn logprob_fwd(s: Storage, n: usize, v: usize) -> Launch {
        let args = bufs(3).chain([Arg::I32(v as i32)]).collect();
        let name = format!("logprob_fwd_{}", s.suffix());
        per_row(name, "logprob", n, LOGPROB_BLOCK, args)
    }

    /// Buffers: logits (n, v) of `s`, targets (n, u32), lse_g (n, 2) f32, gradient (n, v) of `s`.
    pub fn logprob_bwd(s: Storage, n: usize, v: usize) -> Launch {
        let args = bufs(4).chain([Arg::I32(v as i32)]).collect();
        let name = format!("logprob_bwd_{}", s.suffix());
        per_row(name, "logprob", n, LOGPROB_BLOCK, args)
    }
}

/// The CUDA launches (the `cuda` feature only), each through its launch description.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // kernel launches and uninitialised device buffers the kernels fill
mod cuda {
    use crate::kernels::launching::{by_dtype, func, store, view, Described};
    use crate::kernels::logprob::launch;
    use candle_core::backend::BackendStorage;
    use candle_core::{CudaDevice, CudaStorage, Layout, Result, Shape};

    pub fn logprob_fwd(
        l: &CudaStorage,
        ll: &Layout,
        t: &CudaStorage,
        lt: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = l.device();
        let (n, v) = ll.shape().dims2()?;
        let lau = launch::logprob_fwd(store(l.dtype(), "logprob")?, n, v);
        let f = func!(dev, lau)?;
        let tv = view::<u32>(t, lt, "targets")?;
        // SAFETY: every element is written by the kernel.
        let mut stats = unsafe { dev.alloc::<f32>(n * 3)? };
        by_dtype!(l.dtype(), "logprob", T => {
            let lv = view::<T>(l, ll, "logits")?;
            let mut d = Described::new(f.builder(), &lau);
            d.buf(0, &lv)?.buf(1, &tv)?.buf(2, &mut stats)?;
            // SAFETY: logits hold n x v elements, targets n (each < v, checked), stats n x 3.
            unsafe { d.launch() }?;
        });
        Ok((
            CudaStorage::wrap_cuda_slice(stats, dev.clone()),
            Shape::from((n, 3)),
        ))
    }

    pub fn logprob_bwd(
        l: &CudaStorage,
        ll: &Layout,
        t: &CudaStorage,
        lt: &Layout,
        lg: &CudaStorage,
        llg: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dev: &CudaDevice = l.device();
        let (n, v) = ll.shape().dims2()?;
        let lau = launch::logprob_bwd(store(l.dtype(), "logprob bwd")?, n, v);
        let f = func!(dev, lau)?;
        let lgv = view::<f32>(lg, llg, "lse_g")?;
        let tv = view::<u32>(t, lt, "targets")?;
        let out = by_dtype!(l.dtype(), "logprob bwd", T => {
            let lv = view::<T>(l, ll, "logits")?;
            // SAFETY: every element is written by the kernel.
            let mut out = unsafe { dev.alloc::<T>(n * v)? };
            let mut d = Described::new(f.builder(), &lau);
            d.buf(0, &lv)?.buf(1, &tv)?.buf(2, &lgv)?.buf(3, &mut out)?;
            // SAFETY: logits and out hold n x v elements, targets n (each < v, checked), lse_g
            // n x 2.
            unsafe { d.launch() }?;
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        });
        Ok((out, ll.shape().clone()))
    }
}
