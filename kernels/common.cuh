// Shared by the kernels: f32 <-> storage-type conversions (float, bf16). Math is always f32.
#pragma once
// Launch geometry: every constant of crates/model/src/kernels/geometry.rs as `-DTERSE_<NAME>`,
// passed by crates/model/build.rs (and the shim's, the emulated device's and the scripts' builds,
// all by the one rule of crates/model/build_geometry.rs), so the Rust launches and the kernels
// cannot disagree. TERSE_GEOMETRY marks a compile that got them.
#ifndef TERSE_GEOMETRY
#error "TERSE_GEOMETRY and the TERSE_* launch geometry are passed by crates/model/build.rs"
#endif
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

// The online-softmax state of one warp in a single-query decode attention (kv_cache.cu,
// paged_attention.cu): the query row, pre-scaled, and the output accumulators, D / 32 per lane
// (D <= TERSE_DECODE_MAX_HEAD_DIM), with the running max m and sum s.
struct DecodeState {
    float qv[TERSE_DECODE_MAX_HEAD_DIM / 32];
    float acc[TERSE_DECODE_MAX_HEAD_DIM / 32];
    float m, s;
};

template <typename T>
__device__ void decode_start(DecodeState& st, const T* qr, float scale, int d) {
    int lane = threadIdx.x % 32;
    for (int j = 0; j < TERSE_DECODE_MAX_HEAD_DIM / 32; j++) {
        int i = lane + 32 * j;
        st.acc[j] = 0.f;
        st.qv[j] = i < d ? to_f(qr[i]) * scale : 0.f;
    }
    st.m = -INFINITY;
    st.s = 0.f;
}

// One slot: the warp's dot product of q with the key row kr, then the running max and sum
// updated, the accumulators rescaled and the value row vr added with weight e^(dot - max).
template <typename T>
__device__ void decode_slot(DecodeState& st, const T* kr, const T* vr, int d) {
    int lane = threadIdx.x % 32;
    const int per = TERSE_DECODE_MAX_HEAD_DIM / 32;
    float dot = 0.f;
    for (int j = 0; j < per; j++) {
        int i = lane + 32 * j;
        if (i < d) dot += st.qv[j] * to_f(kr[i]);
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
    float mn = fmaxf(st.m, dot);
    float corr = __expf(st.m - mn), p = __expf(dot - mn);
    st.s = st.s * corr + p;
    for (int j = 0; j < per; j++) {
        int i = lane + 32 * j;
        if (i < d) st.acc[j] = st.acc[j] * corr + p * to_f(vr[i]);
    }
    st.m = mn;
}

// The end of a single-query decode attention (kv_cache.cu, paged_attention.cu): one block of
// 32 * TERSE_DECODE_WARPS threads per (row, query head[, split]), each warp holding an
// online-softmax state (running max m, sum s, and its lanes' D / 32 output accumulators acc)
// over its subset of the slots. Merges the warps' states in a fixed order (warp 0 first) and
// hands warp 0 the block's max M, sum S and, per dimension i < d, the unnormalised output o
// (emit(M, S, i, o)); a warp with no slot (m = -inf) adds nothing.
template <typename Emit>
__device__ void decode_merge(float m, float s, const float* acc, int d, Emit emit) {
    const int warps = TERSE_DECODE_WARPS, per = TERSE_DECODE_MAX_HEAD_DIM / 32;
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    __shared__ float sm[warps], ss[warps], sacc[warps][TERSE_DECODE_MAX_HEAD_DIM];
    if (lane == 0) { sm[w] = m; ss[w] = s; }
    for (int j = 0; j < per; j++) {
        int i = lane + 32 * j;
        if (i < d) sacc[w][i] = acc[j];
    }
    __syncthreads();
    if (w != 0) return;
    float M = -INFINITY;
    for (int k = 0; k < warps; k++) M = fmaxf(M, sm[k]);
    float S = 0.f;
    for (int k = 0; k < warps; k++) S += sm[k] == -INFINITY ? 0.f : ss[k] * __expf(sm[k] - M);
    for (int j = 0; j < per; j++) {
        int i = lane + 32 * j;
        if (i >= d) continue;
        float o = 0.f;
        for (int k = 0; k < warps; k++)
            if (sm[k] != -INFINITY) o += sacc[k][i] * __expf(sm[k] - M);
        emit(M, S, i, o);
    }
}

// The warps' merge written as the normalised output row (zeros when no slot was attended, like
// a fully masked softmax).
template <typename T>
__device__ void decode_merge_write(float m, float s, const float* acc, T* orow, int d) {
    decode_merge(m, s, acc, d, [&](float, float S, int i, float o) {
        orow[i] = from_f<T>(S > 0.f ? o / S : 0.f);
    });
}
