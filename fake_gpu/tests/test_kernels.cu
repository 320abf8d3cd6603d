// Kernels for the emulated device's own test (kernels_test.cpp), compiled like a module by
// xtask/src/fake_gpu/kernels/ into <kernels dir>/test: what the fiber runtime must do beyond
// the shim's fixtures (crates/simt/faulty.cu): lanes of multi-dimensional blocks, a partial
// last warp, dynamic shared memory, a device-side assert, deadlocks and early exits inside
// collectives, and the launch geometry the modules were built with.
#include <cuda_runtime.h>

// The linear index of the calling thread in its block (x fastest).
__device__ unsigned linear_tid() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Each thread writes its linear index's warp sum (shuffles over lanes of a 2-D or 3-D block)
// and its block and thread indices.
extern "C" __global__ void t_warp_sum(float* out, unsigned* ids) {
    unsigned t = linear_tid();
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    float v = (float)t;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    out[b * threads + t] = v;
    unsigned* id = ids + 6 * (b * threads + t);
    id[0] = blockIdx.x;
    id[1] = blockIdx.y;
    id[2] = blockIdx.z;
    id[3] = threadIdx.x;
    id[4] = threadIdx.y;
    id[5] = threadIdx.z;
}

// A block reduction through __syncthreads over a block whose last warp is partial: fine.
extern "C" __global__ void t_partial_block_sum(const float* x, float* out) {
    __shared__ float buf[1024];
    unsigned t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    if (t == 0) {
        float s = 0.f;
        for (unsigned i = 0; i < blockDim.x; i++) s += buf[i];
        out[blockIdx.x] = s;
    }
}

// A shuffle in a partial last warp: an error.
extern "C" __global__ void t_partial_warp_shuffle(float* out) {
    float v = __shfl_xor_sync(0xffffffff, (float)threadIdx.x, 1);
    out[threadIdx.x] = v;
}

// Reverses each block's slice through dynamic shared memory (cuLaunchKernel's sharedMemBytes).
extern "C" __global__ void t_dynamic_shared(const int* x, int* out) {
    extern __shared__ int tile[];
    unsigned t = threadIdx.x, n = blockDim.x;
    tile[t] = x[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = tile[n - 1 - t];
}

// A device-side assert that fails for one thread.
extern "C" __global__ void t_assert(const int* x) {
    assert(x[linear_tid()] >= 0);
}

// Lane 0 of each warp waits in __syncthreads, the others in __syncwarp: a deadlock.
extern "C" __global__ void t_deadlock(float* out) {
    if (threadIdx.x % 32 == 0) {
        __syncthreads();
    } else {
        __syncwarp();
    }
    out[threadIdx.x] = 1.f;
}

// A lane returns while the rest of its warp waits in __syncwarp.
extern "C" __global__ void t_exit_in_collective(float* out) {
    if (threadIdx.x == 5) return;
    __syncwarp();
    out[threadIdx.x] = 1.f;
}

// Many barriers per block and a shuffle per step: the scheduler's slow path, timed.
extern "C" __global__ void t_barrier_loop(float* out, int steps) {
    __shared__ float acc[1024];
    float v = (float)threadIdx.x;
    for (int s = 0; s < steps; s++) {
        v = __shfl_xor_sync(0xffffffff, v, 1) * 0.5f + 1.f;
        acc[threadIdx.x] = v;
        __syncthreads();
        v += acc[(threadIdx.x + 1) % blockDim.x];
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

// The launch geometry the modules were built with (crates/model's kernels/geometry.rs, passed by
// kernels.rs as -DTERSE_*), for the test's launches of terse's kernels.
extern "C" __global__ void t_geometry(unsigned* out) {
    out[0] = TERSE_RMSNORM_BLOCK;
    out[1] = TERSE_LOGPROB_BLOCK;
}
