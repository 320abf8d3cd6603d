// The one place kernels/ may use inline PTX: mma.sync m16n8k16 (bf16 in, f32 accumulate),
// ldmatrix m8n8 (.x2/.x4, plain and .trans), 16-byte cp.async with its commit and wait, and
// dynamic shared memory. On the device (nvcc) each is one PTX instruction; under the SIMT shim
// (host C++) the same names come from kernels/shim/mma_sync.h, which emulates mma.sync and
// ldmatrix as warp collectives with the PTX ISA's element mapping and completes cp.async only
// at its wait. crates/simt's portable-subset test allows `asm` only here and only these
// instructions; crates/simt/src/lib_tests/fragments.rs checks the shim's mapping against the ISA.
//
// Register conventions (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
// type"): with g = lane / 4 and t = lane % 4, A (16 x 16, row-major) is 4 x .b32, each two
// bf16 with the lower column in the low half: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..],
// a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]. B (16 x 8, "col") is 2 x .b32:
// b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]. C and D (16 x 8, f32) are 4 floats:
// c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1].
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_bf16.h>

// A shared-memory address as the .shared state space sees it.
__device__ __forceinline__ uint32_t terse_smem(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// d = a b + c for one warp (see the register conventions above).
__device__ __forceinline__ void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b,
                                               const float* c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
                   "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// Four 8 x 8 bf16 matrices from shared memory: lane 8i + r gives the address of row r of
// matrix i (16 bytes, 16-byte aligned); r[i] of lane l is matrix i's row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 (.trans: column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1).
__device__ __forceinline__ void ldmatrix_x4_at(uint32_t* r, uint32_t shared_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_row)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans_at(uint32_t* r, uint32_t shared_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_row)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* row) {
    ldmatrix_x4_at(r, terse_smem(row));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* row) {
    ldmatrix_x4_trans_at(r, terse_smem(row));
}
// The same at a swizzled tile's row (kernels/fa2.cuh): the shared address of `base` with `x` XORed
// into it, plus `add` bytes. With x and add compile-time, that is one LOP3 per distinct x and an
// immediate, where a row address computed in full would cost an IMAD, a LOP3 and a LEA each.
__device__ __forceinline__ void ldmatrix_x4_xor(uint32_t* r, const void* base, uint32_t x,
                                                uint32_t add) {
    ldmatrix_x4_at(r, (terse_smem(base) ^ x) + add);
}
__device__ __forceinline__ void ldmatrix_x4_trans_xor(uint32_t* r, const void* base, uint32_t x,
                                                      uint32_t add) {
    ldmatrix_x4_trans_at(r, (terse_smem(base) ^ x) + add);
}
// Two matrices: lanes 0-15 give the row addresses (the others' are ignored).
__device__ __forceinline__ void ldmatrix_x2(uint32_t* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(terse_smem(row))
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t* r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(terse_smem(row))
                 : "memory");
}

// 16 bytes global -> shared, asynchronously (both 16-byte aligned); visible to the issuing
// thread after the cp_async_wait that covers its group, to the block after a __syncthreads.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(terse_smem(dst)), "l"(src)
                 : "memory");
}
// Closes the calling thread's current group of copies.
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most `Pending` of the calling thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Dynamic shared memory (the launch description's `shared` bytes), 128-byte aligned.
#define TERSE_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]

// Two floats as the bf16 pair of one .b32 fragment register (`lo` in the low half).
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16);
}
#else
#include "shim/mma_sync.h"
#endif

// The A fragment (16 x 16, bf16) of two C fragments side by side, c0 of columns 0-7 and c1 of
// 8-15 (f32): by the conventions above, c0 holds a[0]'s and a[1]'s columns 2t..2t+1 and c1
// a[2]'s and a[3]'s, so one product's C tile feeds the next mma.sync without leaving registers.
__device__ __forceinline__ void c_pair_as_a(uint32_t* a, const float* c0, const float* c1) {
    a[0] = bf16x2(c0[0], c0[1]);
    a[1] = bf16x2(c0[2], c0[3]);
    a[2] = bf16x2(c1[0], c1[1]);
    a[3] = bf16x2(c1[2], c1[3]);
}
