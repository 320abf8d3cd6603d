// Flash attention's forward in FlashAttention-2's structure: mma.sync m16n8k16 (bf16 in, f32
// accumulate) with the fragment layout of kernels/mma.cuh, S, P and O held in registers, K and V
// through ldmatrix (V with .trans) from a swizzled shared layout filled by a 2-stage cp.async
// pipeline. Head sizes 64 and 128 (a template on D); the `_rows` entry points read and write
// the projections' token-major rows, out in bf16 (the written layer backward's). The interface
// and semantics are flash_tc.cu's forward, which it replaces (kernels/flash/cuda.rs chooses): q,
// k, v (bf16), starts (query i attends keys [starts[i], i], which covers causal, padding and
// packing), GQA without repeating K/V, out (f32) and the log-sum-exp per row. The backward is
// flash_fa2_bwd.cu's; the geometry and the tile copy both use are kernels/fa2.cuh's.
// CPU reference: terse_model's flash/cpu.rs; run on the CPU by crates/simt (kernels/shim).
//
// Tiles: a block is FA2_WARPS = TERSE_FLASH_TC_WARPS (4) warps x 16 query rows = 64 rows, each
// warp walking the same FA2_KEYS = 64-key tiles. Per thread at D = 128 that is Q as 8 A
// fragments (32 registers), one 16 x 64 S tile (32) and O (64): about 150 registers with
// addresses and the softmax state, within sm_90's 255 and without spills; 32 rows per warp (FA2's
// 128 x 64 with 4 warps) would double O and S and spill at D = 128 unless Q is re-read from
// shared memory every tile. 8 warps x 16 rows (128 rows) would halve the K/V loads per query
// row but not the shared-memory reads per mma (each warp reads every K/V fragment itself), and
// 64-row blocks balance causal work finer; so 4 warps, and the block order is reversed so the
// heaviest causal row blocks (the last) start first.
//
// Shared memory (dynamic, launch::flash_fa2_fwd's `shared`): 2 stages x (K, V) x 64 rows x D
// bf16: 32,768 bytes at D = 64, 65,536 at D = 128 (above 48 KB: the CUDA launch raises the
// function's limit). The layout is SWIZZLED (fa2.cuh's fa2_at): row r's 16-byte chunk c sits at
// chunk c ^ (r % 8). An ldmatrix reads 8 rows of 16 bytes per matrix, rows r..r+7 at one logical
// chunk, which the XOR puts in 8 distinct 16-byte bank groups: conflict-free. A quarter-warp's
// cp.async copies one row's aligned 128 bytes into the same aligned 128 bytes, permuted: one
// wavefront. The rows were padded to D + 8 until 2026-12-07; Nsight Compute on the H200 counted
// 25 % of the forward's shared wavefronts as excessive, from the copies into rows that then
// started off a 128-byte boundary (docs/gpu/measured/2026-12-04/ncu_flash.csv).
#include "fa2.cuh"

// Grid (ceil(T / FA2_ROWS), B * Hq), blocks taken in reverse. q, k, v and out in attention's
// layout (B, H, T, D), out f32; or with TOKENS in the projections' rows (B, T, H, D), out in
// O = bf16 (the written layer backward's: no transposing copy and no cast around the kernel).
// lse (B, Hq, T) f32 either way.
template <int D, bool TOKENS, typename O>
__device__ void fa2_fwd(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                        O* out, float* lse, int hq, int hkv, int t, float scale) {
    constexpr int KF = D / 16;        // k-steps of S = Q K^T (Q's A fragments)
    constexpr int NS = FA2_KEYS / 8;  // n-tiles of S (8 keys each)
    constexpr int NO = D / 8;         // n-tiles of O (8 columns each)
    constexpr int TILE = FA2_KEYS * D;
    TERSE_DYNAMIC_SHARED(smem);
    bf16* ks = reinterpret_cast<bf16*>(smem);  // [2][FA2_KEYS][D], swizzled
    bf16* vs = ks + 2 * TILE;                  // [2][FA2_KEYS][D], swizzled
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int gq = lane / 4, tq = lane % 4;  // the fragments' groupID and threadID_in_group
    int rb = gridDim.x - 1 - blockIdx.x;  // heaviest causal row block first
    int r0 = rb * FA2_ROWS, bh = blockIdx.y;
    int b = bh / hq, g = b * hkv + (bh % hq) / (hq / hkv);
    const int ldq = fa2_ld<TOKENS, D>(hq), ldk = fa2_ld<TOKENS, D>(hkv);
    const bf16* kh = k + fa2_head<TOKENS, D>(g, hkv, t);
    const bf16* vh = v + fa2_head<TOKENS, D>(g, hkv, t);
    const bf16* qh = q + fa2_head<TOKENS, D>(bh, hq, t);
    const uint32_t* st = starts + (size_t)b * t;
    // This lane's two rows: g and g + 8 of the warp's 16.
    int row[2] = {r0 + w * 16 + gq, r0 + w * 16 + gq + 8};
    int lo_key[2];  // row i attends [st[i], i]; an empty range past T
    for (int h = 0; h < 2; h++) lo_key[h] = row[h] < t ? (int)st[row[h]] : 1;
    // A key tile needs no mask when every valid row of the warp sees all of it: starts never
    // decrease, so that is k0 >= the last valid row's start and k0 + 63 <= the first row.
    // Rows past T are never written, so what they compute does not matter. Warp-uniform: a
    // causal row block masks only its diagonal tiles (and packing the tiles on a boundary).
    int w_first = r0 + w * 16, w_last = min(w_first + 15, t - 1);
    int w_lo = w_first < t ? (int)st[w_last] : 0, w_hi = w_first < t ? w_first : t;
    // Q once, straight into A fragments (rows past T are zeros).
    uint32_t qf[KF][4];
    for (int f = 0; f < KF; f++)
        for (int i = 0; i < 4; i++) {
            int r = row[i & 1], c = f * 16 + 2 * tq + 8 * (i >> 1);
            qf[f][i] = r < t ? bf16x2(to_f(qh[(size_t)r * ldq + c]),
                                      to_f(qh[(size_t)r * ldq + c + 1]))
                             : 0u;
        }
    float o[NO][4];
    for (int n = 0; n < NO; n++)
        for (int i = 0; i < 4; i++) o[n][i] = 0.f;
    // Softmax in base 2 with the scale folded in: p = 2^(s sl2 - m sl2), one FMA and one ex2 an
    // element, where m is the running max of the raw scores (scale > 0, so it is the scaled
    // scores' max too) and l this lane's share of the running sum, per row.
    const float sl2 = scale * 1.4426950408889634f;  // scale log2(e)
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    // The key tiles the block's rows can see, through the 2-stage K/V pipeline (fa2.cuh).
    Fa2Keys keys = fa2_keys(st, r0, t);
    if (keys.tiles > 0) fa2_kv_load<D>(ks, vs, kh, vh, keys.first, t, ldk);
    for (int it = 0; it < keys.tiles; it++) {  // model: main
        int k0 = keys.first + it * FA2_KEYS, s = it & 1;
        fa2_kv_ready<D>(ks, vs, kh, vh, keys, it, t, ldk);  // model: kv-ready
        int mi = lane / 8, r = lane % 8;
        // The lane's rows of the stage's K and V tiles (fa2.cuh's fa2_lane).
        const bf16* kl = fa2_lane<D>(ks + s * TILE, 8 * (mi >> 1) + r, mi & 1, r);
        const bf16* vl = fa2_lane<D>(vs + s * TILE, 8 * (mi & 1) + r, mi >> 1, r);
        // S = Q K^T, 16 x 64 per warp. ldmatrix.x4 gives two n-tiles' B fragments: matrix i
        // (lanes 8i..8i+7) is keys n0 + 8 (i >> 1) + r, dims f * 16 + 8 (i & 1).
        float sc[NS][4];
        for (int n = 0; n < NS; n++)
            for (int i = 0; i < 4; i++) sc[n][i] = 0.f;
        for (int f = 0; f < KF; f++)
            for (int n = 0; n < NS; n += 2) {
                uint32_t bk[4];
                fa2_ldsm<D, false>(bk, kl, n * 8, 2 * f);  // model: k-frag
                mma_bf16_16816(sc[n], qf[f], bk, sc[n]);
                mma_bf16_16816(sc[n + 1], qf[f], bk + 2, sc[n + 1]);
            }
        // Online softmax, in the C fragments: element i of n-tile n is row (i >> 1), key
        // k0 + 8 n + 2 tq + (i & 1); the four lanes of a quad share a row. Masked keys are
        // -inf, which the FMA and ex2 below turn into 0.
        if (!(k0 >= w_lo && k0 + FA2_KEYS - 1 <= w_hi)) {
            for (int n = 0; n < NS; n++)  // model: begin mask
                for (int i = 0; i < 4; i++) {
                    int h = i >> 1, j = k0 + n * 8 + 2 * tq + (i & 1);
                    if (j < lo_key[h] || j > row[h]) sc[n][i] = -INFINITY;
                }  // model: end mask
        }
        float mx[2] = {-INFINITY, -INFINITY};
        for (int n = 0; n < NS; n++)
            for (int i = 0; i < 4; i++) mx[i >> 1] = fmaxf(mx[i >> 1], sc[n][i]);
        float corr[2], msl2[2];
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffff, mx[h], 2));
            float mnew = fmaxf(m[h], mx[h]);
            // A row with no key so far keeps max -inf: its p are 0 (2^-inf), its corr 1.
            msl2[h] = mnew == -INFINITY ? 0.f : mnew * sl2;
            corr[h] = mnew == -INFINITY ? 1.f : exp2f(fmaf(m[h], sl2, -msl2[h]));
            m[h] = mnew;
            l[h] *= corr[h];
        }
        // P = 2^(S sl2 - m sl2), and O rescaled by corr, all in registers.
        for (int n = 0; n < NS; n++)
            for (int i = 0; i < 4; i++) {
                float p = exp2f(fmaf(sc[n][i], sl2, -msl2[i >> 1]));
                sc[n][i] = p;
                l[i >> 1] += p;
            }
        for (int n = 0; n < NO; n++)
            for (int i = 0; i < 4; i++) o[n][i] *= corr[i >> 1];
        // O += P V: P's A fragment for keys [16 kk, 16 kk + 16) is S's C fragments of n-tiles
        // 2 kk and 2 kk + 1 as bf16 pairs (rows g, g + 8; columns 2 tq, 2 tq + 8). V's B
        // fragments by ldmatrix.x4.trans: matrix i is keys 16 kk + 8 (i & 1) + r, dims
        // n * 8 + 8 (i >> 1), so registers 0-1 serve O's n-tile n and 2-3 n-tile n + 1.
        for (int kk = 0; kk < FA2_KEYS / 16; kk++) {
            uint32_t pa[4];
            c_pair_as_a(pa, sc[2 * kk], sc[2 * kk + 1]);
            for (int n = 0; n < NO; n += 2) {
                uint32_t bv[4];
                fa2_ldsm<D, true>(bv, vl, kk * 16, n);  // model: v-frag
                mma_bf16_16816(o[n], pa, bv, o[n]);
                mma_bf16_16816(o[n + 1], pa, bv + 2, o[n + 1]);
            }
        }
        __syncthreads();  // every warp is done with stage s before it is refilled
    }
    // The quad's shares of each row's sum; out = O / l (a row with no key: 0, lse = -inf).
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffff, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffff, l[h], 2);
    }
    O* oh = out + fa2_head<TOKENS, D>(bh, hq, t);
    for (int h = 0; h < 2; h++) {
        if (row[h] >= t) continue;
        float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        for (int n = 0; n < NO; n++) {
            O* dst = oh + (size_t)row[h] * ldq + n * 8 + 2 * tq;
            dst[0] = from_f<O>(o[n][2 * h] * inv);
            dst[1] = from_f<O>(o[n][2 * h + 1] * inv);
        }
        if (tq == 0)
            lse[(size_t)bh * t + row[h]] = l[h] > 0.f ? m[h] * scale + logf(l[h]) : -INFINITY;
    }
}

#define FA2_OPS(D)                                                                                \
    extern "C" __global__ void flash_fa2_fwd_d##D(const bf16* q, const bf16* k, const bf16* v,    \
                                                  const uint32_t* st, float* out, float* lse,     \
                                                  int hq, int hkv, int t, float scale) {          \
        fa2_fwd<D, false, float>(q, k, v, st, out, lse, hq, hkv, t, scale);                       \
    }                                                                                             \
    extern "C" __global__ void flash_fa2_fwd_rows_d##D(const bf16* q, const bf16* k,              \
                                                       const bf16* v, const uint32_t* st,         \
                                                       bf16* out, float* lse, int hq, int hkv,    \
                                                       int t, float scale) {                      \
        fa2_fwd<D, true, bf16>(q, k, v, st, out, lse, hq, hkv, t, scale);                         \
    }

// No __launch_bounds__: held to 3 blocks an SM (168 registers), D = 128 spills 8 bytes that the
// main loop reloads every tile (ptxas-check refuses it), so it takes 2 (see
// docs/gpu/predictions/flash-2026-12-07.md).
FA2_OPS(64)
FA2_OPS(128)
