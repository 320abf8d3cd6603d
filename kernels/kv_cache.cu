// KV-cache write at a slot and single-query decode attention over the cache, for the rollout
// sampler's decode step. The cache is (B, Hkv, C, D) per layer; every row writes the same slot
// (terse's cache advances all rows together) and `valid` (B, C) u8 says which slots of a row
// hold real tokens (left padding, finished or injected rows). Grouped KV heads are read in
// place (query head hq uses KV head hq / (Hq / Hkv), HF's repeat_kv order), never repeated.
// CPU reference: terse_model::kernels::kv_cache.
#include "common.cuh"
#include <math.h>

// new (B, Hkv, D) -> cache[:, :, slot, :]. One thread per element.
template <typename T>
__device__ void kv_write(const T* src, T* cache, int b, int hkv, int cap, int d, int slot) {
    size_t n = (size_t)b * hkv * d;
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    size_t i = k % d, bh = k / d;
    cache[(bh * cap + slot) * d + i] = src[k];
}

// q (B, Hq, D), k/v cache (B, Hkv, C, D), valid (B, C), first `len` slots -> out (B, Hq, D).
// One block of 32 * WARPS threads per (b, hq): each warp walks a strided subset of the slots
// with an online softmax (running max and sum, f32), then the warps' partial states merge.
// D <= 256 (Qwen3 uses 128): each lane keeps D / 32 output accumulators.
#define WARPS TERSE_DECODE_WARPS
template <typename T>
__device__ void decode_attention(const T* q, const T* kc, const T* vc, const uint8_t* valid,
                                 T* out, int hq, int hkv, int cap, int len, int d, float scale) {
    int b = blockIdx.x / hq, h = blockIdx.x % hq, g = h / (hq / hkv);
    int w = threadIdx.x / 32;
    const T* kb = kc + ((size_t)b * hkv + g) * cap * d;
    const T* vb = vc + ((size_t)b * hkv + g) * cap * d;
    DecodeState st;
    decode_start(st, q + ((size_t)b * hq + h) * d, scale, d);
    for (int t = w; t < len; t += WARPS) {
        if (valid[(size_t)b * cap + t]) decode_slot(st, kb + (size_t)t * d, vb + (size_t)t * d, d);
    }
    decode_merge_write<T>(st.m, st.s, st.acc, out + ((size_t)b * hq + h) * d, d);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void kv_write_##S(const T* src, T* cache, int b, int hkv, int cap,  \
                                            int d, int slot) {                                \
        kv_write<T>(src, cache, b, hkv, cap, d, slot);                                        \
    }                                                                                          \
    extern "C" __global__ void decode_attention_##S(const T* q, const T* kc, const T* vc,     \
                                                    const uint8_t* valid, T* out, int hq,     \
                                                    int hkv, int cap, int len, int d,         \
                                                    float scale) {                            \
        decode_attention<T>(q, kc, vc, valid, out, hq, hkv, cap, len, d, scale);              \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
