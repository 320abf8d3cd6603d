// The tile geometry, tile copy and K/V pipeline of FlashAttention-2's forward (flash_fa2.cu) and
// backward (flash_fa2_bwd.cu): blocks of FA2_WARPS warps x 16 rows, 64-key tiles, shared rows
// of D bf16 whose 16-byte chunks are XOR-swizzled (fa2_at; the argument is flash_fa2.cu's
// header), filled by 16-byte cp.async copies through the 2-stage pipeline the forward and the
// dQ kernel walk a row block's key tiles with.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define FA2_WARPS TERSE_FLASH_TC_WARPS
#define FA2_ROWS (16 * FA2_WARPS)
#define FA2_THREADS (32 * FA2_WARPS)
// Keys per tile; crates/model's kernels/flash/launch.rs FLASH_FA2_KEYS must agree (simt checks).
#define FA2_KEYS 64
// Padding of each row of the dK/dV kernel's dS^T scratch, bf16 elements (16 bytes): its stores
// are 4-byte pairs, not the 16-byte chunks a swizzle permutes (flash_fa2_bwd.cu).
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

// The element where row `row`'s 16-byte chunk `chunk` starts in a swizzled shared tile of D bf16
// a row: the chunk is stored at chunk ^ (row % 8), and `r` must be row % 8. The 8 rows an
// ldmatrix matrix reads (a multiple of 8 plus the lane's r = lane % 8) then sit in 8 distinct
// 16-byte bank groups, and the 8 chunks a quarter-warp copies (one row's aligned 128 bytes)
// stay within that row's aligned 128 bytes, so neither takes an extra wavefront, with no
// padding. The tile copy writes through it; the ldmatrix reads go through fa2_lane / fa2_ldsm.
template <int D>
__device__ __forceinline__ int fa2_at(int row, int chunk, int r) {
    return row * D + ((chunk ^ r) << 3);
}

// A lane's base for ldmatrix reads of the swizzled tile `tile` (128-byte aligned in shared
// memory, as every FA2 tile is): row `row0` (a multiple of 8 plus the lane's r = lane % 8) at
// the lane's chunk bits `lane_chunk`. Its read of chunk c ^ lane_chunk at row row0 + `rows` is
// then fa2_ldsm(out, base, rows, c) for c whose bits are disjoint from lane_chunk's: the base's
// address bits 4-6 hold lane_chunk ^ r (the rows below are whole 128-byte lines), so XORing c's
// low bits there is the swizzle, and `rows` and c's bit 3 are an immediate. It is fa2_at with
// the chunk split at bit 3, written out: through fa2_at, ptxas spills 8 bytes in dK/dV at D = 64.
template <int D>
__device__ __forceinline__ const bf16* fa2_lane(const bf16* tile, int row0, int lane_chunk,
                                                int r) {
    return tile + row0 * D + (((lane_chunk ^ r) & 7) << 3) + (lane_chunk & 8) * 8;
}
template <int D, bool TRANS>
__device__ __forceinline__ void fa2_ldsm(uint32_t* out, const bf16* base, int rows, int c) {
    uint32_t x = (c & 7) << 4, add = (rows * D + (c & 8) * 8) * 2;
    if (TRANS)
        ldmatrix_x4_trans_xor(out, base, x, add);
    else
        ldmatrix_x4_xor(out, base, x, add);
}

// Rows [r0, r0 + ROWS) of one head's (T, D) bf16 rows, `ld` elements apart, into a swizzled
// shared tile (ROWS, D) (fa2_at) as 16-byte cp.async copies by the whole block. Rows past T
// copy row T - 1 instead (the buffer's last valid row, so nothing is read past it): the
// kernels mask those rows, so what they hold only ever meets a zero.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, int r0, int t, int ld) {  // model: begin load-rows
    constexpr int CHUNKS = D / 8;
    for (int e = threadIdx.x; e < ROWS * CHUNKS; e += FA2_THREADS) {  // model: copy-loop
        int r = e / CHUNKS, c = e % CHUNKS;
        int row = min(r0 + r, t - 1);
        cp_async16(dst + fa2_at<D>(r, c, r & 7), src + (size_t)row * ld + c * 8);  // model: copy
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

// The 2-stage K/V pipeline: ks and vs are [2][FA2_KEYS][D] (swizzled), tile `it` in stage it & 1;
// the caller loads tile 0 (fa2_kv_load) before its loop and ends every iteration with a barrier.
// At the top of iteration `it`: prefetch tile it + 1 into the other stage (free since that
// barrier), then wait for tile it (at most the prefetch's group stays in flight) and make every
// thread's copies visible to the block.
template <int D>
__device__ __forceinline__ void fa2_kv_ready(bf16* ks, bf16* vs, const bf16* kh, const bf16* vh,
                                             const Fa2Keys& keys, int it, int t, int ld) {
    constexpr int TILE = FA2_KEYS * D;
    if (it + 1 < keys.tiles) {
        int other = ((it & 1) ^ 1) * TILE;
        fa2_kv_load<D>(ks + other, vs + other, kh, vh, keys.first + (it + 1) * FA2_KEYS, t, ld);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}
