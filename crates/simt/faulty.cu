// Kernels that break the rules on purpose, for crates/simt's tests of the shim itself: a
// __syncthreads only some threads reach, a shuffle inside a branch, a shuffle after half a
// warp returned. Compiled only into the shim (build.rs), never for a GPU.
#include <cuda_bf16.h>

extern "C" __global__ void fault_divergent_sync(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.f;
}

// Thread 33 waits in __syncthreads while the rest of its warp waits in a shuffle for it: no
// barrier can complete, so only the deadline ends the launch.
extern "C" __global__ void fault_deadline(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x == 33) {
        __syncthreads();
    } else if (threadIdx.x >= 32) {
        v = __shfl_xor_sync(0xffffffff, v, 1);
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = v;
}

extern "C" __global__ void fault_divergent_shuffle(float* out) {
    float v = threadIdx.x;
    if (threadIdx.x % 2 == 0) {
        v = __shfl_xor_sync(0xffffffff, v, 1);
    } else {
        v = __shfl_xor_sync(0xffffffff, v, 1) + 1.f;
    }
    out[threadIdx.x] = v;
}

extern "C" __global__ void fault_partial_warp(float* out) {
    if (threadIdx.x % 32 >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffff, (float)threadIdx.x, 1);
}

// Not a fault: a block reduction whose early-returning warps leave the barrier, as on the
// device, and a correct shuffle; the reference for the tests above.
extern "C" __global__ void fault_none(const float* x, float* out) {
    __shared__ float part[32];
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    float s = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// A WMMA load from a pointer 16 bytes past a 32-byte boundary (undefined on the device).
#include <mma.h>
extern "C" __global__ void fault_wmma_misaligned(float* out) {
    __shared__ __align__(32) __nv_bfloat16 tile[16 * 24];
    for (int i = threadIdx.x; i < 16 * 24; i += 32) tile[i] = __float2bfloat16(1.f);
    __syncwarp();
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                           nvcuda::wmma::row_major>
        a;
    nvcuda::wmma::load_matrix_sync(a, tile + 8, 24);
    out[threadIdx.x] = 0.f;
}

// A WMMA load with a leading dimension of 20 bf16 (40 bytes, not a multiple of 16): undefined
// on the device.
extern "C" __global__ void fault_wmma_bad_ldm(float* out) {
    __shared__ __align__(32) __nv_bfloat16 tile[16 * 20];
    for (int i = threadIdx.x; i < 16 * 20; i += 32) tile[i] = __float2bfloat16(1.f);
    __syncwarp();
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16,
                           nvcuda::wmma::row_major>
        a;
    nvcuda::wmma::load_matrix_sync(a, tile, 20);
    out[threadIdx.x] = 0.f;
}
