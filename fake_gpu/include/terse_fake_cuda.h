// The CUDA device-side API for the kernels' CPU builds of terse's emulated device: forced into
// every module that xtask/src/fake_gpu/kernels/ compiles (candle-kernels' .cu sources and
// terse's kernels/*.cu, unchanged) ahead of the sources, on top of the SIMT shim's declarations
// (kernels/shim/cuda_shim.h). The runtime behind them is fake_gpu/fibers/, in libcuda.so.1.
//
// It adds what candle's kernels use beyond the shim's portable subset: CUDA's __half and
// __nv_bfloat16 with their operators and intrinsics (each result rounded to nearest even from
// the exact or f32 value, as the device's .rn instructions do), the fp8 types of cuda_fp8.h,
// the vector types, the atomics, the integer and bit intrinsics, and dynamic shared memory.
// The emulation computes transcendental functions exactly where the device uses .approx
// instructions (hexp, __expf...), so those may differ from the device in the last place.
// This file holds the target's macros and the dynamic shared memory; the rest is in
// terse_fake/, included at its end: float16.h (the 16-bit float types and their conversions),
// float16_math.h (their arithmetic), fp8.h, vectors.h, intrinsics.h, atomics.h.
#pragma once

// The device code nvcc compiled for the PTX: sm_90 with CUDA 13.
#define __CUDA_ARCH__ 900
#define __CUDACC_VER_MAJOR__ 13
#define __CUDACC_VER_MINOR__ 0
// One launch at a time, every CUDA thread a fiber on the launching OS thread (fake_gpu/fibers/).
#define TERSE_SHIM_PLAIN_INDICES
// CUDA's full 16-bit float types below, instead of the shim's storage-only ones.
#define TERSE_SHIM_RICH_16BIT_TYPES

#include <assert.h>
#include <limits.h>
#include <stdio.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cuda_shim.h"

#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __grid_constant__
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))

#define TERSE_FAKE_STR2(x) #x
#define TERSE_FAKE_STR(x) TERSE_FAKE_STR2(x)

// A device-side assert ends the launch with an error (cudaErrorAssert on the device).
#undef assert
#define assert(e)                                                                         \
    ((e) ? (void)0                                                                        \
         : terse_shim::fail("device-side assert `" #e "` failed at " __FILE__            \
                            ":" TERSE_FAKE_STR(__LINE__)))

namespace terse_shim {
// The launch's dynamic shared memory (cuLaunchKernel's sharedMemBytes), from the runtime.
void* dynamic_shared_base();
// `extern __shared__ T name[];` (candle's kernels) is rewritten by the generator to
// `T *name = terse_shim::extern_shared();`; kernels/mma.cuh's TERSE_DYNAMIC_SHARED takes the
// shim's `unsigned char* dynamic_shared()` (fibers/scheduler.cpp), which fails on 0 bytes.
struct DynamicShared {
    void* p;
    template <typename T>
    operator T*() const {
        return static_cast<T*>(p);
    }
};
inline DynamicShared extern_shared() { return {dynamic_shared_base()}; }
}  // namespace terse_shim

inline void __trap() { terse_shim::fail("__trap() called"); }
inline void __brkpt() { terse_shim::fail("__brkpt() called"); }
inline void __nanosleep(unsigned) {}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// The rest, in this order (each part relies on those before it).
#include "terse_fake/float16.h"
#include "terse_fake/float16_math.h"
#include "terse_fake/fp8.h"
#include "terse_fake/vectors.h"
#include "terse_fake/intrinsics.h"
#include "terse_fake/atomics.h"
