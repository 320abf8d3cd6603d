// Qwen's rotate-half rotary embedding, forward and backward, with per-row position tables:
// y[i] = x[i] c_i - x[i+h] s_i,  y[i+h] = x[i+h] c_i + x[i] s_i  (h = D/2); the backward applies
// the transposed rotation (sin negated). One thread per (b, head, t, i < h) pair, f32 math.
// CPU reference: terse_model::kernels::rope.
//
// Layout: x, y (B, H, T, D) contiguous; cos, sin (B, T, D/2) contiguous.
#include "common.cuh"

// sign = +1: forward; sign = -1: backward (dy -> dx).
template <typename T>
__device__ void rope(const T* x, const T* cos, const T* sin, T* y, int b, int heads, int t,
                     int d, float sign) {
    int h = d / 2;
    size_t n = (size_t)b * heads * t * h;
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    int i = k % h;
    size_t rest = k / h;
    int ti = rest % t;
    rest /= t;
    rest /= heads;  // the row index b
    size_t base = (k / h) * d;
    size_t tab = (rest * t + ti) * h + i;
    float c = to_f(cos[tab]), s = sign * to_f(sin[tab]);
    float x1 = to_f(x[base + i]), x2 = to_f(x[base + i + h]);
    y[base + i] = from_f<T>(x1 * c - x2 * s);
    y[base + i + h] = from_f<T>(x2 * c + x1 * s);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void rope_fwd_##S(const T* x, const T* cos, const T* sin, T* y,     \
                                            int b, int heads, int t, int d) {                 \
        rope<T>(x, cos, sin, y, b, heads, t, d, 1.f);                                         \
    }                                                                                          \
    extern "C" __global__ void rope_bwd_##S(const T* dy, const T* cos, const T* sin, T* dx,   \
                                            int b, int heads, int t, int d) {                 \
        rope<T>(dy, cos, sin, dx, b, heads, t, d, -1.f);                                      \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
