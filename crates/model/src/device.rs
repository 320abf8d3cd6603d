//! Device selection from a user string ("cpu", "cuda", "cuda:1"): the one place that decides
//! where tensors live and which dtype the forward computes in; what a device offers (memory,
//! the CPU kernels' SIMD level).

use candle_core::{DType, Device, Result};

/// "cpu" -> (CPU, f32). "cuda[:N]" -> (GPU N, bf16) when built with the `cuda` feature; a build
/// without it fails loudly instead of falling back to the CPU.
pub fn select(spec: &str) -> Result<(Device, DType)> {
    let spec = spec.trim();
    if spec == "cpu" {
        return Ok((Device::Cpu, DType::F32));
    }
    let ordinal = match spec.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => match rest.strip_prefix(':').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => n,
            None => crate::fail!("device `{spec}` is not one of cpu, cuda, cuda:N"),
        },
        None => crate::fail!("device `{spec}` is not one of cpu, cuda, cuda:N"),
    };
    cuda(spec, ordinal)
}

#[cfg(feature = "cuda")]
fn cuda(spec: &str, ordinal: usize) -> Result<(Device, DType)> {
    match Device::new_cuda(ordinal) {
        Ok(d) => {
            if let Err(e) = keep_pool_memory(&d) {
                crate::fail!("device `{spec}`: setting its memory pool's release threshold: {e}");
            }
            Ok((d, DType::BF16))
        }
        // First line only: candle appends a backtrace when RUST_BACKTRACE is set.
        Err(e) => crate::fail!(
            "device `{spec}`: no usable CUDA device ({})",
            e.to_string().lines().next().unwrap_or_default()
        ),
    }
}

/// Raises the release threshold of the device's default memory pool (the one cuMemAllocAsync
/// draws from, so every candle tensor) to the maximum. At its default of 0 the driver hands the
/// memory freed into the pool back to the OS at every synchronisation, and the next step's
/// allocations go to the OS again; a serving engine keeps it, as torch's caching allocator does.
/// Memory stays in the pool for this process's next allocations; `memory` counts it as used.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // two driver calls cudarc's safe API does not wrap
fn keep_pool_memory(d: &Device) -> std::result::Result<(), String> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let Device::Cuda(c) = d else { return Ok(()) };
    let Some(pool) = default_pool(c)? else {
        return Ok(());
    };
    // SAFETY: `pool` is the device's default pool (its context bound to this thread by
    // `default_pool`); the value is a cuuint64_t as CU_MEMPOOL_ATTR_RELEASE_THRESHOLD requires.
    unsafe {
        let mut threshold: u64 = u64::MAX;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .map_err(|e| e.to_string())
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(spec: &str, _ordinal: usize) -> Result<(Device, DType)> {
    crate::fail!("device `{spec}` requested but this binary was built without the `cuda` feature (rebuild with --features cuda)")
}

/// (free, total) bytes of a CUDA device's memory; None on the CPU (or when the driver cannot
/// say). Free is what this process can allocate: the driver's free memory plus what the
/// default pool holds unused (`keep_pool_memory` keeps freed memory there, and the driver
/// counts it as used: without it, a rollout's freed KV cache would read as taken at the next
/// step's sizing).
pub fn memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = device {
        let (free, total) = c.cuda_stream().context().mem_get_info().ok()?;
        let held = pool_unused(c).unwrap_or(0);
        return Some((
            (free as u64).saturating_add(held).min(total as u64),
            total as u64,
        ));
    }
    let _ = device;
    None
}

/// The device's default memory pool with its context bound to this thread; None where the
/// device has no memory pools.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // the two driver queries cudarc's result API leaves unsafe
fn default_pool(
    c: &candle_core::CudaDevice,
) -> std::result::Result<Option<candle_core::cuda_backend::cudarc::driver::sys::CUmemoryPool>, String>
{
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    let ctx = c.cuda_stream().context().clone();
    ctx.bind_to_thread().map_err(|e| e.to_string())?;
    let dev = ctx.cu_device();
    // SAFETY: `dev` is the context's device, bound to this thread.
    unsafe {
        let supported = result::device::get_attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        )
        .map_err(|e| e.to_string())?;
        if supported == 0 {
            return Ok(None);
        }
        result::device::get_default_mem_pool(dev)
            .map(Some)
            .map_err(|e| e.to_string())
    }
}

/// The bytes the device's default memory pool holds beyond its live blocks (its reserved
/// memory less its used memory); None where the device has no pools or the driver cannot say.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // a driver call cudarc's safe API does not wrap
fn pool_unused(c: &candle_core::CudaDevice) -> Option<u64> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let pool = default_pool(c).ok()??;
    // SAFETY: `pool` is the device's default pool, its context bound to this thread; each value
    // is a cuuint64_t as CU_MEMPOOL_ATTR_{RESERVED,USED}_MEM_CURRENT require.
    unsafe {
        let read = |a: sys::CUmemPool_attribute| -> Option<u64> {
            let mut v: u64 = 0;
            sys::cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast())
                .result()
                .ok()?;
            Some(v)
        };
        let reserved = read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
        let used = read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
        Some(reserved.saturating_sub(used))
    }
}

/// The SIMD level the CPU kernels dispatch to: "avx512", "avx2" or "portable" (their own
/// detection, capped by `TERSE_CPU_ISA`). Results are bitwise reproducible per level.
pub fn simd_level() -> &'static str {
    let f = crate::decode::features();
    if f.avx512 {
        "avx512"
    } else if f.avx2_fma {
        "avx2"
    } else {
        "portable"
    }
}

/// Whether the fused blocks run on CUDA: on unless `TERSE_FUSED=0`, which keeps today's
/// composite path (the baseline `cargo xtask bench model --skeleton` measures in the same run).
/// Read at each use, so a bench can switch between the two in one process. The CPU's path does
/// not depend on it.
pub fn fused() -> bool {
    std::env::var("TERSE_FUSED").map_or(true, |v| v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_or_refuses() {
        assert!(matches!(select("cpu"), Ok((Device::Cpu, DType::F32))));
        let e = select("tpu").expect_err("bad").to_string();
        assert!(e.contains("`tpu`"), "{e}");
        #[cfg(not(feature = "cuda"))]
        assert!(select("cuda:0")
            .expect_err("no cuda")
            .to_string()
            .contains("without the `cuda` feature"));
    }
}
