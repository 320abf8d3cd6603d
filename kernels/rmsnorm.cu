// RMSNorm forward and backward (Qwen3RMSNorm: y = w * x / sqrt(mean(x^2) + eps)), one block per
// row, statistics in f32 whatever the storage type. CPU reference: terse_model::kernels::rmsnorm.
//
// Layout: x, y, dy, dx (rows, cols) contiguous; w (cols); rstd (rows) f32 saved by the forward
// for the backward; dw (cols) f32, accumulated across rows with atomicAdd (zero it first).
#include "common.cuh"

#define BLOCK TERSE_RMSNORM_BLOCK

// Sum over the block; every thread gets the result.
__device__ float block_sum(float v) {
    __shared__ float warp[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (lane == 0) warp[w] = v;
    __syncthreads();
    v = threadIdx.x < BLOCK / 32 ? warp[threadIdx.x] : 0.f;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    __shared__ float total;
    if (threadIdx.x == 0) total = v;
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

template <typename T>
__device__ void rmsnorm_fwd(const T* x, const T* w, T* y, float* rstd, int cols, float eps) {
    const T* xr = x + (size_t)blockIdx.x * cols;
    T* yr = y + (size_t)blockIdx.x * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        float v = to_f(xr[i]);
        ss += v * v;
    }
    float r = rsqrtf(block_sum(ss) / cols + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    // HF casts the normalised value back to the storage type before multiplying by w.
    for (int i = threadIdx.x; i < cols; i += BLOCK)
        yr[i] = from_f<T>(to_f(from_f<T>(to_f(xr[i]) * r)) * to_f(w[i]));
}

// dx = r * (dy*w) - x * r^3 / cols * sum(dy*w*x);  dw += dy * x * r
template <typename T>
__device__ void rmsnorm_bwd(const T* x, const T* w, const float* rstd, const T* dy, T* dx,
                            float* dw, int cols) {
    size_t off = (size_t)blockIdx.x * cols;
    float r = rstd[blockIdx.x];
    float dot = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK)
        dot += to_f(dy[off + i]) * to_f(w[i]) * to_f(x[off + i]);
    dot = block_sum(dot);
    float c = dot * r * r * r / cols;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        float xv = to_f(x[off + i]), g = to_f(dy[off + i]);
        dx[off + i] = from_f<T>(r * g * to_f(w[i]) - xv * c);
        atomicAdd(&dw[i], g * xv * r);
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void rmsnorm_fwd_##S(const T* x, const T* w, T* y, float* rstd,     \
                                               int cols, float eps) {                         \
        rmsnorm_fwd<T>(x, w, y, rstd, cols, eps);                                             \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)

// The backward runs in f32 only (fused::RmsNorm's backward upcasts x, w and dy), so there is
// no bf16 entry point that nothing launches and gpu-check could not test.
extern "C" __global__ void rmsnorm_bwd_f32(const float* x, const float* w, const float* rstd,
                                           const float* dy, float* dx, float* dw, int cols) {
    rmsnorm_bwd<float>(x, w, rstd, dy, dx, dw, cols);
}
