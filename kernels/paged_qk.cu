// A decode step's query and key after their projections, in one pass: each head's RMSNorm
// (Qwen3's q_norm / k_norm; none for Qwen2), then rotate-half RoPE at the row's position, the
// query written out for attention and the key written straight into its paged-cache slot. It
// replaces two norms, two rotations and a cache write per layer (five launches, each a graph
// node of the captured decode step). CPU reference: terse_model::kernels::paged_qk.
//
// One block of `blockDim.x` >= D/2 threads (a multiple of 32) per (row, head slot): slots
// 0..Hq are the query's heads, Hq..Hq+Hkv the key's. Thread i holds the pair (i, i + D/2).
// Rounding as the separate ops: the norm as kernels/rmsnorm.cu (HF casts the normalised value
// to the storage type before the weight), the rotation in f32 from the rounded values.
//
// Layout: q (N, Hq, D) and k (N, Hkv, D) contiguous, as the projections leave them; qn, kn (D);
// cos, sin (N, D/2); slots (N): row r's key goes to slot slots[r] = block * BS + offset of
// kpool (NB, Hkv, BS, D); qout (N, Hq, D).
#include "common.cuh"

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. The
// order is fixed by the block size: the same bits every run.
__device__ float head_sum(float v) {
    __shared__ float warp[32];
    __shared__ float total;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int lane = threadIdx.x % 32, w = threadIdx.x / 32, warps = blockDim.x / 32;
    if (lane == 0) warp[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < warps ? warp[lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (lane == 0) total = v;
    }
    __syncthreads();
    return total;
}

template <typename T>
__device__ void paged_qk(const T* q, const T* k, const T* qn, const T* kn, const T* cos,
                         const T* sin, const int* slots, T* kpool, T* qout, int hq, int hkv,
                         int bs, int d, int norm, float eps) {
    int heads = hq + hkv;
    size_t row = blockIdx.x / heads;
    int j = blockIdx.x % heads, h = d / 2, i = threadIdx.x;
    const T* src;
    const T* w;
    T* dst;
    if (j < hq) {
        src = q + (row * hq + j) * d;
        dst = qout + (row * hq + j) * d;
        w = qn;
    } else {
        size_t g = j - hq, slot = (size_t)slots[row], blk = slot / bs, off = slot % bs;
        src = k + (row * hkv + g) * d;
        dst = kpool + ((blk * hkv + g) * bs + off) * d;
        w = kn;
    }
    bool on = i < h;
    float x1 = on ? to_f(src[i]) : 0.f, x2 = on ? to_f(src[i + h]) : 0.f;
    if (norm) {
        // Every thread of the block reaches the barrier inside: the branch is per block.
        float r = rsqrtf(head_sum(x1 * x1 + x2 * x2) / d + eps);
        if (on) {
            x1 = to_f(from_f<T>(to_f(from_f<T>(x1 * r)) * to_f(w[i])));
            x2 = to_f(from_f<T>(to_f(from_f<T>(x2 * r)) * to_f(w[i + h])));
        }
    }
    if (!on) return;
    size_t tab = row * h + i;
    float c = to_f(cos[tab]), s = to_f(sin[tab]);
    dst[i] = from_f<T>(x1 * c - x2 * s);
    dst[i + h] = from_f<T>(x2 * c + x1 * s);
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void paged_qk_##S(const T* q, const T* k, const T* qn, const T* kn,  \
                                            const T* cos, const T* sin, const int* slots,     \
                                            T* kpool, T* qout, int hq, int hkv, int bs, int d, \
                                            int norm, float eps) {                             \
        paged_qk<T>(q, k, qn, kn, cos, sin, slots, kpool, qout, hq, hkv, bs, d, norm, eps);    \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
