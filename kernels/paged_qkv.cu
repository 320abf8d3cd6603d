// A decode step's query, key and value after their projection, in one pass: each head's
// RMSNorm (Qwen3's q_norm / k_norm; none for Qwen2), then rotate-half RoPE at the row's
// position; the query written out for attention, the key and the value written straight into
// their paged-cache slots. It replaces two norms, two rotations and two cache writes per layer
// (six launches, each a graph node of the captured decode step). CPU reference:
// terse_model::kernels::paged_qkv.
//
// One block of `blockDim.x` >= D/2 threads (a multiple of 32) per (row, head slot): slots
// 0..Hq are the query's heads, Hq..Hq+Hkv the key's, Hq+Hkv..Hq+2Hkv the value's (copied, no
// norm, no rotation). Thread i holds the pair (i, i + D/2). Rounding as the separate ops: the
// norm as kernels/rmsnorm.cu (HF casts the normalised value to the storage type before the
// weight), the rotation in f32 from the rounded values.
//
// Layout: qkv (N, (Hq + 2 Hkv) D) contiguous, one row per token as the stacked projection
// leaves it ([q heads | k heads | v heads]); qn, kn (D); cos, sin (N, D/2); slots (N): row
// r's key and value go to slot slots[r] = block * BS + offset of kpool and vpool (NB, Hkv,
// BS, D); qout (N, Hq, D).
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
__device__ void paged_qkv(const T* qkv, const T* qn, const T* kn, const T* cos, const T* sin,
                          const int* slots, T* kpool, T* vpool, T* qout, int hq, int hkv,
                          int bs, int d, int norm, float eps) {
    int heads = hq + 2 * hkv;
    size_t row = blockIdx.x / heads;
    int j = blockIdx.x % heads, h = d / 2, i = threadIdx.x;
    const T* src = qkv + (row * heads + j) * d;
    size_t slot = (size_t)slots[row], blk = slot / bs, off = slot % bs;
    if (j >= hq + hkv) {
        // A value head: into its slot as it is.
        size_t g = j - hq - hkv;
        T* dst = vpool + ((blk * hkv + g) * bs + off) * d;
        for (int e = i; e < d; e += blockDim.x) dst[e] = src[e];
        return;
    }
    const T* w;
    T* dst;
    if (j < hq) {
        dst = qout + (row * hq + j) * d;
        w = qn;
    } else {
        dst = kpool + ((blk * hkv + (j - hq)) * bs + off) * d;
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
    extern "C" __global__ void paged_qkv_##S(const T* qkv, const T* qn, const T* kn,          \
                                             const T* cos, const T* sin, const int* slots,    \
                                             T* kpool, T* vpool, T* qout, int hq, int hkv,    \
                                             int bs, int d, int norm, float eps) {             \
        paged_qkv<T>(qkv, qn, kn, cos, sin, slots, kpool, vpool, qout, hq, hkv, bs, d, norm,  \
                     eps);                                                                     \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
