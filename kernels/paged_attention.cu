// The paged KV cache's decode-step kernels: K/V write into a sequence's block and single-query
// attention over a block table. A pool is (NB, Hkv, BS, D) per layer; `tables` (B, MAXB) i32
// holds each sequence's block ids in order; `lens` (B) i32 the slots each attends (its tokens,
// the new one included); `slots` (B) i32 where each new token goes (block id * BS + offset).
// No padding exists: every slot below a sequence's length holds a token. Grouped KV heads are
// read in place (query head hq uses KV head hq / (Hq / Hkv)). The per-slot online softmax and
// the warps' merge are common.cuh's (as kv_cache.cu's); only the slot's address differs: it is
// looked up in the table.
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
// q (B, Hq, D) over the first lens[b] slots of sequence b's blocks -> out (B, Hq, D).
// One block of 32 * WARPS threads per (b, hq); each warp walks a strided subset of the slots.
template <typename T>
__device__ void paged_decode_attention(const T* q, const T* kp, const T* vp, const int* tables,
                                       const int* lens, T* out, int hq, int hkv, int bs,
                                       int maxb, int d, float scale) {
    int b = blockIdx.x / hq, h = blockIdx.x % hq, g = h / (hq / hkv);
    int w = threadIdx.x / 32;
    const int* table = tables + (size_t)b * maxb;
    int len = lens[b];
    DecodeState st;
    decode_start(st, q + ((size_t)b * hq + h) * d, scale, d);
    for (int t = w; t < len; t += WARPS) {
        size_t at = (((size_t)table[t / bs] * hkv + g) * bs + t % bs) * d;
        decode_slot(st, kp + at, vp + at, d);
    }
    decode_merge_write<T>(st.m, st.s, st.acc, out + ((size_t)b * hq + h) * d, d);
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
