// The paged KV cache's decode-step kernels: K/V write into a sequence's block and single-query
// attention over a block table. A pool is (NB, Hkv, BS, D) per layer; `tables` (B, MAXB) i32
// holds each sequence's block ids in order; `lens` (B) i32 the slots each attends (its tokens,
// the new one included); `slots` (B) i32 where each new token goes (block id * BS + offset).
// No padding exists: every slot below a sequence's length holds a token. Grouped KV heads are
// read in place (query head hq uses KV head hq / (Hq / Hkv)). The per-slot online softmax and
// the warps' merge are common.cuh's (as kv_cache.cu's); only the slot's address differs: it is
// looked up in the table.
//
// Flash-decoding (paged_decode_split_* then paged_decode_merge_*): a long context is cut into
// splits of `chunk` slots (at most `splits` of them) computed by Y blocks per (row, query head),
// so that a batch smaller than the SM count still fills the GPU. Each split writes its partial
// max, sum and unnormalised output (f32); the merge combines a row's splits in split order.
// The geometry (B * Hq, Y) and the partial buffers (B * Hq * splits) depend only on the batch
// size and fixed limits, never on a step's lengths, so a CUDA graph can hold the launch; a
// row's split count comes from its own length on the device, so its result is the same
// whatever else is in the batch, and a block with no split of its row exits at once.
// `paged_decode_attention_*` stays the reference path (TERSE_FLASH_DECODING=0).
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

// Splits of a row of `len` slots: one per `chunk` slots, at most `splits` (then longer ones);
// 0 for an empty row. Its length alone decides it: the split kernel and the merge both compute
// it from `lens` on the device (crate paged_split.rs's `SplitPlan::count` is its host twin).
__device__ __forceinline__ int split_count(int len, int splits, int chunk) {
    if (len <= 0) return 0;
    int n = (len + chunk - 1) / chunk;
    return n < splits ? n : splits;
}

// Slots a warp takes at once in a split: their K rows are loaded before any of their scores is
// used, so a warp has SPLIT_UNROLL rows in flight instead of one.
#define SPLIT_UNROLL 4

// q (B, Hq, D) over row b's splits -> part_o (B * Hq, splits, D) and part_ms (B * Hq, splits,
// 2): split k's max, sum and unnormalised output over its slots [k * per, min(len, (k + 1) *
// per)), per = ceil(len / n). Grid (B * Hq, Y): block y computes splits y, y + Y, ... of its
// (row, head), so Y (chosen from the batch and the SM count) changes who computes a split,
// never its value. 32 * WARPS threads; warp w takes SPLIT_UNROLL consecutive slots, then the
// next WARPS * SPLIT_UNROLL.
template <typename T>
__device__ void paged_decode_split(const T* q, const T* kp, const T* vp, const int* tables,
                                   const int* lens, float* part_o, float* part_ms, int hq,
                                   int hkv, int bs, int maxb, int d, float scale, int splits,
                                   int chunk) {
    int r = blockIdx.x, b = r / hq, h = r % hq, g = h / (hq / hkv);
    int len = lens[b], n = split_count(len, splits, chunk);
    int per_split = n > 0 ? (len + n - 1) / n : 0;
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int per = TERSE_DECODE_MAX_HEAD_DIM / 32;
    const int* table = tables + (size_t)b * maxb;
    // k is the same for the whole block: every barrier below is reached by all or none.
    for (int k = blockIdx.y; k < n; k += gridDim.y) {
        int start = k * per_split, end = min(len, start + per_split);
        DecodeState st;
        decode_start(st, q + ((size_t)b * hq + h) * d, scale, d);
        for (int t0 = start + w * SPLIT_UNROLL; t0 < end; t0 += WARPS * SPLIT_UNROLL) {
            size_t at[SPLIT_UNROLL];
            float dot[SPLIT_UNROLL];
            for (int u = 0; u < SPLIT_UNROLL; u++) {
                int t = min(t0 + u, end - 1);  // past the end: a valid slot, weighted 0 below
                at[u] = (((size_t)table[t / bs] * hkv + g) * bs + t % bs) * d;
                dot[u] = 0.f;
                for (int j = 0; j < per; j++) {
                    int i = lane + 32 * j;
                    if (i < d) dot[u] += st.qv[j] * to_f(kp[at[u] + i]);
                }
            }
            float mn = st.m;
            for (int u = 0; u < SPLIT_UNROLL; u++) {
                for (int o = 16; o > 0; o >>= 1)
                    dot[u] += __shfl_xor_sync(0xffffffff, dot[u], o);
                if (t0 + u < end) mn = fmaxf(mn, dot[u]);
            }
            float corr = __expf(st.m - mn), p[SPLIT_UNROLL];
            st.s *= corr;
            for (int u = 0; u < SPLIT_UNROLL; u++) {
                p[u] = t0 + u < end ? __expf(dot[u] - mn) : 0.f;
                st.s += p[u];
            }
            for (int j = 0; j < per; j++) {
                int i = lane + 32 * j;
                if (i >= d) continue;
                float a = st.acc[j] * corr;
                for (int u = 0; u < SPLIT_UNROLL; u++) a += p[u] * to_f(vp[at[u] + i]);
                st.acc[j] = a;
            }
            st.m = mn;
        }
        size_t at = (size_t)r * splits + k;
        float* orow = part_o + at * d;
        float* ms = part_ms + at * 2;
        decode_merge(st.m, st.s, st.acc, d, [&](float M, float S, int i, float o) {
            orow[i] = o;
            if (i == 0) { ms[0] = M; ms[1] = S; }
        });
        __syncthreads();  // warp 0 has read the shared states before the next split's writes
    }
}

// The splits of each (row, query head) merged in split order: out = sum_k o_k e^(m_k - M) /
// sum_k s_k e^(m_k - M), M the largest m_k; zeros for an empty row. One block per (row, head),
// each thread a strided subset of the D dimensions (every thread reads the same n (m, s) pairs).
template <typename T>
__device__ void paged_decode_merge(const float* part_o, const float* part_ms, const int* lens,
                                   T* out, int hq, int d, int splits, int chunk) {
    int r = blockIdx.x, n = split_count(lens[r / hq], splits, chunk);
    const float* ms = part_ms + (size_t)r * splits * 2;
    const float* po = part_o + (size_t)r * splits * d;
    float M = -INFINITY;
    for (int k = 0; k < n; k++) M = fmaxf(M, ms[2 * k]);
    float S = 0.f;
    for (int k = 0; k < n; k++)
        if (ms[2 * k] != -INFINITY) S += ms[2 * k + 1] * __expf(ms[2 * k] - M);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float o = 0.f;
        for (int k = 0; k < n; k++)
            if (ms[2 * k] != -INFINITY) o += po[(size_t)k * d + i] * __expf(ms[2 * k] - M);
        out[(size_t)r * d + i] = from_f<T>(S > 0.f ? o / S : 0.f);
    }
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
    }                                                                                          \
    extern "C" __global__ void paged_decode_split_##S(                                         \
        const T* q, const T* kp, const T* vp, const int* tables, const int* lens,             \
        float* part_o, float* part_ms, int hq, int hkv, int bs, int maxb, int d, float scale,  \
        int splits, int chunk) {                                                               \
        paged_decode_split<T>(q, kp, vp, tables, lens, part_o, part_ms, hq, hkv, bs, maxb, d,  \
                              scale, splits, chunk);                                           \
    }                                                                                          \
    extern "C" __global__ void paged_decode_merge_##S(const float* part_o,                    \
                                                      const float* part_ms, const int* lens,  \
                                                      T* out, int hq, int d, int splits,      \
                                                      int chunk) {                            \
        paged_decode_merge<T>(part_o, part_ms, lens, out, hq, d, splits, chunk);              \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
