//! The one GEMM candle does not make: `acc += aᵀ b` into an f32 accumulator that stays in place
//! (cuBLAS's beta = 1), with a and b in bf16 or f32 and the products summed in f32. The
//! log-prob head's weight gradient is a sum over row chunks; through candle each chunk's (V, H)
//! product would be a new tensor and then a re-addition of the whole gradient, where here every
//! chunk's GEMM adds into the one buffer as it writes.
//!
//! Data flow: logprob.rs's written head backward -> `accumulate_at_b` -> the f32 CPU reference
//! (plain loops) or one `cublasGemmEx` on the device's cuBLAS handle and stream.

use super::op::{apply_inplace3, InplaceKernel3};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor};

/// acc (M, N) f32 += a (K, M)ᵀ b (K, N), in place; a and b of one dtype (f32 or bf16), all three
/// contiguous.
pub(crate) fn accumulate_at_b(acc: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    let (m, n) = acc.dims2()?;
    let ((ka, ma), (kb, nb)) = (a.dims2()?, b.dims2()?);
    if ma != m || nb != n || ka != kb {
        crate::fail!(
            "accumulate_at_b: acc {:?} += a {:?}ᵀ b {:?} do not agree",
            acc.shape(),
            a.shape(),
            b.shape()
        );
    }
    if acc.dtype() != DType::F32 || a.dtype() != b.dtype() {
        crate::fail!(
            "accumulate_at_b: acc must be f32 and a, b of one dtype, got {:?}, {:?}, {:?}",
            acc.dtype(),
            a.dtype(),
            b.dtype()
        );
    }
    if !acc.is_contiguous() {
        crate::fail!("accumulate_at_b: the accumulator must be contiguous");
    }
    if ka == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    apply_inplace3(acc, &a.contiguous()?, &b.contiguous()?, &AccumulateAtB)
}

struct AccumulateAtB;

impl InplaceKernel3 for AccumulateAtB {
    const NAME: &'static str = "terse-accumulate-at-b";

    fn cpu(
        &self,
        (acc, la): (&mut CpuStorage, &Layout),
        [(a, l1), (b, l2)]: [(&CpuStorage, &Layout); 2],
    ) -> Result<()> {
        let (m, n) = la.shape().dims2()?;
        let (k, _) = l1.shape().dims2()?;
        let (a, b) = (floats(a, l1)?, floats(b, l2)?);
        let Some((lo, hi)) = la.contiguous_offsets() else {
            crate::fail!("accumulate_at_b: the accumulator must be contiguous");
        };
        let CpuStorage::F32(acc) = acc else {
            crate::fail!("accumulate_at_b: the accumulator must be f32");
        };
        reference::accumulate_at_b(&mut acc[lo..hi], &a, &b, k, m, n);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda(
        &self,
        acc: (&mut CudaStorage, &Layout),
        [a, b]: [(&CudaStorage, &Layout); 2],
    ) -> Result<()> {
        cuda::accumulate_at_b(acc, [a, b])
    }
}

/// A contiguous f32 or bf16 CPU tensor's values as f32.
fn floats(s: &CpuStorage, l: &Layout) -> Result<Vec<f32>> {
    let Some((lo, hi)) = l.contiguous_offsets() else {
        crate::fail!("accumulate_at_b: operands must be contiguous");
    };
    match s {
        CpuStorage::F32(v) => Ok(v[lo..hi].to_vec()),
        CpuStorage::BF16(v) => Ok(v[lo..hi].iter().map(|x| x.to_f32()).collect()),
        _ => crate::fail!("accumulate_at_b: operands must be f32 or bf16"),
    }
}

/// The f32 CPU reference.
pub(crate) mod reference {
    /// acc (m, n) += a (k, m)ᵀ b (k, n): each entry's k products summed in f32 in order of k,
    /// then added to the accumulator once (cuBLAS's alpha·AB + beta·C with beta = 1).
    pub fn accumulate_at_b(acc: &mut [f32], a: &[f32], b: &[f32], k: usize, m: usize, n: usize) {
        for i in 0..m {
            for j in 0..n {
                let s: f32 = (0..k).map(|r| a[r * m + i] * b[r * n + j]).sum();
                acc[i * n + j] += s;
            }
        }
    }
}

/// The cuBLAS call (the `cuda` feature only).
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // a cuBLAS call over raw device pointers
mod cuda {
    use crate::kernels::launching::view;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::cublas::{result::gemm_ex, sys};
    use candle_core::cuda_backend::cudarc::driver::{
        CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    };
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result};

    /// Row-major acc (m, n) is column-major accᵀ (n, m) with ld n, so accᵀ += bᵀ a: cuBLAS's A is
    /// b read as (n, k) column-major (no transpose, ld n) and its B is a read as (m, k) through a
    /// transpose (ld m), k = the rows of both.
    pub fn accumulate_at_b(
        (acc, la): (&mut CudaStorage, &Layout),
        [(a, l1), (b, l2)]: [(&CudaStorage, &Layout); 2],
    ) -> Result<()> {
        let (m, n) = la.shape().dims2()?;
        let (k, _) = l1.shape().dims2()?;
        let Some((lo, hi)) = la.contiguous_offsets() else {
            crate::fail!("accumulate_at_b: the accumulator must be contiguous");
        };
        let dev = acc.device().clone();
        let c = acc.as_cuda_slice_mut::<f32>()?;
        let mut c = c.slice_mut(lo..hi);
        let dims = [n, m, k].map(|d| d as i32);
        match a.dtype() {
            DType::BF16 => {
                let ty = sys::cudaDataType_t::CUDA_R_16BF;
                gemm::<half::bf16>(&dev, &mut c, (a, l1), (b, l2), ty, dims)
            }
            DType::F32 => {
                let ty = sys::cudaDataType_t::CUDA_R_32F;
                gemm::<f32>(&dev, &mut c, (a, l1), (b, l2), ty, dims)
            }
            other => crate::fail!("accumulate_at_b: no GEMM for {other:?} (f32 or bf16)"),
        }
    }

    /// cuBLAS's column-major (n, m) += (n, k) (k, m)ᵀ with `dims` = [n, m, k], operands of
    /// cuBLAS type `ty` (T's), f32 products.
    fn gemm<T: CudaDType + DeviceRepr>(
        dev: &CudaDevice,
        c: &mut CudaViewMut<f32>,
        (a, l1): (&CudaStorage, &Layout),
        (b, l2): (&CudaStorage, &Layout),
        ty: sys::cudaDataType_t,
        [n, m, k]: [i32; 3],
    ) -> Result<()> {
        let (blas, stream) = (dev.cublas_handle(), dev.cuda_stream());
        let (av, bv) = (
            view::<T>(a, l1, "accumulate_at_b a")?,
            view::<T>(b, l2, "accumulate_at_b b")?,
        );
        let (ap, _ga) = av.device_ptr(&stream);
        let (bp, _gb) = bv.device_ptr(&stream);
        let (cp, _gc) = c.device_ptr_mut(&stream);
        let one = 1f32;
        // SAFETY: b holds k x n and a k x m elements, c m x n (contiguous views); alpha and beta
        // are host f32s, as CUBLAS_COMPUTE_32F reads them.
        unsafe {
            gemm_ex(
                *blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_N,
                sys::cublasOperation_t::CUBLAS_OP_T,
                n,
                m,
                k,
                (&one) as *const f32 as *const _,
                bp as *const _,
                ty,
                n,
                ap as *const _,
                ty,
                m,
                (&one) as *const f32 as *const _,
                cp as *mut _,
                sys::cudaDataType_t::CUDA_R_32F,
                n,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
        .w()?;
        Ok(())
    }
}
