//! AdamW over every parameter in one launch (kernels/adamw.cu), everything about it in one
//! place: the update's f32 scalars as candle's ops round them, the f32 CPU reference of one
//! tensor's update, the table and launch description, and the CUDA launch over all tensors.
//! terse-optim's `AdamW::step` calls [`step`] on CUDA (unless `TERSE_FUSED=0`, which keeps its
//! per-tensor composite update, the one this equals bit for bit).
//!
//! Gradient clipping's norm shares the table: [`grad_sumsq`] (`grad_sumsq_f32`, one launch and
//! one download of the blocks' partial sums) is terse-optim's `clip_grad_norm` on CUDA.
//!
//! Data flow: terse_optim's `AdamW::step` -> [`step`] (one table upload and one launch per
//! parameter dtype) -> `adamw_{f32,bf16}`, which writes parameters, masters and moments in place.

use candle_core::{Result, Tensor};

/// The scalars every tensor's update shares, each rounded to f32 as candle's ops round theirs
/// (`Tensor * f64` is an affine whose factor becomes f32).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scalars {
    /// 1 - lr * weight_decay.
    pub decay: f32,
    /// 1 - beta1.
    pub b1c: f32,
    pub beta2: f32,
    /// 1 - beta2.
    pub b2c: f32,
    pub eps: f32,
}

impl Scalars {
    pub fn new(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        Self {
            decay: (1.0 - lr * weight_decay) as f32,
            b1c: (1.0 - beta1) as f32,
            beta2: beta2 as f32,
            b2c: (1.0 - beta2) as f32,
            eps: eps as f32,
        }
    }
}

/// One tensor's scalars at its `step` (counted from 1): [lr / (1 - beta1^step),
/// 1 / sqrt(1 - beta2^step)], computed in f64 and rounded to f32 as the composite update's
/// `* (lr / bc1)` and `/ bc2_sqrt` are.
pub fn step_scalars(lr: f64, beta1: f64, beta2: f64, step: u64) -> [f32; 2] {
    let bc1 = 1.0 - beta1.powi(step as i32);
    let bc2_sqrt = (1.0 - beta2.powi(step as i32)).sqrt();
    [(lr / bc1) as f32, (1.0 / bc2_sqrt) as f32]
}

/// One parameter's part of a [`step`]: the tensors it updates in place, its gradient and its
/// [`step_scalars`]. `name` is for errors.
pub struct Slot<'a> {
    pub name: &'a str,
    /// The parameter (f32 or bf16), written with the new master weights.
    pub param: &'a Tensor,
    /// The f32 master copy of a bf16 parameter; None when the parameter is f32 (its own master).
    pub master: Option<&'a Tensor>,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
    /// The gradient, in the parameter's dtype.
    pub grad: &'a Tensor,
    pub scalars: [f32; 2],
}

/// The AdamW update of every slot, in place: on CUDA one launch per parameter dtype, each over
/// a table of the slots' tensors uploaded once; on the CPU the reference, tensor by tensor (for
/// the parity rows; terse-optim keeps its per-tensor update there). Every tensor must be
/// contiguous, of the parameter's element count, and own its storage (no two written tensors
/// share one).
pub fn step(slots: &[Slot], h: &Scalars) -> Result<()> {
    for s in slots {
        check(s)?;
    }
    for s in slots.iter().filter(|s| !s.param.device().is_cuda()) {
        cpu(s, h)?;
    }
    #[cfg(feature = "cuda")]
    for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
        let group: Vec<&Slot> = slots
            .iter()
            .filter(|s| s.param.device().is_cuda() && s.param.dtype() == dtype)
            .collect();
        if !group.is_empty() {
            cuda::step(&group, h)?;
        }
    }
    Ok(())
}

/// The sum of squares of every element of `grads` (f32, contiguous, one device), in f64: on
/// CUDA one launch over a table of the tensors (`grad_sumsq_f32`) and one download of its
/// blocks' partial sums, added in block order; on the CPU the reference's same order.
pub fn grad_sumsq(grads: &[&Tensor]) -> Result<f64> {
    use candle_core::DType;
    for (i, g) in grads.iter().enumerate() {
        if g.dtype() != DType::F32
            || !g.is_contiguous()
            || !g.device().same_device(grads[0].device())
        {
            crate::fail!(
                "grad_sumsq: gradient {i} is {:?} on {:?} (contiguous: {}); expected contiguous f32 on one device",
                g.dtype(),
                g.device().location(),
                g.is_contiguous()
            );
        }
    }
    if grads.first().is_some_and(|g| g.device().is_cuda()) {
        #[cfg(feature = "cuda")]
        return cuda::sumsq(grads);
    }
    let mut sum = 0f64;
    for g in grads {
        let v = g.flatten_all()?.to_vec1::<f32>()?;
        for p in reference::grad_sumsq(&v) {
            sum += p;
        }
    }
    Ok(sum)
}

/// One slot on the CPU: the reference on its values, written back in place.
fn cpu(s: &Slot, h: &Scalars) -> Result<()> {
    use candle_core::DType;
    let values = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
    let (mut w, mut m, mut v) = (
        values(s.master.unwrap_or(s.param))?,
        values(s.exp_avg)?,
        values(s.exp_avg_sq)?,
    );
    reference::adamw(&mut w, &mut m, &mut v, &values(s.grad)?, h, s.scalars);
    let put = |t: &Tensor, x: Vec<f32>| {
        let new = Tensor::from_vec(x, t.shape(), t.device())?.to_dtype(t.dtype())?;
        t.slice_set(&new, 0, 0)
    };
    put(s.exp_avg, m)?;
    put(s.exp_avg_sq, v)?;
    if let Some(master) = s.master {
        put(master, w.clone())?;
    }
    put(s.param, w)
}

/// A slot's dtypes, shapes and layouts.
fn check(s: &Slot) -> Result<()> {
    use candle_core::DType;
    let n = s.param.elem_count();
    let p = s.param.dtype();
    if s.param.rank() == 0 {
        crate::fail!("adamw `{}`: a scalar parameter (rank 0)", s.name);
    }
    if !matches!(p, DType::F32 | DType::BF16) || s.grad.dtype() != p {
        crate::fail!(
            "adamw `{}`: parameter {p:?} with gradient {:?} (f32 or bf16, both the same)",
            s.name,
            s.grad.dtype()
        );
    }
    if (p == DType::BF16) != s.master.is_some() {
        crate::fail!(
            "adamw `{}`: a bf16 parameter needs an f32 master, an f32 one none",
            s.name
        );
    }
    let f32s = [Some(s.exp_avg), Some(s.exp_avg_sq), s.master];
    for (what, t) in [("parameter", s.param), ("gradient", s.grad)]
        .into_iter()
        .chain(f32s.into_iter().flatten().map(|t| ("state", t)))
    {
        if t.elem_count() != n || !t.is_contiguous() || !t.device().same_device(s.param.device()) {
            crate::fail!(
                "adamw `{}`: {what} of shape {:?} on {:?} (contiguous: {}), the parameter has {:?} on {:?}",
                s.name,
                t.dims(),
                t.device().location(),
                t.is_contiguous(),
                s.param.dims(),
                s.param.device().location()
            );
        }
        if what == "state" && t.dtype() != DType::F32 {
            crate::fail!("adamw `{}`: state in {:?}, not f32", s.name, t.dtype());
        }
    }
    Ok(())
}

/// The f32 CPU reference (the shim's tests run `adamw_*` against it; a CPU test holds it to
/// terse-optim's composite update bit for bit).
pub mod reference {
    use crate::kernels::adamw::Scalars;

    /// One tensor's update in place: `w` is the f32 master (or the f32 parameter), `m` and `v`
    /// the moments, `g` the gradient in f32; each operation rounded on its own, in the
    /// composite update's order.
    pub fn adamw(w: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], h: &Scalars, s: [f32; 2]) {
        let [step_size, inv_bc2] = s;
        for i in 0..w.len() {
            let mi = m[i] + (g[i] - m[i]) * h.b1c;
            let vi = v[i] * h.beta2 + (g[i] * g[i]) * h.b2c;
            let den = (vi.sqrt() * inv_bc2) + h.eps;
            w[i] = w[i] * h.decay - (mi / den) * step_size;
            m[i] = mi;
            v[i] = vi;
        }
    }

    /// `grad_sumsq_f32`'s partial sums of one tensor, one per chunk of `ADAMW_CHUNK`, in its
    /// order: thread t of `ADAMW_BLOCK` adds g * g (exact in f64) over its elements t, t +
    /// block, ... of the chunk, then the threads' sums are added in the kernel's fixed tree.
    pub fn grad_sumsq(g: &[f32]) -> Vec<f64> {
        use crate::kernels::geometry::{ADAMW_BLOCK, ADAMW_CHUNK};
        let block = ADAMW_BLOCK as usize;
        g.chunks(ADAMW_CHUNK as usize)
            .map(|c| {
                let mut sh: Vec<f64> = (0..block)
                    .map(|t| {
                        c.iter().skip(t).step_by(block).fold(0f64, |s, &v| {
                            let v = f64::from(v);
                            s + v * v
                        })
                    })
                    .collect();
                let mut k = block / 2;
                while k > 0 {
                    for t in 0..k {
                        sh[t] += sh[t + k];
                    }
                    k /= 2;
                }
                sh[0]
            })
            .collect()
    }
}

pub mod launch {
    use crate::kernels::adamw::Scalars;
    use crate::kernels::describe::{Arg, Launch, Storage};
    use crate::kernels::geometry::{ADAMW_BLOCK, ADAMW_CHUNK};

    /// u64 words per tensor in the table (kernels/adamw.cu's `ADAMW_ROW`; the shim's bit-exact
    /// test fails if the two disagree).
    pub const ADAMW_ROW: usize = 8;

    /// The table `adamw_*` reads: per tensor its pointers [param, master (0: none), exp_avg,
    /// exp_avg_sq, grad] and element count -> ADAMW_ROW words (the pointers, the count, the
    /// tensor's first block, 0), and the blocks of the whole launch.
    pub fn adamw_table(tensors: &[([u64; 5], usize)]) -> (Vec<u64>, usize) {
        let mut table = Vec::with_capacity(tensors.len() * ADAMW_ROW);
        let mut blocks = 0usize;
        for (ptrs, len) in tensors {
            table.extend_from_slice(ptrs);
            table.extend([*len as u64, blocks as u64, 0]);
            blocks += len.div_ceil(ADAMW_CHUNK as usize);
        }
        (table, blocks)
    }

    /// Buffers: the table (`adamw_table`, u64) and the tensors' `step_scalars` (2 f32 each).
    pub fn adamw(s: Storage, tensors: usize, blocks: usize, h: &Scalars) -> Launch {
        Launch {
            kernel: format!("adamw_{}", s.suffix()),
            module: "adamw",
            grid: (blocks as u32, 1, 1),
            block: (ADAMW_BLOCK, 1, 1),
            shared: 0,
            args: vec![
                Arg::Buf(0),
                Arg::Buf(1),
                Arg::I32(tensors as i32),
                Arg::F32(h.decay),
                Arg::F32(h.b1c),
                Arg::F32(h.beta2),
                Arg::F32(h.b2c),
                Arg::F32(h.eps),
            ],
        }
    }

    /// Buffers: the table (`adamw_table` with each gradient in word 4, u64) and the blocks'
    /// partial sums (f64, one per block).
    pub fn grad_sumsq(tensors: usize, blocks: usize) -> Launch {
        Launch {
            kernel: "grad_sumsq_f32".into(),
            module: "adamw",
            grid: (blocks as u32, 1, 1),
            block: (ADAMW_BLOCK, 1, 1),
            shared: 0,
            args: vec![Arg::Buf(0), Arg::I32(tensors as i32), Arg::Buf(1)],
        }
    }
}

/// The CUDA launch (the `cuda` feature only).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // a kernel launch over raw device pointers
mod cuda {
    use crate::kernels::adamw::{launch, Scalars, Slot};
    use crate::kernels::describe::Storage as Store;
    use crate::kernels::launching::{func, Described};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::{DType, Result, Storage, StorageRef, Tensor};

    /// The device address of a contiguous CUDA tensor's first element.
    fn address(t: &Tensor, guard: &StorageRef<'_>, name: &str) -> Result<(u64, usize)> {
        let Storage::Cuda(s) = &**guard else {
            crate::fail!("adamw `{name}`: a tensor is not on a CUDA device");
        };
        let (start, _) = match t.layout().contiguous_offsets() {
            Some(o) => o,
            None => crate::fail!("adamw `{name}`: expected contiguous tensors"),
        };
        let stream = s.device().cuda_stream();
        let (base, size) = match t.dtype() {
            DType::F32 => (s.as_cuda_slice::<f32>()?.device_ptr(&stream).0, 4),
            DType::BF16 => (s.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0, 2),
            other => crate::fail!("adamw `{name}`: no kernel for {other:?}"),
        };
        Ok((base + (start * size) as u64, size))
    }

    /// One launch over `slots`, whose parameters share one dtype.
    pub(super) fn step(slots: &[&Slot], h: &Scalars) -> Result<()> {
        let first = slots[0].param;
        let candle_core::Device::Cuda(dev) = first.device() else {
            crate::fail!(
                "adamw `{}`: the parameter is not on a CUDA device",
                slots[0].name
            );
        };
        let store = match first.dtype() {
            DType::F32 => Store::F32,
            _ => Store::Bf16,
        };
        // The slots' tensors keep every storage alive until the launch is queued (frees are
        // ordered after it on the one stream); the kernel writes them in place as candle's
        // in-place ops do.
        let mut rows = Vec::with_capacity(slots.len());
        let mut written = vec![];
        let mut scal = Vec::with_capacity(2 * slots.len());
        for s in slots {
            let tensors = [
                Some(s.param),
                s.master,
                Some(s.exp_avg),
                Some(s.exp_avg_sq),
                Some(s.grad),
            ];
            let mut ptrs = [0u64; 5];
            for (i, t) in tensors.into_iter().enumerate() {
                if let Some(t) = t {
                    let (guard, _) = t.storage_and_layout();
                    let (p, size) = address(t, &guard, s.name)?;
                    ptrs[i] = p;
                    if i < 4 {
                        written.push((p, p + (t.elem_count() * size) as u64, s.name));
                    }
                }
            }
            rows.push((ptrs, s.param.elem_count()));
            scal.extend_from_slice(&s.scalars);
        }
        // Two tensors written through one storage would race in the kernel.
        written.sort_unstable();
        if let Some(w) = written.windows(2).find(|w| w[1].0 < w[0].1) {
            crate::fail!(
                "adamw: `{}` and `{}` write overlapping device memory (shared storage)",
                w[0].2,
                w[1].2
            );
        }
        let (table, blocks) = launch::adamw_table(&rows);
        if blocks == 0 {
            return Ok(());
        }
        let table = dev.clone_htod(table.as_slice())?;
        let scal = dev.clone_htod(scal.as_slice())?;
        let l = launch::adamw(store, slots.len(), blocks, h);
        let f = func!(dev, l)?;
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &table)?.buf(1, &scal)?;
        // SAFETY: the table's pointers are live storages of the slots (held by the caller's
        // tensors until this returns, and the launch is ordered before any later free on the
        // one stream), each with the row's element count of its dtype (checked by `check`).
        unsafe { d.launch() }
    }

    /// `grad_sumsq` on CUDA: one launch, one download of the partials, added in block order.
    pub(super) fn sumsq(grads: &[&Tensor]) -> Result<f64> {
        let candle_core::Device::Cuda(dev) = grads[0].device() else {
            crate::fail!("grad_sumsq: the gradients are not on a CUDA device");
        };
        let mut rows = Vec::with_capacity(grads.len());
        for g in grads {
            let (guard, _) = g.storage_and_layout();
            let (p, _) = address(g, &guard, "grad_sumsq")?;
            rows.push(([0, 0, 0, 0, p], g.elem_count()));
        }
        let (table, blocks) = launch::adamw_table(&rows);
        if blocks == 0 {
            return Ok(0.0);
        }
        let table = dev.clone_htod(table.as_slice())?;
        // SAFETY: every block writes its one partial sum.
        let mut partial = unsafe { dev.alloc::<f64>(blocks)? };
        let l = launch::grad_sumsq(grads.len(), blocks);
        let f = func!(dev, l)?;
        let mut d = Described::new(f.builder(), &l);
        d.buf(0, &table)?.buf(1, &mut partial)?;
        // SAFETY: the table's pointers are the gradients' live f32 storages (held by the
        // caller), each with the row's element count; `partial` holds one f64 a block.
        unsafe { d.launch() }?;
        Ok(dev.clone_dtoh(&partial)?.iter().fold(0f64, |s, p| s + p))
    }
}
