// The fused log-prob epilogue over one chunk of LM-head logits (n, V), f32 or bf16 (the GEMM's
// own output: bf16 logits are never cast to an f32 tensor), one block per row: the forward reads
// the row once for the max, sum(exp) and sum(p * x) (online), and writes log p(target), the
// log-partition and the entropy in f32; the backward writes d logp / d logits =
// g * (onehot(target) - softmax) in the logits' type, which the head's GEMMs read as they are.
// Math in f32 either way. The (n, V) @ (V, H) products around it stay cuBLAS GEMMs (the weight
// gradient's accumulates in f32, kernels/gemm.rs). CPU reference: terse_model::kernels::logprob.
#include "common.cuh"

#define BLOCK TERSE_LOGPROB_BLOCK

struct Stat {
    float m;  // running max
    float s;  // sum exp(x - m)
    float t;  // sum exp(x - m) * x  (for the entropy)
};

__device__ __forceinline__ Stat merge(Stat a, Stat b) {
    if (a.m == -INFINITY) return b;
    if (b.m == -INFINITY) return a;
    float m = fmaxf(a.m, b.m);
    float ea = __expf(a.m - m), eb = __expf(b.m - m);
    return {m, a.s * ea + b.s * eb, a.t * ea + b.t * eb};
}

__device__ Stat block_merge(Stat v) {
    __shared__ Stat warp[BLOCK / 32];
    for (int o = 16; o > 0; o >>= 1) {
        Stat u = {__shfl_xor_sync(0xffffffff, v.m, o), __shfl_xor_sync(0xffffffff, v.s, o),
                  __shfl_xor_sync(0xffffffff, v.t, o)};
        v = merge(v, u);
    }
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    if (lane == 0) warp[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < BLOCK / 32 ? warp[lane] : Stat{-INFINITY, 0.f, 0.f};
        for (int o = 16; o > 0; o >>= 1) {
            Stat u = {__shfl_xor_sync(0xffffffff, v.m, o), __shfl_xor_sync(0xffffffff, v.s, o),
                      __shfl_xor_sync(0xffffffff, v.t, o)};
            v = merge(v, u);
        }
        if (lane == 0) warp[0] = v;
    }
    __syncthreads();
    Stat r = warp[0];
    __syncthreads();
    return r;
}

// logits (n, V); targets (n) u32 -> stats (n, 3) f32 = [log p(target), log Z, entropy] per row.
template <typename T>
__device__ void logprob_fwd(const T* logits, const uint32_t* targets, float* stats, int v) {
    const T* row = logits + (size_t)blockIdx.x * v;
    Stat st = {-INFINITY, 0.f, 0.f};
    for (int i = threadIdx.x; i < v; i += BLOCK) {
        float x = to_f(row[i]);
        st = merge(st, Stat{x, 1.f, x});
    }
    st = block_merge(st);
    if (threadIdx.x == 0) {
        float z = st.m + logf(st.s);
        float* out = stats + 3 * (size_t)blockIdx.x;
        out[0] = to_f(row[targets[blockIdx.x]]) - z;
        out[1] = z;
        out[2] = z - st.t / st.s;  // H = log Z - E_p[x]
    }
}

// logits (n, V), lse_g (n, 2) = [lse, g] -> out (n, V) = g * (onehot(target) - exp(logits - lse)).
// Out of place: the chunk's logits buffer is read once and the gradient written once (in place
// would need a copy first, since candle hands an op its inputs to read).
template <typename T>
__device__ void logprob_bwd(const T* logits, const uint32_t* targets, const float* lse_g, T* out,
                            int v) {
    const T* row = logits + (size_t)blockIdx.x * v;
    T* dst = out + (size_t)blockIdx.x * v;
    float z = lse_g[2 * (size_t)blockIdx.x], gr = lse_g[2 * (size_t)blockIdx.x + 1];
    uint32_t tgt = targets[blockIdx.x];
    for (int i = threadIdx.x; i < v; i += BLOCK) {
        float p = __expf(to_f(row[i]) - z);
        dst[i] = from_f<T>(gr * ((i == (int)tgt ? 1.f : 0.f) - p));
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void logprob_fwd_##S(const T* logits, const uint32_t* targets,      \
                                               float* stats, int v) {                          \
        logprob_fwd<T>(logits, targets, stats, v);                                             \
    }                                                                                          \
    extern "C" __global__ void logprob_bwd_##S(const T* logits, const uint32_t* targets,      \
                                               const float* lse_g, T* out, int v) {            \
        logprob_bwd<T>(logits, targets, lse_g, out, v);                                        \
    }

INSTANTIATE(float, f32)
INSTANTIATE(__nv_bfloat16, bf16)
