// Flash attention's backward in FlashAttention-2's structure (the forward is flash_fa2.cu's):
// mma.sync m16n8k16 with S, P, dP and dS in registers, Q/dO/K/V fragments by ldmatrix from
// swizzled shared tiles filled by a 2-stage cp.async pipeline. Two kernels:
// - dK/dV (`flash_fa2_bwd_dkdv_d*`): a block owns 64 keys (4 warps x 16); each warp holds its
//   keys' K and V as A fragments and its dK and dV in registers for the whole kernel, and walks
//   every query that can see the block's keys once (each query head of the GQA group in turn),
//   QT queries a step: S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T, dK += dS^T Q.
//   With `dq_atomic` it also adds dQ += dS K for its keys into dq with f32 atomics (dS^T goes
//   through shared memory, each warp takes a quarter of dQ's columns), FlashAttention-2's five
//   matmuls in one pass; dq must start zeroed and its sums depend on the blocks' order.
// - dQ (`flash_fa2_bwd_dq_d*`), the deterministic dQ: the forward's grid and pipeline (64 query
//   rows a block, 64-key tiles of K and V), S = Q K^T, P, dP = dO V^T, dS, dQ += dS K, with Q,
//   dO and dQ in registers. Each dq element is written once, in a fixed order: bit-identical
//   across runs. crates/model's kernels/flash/cuda.rs runs it unless `TERSE_FLASH_DQ_ATOMIC=1`.
// Inputs are the forward's (q, k, v bf16, starts, lse) with delta = rowsum(dO * O) and dO as
// bf16 (B, Hq, T, D); outputs f32. The `_rows` entry points (the written layer backward's) read
// q, k, v, dO and the forward's bf16 O in the projections' rows (B, T, H, D), write dq, dk and
// dv there in bf16, and their dQ kernel computes delta from O and dO and stores it for the
// dK/dV kernel, so no glue runs around the two kernels. The masks and the block order follow
// the forward: query i attends keys [starts[i], i], starts never decrease along a row, so the
// queries a key block can reach are [kb0, end) with `end` found by binary search; the first
// key blocks are the heaviest under causal masks and are the grid's first, the dQ kernel takes
// its row blocks in reverse.
// CPU reference: terse_model's flash/cpu.rs; run on the CPU by crates/simt (kernels/shim).
//
// Registers per thread at D = 128 (dK/dV): K and V fragments 2 x 32, dK and dV 2 x 64, S^T and
// dS^T at QT = 16 queries 2 x 8: about 210 with addresses, within sm_90's 255 (ptxas-check.sh
// fails on a spill); QT = 32 at D = 64. dQ at D = 128: Q and dO 2 x 32, dQ 64, S and dP over 32
// keys at a time 2 x 16.
//
// Shared memory (dynamic; launch::flash_fa2_bwd_dkdv_shared): the block's K and V (64 rows),
// 2 stages of Q and dO (QT rows each), all D bf16 a row, swizzled (fa2.cuh's fa2_at: conflict-free
// ldmatrix and copies, see flash_fa2.cu), dS^T as 64 x (QT + 8) bf16 (padded: an odd number of
// 16-byte units per row, so its transposing ldmatrix and its 4-byte stores are conflict-free),
// and per stage the QT queries' lse, delta and starts: 38,656 bytes at D = 64, 52,608 at
// D = 128. dQ: the forward's 2 stages of K and V.
#include "fa2.cuh"

// Queries per step of the dK/dV kernel by head size; crates/model's launch.rs
// flash_fa2_bwd_queries must agree (simt checks).
#define FA2_BWD_QT_D64 32
#define FA2_BWD_QT_D128 16
// Softmax in base 2: the forward's lse (natural log) times log2 e.
#define LOG2E 1.4426950408889634f

template <int D>
__device__ constexpr int bwd_queries() {
    return D == 64 ? FA2_BWD_QT_D64 : FA2_BWD_QT_D128;
}

// A warp's 16 rows of a head's (T, D) bf16 rows, `ld` apart, as A fragments straight from
// global memory (rows g and g + 8 of the fragment are row[0] and row[1]; rows past T are zeros).
template <int D>
__device__ __forceinline__ void rows_as_a(uint32_t (&fr)[D / 16][4], const bf16* src,
                                          const int* row, int t, int tq, int ld) {
    for (int f = 0; f < D / 16; f++)
        for (int i = 0; i < 4; i++) {
            int r = row[i & 1], c = f * 16 + 2 * tq + 8 * (i >> 1);
            const bf16* at = src + (size_t)min(r, t - 1) * ld + c;
            fr[f][i] = r < t ? bf16x2(to_f(at[0]), to_f(at[1])) : 0u;
        }
}

// delta = rowsum(dO * O) of the lane's two rows from the forward's bf16 O and dO (rows `ld`
// apart): each lane of a quad sums the D / 4 columns of its A fragments' layout, then the quad
// adds its four shares in a fixed order (rows past T give 0). Every lane of the warp takes part
// (the shuffles).
template <int D>
__device__ __forceinline__ void rows_delta(float (&dr)[2], const bf16* o, const bf16* dout,
                                           const int* row, int t, int tq, int ld) {
    for (int h = 0; h < 2; h++) dr[h] = 0.f;
    for (int f = 0; f < D / 16; f++)
        for (int i = 0; i < 4; i++) {
            int h = i & 1, r = row[h], c = f * 16 + 2 * tq + 8 * (i >> 1);
            if (r >= t) continue;
            size_t at = (size_t)r * ld + c;
            dr[h] += to_f(o[at]) * to_f(dout[at]) + to_f(o[at + 1]) * to_f(dout[at + 1]);
        }
    for (int h = 0; h < 2; h++) {
        dr[h] += __shfl_xor_sync(0xffffffff, dr[h], 1);
        dr[h] += __shfl_xor_sync(0xffffffff, dr[h], 2);
    }
}

// Grid (ceil(T / FA2_ROWS), B * Hq), blocks taken in reverse; dq (B, Hq, T, D) f32.
// dq_i = scale * sum_j p_ij (dO_i . v_j - delta_i) k_j. With TOKENS, q, k, v, dO, O and dq are
// the projections' rows (B, T, H, D), dq in G = bf16, and the kernel computes delta itself
// from O and dO and writes it (B, Hq, T) for the dK/dV kernel that runs after it.
template <int D, bool TOKENS, typename G>
__device__ void fa2_bwd_dq(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                           const float* lse, float* delta, const bf16* dout, G* dq,
                           const bf16* o, int hq, int hkv, int t, float scale) {
    constexpr int KF = D / 16, NO = D / 8, TILE = FA2_KEYS * D;
    constexpr int HK = 32, NH = HK / 8;  // keys per half tile and their n-tiles
    constexpr int VROWS = 2 * FA2_KEYS;  // a stage's V tile, in rows after its K tile
    TERSE_DYNAMIC_SHARED(smem);
    bf16* ks = reinterpret_cast<bf16*>(smem);  // [2][FA2_KEYS][D], swizzled
    bf16* vs = ks + 2 * TILE;                  // [2][FA2_KEYS][D], swizzled
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int gq = lane / 4, tq = lane % 4, mi = lane / 8, r = lane % 8;
    int rb = gridDim.x - 1 - blockIdx.x;  // heaviest causal row block first
    int r0 = rb * FA2_ROWS, bh = blockIdx.y;
    int b = bh / hq, g = b * hkv + (bh % hq) / (hq / hkv);
    const int ldq = fa2_ld<TOKENS, D>(hq), ldk = fa2_ld<TOKENS, D>(hkv);
    const size_t qo = fa2_head<TOKENS, D>(bh, hq, t);
    const bf16* kh = k + fa2_head<TOKENS, D>(g, hkv, t);
    const bf16* vh = v + fa2_head<TOKENS, D>(g, hkv, t);
    const uint32_t* st = starts + (size_t)b * t;
    int row[2] = {r0 + w * 16 + gq, r0 + w * 16 + gq + 8};
    int lo_key[2], hi_key[2];
    float lr[2], dr[2];  // the rows' lse (times log2 e, for base 2) and delta
    for (int h = 0; h < 2; h++) {
        bool in = row[h] < t;
        lo_key[h] = in ? (int)st[row[h]] : 1;
        hi_key[h] = in ? row[h] : 0;
        lr[h] = in ? lse[(size_t)bh * t + row[h]] * LOG2E : 0.f;
        if (!TOKENS) dr[h] = in ? delta[(size_t)bh * t + row[h]] : 0.f;
    }
    // As the forward's (flash_fa2.cu): 32 keys need no mask when every valid row of the warp
    // sees all of them; warp-uniform. Rows past T are never written.
    int w_first = r0 + w * 16, w_last = min(w_first + 15, t - 1);
    int w_lo = w_first < t ? (int)st[w_last] : 0, w_hi = w_first < t ? w_first : t;
    const float sl2 = scale * LOG2E;
    uint32_t qf[KF][4], gf[KF][4];
    rows_as_a<D>(qf, q + qo, row, t, tq, ldq);
    rows_as_a<D>(gf, dout + qo, row, t, tq, ldq);
    if (TOKENS) {
        rows_delta<D>(dr, o + qo, dout + qo, row, t, tq, ldq);
        for (int h = 0; h < 2; h++)
            if (tq == 0 && row[h] < t) delta[(size_t)bh * t + row[h]] = dr[h];
    }
    float acc[NO][4];
    for (int n = 0; n < NO; n++)
        for (int i = 0; i < 4; i++) acc[n][i] = 0.f;
    // The forward's key tiles and K/V pipeline (fa2.cuh).
    Fa2Keys keys = fa2_keys(st, r0, t);
    if (keys.tiles > 0) fa2_kv_load<D>(ks, vs, kh, vh, keys.first, t, ldk);
    for (int it = 0; it < keys.tiles; it++) {  // model: dq-main
        int k0 = keys.first + it * FA2_KEYS, s = it & 1;
        fa2_kv_ready<D>(ks, vs, kh, vh, keys, it, t, ldk);
        // The lane's rows of the stage's K tile, by rows and by columns (fa2_lane); the V tile
        // is VROWS rows after it.
        const bf16* kl = fa2_lane<D>(ks + s * TILE, 8 * (mi >> 1) + r, mi & 1, r);
        const bf16* kc = fa2_lane<D>(ks + s * TILE, 8 * (mi & 1) + r, mi >> 1, r);
        for (int half = 0; half < FA2_KEYS / HK; half++) {  // model: dq-halves
            int kb = half * HK;
            // S = Q K^T and dP = dO V^T over 32 keys: B fragments of K and V by ldmatrix.x4 of
            // their rows (matrix mi: keys kb + 8n + 8 (mi >> 1) + r, dims 16f + 8 (mi & 1)).
            float sc[NH][4], dp[NH][4];
            for (int n = 0; n < NH; n++)
                for (int i = 0; i < 4; i++) sc[n][i] = dp[n][i] = 0.f;
            for (int f = 0; f < KF; f++)
                for (int n = 0; n < NH; n += 2) {
                    uint32_t bk[4], bv[4];
                    fa2_ldsm<D, false>(bk, kl, kb + n * 8, 2 * f);  // model: rows-frag
                    mma_bf16_16816(sc[n], qf[f], bk, sc[n]);
                    mma_bf16_16816(sc[n + 1], qf[f], bk + 2, sc[n + 1]);
                    fa2_ldsm<D, false>(bv, kl, VROWS + kb + n * 8, 2 * f);  // model: rows-frag
                    mma_bf16_16816(dp[n], gf[f], bv, dp[n]);
                    mma_bf16_16816(dp[n + 1], gf[f], bv + 2, dp[n + 1]);
                }
            // dS = P (dP - delta) scale in the C fragments: element i of n-tile n is row
            // row[i >> 1], key k0 + kb + 8n + 2 tq + (i & 1). P = 2^(S scale log2 e - lse
            // log2 e), one FMA and one ex2; a masked key's P (possibly inf) is then 0.
            for (int n = 0; n < NH; n++)
                for (int i = 0; i < 4; i++) sc[n][i] = exp2f(fmaf(sc[n][i], sl2, -lr[i >> 1]));
            if (!(k0 + kb >= w_lo && k0 + kb + HK - 1 <= w_hi)) {
                for (int n = 0; n < NH; n++)  // model: begin dq-mask
                    for (int i = 0; i < 4; i++) {
                        int h = i >> 1, j = k0 + kb + n * 8 + 2 * tq + (i & 1);
                        if (j < lo_key[h] || j > hi_key[h]) sc[n][i] = 0.f;
                    }  // model: end dq-mask
            }
            for (int n = 0; n < NH; n++)
                for (int i = 0; i < 4; i++) sc[n][i] *= (dp[n][i] - dr[i >> 1]) * scale;
            // dQ += dS K: dS's A fragments from its C fragments (as the forward's P), K's B
            // fragments by ldmatrix.x4.trans (matrix mi: keys kb + 16kk + 8 (mi & 1) + r, dims
            // 8n + 8 (mi >> 1)).
            for (int kk = 0; kk < HK / 16; kk++) {
                uint32_t sa[4];
                c_pair_as_a(sa, sc[2 * kk], sc[2 * kk + 1]);
                for (int n = 0; n < NO; n += 2) {
                    uint32_t bk[4];
                    fa2_ldsm<D, true>(bk, kc, kb + kk * 16, n);  // model: cols-frag
                    mma_bf16_16816(acc[n], sa, bk, acc[n]);
                    mma_bf16_16816(acc[n + 1], sa, bk + 2, acc[n + 1]);
                }
            }
        }
        __syncthreads();  // every warp is done with stage s before it is refilled
    }
    G* dqh = dq + qo;
    for (int h = 0; h < 2; h++) {
        if (row[h] >= t) continue;
        for (int n = 0; n < NO; n++) {
            G* dst = dqh + (size_t)row[h] * ldq + n * 8 + 2 * tq;
            dst[0] = from_f<G>(acc[n][2 * h]);
            dst[1] = from_f<G>(acc[n][2 * h + 1]);
        }
    }
}

// One step's QT queries of one head into a stage: Q and dO rows (`ld` apart) by cp.async, lse,
// delta and starts by plain stores (a query past T gets start T + 1, which no key reaches).
template <int D, int QT>
__device__ __forceinline__ void load_queries(bf16* qs, bf16* gs, float* ls, float* ds, int* ss,
                                             const bf16* q, const bf16* dout, const float* lse,
                                             const float* delta, const uint32_t* st, int i0,
                                             int t, int ld) {
    load_rows<D, QT>(qs, q, i0, t, ld);  // model: query-rows
    load_rows<D, QT>(gs, dout, i0, t, ld);  // model: query-rows
    for (int e = threadIdx.x; e < QT; e += FA2_THREADS) {  // model: queries-loop, begin queries
        int i = i0 + e;
        ls[e] = i < t ? lse[i] * LOG2E : 0.f;  // model: query-store
        ds[e] = i < t ? delta[i] : 0.f;  // model: query-store
        ss[e] = i < t ? (int)st[i] : t + 1;  // model: query-store
    }  // model: end queries
}

// Grid (ceil(T / FA2_ROWS), B * Hkv); dk, dv (B, Hkv, T, D) f32; dq (B, Hq, T, D), added to
// only when dq_atomic is non-zero. With TOKENS, q, k, v, dO, dk and dv are the projections'
// rows (B, T, H, D), dk and dv in G = bf16, and there is no atomic dQ.
template <int D, bool TOKENS, typename G>
__device__ void fa2_bwd_dkdv(const bf16* q, const bf16* k, const bf16* v, const uint32_t* starts,
                             const float* lse, const float* delta, const bf16* dout, float* dq,
                             G* dk, G* dv, int hq, int hkv, int t, float scale, int dq_atomic) {
    constexpr int KF = D / 16, NO = D / 8;
    constexpr int QT = bwd_queries<D>(), NQ = QT / 8, QTILE = QT * D, LDS = QT + FA2_PAD;
    constexpr int NW = NO / FA2_WARPS;  // dQ n-tiles per warp in the atomic pass
    constexpr int GROWS = 2 * QT;       // a stage's dO tile, in rows after its Q tile
    TERSE_DYNAMIC_SHARED(smem);
    bf16* kvs = reinterpret_cast<bf16*>(smem);  // [2][FA2_ROWS][D]: the block's K, then V
    bf16* qs = kvs + 2 * FA2_ROWS * D;          // [2][QT][D]: Q by stage
    bf16* gs = qs + 2 * QTILE;                  // [2][QT][D]: dO by stage (all swizzled)
    bf16* dss = gs + 2 * QTILE;                 // [FA2_ROWS][LDS]: dS^T (atomic dQ only)
    float* ls = reinterpret_cast<float*>(dss + FA2_ROWS * LDS);  // [2][QT]: lse by stage
    float* ds = ls + 2 * QT;                                     // [2][QT]: delta by stage
    int* ss = reinterpret_cast<int*>(ds + 2 * QT);               // [2][QT]: starts by stage
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int gq = lane / 4, tq = lane % 4, mi = lane / 8, r = lane % 8;
    int kb0 = blockIdx.x * FA2_ROWS, bg = blockIdx.y;
    int b = bg / hkv, rep = hq / hkv, h0 = (bg % hkv) * rep;
    const int ldq = fa2_ld<TOKENS, D>(hq), ldk = fa2_ld<TOKENS, D>(hkv);
    const size_t ko = fa2_head<TOKENS, D>(bg, hkv, t);
    const uint32_t* st = starts + (size_t)b * t;
    load_rows<D, FA2_ROWS>(kvs, k + ko, kb0, t, ldk);  // model: block-rows
    load_rows<D, FA2_ROWS>(kvs + FA2_ROWS * D, v + ko, kb0, t, ldk);  // model: block-rows
    cp_async_commit();
    // The queries the block's keys can reach: [kb0, end), end the first query at or after kb0
    // whose start is past the block's last key (starts never decrease), by binary search.
    int klast = min(kb0 + FA2_ROWS, t) - 1, lo = kb0, hi = t;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((int)st[mid] <= klast)
            lo = mid + 1;
        else
            hi = mid;
    }
    int per = lo > kb0 ? (lo - kb0 + QT - 1) / QT : 0;  // steps per query head
    int steps = rep * per;
    if (steps > 0) {
        size_t base = ((size_t)b * hq + h0) * t;
        size_t qo = fa2_head<TOKENS, D>(b * hq + h0, hq, t);
        load_queries<D, QT>(qs, gs, ls, ds, ss, q + qo, dout + qo, lse + base, delta + base, st,
                            kb0, t, ldq);
        cp_async_commit();
    }
    // The block's K and V (the first group) have landed; the first stage may still be in flight.
    if (steps > 0)
        cp_async_wait<1>();
    else
        cp_async_wait<0>();
    __syncthreads();
    // This warp's 16 keys of K and V as A fragments (matrix mi: key rows 16w + 8 (mi & 1) + r,
    // dims 16f + 8 (mi >> 1)).
    uint32_t kf[KF][4], vf[KF][4];
    for (int f = 0; f < KF; f++) {
        const bf16* ka = fa2_lane<D>(kvs, w * 16 + 8 * (mi & 1) + r, mi >> 1, r);
        fa2_ldsm<D, false>(kf[f], ka, 0, 2 * f);  // model: cols-frag
        fa2_ldsm<D, false>(vf[f], ka, FA2_ROWS, 2 * f);  // model: cols-frag
    }
    float dkf[NO][4], dvf[NO][4];
    for (int n = 0; n < NO; n++)
        for (int i = 0; i < 4; i++) dkf[n][i] = dvf[n][i] = 0.f;
    int key[2] = {kb0 + w * 16 + gq, kb0 + w * 16 + gq + 8};
    const float sl2 = scale * LOG2E;
    for (int s = 0; s < steps; s++) {  // model: dkdv-main
        int h = h0 + s / per, i0 = kb0 + (s % per) * QT, sb = s & 1;
        if (s + 1 < steps) {
            int hn = h0 + (s + 1) / per, in = kb0 + ((s + 1) % per) * QT, o = sb ^ 1;
            size_t base = ((size_t)b * hq + hn) * t;
            size_t qo = fa2_head<TOKENS, D>(b * hq + hn, hq, t);
            load_queries<D, QT>(qs + o * QTILE, gs + o * QTILE, ls + o * QT, ds + o * QT,
                                ss + o * QT, q + qo, dout + qo, lse + base, delta + base, st, in,
                                t, ldq);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // this stage's copies and stores are visible to the block
        // The lane's rows of the stage's Q tile, by rows and by columns (fa2_lane); its dO tile
        // is GROWS rows after it.
        const bf16* ql = fa2_lane<D>(qs + sb * QTILE, 8 * (mi >> 1) + r, mi & 1, r);
        const bf16* qc = fa2_lane<D>(qs + sb * QTILE, 8 * (mi & 1) + r, mi >> 1, r);
        const float* lt = ls + sb * QT;
        const float* dt = ds + sb * QT;
        const int* sst = ss + sb * QT;
        // S^T = K Q^T and dP^T = V dO^T, 16 keys x QT queries: B fragments by ldmatrix.x4 of
        // Q's and dO's rows (matrix mi: queries 8n + 8 (mi >> 1) + r, dims 16f + 8 (mi & 1)).
        float sc[NQ][4], dp[NQ][4];
        for (int n = 0; n < NQ; n++)
            for (int i = 0; i < 4; i++) sc[n][i] = dp[n][i] = 0.f;
        for (int f = 0; f < KF; f++)
            for (int n = 0; n < NQ; n += 2) {
                uint32_t bq[4], bo[4];
                fa2_ldsm<D, false>(bq, ql, n * 8, 2 * f);  // model: rows-frag
                mma_bf16_16816(sc[n], kf[f], bq, sc[n]);
                mma_bf16_16816(sc[n + 1], kf[f], bq + 2, sc[n + 1]);
                fa2_ldsm<D, false>(bo, ql, GROWS + n * 8, 2 * f);  // model: rows-frag
                mma_bf16_16816(dp[n], vf[f], bo, dp[n]);
                mma_bf16_16816(dp[n + 1], vf[f], bo + 2, dp[n + 1]);
            }
        // P^T and dS^T = P^T (dP^T - delta) scale: element i of n-tile n is key key[i >> 1],
        // query i0 + 8n + 2 tq + (i & 1). P = 2^(S scale log2 e - lse log2 e) (the stage's
        // lse is stored times log2 e); a masked query's P (possibly inf) is then 0. No mask
        // when every query of the step sees all 16 of the warp's keys (warp-uniform): the
        // step's last start (starts never decrease; a query past T has T + 1) at or before
        // the first key, and its first query at or after the last key.
        for (int n = 0; n < NQ; n++)
            for (int i = 0; i < 4; i++) {
                int c = n * 8 + 2 * tq + (i & 1);
                sc[n][i] = exp2f(fmaf(sc[n][i], sl2, -lt[c]));  // model: column-read
            }
        if (!(sst[QT - 1] <= kb0 + w * 16 && i0 >= kb0 + w * 16 + 15)) {
            for (int n = 0; n < NQ; n++)  // model: begin dkdv-mask
                for (int i = 0; i < 4; i++) {
                    int c = n * 8 + 2 * tq + (i & 1), j = key[i >> 1];
                    if (j < sst[c] || j > i0 + c) sc[n][i] = 0.f;
                }  // model: end dkdv-mask
        }
        for (int n = 0; n < NQ; n++)
            for (int i = 0; i < 4; i++) {
                int c = n * 8 + 2 * tq + (i & 1);
                dp[n][i] = sc[n][i] * (dp[n][i] - dt[c]) * scale;  // model: column-read
            }
        // dV += P^T dO and dK += dS^T Q: A fragments from the C fragments (queries 16kk..), B
        // fragments of dO and Q by ldmatrix.x4.trans (matrix mi: queries 16kk + 8 (mi & 1) + r,
        // dims 8n + 8 (mi >> 1)).
        for (int kk = 0; kk < QT / 16; kk++) {
            uint32_t pa[4];
            c_pair_as_a(pa, sc[2 * kk], sc[2 * kk + 1]);
            uint32_t da[4];
            c_pair_as_a(da, dp[2 * kk], dp[2 * kk + 1]);
            for (int n = 0; n < NO; n += 2) {
                uint32_t bo[4], bq[4];
                fa2_ldsm<D, true>(bo, qc, GROWS + kk * 16, n);  // model: cols-frag
                mma_bf16_16816(dvf[n], pa, bo, dvf[n]);
                mma_bf16_16816(dvf[n + 1], pa, bo + 2, dvf[n + 1]);
                fa2_ldsm<D, true>(bq, qc, kk * 16, n);  // model: cols-frag
                mma_bf16_16816(dkf[n], da, bq, dkf[n]);
                mma_bf16_16816(dkf[n + 1], da, bq + 2, dkf[n + 1]);
            }
        }
        if (!TOKENS && dq_atomic) {  // model: atomic-if
            // dS^T into shared memory (this warp's 16 key rows), then dQ (QT x D) += dS  // model: begin atomic
            // (QT x 64 keys) K (64 keys x D), warp w taking columns [w D / 4, (w + 1) D / 4).
            for (int n = 0; n < NQ; n++)
                for (int i = 0; i < 4; i++)
                    dss[(w * 16 + gq + 8 * (i >> 1)) * LDS + n * 8 + 2 * tq + (i & 1)] =  // model: dss-store
                        __float2bfloat16(dp[n][i]);  // model: dss-store
            __syncthreads();
            float* dqh = dq + ((size_t)b * hq + h) * t * D;
            // K's .trans B fragments of this warp's quarter of the columns (fa2_lane).
            const bf16* kw = fa2_lane<D>(kvs, 8 * (mi & 1) + r, (w * (D / 8 / FA2_WARPS)) ^ (mi >> 1), r);
            for (int m = 0; m < QT / 16; m++) {
                float acc[NW][4];
                for (int n = 0; n < NW; n++)
                    for (int i = 0; i < 4; i++) acc[n][i] = 0.f;
                for (int kk = 0; kk < FA2_ROWS / 16; kk++) {
                    // dS's A fragment from dS^T by ldmatrix.x4.trans (matrix mi: key rows
                    // 16kk + 8 (mi >> 1) + r, queries 16m + 8 (mi & 1)).
                    uint32_t sa[4];
                    ldmatrix_x4_trans(sa, dss + (kk * 16 + 8 * (mi >> 1) + r) * LDS + m * 16 +  // model: atomic-frag
                                              8 * (mi & 1));  // model: atomic-frag
                    for (int n = 0; n < NW; n += 2) {
                        uint32_t bk[4];
                        fa2_ldsm<D, true>(bk, kw, kk * 16, n);  // model: atomic-frag
                        mma_bf16_16816(acc[n], sa, bk, acc[n]);
                        mma_bf16_16816(acc[n + 1], sa, bk + 2, acc[n + 1]);
                    }
                }
                for (int n = 0; n < NW; n++)
                    for (int i = 0; i < 4; i++) {
                        int qi = i0 + m * 16 + gq + 8 * (i >> 1);
                        int col = w * (D / FA2_WARPS) + n * 8 + 2 * tq + (i & 1);
                        if (qi < t) atomicAdd(dqh + (size_t)qi * D + col, acc[n][i]);
                    }
            }  // model: end atomic
        }
        __syncthreads();  // stage sb (and dS^T) are free for the next step's writes  // model: after-atomic
    }
    for (int h = 0; h < 2; h++) {
        if (key[h] >= t) continue;
        size_t at = ko + (size_t)key[h] * ldk + 2 * tq;
        for (int n = 0; n < NO; n++) {
            dk[at + n * 8] = from_f<G>(dkf[n][2 * h]);
            dk[at + n * 8 + 1] = from_f<G>(dkf[n][2 * h + 1]);
            dv[at + n * 8] = from_f<G>(dvf[n][2 * h]);
            dv[at + n * 8 + 1] = from_f<G>(dvf[n][2 * h + 1]);
        }
    }
}

#define FA2_BWD_OPS(D, DKDV_MIN_BLOCKS)                                                          \
    extern "C" __global__ void flash_fa2_bwd_dq_d##D(                                            \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        const float* delta, const bf16* dout, float* dq, int hq, int hkv, int t, float scale) {  \
        fa2_bwd_dq<D, false, float>(q, k, v, st, lse, const_cast<float*>(delta), dout, dq,       \
                                    nullptr, hq, hkv, t, scale);                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(FA2_THREADS, DKDV_MIN_BLOCKS)                  \
        flash_fa2_bwd_dkdv_d##D(                                                                 \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        const float* delta, const bf16* dout, float* dq, float* dk, float* dv, int hq, int hkv,  \
        int t, float scale, int dq_atomic) {                                                     \
        fa2_bwd_dkdv<D, false, float>(q, k, v, st, lse, delta, dout, dq, dk, dv, hq, hkv, t,     \
                                      scale, dq_atomic);                                         \
    }                                                                                            \
    extern "C" __global__ void flash_fa2_bwd_dq_rows_d##D(                                       \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        float* delta, const bf16* dout, bf16* dq, const bf16* o, int hq, int hkv, int t,         \
        float scale) {                                                                           \
        fa2_bwd_dq<D, true, bf16>(q, k, v, st, lse, delta, dout, dq, o, hq, hkv, t, scale);      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(FA2_THREADS, DKDV_MIN_BLOCKS)                  \
        flash_fa2_bwd_dkdv_rows_d##D(                                                            \
        const bf16* q, const bf16* k, const bf16* v, const uint32_t* st, const float* lse,       \
        const float* delta, const bf16* dout, bf16* dk, bf16* dv, int hq, int hkv, int t,        \
        float scale) {                                                                           \
        fa2_bwd_dkdv<D, true, bf16>(q, k, v, st, lse, delta, dout, nullptr, dk, dv, hq, hkv, t,  \
                                    scale, 0);                                                   \
    }

// dK/dV at D = 64 held to 3 blocks an SM (168 registers, no spill): unconstrained it takes
// 169, which the register file's granularity rounds to 2 blocks.
FA2_BWD_OPS(64, 3)
FA2_BWD_OPS(128, 1)
