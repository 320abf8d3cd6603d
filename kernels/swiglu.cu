// SwiGLU, the MLP's gate: y = silu(g) u = g u / (1 + e^-g), and its backward in one pass:
// dg = dy u s (1 + g (1 - s)), du = dy g s, with s = sigmoid(g). One thread per element, f32
// math, one rounding to the storage type at the end (candle's composite path rounds after the
// SiLU and again after the product, and its SiLU backward is eight kernels).
// CPU reference: terse_model::kernels::swiglu.
//
// Layout: g, u, y, dy contiguous with n elements; the backward writes dg and du into one
// buffer of 2n elements (dg first). The stacked forward (inference) reads one buffer of rows
// [g | u] of 2 `width` values each (the gate and up projections as one GEMM) into y's rows of
// `width`, with the same math and rounding.
#include "common.cuh"

template <typename T>
__device__ void swiglu_fwd(const T* g, const T* u, T* y, size_t n) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    float a = to_f(g[k]);
    float s = 1.f / (1.f + expf(-a));
    y[k] = from_f<T>(a * s * to_f(u[k]));
}

template <typename T>
__device__ void swiglu_stacked(const T* gu, T* y, size_t n, size_t width) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const T* row = gu + (k / width) * 2 * width;
    size_t c = k % width;
    float a = to_f(row[c]);
    float s = 1.f / (1.f + expf(-a));
    y[k] = from_f<T>(a * s * to_f(row[width + c]));
}

template <typename T>
__device__ void swiglu_bwd(const T* g, const T* u, const T* dy, T* dgu, size_t n) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    float a = to_f(g[k]), b = to_f(u[k]), d = to_f(dy[k]);
    float s = 1.f / (1.f + expf(-a));
    dgu[k] = from_f<T>(d * b * s * (1.f + a * (1.f - s)));
    dgu[n + k] = from_f<T>(d * a * s);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void swiglu_fwd_##S(const T* g, const T* u, T* y, size_t n) {       \
        swiglu_fwd<T>(g, u, y, n);                                                             \
    }                                                                                          \
    extern "C" __global__ void swiglu_stacked_##S(const T* gu, T* y, size_t n, size_t width) { \
        swiglu_stacked<T>(gu, y, n, width);                                                    \
    }                                                                                          \
    extern "C" __global__ void swiglu_bwd_##S(const T* g, const T* u, const T* dy, T* dgu,    \
                                              size_t n) {                                      \
        swiglu_bwd<T>(g, u, dy, dgu, n);                                                       \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
