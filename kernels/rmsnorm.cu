// RMSNorm forward and backward (Qwen3RMSNorm: y = w * x / sqrt(mean(x^2) + eps)), one block per
// row, statistics in f32 whatever the storage type. CPU reference: terse_model::kernels::rmsnorm.
//
// Layout: x, y, dy, dres, dx (rows, cols) contiguous; w (cols); rstd (rows) f32 from the
// forward (the backward recomputes it); dw (cols) f32, accumulated across rows with atomicAdd
// (zero it first).
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

// The residual stream's add fused in front: s = x + res (stored, rounded to T), then y =
// RMSNorm(s) * w from the stored s, as an add and `rmsnorm_fwd` would compute them; one pass
// instead of two launches. Each thread reads back only what it wrote itself.
template <typename T>
__device__ void rmsnorm_fwd_res(const T* x, const T* res, const T* w, T* s, T* y, int cols,
                                float eps) {
    size_t off = (size_t)blockIdx.x * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        T v = from_f<T>(to_f(x[off + i]) + to_f(res[off + i]));
        s[off + i] = v;
        ss += to_f(v) * to_f(v);
    }
    float r = rsqrtf(block_sum(ss) / cols + eps);
    for (int i = threadIdx.x; i < cols; i += BLOCK)
        y[off + i] = from_f<T>(to_f(from_f<T>(to_f(s[off + i]) * r)) * to_f(w[i]));
}

// dx = r * (dy*w) - x * r^3 / cols * sum(dy*w*x) (+ dres with `residual`);  dw += dy * x * r.
// The row statistic r is recomputed from x as the forward computed it (no saved rstd, no
// forward launch first), and a residual stream's gradient that also feeds x is added before the
// one rounding to T, so the layer backward's add is not a launch of its own.
template <typename T>
__device__ void rmsnorm_bwd(const T* x, const T* w, const T* dy, const T* dres, T* dx,
                            float* dw, int cols, float eps, int residual) {
    size_t off = (size_t)blockIdx.x * cols;
    float ss = 0.f, dot = 0.f;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        float v = to_f(x[off + i]);
        ss += v * v;
        dot += to_f(dy[off + i]) * to_f(w[i]) * v;
    }
    float r = rsqrtf(block_sum(ss) / cols + eps);
    dot = block_sum(dot);
    float c = dot * r * r * r / cols;
    for (int i = threadIdx.x; i < cols; i += BLOCK) {
        float xv = to_f(x[off + i]), g = to_f(dy[off + i]);
        float d = r * g * to_f(w[i]) - xv * c;
        if (residual) d += to_f(dres[off + i]);
        dx[off + i] = from_f<T>(d);
        atomicAdd(&dw[i], g * xv * r);
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void rmsnorm_fwd_##S(const T* x, const T* w, T* y, float* rstd,     \
                                               int cols, float eps) {                         \
        rmsnorm_fwd<T>(x, w, y, rstd, cols, eps);                                             \
    }                                                                                          \
    extern "C" __global__ void rmsnorm_fwd_res_##S(const T* x, const T* res, const T* w,      \
                                                   T* s, T* y, int cols, float eps) {         \
        rmsnorm_fwd_res<T>(x, res, w, s, y, cols, eps);                                       \
    }                                                                                          \
    extern "C" __global__ void rmsnorm_bwd_##S(const T* x, const T* w, const T* dy,           \
                                               const T* dres, T* dx, float* dw, int cols,     \
                                               float eps, int residual) {                     \
        rmsnorm_bwd<T>(x, w, dy, dres, dx, dw, cols, eps, residual);                          \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
