// The paged KV cache's decode-step kernels: K/V write into a sequence's block and single-query
// attention over a block table. A pool is (NB, Hkv, BS, D) per layer; `tables` (B, MAXB) i32
// holds each sequence's block ids in order; `lens` (B) i32 the slots each attends (its tokens,
// the new one included); `slots` (B) i32 where each new token goes (block id * BS + offset).
// No padding exists: every slot below a sequence's length holds a token. Grouped KV heads are
// read in place (query head hq uses KV head hq / (Hq / Hkv)). The walk over slots and the
// warps' merge are kv_cache.cu's decode_attention with the slot address looked up in the table.
// CPU reference: terse_model::kernels::paged_{kv_write,decode_attention}.
#include "common.cuh"
#include <math.h>

// new (B, Hkv, D) -> pool[slot / BS, :, slot % BS, :] per row. One thread per element.
template <typename T>
__device__ void paged_kv_write(const T* src, T* pool, const int* slots, int b, int hkv, int bs,
                               int d) {
    size_t n = (size_t)b * hkv * d;
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    size_t i = k % d, bh = k / d;
    size_t row = bh / hkv, h = bh % hkv;
    size_t slot = (size_t)slots[row], blk = slot / bs, off = slot % bs;
    pool[((blk * hkv + h) * bs + off) * d + i] = src[k];
}

#define WARPS TERSE_DECODE_WARPS
#define MAXD TERSE_DECODE_MAX_HEAD_DIM
// q (B, Hq, D) over the first lens[b] slots of sequence b's blocks -> out (B, Hq, D).
// One block of 32 * WARPS threads per (b, hq); each warp walks a strided subset of the slots.
template <typename T>
__device__ void paged_decode_attention(const T* q, const T* kp, const T* vp, const int* tables,
                                       const int* lens, T* out, int hq, int hkv, int bs,
                                       int maxb, int d, float scale) {
    int b = blockIdx.x / hq, h = blockIdx.x % hq, g = h / (hq / hkv);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const T* qr = q + ((size_t)b * hq + h) * d;
    const int* table = tables + (size_t)b * maxb;
    int len = lens[b];
    const int per = MAXD / 32;
    float acc[per];
    float qv[per];
    for (int j = 0; j < per; j++) {
        int i = lane + 32 * j;
        acc[j] = 0.f;
        qv[j] = i < d ? to_f(qr[i]) * scale : 0.f;
    }
    float m = -INFINITY, s = 0.f;
    for (int t = w; t < len; t += WARPS) {
        size_t at = (((size_t)table[t / bs] * hkv + g) * bs + t % bs) * d;
        float dot = 0.f;
        for (int j = 0; j < per; j++) {
            int i = lane + 32 * j;
            if (i < d) dot += qv[j] * to_f(kp[at + i]);
        }
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
        float mn = fmaxf(m, dot);
        float corr = __expf(m - mn), p = __expf(dot - mn);
        s = s * corr + p;
        for (int j = 0; j < per; j++) {
            int i = lane + 32 * j;
            if (i < d) acc[j] = acc[j] * corr + p * to_f(vp[at + i]);
        }
        m = mn;
    }
    decode_merge_write<T>(m, s, acc, out + ((size_t)b * hq + h) * d, d);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void paged_kv_write_##S(const T* src, T* pool, const int* slots,    \
                                                  int b, int hkv, int bs, int d) {            \
        paged_kv_write<T>(src, pool, slots, b, hkv, bs, d);                                   \
    }                                                                                          \
    extern "C" __global__ void paged_decode_attention_##S(                                     \
        const T* q, const T* kp, const T* vp, const int* tables, const int* lens, T* out,      \
        int hq, int hkv, int bs, int maxb, int d, float scale) {                               \
        paged_decode_attention<T>(q, kp, vp, tables, lens, out, hq, hkv, bs, maxb, d, scale);  \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
