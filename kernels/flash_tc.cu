// FlashAttention-2 on tensor cores: nvcuda::wmma 16x16x16 fragments, bf16 in, f32 accumulate,
// head sizes 64 and 128 (a template on D), GQA without repeating K/V, the same one-key-range-
// start-per-row masking as flash_attn.cu (query i attends keys [starts[i], i]). The forward keeps
// the log-sum-exp; the backward is deterministic: dK/dV per key block (walking the query rows
// and the group's query heads) and dQ per query block (walking the key tiles), no atomics.
// CPU reference: terse_model's kernels/flash/cpu.rs; run on the CPU by crates/simt (kernels/shim).
//
// The fragment layout is opaque (WMMA leaves it unspecified), so every row-wise step (masking,
// max, exp, sums, the rescale of the output, the P that feeds the next mma) goes through shared
// memory with an explicit lane mapping: lanes 2r and 2r + 1 own row r of a warp's 16 rows, each
// half of its columns. A __syncwarp follows each store_matrix_sync and precedes a rewrite of a
// buffer a wmma load read; a __syncthreads precedes each restaging of a shared tile.
//
// WMMA loads and stores need 32-byte aligned pointers: every shared tile they touch is declared
// __align__(32), and every fragment's first element sits at a multiple of 32 bytes in it (the
// shim's wmma.h checks each pointer).
//
// Tiles (sm_90: 228 KB of shared memory per SM, at most 48 KB static per block; 255 registers):
// a block is TC_WARPS = 4 warps x 16 rows = 64 rows; the forward and dQ walk TC_KEYS = 32 keys
// at a time, so K and V tiles are 2 x 32 x D bf16 (16 KB at D = 128) and each warp's score and
// probability tiles 16 x 32 (2 KB f32 + 1 KB bf16); the Q tile is staged once (in the K/V tile's
// space) and kept as D / 16 matrix_a fragments, the output as D / 16 accumulators. dK/dV keeps
// the block's 64 K and V rows in shared memory (32 KB at D = 128) and walks 16 query rows at a
// time (Q and dO tiles 2 x 16 x D bf16), accumulating dK and dV in 2 x D / 16 fragments per warp.
#include "common.cuh"
#include <mma.h>

#define TC_WARPS TERSE_FLASH_TC_WARPS
#define TC_ROWS (16 * TC_WARPS)
#define TC_KEYS TERSE_FLASH_TC_KEYS
#define TC_THREADS (32 * TC_WARPS)

typedef __nv_bfloat16 bf16;
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, bf16, nvcuda::wmma::row_major>
    FragA;
// B read from rows of X (B = X^T): element (k, n) is X[n][k].
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, bf16, nvcuda::wmma::col_major>
    FragBt;
// B read as it lies: element (k, n) is X[k][n].
typedef nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, bf16, nvcuda::wmma::row_major>
    FragB;
typedef nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> FragC;

__device__ __forceinline__ bf16 bf_zero() { return __float2bfloat16(0.f); }

// Query i may attend key j.
__device__ __forceinline__ bool allowed(const uint32_t* st, int i, int j, int t) {
    return i < t && j < t && j >= (int)st[i] && j <= i;
}

// Rows [r0, r0 + n) of a (T, D) head into shared (n, LD) (LD = D + PAD: rows padded so the
// fragment loads of consecutive rows fall in different banks), zeros past T; bf16 or f32 source.
template <int D, int LD, typename T>
__device__ void stage(bf16* dst, const T* src, int r0, int n, int t) {
    for (int e = threadIdx.x; e < n * D; e += TC_THREADS) {  // model: stage-loop
        int r = r0 + e / D;
        dst[(e / D) * LD + e % D] =  // model: stage-store
            r < t ? __float2bfloat16(to_f(src[(size_t)r * D + e % D])) : bf_zero();
    }
}

// Shared-memory row padding (bf16 elements): 16 bytes, which keeps every fragment's first
// element 32-byte aligned (16 rows x (D + PAD) x 2 bytes is a multiple of 32).
#define PAD 8

// A warp's 16 x TC_KEYS scores A B^T into `out` (row stride TC_KEYS): A as NF fragments held
// in registers (the warp's 16 query rows), B as TC_KEYS staged key rows of stride LD.
template <int NF, int LD>
__device__ void scores(const FragA* af, const bf16* b, float* out) {
    for (int n = 0; n < TC_KEYS / 16; n++) {  // model: key-tiles
        FragC sf;
        nvcuda::wmma::fill_fragment(sf, 0.f);
        for (int f = 0; f < NF; f++) {  // model: dim-tiles
            FragBt bf;
            nvcuda::wmma::load_matrix_sync(bf, b + (n * 16) * LD + f * 16, LD);  // model: wmma-ld
            nvcuda::wmma::mma_sync(sf, af[f], bf, sf);
        }
        nvcuda::wmma::store_matrix_sync(out + n * 16, sf, TC_KEYS, nvcuda::wmma::mem_row_major);  // model: wmma-keys
    }
}

// A warp's 16 x 16 accumulator scaled row by row (`scale[r]`) through `buf` (16 x 16 f32).
__device__ void scale_rows(FragC& f, float* buf, const float* scale, int lane) {
    nvcuda::wmma::store_matrix_sync(buf, f, 16, nvcuda::wmma::mem_row_major);  // model: wmma-16-st
    __syncwarp();
    for (int e = lane; e < 256; e += 32) buf[e] *= scale[e / 16];  // model: buf-scale
    __syncwarp();
    nvcuda::wmma::load_matrix_sync(f, buf, 16, nvcuda::wmma::mem_row_major);  // model: wmma-16-ld
    __syncwarp();
}

// A warp's 16 x 16 accumulator into rows [row0, row0 + 16) (those < t), columns [col0, +16) of
// a (T, D) f32 output, each row times `scale[r]`, through `buf`.
template <int D>
__device__ void write_rows(float* out, int row0, int col0, int t, FragC& f, float* buf,
                           const float* scale, int lane) {
    nvcuda::wmma::store_matrix_sync(buf, f, 16, nvcuda::wmma::mem_row_major);  // model: wmma-16-st
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {  // model: buf-loop
        int r = row0 + e / 16;
        if (r < t) out[(size_t)r * D + col0 + e % 16] = buf[e] * scale[e / 16];  // model: buf-write
    }
    __syncwarp();
}

// Grid (ceil(T / TC_ROWS), B * Hq). out (B, Hq, T, D) and lse (B, Hq, T), f32.
template <int D>
__device__ void tc_fwd(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                       float* out, float* lse, int hq, int hkv, int t, float scale) {
    constexpr int NF = D / 16, HALF = TC_KEYS / 2, LD = D + PAD;
    __shared__ __align__(32) bf16 kv[2][TC_KEYS][LD];  // the K and V tiles; the Q tile before the walk
    __shared__ __align__(32) float sbuf[TC_WARPS][16][TC_KEYS];
    __shared__ __align__(32) bf16 pbuf[TC_WARPS][16][TC_KEYS];
    __shared__ __align__(32) float obuf[TC_WARPS][16 * 16];
    __shared__ float m_s[TC_WARPS][16], l_s[TC_WARPS][16], c_s[TC_WARPS][16];
    static_assert(2 * TC_KEYS >= TC_ROWS, "the Q tile is staged in the K/V tiles' space");
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int r0 = blockIdx.x * TC_ROWS, bh = blockIdx.y;
    int b = bh / hq, g = b * hkv + (bh % hq) / (hq / hkv);
    const bf16* kh = k + (size_t)g * t * D;
    const bf16* vh = v + (size_t)g * t * D;
    const uint32_t* st = starts + (size_t)b * t;
    bf16* qs = &kv[0][0][0];
    stage<D, LD>(qs, q + (size_t)bh * t * D, r0, TC_ROWS, t);  // model: stage-rows
    __syncthreads();
    FragA qf[NF];
    for (int f = 0; f < NF; f++)  // model: dim-tiles
        nvcuda::wmma::load_matrix_sync(qf[f], qs + (w * 16) * LD + f * 16, LD);  // model: wmma-ld
    FragC of[NF];
    for (int f = 0; f < NF; f++) nvcuda::wmma::fill_fragment(of[f], 0.f);  // model: dim-tiles
    int row = lane / 2, half = lane % 2, i = r0 + w * 16 + row;
    if (half == 0) {
        m_s[w][row] = -INFINITY;  // model: row-state
        l_s[w][row] = 0.f;  // model: row-state
    }
    // The keys the block's rows can see: from its first row's start (starts never decrease)
    // to its last row.
    int last = min(r0 + TC_ROWS, t) - 1;
    int lo = r0 < t ? min((int)st[r0], last + 1) : t;
    __syncthreads();  // every warp holds its Q fragments before the tiles overwrite them
    for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last; k0 += TC_KEYS) {  // model: fwd-main
        stage<D, LD>(&kv[0][0][0], kh, k0, TC_KEYS, t);  // model: stage-keys
        stage<D, LD>(&kv[1][0][0], vh, k0, TC_KEYS, t);  // model: stage-keys
        __syncthreads();
        // S = Q K^T: this warp's 16 rows x TC_KEYS keys.
        scores<NF, LD>(qf, &kv[0][0][0], &sbuf[w][0][0]);
        __syncwarp();
        // Online softmax of row i over this tile: lanes 2r, 2r + 1 take half the keys each.
        float sv[HALF], mx = -INFINITY, mold = m_s[w][row];  // model: row-state
        for (int c = 0; c < HALF; c++) {  // model: half-row
            int col = half * HALF + c;
            float x = allowed(st, i, k0 + col, t) ? sbuf[w][row][col] * scale : -INFINITY;  // model: s-read
            sv[c] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
        float mnew = fmaxf(mold, mx);
        float corr = mnew == -INFINITY ? 1.f : __expf(mold - mnew), sum = 0.f;
        for (int c = 0; c < HALF; c++) {  // model: half-row
            float p = sv[c] == -INFINITY ? 0.f : __expf(sv[c] - mnew);
            sum += p;
            pbuf[w][row][half * HALF + c] = __float2bfloat16(p);  // model: p-write
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        if (half == 0) {
            m_s[w][row] = mnew;  // model: row-state
            l_s[w][row] = l_s[w][row] * corr + sum;  // model: row-state
            c_s[w][row] = corr;  // model: row-state
        }
        // O = O * corr + P V; the rescale's round trip through shared memory is skipped when
        // no row of the warp has a new maximum (corr is exactly 1: the result is the same).
        int rescale = corr != 1.f;
        for (int o = 16; o > 0; o >>= 1) rescale |= __shfl_xor_sync(0xffffffff, rescale, o);
        __syncwarp();
        if (rescale)
            for (int f = 0; f < NF; f++) scale_rows(of[f], obuf[w], c_s[w], lane);  // model: rescale
        FragA pf[TC_KEYS / 16];
        for (int kk = 0; kk < TC_KEYS / 16; kk++)
            nvcuda::wmma::load_matrix_sync(pf[kk], &pbuf[w][0][kk * 16], TC_KEYS);  // model: wmma-p-keys
        for (int f = 0; f < NF; f++)
            for (int kk = 0; kk < TC_KEYS / 16; kk++) {
                FragB vf;
                nvcuda::wmma::load_matrix_sync(vf, &kv[1][kk * 16][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(of[f], pf[kk], vf, of[f]);
            }
        __syncthreads();  // every warp is done with the tiles before they are restaged
    }
    // out = O / l (a row with no key gets 0 and lse = -inf).
    if (half == 0) c_s[w][row] = l_s[w][row] > 0.f ? 1.f / l_s[w][row] : 0.f;  // model: row-state
    __syncwarp();
    for (int f = 0; f < NF; f++)
        write_rows<D>(out + (size_t)bh * t * D, r0 + w * 16, f * 16, t, of[f], obuf[w], c_s[w],
                      lane);
    if (half == 0 && i < t)
        lse[(size_t)bh * t + i] = l_s[w][row] > 0.f ? m_s[w][row] + logf(l_s[w][row]) : -INFINITY;  // model: row-state
}

// dQ: grid and rows as the forward. dq_i = scale * sum_j p_ij (dO_i . v_j - delta_i) k_j.
template <int D>
__device__ void tc_bwd_dq(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                          const float* lse, const float* delta, const float* dout, float* dq,
                          int hq, int hkv, int t, float scale) {
    constexpr int NF = D / 16, HALF = TC_KEYS / 2, LD = D + PAD;
    __shared__ __align__(32) bf16 kv[2][TC_KEYS][LD];
    __shared__ __align__(32) bf16 dos[TC_ROWS][LD];  // the block's dO rows
    __shared__ __align__(32) float sbuf[TC_WARPS][16][TC_KEYS];
    __shared__ __align__(32) bf16 pbuf[TC_WARPS][16][TC_KEYS];
    __shared__ float one[TC_WARPS][16];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int r0 = blockIdx.x * TC_ROWS, bh = blockIdx.y;
    int b = bh / hq, g = b * hkv + (bh % hq) / (hq / hkv);
    const bf16* kh = k + (size_t)g * t * D;
    const bf16* vh = v + (size_t)g * t * D;
    const uint32_t* st = starts + (size_t)b * t;
    stage<D, LD>(&kv[0][0][0], q + (size_t)bh * t * D, r0, TC_ROWS, t);  // model: stage-rows
    stage<D, LD>(&dos[0][0], dout + (size_t)bh * t * D, r0, TC_ROWS, t);  // model: stage-rows
    __syncthreads();
    FragA qf[NF];
    for (int f = 0; f < NF; f++)
        nvcuda::wmma::load_matrix_sync(qf[f], &kv[0][0][0] + (w * 16) * LD + f * 16, LD);  // model: wmma-ld
    FragC acc[NF];
    for (int f = 0; f < NF; f++) nvcuda::wmma::fill_fragment(acc[f], 0.f);
    int row = lane / 2, half = lane % 2, i = r0 + w * 16 + row;
    float l_i = i < t ? lse[(size_t)bh * t + i] : 0.f, d_i = i < t ? delta[(size_t)bh * t + i] : 0.f;
    int last = min(r0 + TC_ROWS, t) - 1;
    int lo = r0 < t ? min((int)st[r0], last + 1) : t;
    if (half == 0) one[w][row] = 1.f;  // model: row-state
    __syncthreads();
    for (int k0 = (lo / TC_KEYS) * TC_KEYS; k0 <= last; k0 += TC_KEYS) {  // model: dq-main
        stage<D, LD>(&kv[0][0][0], kh, k0, TC_KEYS, t);  // model: stage-keys
        stage<D, LD>(&kv[1][0][0], vh, k0, TC_KEYS, t);  // model: stage-keys
        __syncthreads();
        // S = Q K^T, then P = exp(S scale - lse) on the allowed entries.
        scores<NF, LD>(qf, &kv[0][0][0], &sbuf[w][0][0]);
        __syncwarp();
        float p[HALF];
        for (int c = 0; c < HALF; c++) {  // model: half-row
            int col = half * HALF + c;
            p[c] = allowed(st, i, k0 + col, t) ? __expf(sbuf[w][row][col] * scale - l_i) : 0.f;  // model: s-read
        }
        __syncwarp();  // every lane read S before dP overwrites it
        // dP = dO V^T.
        for (int n = 0; n < TC_KEYS / 16; n++) {
            FragC df;
            nvcuda::wmma::fill_fragment(df, 0.f);
            for (int f = 0; f < NF; f++) {
                FragA gf;
                FragBt vf;
                nvcuda::wmma::load_matrix_sync(gf, &dos[w * 16][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::load_matrix_sync(vf, &kv[1][n * 16][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(df, gf, vf, df);
            }
            nvcuda::wmma::store_matrix_sync(&sbuf[w][0][n * 16], df, TC_KEYS,  // model: wmma-keys
                                            nvcuda::wmma::mem_row_major);
        }
        __syncwarp();
        // dS = P (dP - delta) scale, then dQ += dS K.
        for (int c = 0; c < HALF; c++) {  // model: half-row
            int col = half * HALF + c;
            pbuf[w][row][col] = __float2bfloat16(p[c] * (sbuf[w][row][col] - d_i) * scale);  // model: ds-rw
        }
        __syncwarp();
        for (int kk = 0; kk < TC_KEYS / 16; kk++) {
            FragA sf;
            nvcuda::wmma::load_matrix_sync(sf, &pbuf[w][0][kk * 16], TC_KEYS);  // model: wmma-p-keys
            for (int f = 0; f < NF; f++) {
                FragB kf;
                nvcuda::wmma::load_matrix_sync(kf, &kv[0][kk * 16][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(acc[f], sf, kf, acc[f]);
            }
        }
        __syncthreads();
    }
    for (int f = 0; f < NF; f++)
        write_rows<D>(dq + (size_t)bh * t * D, r0 + w * 16, f * 16, t, acc[f], &sbuf[w][0][0],
                      one[w], lane);
}

// dK, dV: grid (ceil(T / TC_ROWS), B * Hkv); warp w owns key rows kb0 + 16w .. + 16 and walks,
// for each query head of its group, the query rows from kb0 until the first that starts after
// the block's last key (starts never decrease), 16 at a time.
template <int D>
__device__ void tc_bwd_dkdv(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                            const float* lse, const float* delta, const float* dout, float* dk,
                            float* dv, int hq, int hkv, int t, float scale) {
    // K and V unpadded: with padding the block's tiles would pass the 48 KB of static shared
    // memory at D = 128.
    constexpr int NF = D / 16, LD = D + PAD;
    __shared__ __align__(32) bf16 ks[TC_ROWS][D], vs[TC_ROWS][D];
    __shared__ __align__(32) bf16 qt[16][LD], gt[16][LD];
    __shared__ float lse_t[16], delta_t[16];
    __shared__ __align__(32) float sbuf[TC_WARPS][16][16];
    __shared__ __align__(32) bf16 pbuf[TC_WARPS][16][16];
    __shared__ float one[TC_WARPS][16];
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int kb0 = blockIdx.x * TC_ROWS, bg = blockIdx.y;
    int b = bg / hkv, g = bg % hkv, rep = hq / hkv;
    const uint32_t* st = starts + (size_t)b * t;
    stage<D, D>(&ks[0][0], k + (size_t)bg * t * D, kb0, TC_ROWS, t);  // model: stage-rows
    stage<D, D>(&vs[0][0], v + (size_t)bg * t * D, kb0, TC_ROWS, t);  // model: stage-rows
    FragC dkf[NF], dvf[NF];
    for (int f = 0; f < NF; f++) {
        nvcuda::wmma::fill_fragment(dkf[f], 0.f);
        nvcuda::wmma::fill_fragment(dvf[f], 0.f);
    }
    int kr = lane / 2, half = lane % 2, j = kb0 + w * 16 + kr;  // this lane's key row
    if (half == 0) one[w][kr] = 1.f;  // model: row-state
    // The query rows any key of the block can reach: [kb0, end).
    int klast = min(kb0 + TC_ROWS, t) - 1, end = kb0;
    while (end < t && (int)st[end] <= klast) end++;
    __syncthreads();
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        size_t base = ((size_t)b * hq + h) * t;
        for (int i0 = (kb0 / 16) * 16; i0 < end; i0 += 16) {  // model: dkdv-main
            stage<D, LD>(&qt[0][0], q + base * D, i0, 16, t);  // model: stage-16
            stage<D, LD>(&gt[0][0], dout + base * D, i0, 16, t);  // model: stage-16
            if (threadIdx.x < 16) {
                int i = i0 + threadIdx.x;
                lse_t[threadIdx.x] = i < t ? lse[base + i] : 0.f;  // model: col-store
                delta_t[threadIdx.x] = i < t ? delta[base + i] : 0.f;  // model: col-store
            }
            __syncthreads();
            // S^T = K Q^T: this warp's 16 keys x 16 queries.
            FragC sf;
            nvcuda::wmma::fill_fragment(sf, 0.f);
            for (int f = 0; f < NF; f++) {
                FragA kf;
                FragBt qf;
                nvcuda::wmma::load_matrix_sync(kf, &ks[w * 16][f * 16], D);  // model: wmma-d
                nvcuda::wmma::load_matrix_sync(qf, &qt[0][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(sf, kf, qf, sf);
            }
            nvcuda::wmma::store_matrix_sync(&sbuf[w][0][0], sf, 16, nvcuda::wmma::mem_row_major);  // model: wmma-16-st
            __syncwarp();
            float p[8];
            for (int c = 0; c < 8; c++) {  // model: col-loop
                int col = half * 8 + c, i = i0 + col;
                p[c] = allowed(st, i, j, t) ? __expf(sbuf[w][kr][col] * scale - lse_t[col]) : 0.f;  // model: scan-read
                pbuf[w][kr][col] = __float2bfloat16(p[c]);  // model: scan-write
            }
            __syncwarp();
            // dV += P^T dO.
            FragA pf;
            nvcuda::wmma::load_matrix_sync(pf, &pbuf[w][0][0], 16);  // model: wmma-p-16
            for (int f = 0; f < NF; f++) {
                FragB gf;
                nvcuda::wmma::load_matrix_sync(gf, &gt[0][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(dvf[f], pf, gf, dvf[f]);
            }
            // dP^T = V dO^T.
            FragC df;
            nvcuda::wmma::fill_fragment(df, 0.f);
            for (int f = 0; f < NF; f++) {
                FragA vf;
                FragBt gf;
                nvcuda::wmma::load_matrix_sync(vf, &vs[w * 16][f * 16], D);  // model: wmma-d
                nvcuda::wmma::load_matrix_sync(gf, &gt[0][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(df, vf, gf, df);
            }
            __syncwarp();  // every lane read S^T and loaded P^T before both are rewritten
            nvcuda::wmma::store_matrix_sync(&sbuf[w][0][0], df, 16, nvcuda::wmma::mem_row_major);  // model: wmma-16-st
            __syncwarp();
            // dS^T = P^T (dP^T - delta) scale, then dK += dS^T Q.
            for (int c = 0; c < 8; c++) {  // model: col-loop
                int col = half * 8 + c;
                pbuf[w][kr][col] = __float2bfloat16(p[c] * (sbuf[w][kr][col] - delta_t[col]) * scale);  // model: scan-rw
            }
            __syncwarp();
            nvcuda::wmma::load_matrix_sync(pf, &pbuf[w][0][0], 16);  // model: wmma-p-16
            for (int f = 0; f < NF; f++) {
                FragB qf;
                nvcuda::wmma::load_matrix_sync(qf, &qt[0][f * 16], LD);  // model: wmma-ld
                nvcuda::wmma::mma_sync(dkf[f], pf, qf, dkf[f]);
            }
            __syncthreads();  // every warp is done with the Q and dO tiles before restaging
        }
    }
    for (int f = 0; f < NF; f++) {
        write_rows<D>(dk + (size_t)bg * t * D, kb0 + w * 16, f * 16, t, dkf[f], &sbuf[w][0][0],
                      one[w], lane);
        write_rows<D>(dv + (size_t)bg * t * D, kb0 + w * 16, f * 16, t, dvf[f], &sbuf[w][0][0],
                      one[w], lane);
    }
}

#define TC_OPS(D)                                                                                \
    extern "C" __global__ void flash_tc_fwd_d##D(const bf16* q, const bf16* k, const bf16* v,    \
                                                 const uint32_t* st, float* out, float* lse,     \
                                                 int hq, int hkv, int t, float scale) {          \
        tc_fwd<D>(q, k, v, st, out, lse, hq, hkv, t, scale);                                     \
    }                                                                                            \
    extern "C" __global__ void flash_tc_bwd_dq_d##D(                                             \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        const float* delta, const float* dout, float* dq, int hq, int hkv, int t, float scale) { \
        tc_bwd_dq<D>(q, k, v, st, lse, delta, dout, dq, hq, hkv, t, scale);                      \
    }                                                                                            \
    extern "C" __global__ void flash_tc_bwd_dkdv_d##D(                                           \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        const float* delta, const float* dout, float* dk, float* dv, int hq, int hkv, int t,     \
        float scale) {                                                                           \
        tc_bwd_dkdv<D>(q, k, v, st, lse, delta, dout, dk, dv, hq, hkv, t, scale);                \
    }

TC_OPS(64)
TC_OPS(128)
