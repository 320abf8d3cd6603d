// Shared by the kernels: f32 <-> storage-type conversions (float, bf16). Math is always f32.
#pragma once
// Launch geometry: passed by crates/model/build.rs from crates/model/src/kernel_checks.rs, the
// constants the Rust launches use too, so the two sides cannot disagree.
#ifndef TERSE_RMSNORM_BLOCK
#error "TERSE_RMSNORM_BLOCK is passed by crates/model/build.rs"
#endif
#ifndef TERSE_LOGPROB_BLOCK
#error "TERSE_LOGPROB_BLOCK is passed by crates/model/build.rs"
#endif
#ifndef TERSE_DECODE_WARPS
#error "TERSE_DECODE_WARPS is passed by crates/model/build.rs"
#endif
#ifndef TERSE_DECODE_MAX_HEAD_DIM
#error "TERSE_DECODE_MAX_HEAD_DIM is passed by crates/model/build.rs"
#endif
#ifndef TERSE_FLASH_WARPS
#error "TERSE_FLASH_WARPS is passed by crates/model/build.rs"
#endif
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}
