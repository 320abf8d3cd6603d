// The tile geometry, tile copy and K/V pipeline of FlashAttention-2's forward (flash_fa2.cu) and
// backward (flash_fa2_bwd.cu): blocks of FA2_WARPS warps x 16 rows, 64-key tiles, shared rows
// padded by 16 bytes (the argument is flash_fa2.cu's header), filled by 16-byte cp.async copies
// through the 2-stage pipeline the forward and the dQ kernel walk a row block's key tiles with.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define FA2_WARPS TERSE_FLASH_TC_WARPS
#define FA2_ROWS (16 * FA2_WARPS)
#define FA2_THREADS (32 * FA2_WARPS)
// Keys per tile; crates/model's kernels/flash/launch.rs FLASH_FA2_KEYS must agree (simt checks).
#define FA2_KEYS 64
// Padding of each shared row, bf16 elements (16 bytes).
#define FA2_PAD 8

typedef __nv_bfloat16 bf16;

// Where a head starts, by its flat index `head` = b * heads + h (the grid's), in a tensor of
// `heads` heads: in attention's layout (B, H, T, D) the head is one (T, D) block; in the
// projections' rows (B, T, H, D) (`TOKENS`, the written layer backward's layout) its rows are
// H * D apart (fa2_ld).
template <bool TOKENS, int D>
__device__ __forceinline__ size_t fa2_head(int head, int heads, int t) {
    return TOKENS ? ((size_t)(head / heads) * t * heads + head % heads) * D : (size_t)head * t * D;
}
template <bool TOKENS, int D>
__device__ __forceinline__ int fa2_ld(int heads) {
    return TOKENS ? heads * D : D;
}

// Rows [r0, r0 + ROWS) of one head's (T, D) bf16 rows, `ld` elements apart, into a shared
// tile (ROWS, D + FA2_PAD) as 16-byte cp.async copies by the whole block. Rows past T copy row
// T - 1 instead (the buffer's last valid row, so nothing is read past it): the kernels mask
// those rows, so what they hold only ever meets a zero.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, int r0, int t, int ld) {  // model: begin load-rows
    constexpr int CHUNKS = D / 8, LD = D + FA2_PAD;
    for (int e = threadIdx.x; e < ROWS * CHUNKS; e += FA2_THREADS) {  // model: copy-loop
        int r = e / CHUNKS, c = e % CHUNKS;
        int row = min(r0 + r, t - 1);
        cp_async16(dst + r * LD + c * 8, src + (size_t)row * ld + c * 8);  // model: copy
    }
}  // model: end load-rows

// The key tiles rows [r0, r0 + FA2_ROWS) can see: from the first row's start (starts never
// decrease) to the last row, so no search is needed; `tiles` tiles of FA2_KEYS keys from
// `first`.
struct Fa2Keys {
    int first, tiles;
};
__device__ __forceinline__ Fa2Keys fa2_keys(const uint32_t* st, int r0, int t) {
    int last = min(r0 + FA2_ROWS, t) - 1;
    int lo = r0 < t ? min((int)st[r0], last + 1) : t;
    int first = (lo / FA2_KEYS) * FA2_KEYS;
    return {first, last >= first ? (last - first) / FA2_KEYS + 1 : 0};
}

// K and V tiles from key k0 (rows `ld` apart) into one stage of ks / vs, as one cp.async group.
template <int D>
__device__ __forceinline__ void fa2_kv_load(bf16* ks, bf16* vs, const bf16* kh, const bf16* vh,
                                            int k0, int t, int ld) {
    load_rows<D, FA2_KEYS>(ks, kh, k0, t, ld);  // model: kv-load
    load_rows<D, FA2_KEYS>(vs, vh, k0, t, ld);  // model: kv-load
    cp_async_commit();
}

// The 2-stage K/V pipeline: ks and vs are [2][FA2_KEYS][D + FA2_PAD], tile `it` in stage it & 1;
// the caller loads tile 0 (fa2_kv_load) before its loop and ends every iteration with a barrier.
// At the top of iteration `it`: prefetch tile it + 1 into the other stage (free since that
// barrier), then wait for tile it (at most the prefetch's group stays in flight) and make every
// thread's copies visible to the block.
template <int D>
__device__ __forceinline__ void fa2_kv_ready(bf16* ks, bf16* vs, const bf16* kh, const bf16* vh,
                                             const Fa2Keys& keys, int it, int t, int ld) {
    constexpr int TILE = FA2_KEYS * (D + FA2_PAD);
    if (it + 1 < keys.tiles) {
        int other = ((it & 1) ^ 1) * TILE;
        fa2_kv_load<D>(ks + other, vs + other, kh, vh, keys.first + (it + 1) * FA2_KEYS, t, ld);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}
