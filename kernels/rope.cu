// Qwen's rotate-half rotary embedding, forward and backward, with per-row position tables:
// y[i] = x[i] c_i - x[i+h] s_i,  y[i+h] = x[i+h] c_i + x[i] s_i  (h = D/2); the backward applies
// the transposed rotation (sin negated). One thread per (b, head, t, i < h) pair, f32 math.
// CPU reference: terse_model::kernels::rope.
//
// Layout: x and y each (B, H, T, D), the layout attention reads, or with `x_tokens` /
// `y_tokens` (B, T, H, D), the projections' rows: the written layer backward rotates q and k
// straight from their rows into attention's layout and back, without a transposing copy
// either way. cos, sin (B, T, D/2); all contiguous.
#include "common.cuh"

// sign = +1: forward; sign = -1: backward (dy -> dx).
template <typename T>
__device__ void rope(const T* x, const T* cos, const T* sin, T* y, int b, int heads, int t,
                     int d, int x_tokens, int y_tokens, float sign) {
    int h = d / 2;
    size_t n = (size_t)b * heads * t * h;
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    int i = k % h;
    size_t rest = k / h;
    int ti = rest % t;
    rest /= t;
    int hi = rest % heads;
    rest /= heads;  // the row index b
    size_t by_heads = (k / h) * d, by_tokens = ((rest * t + ti) * heads + hi) * d;
    size_t xb = x_tokens ? by_tokens : by_heads, yb = y_tokens ? by_tokens : by_heads;
    size_t tab = (rest * t + ti) * h + i;
    float c = to_f(cos[tab]), s = sign * to_f(sin[tab]);
    float x1 = to_f(x[xb + i]), x2 = to_f(x[xb + i + h]);
    y[yb + i] = from_f<T>(x1 * c - x2 * s);
    y[yb + i + h] = from_f<T>(x2 * c + x1 * s);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void rope_fwd_##S(const T* x, const T* cos, const T* sin, T* y,     \
                                            int b, int heads, int t, int d, int x_tokens,     \
                                            int y_tokens) {                                    \
        rope<T>(x, cos, sin, y, b, heads, t, d, x_tokens, y_tokens, 1.f);                     \
    }                                                                                          \
    extern "C" __global__ void rope_bwd_##S(const T* dy, const T* cos, const T* sin, T* dx,   \
                                            int b, int heads, int t, int d, int x_tokens,     \
                                            int y_tokens) {                                    \
        rope<T>(dy, cos, sin, dx, b, heads, t, d, x_tokens, y_tokens, -1.f);                  \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
