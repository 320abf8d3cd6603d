// The tile geometry and the tile copy shared by FlashAttention-2's forward (flash_fa2.cu) and
// backward (flash_fa2_bwd.cu): blocks of FA2_WARPS warps x 16 rows, 64-key tiles, shared rows
// padded by 16 bytes, filled by 16-byte cp.async copies (the padding argument is
// flash_fa2.cu's header).
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

// Rows [r0, r0 + ROWS) of one (T, D) bf16 matrix into a shared tile (ROWS, D + FA2_PAD) as
// 16-byte cp.async copies by the whole block. Rows past T copy row T - 1 instead (the
// buffer's last valid row, so nothing is read past it): the kernels mask those rows, so what
// they hold only ever meets a zero.
template <int D, int ROWS>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* src, int r0, int t) {
    constexpr int CHUNKS = D / 8, LD = D + FA2_PAD;
    for (int e = threadIdx.x; e < ROWS * CHUNKS; e += FA2_THREADS) {
        int r = e / CHUNKS, c = e % CHUNKS;
        int row = min(r0 + r, t - 1);
        cp_async16(dst + r * LD + c * 8, src + (size_t)row * D + c * 8);
    }
}
