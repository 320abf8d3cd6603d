// Causal grouped-query attention over key ranges for the training forward and backward, with
// O(T) memory (the FlashAttention-2 algorithm): the forward keeps each query row's log-sum-exp
// only; the backward recomputes the scores. Query i attends keys [starts[b, i], i] (padding and
// packed rows; an empty range gives 0). q (B, Hq, T, D), k/v (B, Hkv, T, D) in f32 or bf16,
// everything else f32; query head h reads KV head h / (Hq / Hkv), never repeated.
// One warp per row (a query row in the forward and dQ, a key row in dK/dV); each lane holds
// D / 32 elements, dot products reduce across the warp; no atomics, so the result does not
// depend on scheduling. CPU reference: terse_model::flash::cpu (the same function; tiled).
#include "common.cuh"
#include <math.h>

#define FW TERSE_FLASH_WARPS
#define FMAXD TERSE_DECODE_MAX_HEAD_DIM
#define PER (FMAXD / 32)

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffff, x, o);
    return x;
}

template <typename T>
__device__ __forceinline__ void load_row(const T* p, float* r, int lane, int d, float mul) {
    for (int j = 0; j < PER; j++) {
        int i = lane + 32 * j;
        r[j] = i < d ? to_f(p[i]) * mul : 0.f;
    }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float* r, const T* p, int lane, int d) {
    float s = 0.f;
    for (int j = 0; j < PER; j++) {
        int i = lane + 32 * j;
        if (i < d) s += r[j] * to_f(p[i]);
    }
    return warp_sum(s);
}

// Grid (ceil(T / FW), B * Hq), FW warps: warp w takes query row blockIdx.x * FW + w.
// out (B, Hq, T, D) and lse (B, Hq, T), f32.
template <typename T>
__device__ void flash_fwd(const T* q, const T* k, const T* v, const uint32_t* starts, float* out,
                          float* lse, int hq, int hkv, int t, int d, float scale) {
    int lane = threadIdx.x % 32, i = blockIdx.x * FW + threadIdx.x / 32;
    int bh = blockIdx.y, b = bh / hq, h = bh % hq, g = b * hkv + h / (hq / hkv);
    if (i >= t) return;
    size_t row = (size_t)bh * t + i;
    float qv[PER], acc[PER];
    load_row(q + row * d, qv, lane, d, scale);
    for (int j = 0; j < PER; j++) acc[j] = 0.f;
    const T* kb = k + (size_t)g * t * d;
    const T* vb = v + (size_t)g * t * d;
    float m = -INFINITY, s = 0.f;
    for (int j = starts[(size_t)b * t + i]; j <= i; j++) {
        float x = dot_row(qv, kb + (size_t)j * d, lane, d);
        float mn = fmaxf(m, x);
        float corr = __expf(m - mn), p = __expf(x - mn);
        s = s * corr + p;
        for (int e = 0; e < PER; e++) {
            int c = lane + 32 * e;
            if (c < d) acc[e] = acc[e] * corr + p * to_f(vb[(size_t)j * d + c]);
        }
        m = mn;
    }
    float inv = s > 0.f ? 1.f / s : 0.f;
    for (int e = 0; e < PER; e++) {
        int c = lane + 32 * e;
        if (c < d) out[row * d + c] = acc[e] * inv;
    }
    if (lane == 0) lse[row] = s > 0.f ? m + logf(s) : -INFINITY;
}

// delta (B * Hq * T) = rowsum(dO * O). One warp per row, grid (ceil(rows / FW)).
__device__ void flash_delta(const float* out, const float* dout, float* delta, size_t rows,
                            int d) {
    int lane = threadIdx.x % 32;
    size_t r = (size_t)blockIdx.x * FW + threadIdx.x / 32;
    if (r >= rows) return;
    float s = 0.f;
    for (int c = lane; c < d; c += 32) s += out[r * d + c] * dout[r * d + c];
    s = warp_sum(s);
    if (lane == 0) delta[r] = s;
}

// dQ: grid and rows as the forward. dq_i = scale * sum_j p_ij (dO_i . v_j - delta_i) k_j.
template <typename T>
__device__ void flash_bwd_dq(const T* q, const T* k, const T* v, const uint32_t* starts,
                             const float* lse, const float* delta, const float* dout, float* dq,
                             int hq, int hkv, int t, int d, float scale) {
    int lane = threadIdx.x % 32, i = blockIdx.x * FW + threadIdx.x / 32;
    int bh = blockIdx.y, b = bh / hq, h = bh % hq, g = b * hkv + h / (hq / hkv);
    if (i >= t) return;
    size_t row = (size_t)bh * t + i;
    float qv[PER], gv[PER], acc[PER];
    load_row(q + row * d, qv, lane, d, scale);
    load_row(dout + row * d, gv, lane, d, 1.f);
    for (int e = 0; e < PER; e++) acc[e] = 0.f;
    const T* kb = k + (size_t)g * t * d;
    const T* vb = v + (size_t)g * t * d;
    float l = lse[row], dl = delta[row];
    for (int j = starts[(size_t)b * t + i]; j <= i; j++) {
        float p = __expf(dot_row(qv, kb + (size_t)j * d, lane, d) - l);
        float ds = p * (dot_row(gv, vb + (size_t)j * d, lane, d) - dl) * scale;
        for (int e = 0; e < PER; e++) {
            int c = lane + 32 * e;
            if (c < d) acc[e] += ds * to_f(kb[(size_t)j * d + c]);
        }
    }
    for (int e = 0; e < PER; e++) {
        int c = lane + 32 * e;
        if (c < d) dq[row * d + c] = acc[e];
    }
}

// dK, dV: grid (ceil(T / FW), B * Hkv), warp w takes key row j; it walks its group's query
// heads and the rows i >= j whose range holds j (starts never decrease: the first row that
// starts after j ends the walk).
template <typename T>
__device__ void flash_bwd_dkdv(const T* q, const T* k, const T* v, const uint32_t* starts,
                               const float* lse, const float* delta, const float* dout,
                               float* dk, float* dv, int hq, int hkv, int t, int d, float scale) {
    int lane = threadIdx.x % 32, j = blockIdx.x * FW + threadIdx.x / 32;
    int bg = blockIdx.y, b = bg / hkv, g = bg % hkv, rep = hq / hkv;
    if (j >= t) return;
    size_t krow = (size_t)bg * t + j;
    float kv[PER], vv[PER], ak[PER], av[PER];
    load_row(k + krow * d, kv, lane, d, scale);
    load_row(v + krow * d, vv, lane, d, 1.f);
    for (int e = 0; e < PER; e++) ak[e] = av[e] = 0.f;
    const uint32_t* st = starts + (size_t)b * t;
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        size_t base = ((size_t)b * hq + h) * t;
        for (int i = j; i < t && (int)st[i] <= j; i++) {
            size_t row = base + i;
            float p = __expf(dot_row(kv, q + row * d, lane, d) - lse[row]);
            float ds = p * (dot_row(vv, dout + row * d, lane, d) - delta[row]) * scale;
            for (int e = 0; e < PER; e++) {
                int c = lane + 32 * e;
                if (c < d) {
                    av[e] += p * dout[row * d + c];
                    ak[e] += ds * to_f(q[row * d + c]);
                }
            }
        }
    }
    for (int e = 0; e < PER; e++) {
        int c = lane + 32 * e;
        if (c < d) {
            dk[krow * d + c] = ak[e];
            dv[krow * d + c] = av[e];
        }
    }
}

#define FLASH_OPS(T, SFX)                                                                        \
    extern "C" __global__ void flash_fwd_##SFX(const T* q, const T* k, const T* v,               \
                                               const uint32_t* st, float* out, float* lse,       \
                                               int hq, int hkv, int t, int d, float scale) {     \
        flash_fwd<T>(q, k, v, st, out, lse, hq, hkv, t, d, scale);                               \
    }                                                                                            \
    extern "C" __global__ void flash_bwd_dq_##SFX(                                               \
        const T* q, const T* k, const T* v, const uint32_t* st, const float* lse,                \
        const float* delta, const float* dout, float* dq, int hq, int hkv, int t, int d,         \
        float scale) {                                                                           \
        flash_bwd_dq<T>(q, k, v, st, lse, delta, dout, dq, hq, hkv, t, d, scale);                \
    }                                                                                            \
    extern "C" __global__ void flash_bwd_dkdv_##SFX(                                             \
        const T* q, const T* k, const T* v, const uint32_t* st, const float* lse,                \
        const float* delta, const float* dout, float* dk, float* dv, int hq, int hkv, int t,     \
        int d, float scale) {                                                                    \
        flash_bwd_dkdv<T>(q, k, v, st, lse, delta, dout, dk, dv, hq, hkv, t, d, scale);          \
    }

FLASH_OPS(float, f32)
FLASH_OPS(__nv_bfloat16, bf16)

extern "C" __global__ void flash_delta_f32(const float* out, const float* dout, float* delta,
                                           size_t rows, int d) {
    flash_delta(out, dout, delta, rows, d);
}
