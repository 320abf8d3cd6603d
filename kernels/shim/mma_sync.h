// The SIMT shim's twin of kernels/mma.cuh (the inline-PTX header): mma.sync m16n8k16 bf16 and
// ldmatrix m8n8 as warp collectives (every lane hands its registers or row address to the
// warp through `gather`, then computes its own share) that follow the PTX ISA's documented
// element mapping, cp.async as a copy done at the wait, and dynamic shared memory as the
// launch's buffer. A kernel that assumes another layout, reads a cp.async destination before
// waiting, or gives a misaligned row address reads wrong values or fails the launch here.
#pragma once
#include "cuda_shim.h"

namespace terse_shim {
// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type": g = lane / 4 (the
// groupID), t = lane % 4 (the threadID_in_group). Element h (0: low half, 1: high) of register
// i of a lane, as (row, column) of the matrix it belongs to.
struct RowCol {
    int row, col;
};
// A, 16 x 16: a0..a7 in four .b32; rows g (a0, a1, a4, a5) and g + 8 (a2, a3, a6, a7),
// columns 2t + (element & 1), + 8 for a4..a7.
inline RowCol frag_a(int lane, int i, int h) {
    return {lane / 4 + 8 * (i & 1), 2 * (lane % 4) + h + 8 * (i >> 1)};
}
// B, 16 x 8: b0..b3 in two .b32; rows 2t + (element & 1), + 8 for b2, b3; column g.
inline RowCol frag_b(int lane, int i, int h) { return {2 * (lane % 4) + h + 8 * i, lane / 4}; }
// C and D, 16 x 8 f32: c0..c3; rows g (c0, c1) and g + 8 (c2, c3), columns 2t + (i & 1).
inline RowCol frag_c(int lane, int i) { return {lane / 4 + 8 * (i >> 1), 2 * (lane % 4) + (i & 1)}; }

inline float bf16_half(uint32_t r, int h) { return bf16_to_f32((uint16_t)(r >> (16 * h))); }

// d = a b + c over the warp (the register conventions are kernels/mma.cuh's).
inline void mma_bf16(int line, float* d, const uint32_t* a, const uint32_t* b, const float* c) {
    struct Regs {
        uint32_t a[4], b[2];
        float c[4];
    };
    Regs mine, all[32];
    for (int i = 0; i < 4; i++) mine.a[i] = a[i], mine.c[i] = c[i];
    for (int i = 0; i < 2; i++) mine.b[i] = b[i];
    gather(&mine, sizeof mine, all, line);
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) {
                RowCol p = frag_a(l, i, h);
                A[p.row][p.col] = bf16_half(all[l].a[i], h);
            }
        for (int i = 0; i < 2; i++)
            for (int h = 0; h < 2; h++) {
                RowCol p = frag_b(l, i, h);
                B[p.row][p.col] = bf16_half(all[l].b[i], h);
            }
        for (int i = 0; i < 4; i++) {
            RowCol p = frag_c(l, i);
            C[p.row][p.col] = all[l].c[i];
        }
    }
    int lane = lane_id();
    for (int i = 0; i < 4; i++) {
        RowCol p = frag_c(lane, i);
        float s = C[p.row][p.col];
        for (int k = 0; k < 16; k++) s += A[p.row][k] * B[k][p.col];
        d[i] = s;
    }
}

// PTX ISA, "Warp-level matrix load instruction: ldmatrix": for .x1/.x2/.x4, lanes 8i..8i+7
// give the row addresses of matrix i (each row 16 bytes, 16-byte aligned); lane l receives of
// matrix i the row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1, or with .trans the column
// l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1.
inline void ldmatrix(int line, uint32_t* r, const void* row, int count, bool trans) {
    const void* rows[32];
    gather(&row, sizeof row, rows, line);
    for (int m = 0; m < 8 * count; m++)
        if (reinterpret_cast<uintptr_t>(rows[m]) % 16)
            fail("an ldmatrix row address that is not 16-byte aligned");
    int lane = lane_id();
    for (int m = 0; m < count; m++) {
        uint32_t v = 0;
        for (int h = 0; h < 2; h++) {
            int rr = trans ? 2 * (lane % 4) + h : lane / 4;
            int cc = trans ? lane / 4 : 2 * (lane % 4) + h;
            uint16_t e;
            std::memcpy(&e, static_cast<const unsigned char*>(rows[8 * m + rr]) + 2 * cc, 2);
            v |= (uint32_t)e << (16 * h);
        }
        r[m] = v;
    }
}

inline const void* xor_address(const void* base, uint32_t x, uint32_t add) {
    return (const unsigned char*)((uintptr_t)base ^ x) + add;
}

inline uint32_t bf16x2(float lo, float hi) {
    return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16);
}
}  // namespace terse_shim

// The device names of kernels/mma.cuh; the collectives carry their call site (a warp whose
// lanes reach them from different lines fails the launch, as for the shuffles).
#define mma_bf16_16816(...) terse_shim::mma_bf16(__LINE__, __VA_ARGS__)
#define ldmatrix_x4(r, p) terse_shim::ldmatrix(__LINE__, r, p, 4, false)
#define ldmatrix_x4_trans(r, p) terse_shim::ldmatrix(__LINE__, r, p, 4, true)
// The swizzled-row forms: the shim's dynamic shared memory is 128-byte aligned, as the device's,
// so XORing the host address's low bits moves it within the tile exactly as the device's.
#define ldmatrix_x4_xor(r, base, x, add) \
    terse_shim::ldmatrix(__LINE__, r, terse_shim::xor_address(base, x, add), 4, false)
#define ldmatrix_x4_trans_xor(r, base, x, add) \
    terse_shim::ldmatrix(__LINE__, r, terse_shim::xor_address(base, x, add), 4, true)
#define ldmatrix_x2(r, p) terse_shim::ldmatrix(__LINE__, r, p, 2, false)
#define ldmatrix_x2_trans(r, p) terse_shim::ldmatrix(__LINE__, r, p, 2, true)
inline void cp_async16(void* dst, const void* src) { terse_shim::async_copy16(dst, src); }
inline void cp_async_commit() { terse_shim::async_commit(); }
template <int Pending>
inline void cp_async_wait() {
    terse_shim::async_wait(Pending);
}
#define TERSE_DYNAMIC_SHARED(name) unsigned char* const name = terse_shim::dynamic_shared()
using terse_shim::bf16x2;
