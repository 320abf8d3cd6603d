//! candle's custom-op plumbing, written once. Every terse kernel op (each kernel family's op,
//! flash/, the log-prob's chunked backward) implements [`Kernel`]: its name, its CPU path, its
//! CUDA launch and optionally its backward, each over an array of (storage, layout) pairs;
//! [`apply1`] / [`apply2`] / [`apply3`] run it as a candle `CustomOp1` / `CustomOp2` /
//! `CustomOp3` through the [`Op`]
//! wrapper. The in-place cache writes do the same with [`InplaceKernel`] and [`apply_inplace`],
//! and the accumulating GEMM with [`InplaceKernel3`] and [`apply_inplace3`].
//!
//! The wrapper exists because Rust's orphan rule forbids implementing candle's traits for every
//! `K: Kernel` directly; it is invisible at the call sites.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, InplaceOp2, InplaceOp3, Layout};
use candle_core::{Result, Shape, Tensor};

#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// One input of an op: its storage and the layout it is read through.
pub(crate) type Arg<'a, S> = (&'a S, &'a Layout);

/// A kernel op of `N` inputs (1, 2 or 3).
pub(crate) trait Kernel<const N: usize>: Send + Sync + 'static {
    /// The op's name in candle's graph and in its errors.
    const NAME: &'static str;

    /// The CPU path (the kernel's f32 reference, or a precomputed value).
    fn cpu(&self, args: [Arg<'_, CpuStorage>; N]) -> Result<(CpuStorage, Shape)>;

    /// The CUDA launch.
    #[cfg(feature = "cuda")]
    fn cuda(&self, args: [Arg<'_, CudaStorage>; N]) -> Result<(CudaStorage, Shape)>;

    /// The gradients of the inputs from the result and its gradient; forward-only ops keep
    /// candle's refusal.
    fn bwd(
        &self,
        _args: [&Tensor; N],
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<[Option<Tensor>; N]> {
        Err(candle_core::Error::BackwardNotSupported { op: Self::NAME })
    }
}

/// A [`Kernel`] as candle sees it.
pub(crate) struct Op<K>(K);

impl<K: Kernel<1>> CustomOp1 for Op<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        self.0.cpu([(s, l)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        self.0.cuda([(s, l)])
    }

    fn bwd(&self, a: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let [da] = self.0.bwd([a], res, grad)?;
        Ok(da)
    }
}

impl<K: Kernel<2>> CustomOp2 for Op<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.cpu([(s1, l1), (s2, l2)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.0.cuda([(s1, l1), (s2, l2)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let [da, db] = self.0.bwd([a, b], res, grad)?;
        Ok((da, db))
    }
}

impl<K: Kernel<3>> CustomOp3 for Op<K> {
    fn name(&self) -> &'static str {
        K::NAME
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
        self.0.cpu([(s1, l1), (s2, l2), (s3, l3)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        self.0.cuda([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let [da, db, dc] = self.0.bwd([a, b, c], res, grad)?;
        Ok((da, db, dc))
    }
}

/// `kernel(a)`, with its backward in the graph.
pub(crate) fn apply1(a: &Tensor, kernel: impl Kernel<1>) -> Result<Tensor> {
    a.apply_op1(Op(kernel))
}

/// `kernel(a, b)`, with its backward in the graph.
pub(crate) fn apply2(a: &Tensor, b: &Tensor, kernel: impl Kernel<2>) -> Result<Tensor> {
    a.apply_op2(b, Op(kernel))
}

/// `kernel(a, b, c)`, with its backward in the graph.
pub(crate) fn apply3(a: &Tensor, b: &Tensor, c: &Tensor, kernel: impl Kernel<3>) -> Result<Tensor> {
    a.apply_op3(b, c, Op(kernel))
}

/// A kernel that writes `src` into `dst` in place (the KV cache writes).
pub(crate) trait InplaceKernel {
    const NAME: &'static str;

    fn cpu(&self, dst: (&mut CpuStorage, &Layout), src: Arg<'_, CpuStorage>) -> Result<()>;

    #[cfg(feature = "cuda")]
    fn cuda(&self, dst: (&mut CudaStorage, &Layout), src: Arg<'_, CudaStorage>) -> Result<()>;
}

struct Inplace<'k, K>(&'k K);

impl<K: InplaceKernel> InplaceOp2 for Inplace<'_, K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        self.0.cpu((s1, l1), (s2, l2))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        self.0.cuda((s1, l1), (s2, l2))
    }
}

/// Runs `kernel` writing `src` into `dst`.
pub(crate) fn apply_inplace(dst: &Tensor, src: &Tensor, kernel: &impl InplaceKernel) -> Result<()> {
    dst.inplace_op2(src, &Inplace(kernel))
}

/// A kernel that updates `dst` in place from two sources (the weight gradient's accumulating
/// GEMM, kernels/gemm.rs).
pub(crate) trait InplaceKernel3 {
    const NAME: &'static str;

    fn cpu(&self, dst: (&mut CpuStorage, &Layout), srcs: [Arg<'_, CpuStorage>; 2]) -> Result<()>;

    #[cfg(feature = "cuda")]
    fn cuda(&self, dst: (&mut CudaStorage, &Layout), srcs: [Arg<'_, CudaStorage>; 2])
        -> Result<()>;
}

struct Inplace3<'k, K>(&'k K);

impl<K: InplaceKernel3> InplaceOp3 for Inplace3<'_, K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        self.0.cpu((s1, l1), [(s2, l2), (s3, l3)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        self.0.cuda((s1, l1), [(s2, l2), (s3, l3)])
    }
}

/// Runs `kernel` updating `dst` from `a` and `b`.
pub(crate) fn apply_inplace3(
    dst: &Tensor,
    a: &Tensor,
    b: &Tensor,
    kernel: &impl InplaceKernel3,
) -> Result<()> {
    dst.inplace_op3(a, b, &Inplace3(kernel))
}

/// A kernel that writes one source into two tensors in place (a decode step's key and value
/// pools, kernels/paged_qkv.rs).
pub(crate) trait InplacePairKernel {
    const NAME: &'static str;

    fn cpu(&self, dsts: [(&mut CpuStorage, &Layout); 2], src: Arg<'_, CpuStorage>) -> Result<()>;

    #[cfg(feature = "cuda")]
    fn cuda(&self, dsts: [(&mut CudaStorage, &Layout); 2], src: Arg<'_, CudaStorage>)
        -> Result<()>;
}

/// Runs `kernel` writing `src` into `a` and `b`. candle lends one tensor's storage mutably per
/// op, so the op on `a` (which holds `a`'s write lock and `src`'s read lock) runs a second
/// in-place op on `b` inside it, which hands both storages to the kernel. The locks are taken
/// in one order, `a` then `b`; `b` must not share `a`'s or `src`'s storage.
pub(crate) fn apply_inplace_pair<K: InplacePairKernel>(
    a: &Tensor,
    b: &Tensor,
    src: &Tensor,
    kernel: &K,
) -> Result<()> {
    // Two write locks of one storage in one thread would deadlock: refuse instead.
    let at = |t: &Tensor| &*t.storage_and_layout().0 as *const candle_core::Storage;
    if at(b) == at(a) || at(b) == at(src) {
        crate::fail!("{}: the second destination shares a storage", K::NAME);
    }
    a.inplace_op2(src, &PairFirst { b, kernel })
}

/// The op on the first destination.
struct PairFirst<'k, K> {
    b: &'k Tensor,
    kernel: &'k K,
}

/// The first destination, mutably, and the source: what the second op hands on.
type Held<'a, S> = ((&'a mut S, &'a Layout), Arg<'a, S>);

/// The op on the second destination, holding the first's storage and the source.
struct PairSecond<'a, K, S> {
    kernel: &'a K,
    first: std::cell::RefCell<Option<Held<'a, S>>>,
}

impl<'k, K> PairFirst<'k, K> {
    /// Runs the op on the second destination with the first's storage and the source.
    fn second<'a, S>(&'a self, first: Held<'a, S>) -> Result<()>
    where
        PairSecond<'a, K, S>: candle_core::InplaceOp1,
    {
        self.b.inplace_op1(&PairSecond {
            kernel: self.kernel,
            first: std::cell::RefCell::new(Some(first)),
        })
    }
}

impl<K: InplacePairKernel> InplaceOp2 for PairFirst<'_, K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        self.second(((s1, l1), (s2, l2)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        self.second(((s1, l1), (s2, l2)))
    }
}

impl<K: InplacePairKernel> candle_core::InplaceOp1 for PairSecond<'_, K, CpuStorage> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        match self.first.borrow_mut().take() {
            Some(((s1, l1), src)) => self.kernel.cpu([(s1, l1), (s, l)], src),
            None => crate::fail!("{}: run twice", K::NAME),
        }
    }
}

#[cfg(feature = "cuda")]
impl<K: InplacePairKernel> candle_core::InplaceOp1 for PairSecond<'_, K, CudaStorage> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        crate::fail!("{}: the two destinations are on different devices", K::NAME)
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        match self.first.borrow_mut().take() {
            Some(((s1, l1), src)) => self.kernel.cuda([(s1, l1), (s, l)], src),
            None => crate::fail!("{}: run twice", K::NAME),
        }
    }
}
