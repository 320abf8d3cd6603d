// terse's SIMT shim: compiles kernels/*.cu unchanged as host C++ (g++ -std=c++20 -pthread),
// so every kernel runs on the CPU in `cargo test` (crates/simt builds and drives it).
//
// Model: every CUDA thread of a block is an OS thread; the blocks of a launch run one after the
// other on the same threads, so `__shared__` (a function-level static here) is per block, and
// launches are serialised. `__syncthreads` is a block barrier, the warp collectives a barrier
// of the warp's 32 lanes with an exchange slot per lane. Every barrier has a deadline: a
// thread that never arrives (a divergent `__syncthreads`, a shuffle some lanes skip) ends the
// launch with an error naming the kernel, the block and the barrier's line, never a hang.
// Shuffles also check that all lanes called the same one (same source line).
//
// Only the portable subset the kernels use is provided (the rule crates/simt's tests enforce):
// full-mask shuffles, __syncthreads/__syncwarp, static __shared__, atomicAdd on f32 and u32,
// bf16 and f16 through conversions, and the math intrinsics below; and, through kernels/mma.cuh
// only (its twin here is mma_sync.h), mma.sync m16n8k16 bf16, ldmatrix, cp.async and dynamic
// shared memory.
//
// The emulated CUDA device (fake_gpu/) compiles candle's kernels and these against the same
// declarations: fake_gpu/fibers/ is its runtime for them (CUDA threads as fibers, any block
// shape), fake_gpu/include/ adds what candle's kernels use beyond the portable subset.
#pragma once
#include <math.h>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

// build.rs reads the kernels' signatures from the preprocessed sources through this mark.
#ifdef TERSE_KERNEL_MARK
#define __global__ TERSE_KERNEL
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
// A register budget for nvcc; nothing to the host build.
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Per block: blocks of one launch run one at a time and launches are serialised.
#define __shared__ static

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// The index variables: one per OS thread here (every CUDA thread is one); the emulated device
// (fake_gpu/fibers/) runs a launch's CUDA threads as fibers on the launching OS thread, one
// launch at a time, and defines TERSE_SHIM_PLAIN_INDICES for plain globals.
#ifdef TERSE_SHIM_PLAIN_INDICES
#define TERSE_SHIM_INDEX_STORAGE
#else
#define TERSE_SHIM_INDEX_STORAGE thread_local
#endif

namespace terse_shim {
// The calling thread's indices and the launch's shape.
extern TERSE_SHIM_INDEX_STORAGE dim3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;
// Barriers; `line` is the call site, reported on a deadline or a divergence.
void sync_block(int line);
void sync_warp(int line);
// One 64-bit value per lane exchanged through the warp: every lane writes `v`, then reads lane
// `src`'s value. Lanes must all call it from the same line.
uint64_t exchange(uint64_t v, int src, int line);
// Ends the launch with `what` (and the kernel, block and thread) as its error.
[[noreturn]] void fail(const char* what);
// `bytes` (at most 64) from every lane of the warp: lane i's land at `all + i * bytes`. Lanes
// must all call it from the same line; the mma.sync and ldmatrix twins (mma_sync.h) use it.
void gather(const void* mine, unsigned bytes, void* all, int line);
// The launch's dynamic shared memory (the size given at launch, 128-byte aligned, filled with
// 0xff bytes before every block, as undefined on the device); a launch that gave none fails.
unsigned char* dynamic_shared();
// cp.async (mma_sync.h): the calling thread's copies, completed at the wait.
void async_copy16(void* dst, const void* src);
void async_commit();
void async_wait(int pending);
}  // namespace terse_shim

#define threadIdx (terse_shim::thread_idx)
#define blockIdx (terse_shim::block_idx)
#define blockDim (terse_shim::block_dim)
#define gridDim (terse_shim::grid_dim)
#define warpSize 32
#define __syncthreads() terse_shim::sync_block(__LINE__)
#define __syncwarp(...) terse_shim::sync_warp(__LINE__)

namespace terse_shim {
template <typename T>
inline uint64_t bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 64 bits");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T>
inline T unbits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
inline void full_mask(unsigned mask) {
    if (mask != 0xffffffffu) {
        fail("a shuffle with a partial mask (only full-mask collectives are portable here)");
    }
}
// The calling thread's lane: its linear index in the block (x fastest) modulo 32.
inline int lane_id() {
    return (int)((thread_idx.x + block_dim.x * (thread_idx.y + block_dim.y * thread_idx.z)) % 32);
}
// The shuffles take CUDA's optional width (a power of two up to 32): the warp splits into
// segments of `width` lanes, and a source outside the caller's segment reads its own value (xor
// and down: a later segment; up: an earlier one).
template <typename T>
inline T shfl_xor(int line, unsigned mask, T v, int m, int width = 32) {
    full_mask(mask);
    int lane = lane_id(), src = lane ^ m;
    if (src >= (lane / width + 1) * width) src = lane;
    return unbits<T>(exchange(bits(v), src & 31, line));
}
template <typename T>
inline T shfl(int line, unsigned mask, T v, int src, int width = 32) {
    full_mask(mask);
    int base = lane_id() / width * width;
    return unbits<T>(exchange(bits(v), (base + ((src % width) + width) % width) & 31, line));
}
template <typename T>
inline T shfl_down(int line, unsigned mask, T v, unsigned d, int width = 32) {
    full_mask(mask);
    int lane = lane_id();
    int src = lane + (int)d;
    return unbits<T>(exchange(bits(v), src < (lane / width + 1) * width ? src : lane, line));
}
template <typename T>
inline T shfl_up(int line, unsigned mask, T v, unsigned d, int width = 32) {
    full_mask(mask);
    int lane = lane_id();
    int src = lane - (int)d;
    return unbits<T>(exchange(bits(v), src >= lane / width * width ? src : lane, line));
}
}  // namespace terse_shim

#define __shfl_xor_sync(mask, ...) terse_shim::shfl_xor(__LINE__, mask, __VA_ARGS__)
#define __shfl_sync(mask, ...) terse_shim::shfl(__LINE__, mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...) terse_shim::shfl_down(__LINE__, mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...) terse_shim::shfl_up(__LINE__, mask, __VA_ARGS__)

// Atomics: f32 by compare-and-swap on the bits, u32 and i32 by fetch-add.
inline float atomicAdd(float* p, float v) {
    uint32_t* u = reinterpret_cast<uint32_t*>(p);
    uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), next;
    do {
        float f;
        std::memcpy(&f, &old, 4);
        f += v;
        std::memcpy(&next, &f, 4);
    } while (!__atomic_compare_exchange_n(u, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    float f;
    std::memcpy(&f, &old, 4);
    return f;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// Math intrinsics: the fast forms are the plain ones here (the tests' tolerances allow the
// device's approximations).
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
// The explicitly rounded f32 operations (never contracted into an fma on the device): exact
// IEEE operations here (the shim builds contract nothing: ISO C++, or -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
// CUDA's integer min/max device functions.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// bf16 and f16: round-to-nearest-even conversions on the bits (NaN becomes the canonical 0x7fff,
// as the device's cvt.rn does), shared with the emulated device's richer types (fake_gpu/include).
namespace terse_shim {
inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest, ties to even
    return (uint16_t)(u >> 16);
}
inline float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = s | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        u = s | ((e + 112) << 23) | (m << 13);
    } else if (m == 0) {
        u = s;
    } else {  // subnormal: normalise
        int k = 0;
        while (!(m & 0x400u)) {
            m <<= 1;
            k++;
        }
        u = s | ((uint32_t)(113 - k) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fff;                      // NaN
    if (a >= 0x47800000u) return (uint16_t)(s | 0x7c00u);  // overflow: inf
    if (a < 0x38800000u) {                                   // subnormal or zero
        if (a < 0x33000000u) return (uint16_t)s;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23);
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(s | r);
    }
    uint32_t r = a - 0x38000000u;  // rebias 127 -> 15
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(s | q);
}
}  // namespace terse_shim

// The storage types, through conversions only (the portable subset). The emulated device
// defines TERSE_SHIM_RICH_16BIT_TYPES and CUDA's full __half / __nv_bfloat16 instead
// (fake_gpu/include/terse_fake_cuda.h).
#ifndef TERSE_SHIM_RICH_16BIT_TYPES
struct __nv_bfloat16 {
    uint16_t x;
};
inline float __bfloat162float(__nv_bfloat16 h) { return terse_shim::bf16_to_f32(h.x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {terse_shim::f32_to_bf16(f)}; }
struct __half {
    uint16_t x;
};
inline float __half2float(__half h) { return terse_shim::f16_to_f32(h.x); }
inline __half __float2half(float f) { return {terse_shim::f32_to_f16(f)}; }
#endif
