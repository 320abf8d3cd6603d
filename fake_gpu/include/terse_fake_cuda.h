// The CUDA device-side API for the kernels' CPU builds of terse's emulated device: forced into
// every module that xtask/src/fake_gpu/kernels.rs compiles (candle-kernels' .cu sources and
// terse's kernels/*.cu, unchanged) ahead of the sources, on top of the SIMT shim's declarations
// (kernels/shim/cuda_shim.h). The runtime behind them is fake_gpu/fibers.cpp, in libcuda.so.1.
//
// It adds what candle's kernels use beyond the shim's portable subset: CUDA's __half and
// __nv_bfloat16 with their operators and intrinsics (each result rounded to nearest even from
// the exact or f32 value, as the device's .rn instructions do), the fp8 types of cuda_fp8.h,
// the vector types, the atomics, the integer and bit intrinsics, and dynamic shared memory.
// The emulation computes transcendental functions exactly where the device uses .approx
// instructions (hexp, __expf...), so those may differ from the device in the last place.
#pragma once

// The device code nvcc compiled for the PTX: sm_90 with CUDA 13.
#define __CUDA_ARCH__ 900
#define __CUDACC_VER_MAJOR__ 13
#define __CUDACC_VER_MINOR__ 0
// One launch at a time, every CUDA thread a fiber on the launching OS thread (fibers.cpp).
#define TERSE_SHIM_PLAIN_INDICES
// CUDA's full 16-bit float types below, instead of the shim's storage-only ones.
#define TERSE_SHIM_RICH_16BIT_TYPES

#include <assert.h>
#include <limits.h>
#include <stdio.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cuda_shim.h"

#define __launch_bounds__(...)
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __grid_constant__
#define __CUDA_ALIGN__(n) __attribute__((aligned(n)))

#define TERSE_FAKE_STR2(x) #x
#define TERSE_FAKE_STR(x) TERSE_FAKE_STR2(x)

// A device-side assert ends the launch with an error (cudaErrorAssert on the device).
#undef assert
#define assert(e)                                                                         \
    ((e) ? (void)0                                                                        \
         : terse_shim::fail("device-side assert `" #e "` failed at " __FILE__            \
                            ":" TERSE_FAKE_STR(__LINE__)))

namespace terse_shim {
// The launch's dynamic shared memory (cuLaunchKernel's sharedMemBytes), from the runtime.
void* dynamic_shared_base();
// `extern __shared__ T name[];` is rewritten by the generator to
// `T *name = terse_shim::dynamic_shared();`.
struct DynamicShared {
    void* p;
    template <typename T>
    operator T*() const {
        return static_cast<T*>(p);
    }
};
inline DynamicShared dynamic_shared() { return {dynamic_shared_base()}; }
}  // namespace terse_shim

inline void __trap() { terse_shim::fail("__trap() called"); }
inline void __brkpt() { terse_shim::fail("__brkpt() called"); }
inline void __nanosleep(unsigned) {}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- Rounding to the small float formats (exact; ties to even unless a mode says otherwise).
namespace terse_fake {
enum Round { RN, RZ, RD, RU };
// `x` rounded to a binary format with `mant` fraction bits and smallest normal exponent `emin`
// (subnormals below it); no overflow handling here.
inline long double round_to(long double x, int mant, int emin, Round mode = RN) {
    if (x == 0 || !std::isfinite(x)) return x;
    int e;
    std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
    int q = std::max(e - 1, emin) - mant;
    long double s = std::ldexp(x, -q), r;
    switch (mode) {
        case RZ: r = std::trunc(s); break;
        case RD: r = std::floor(s); break;
        case RU: r = std::ceil(s); break;
        default: r = std::nearbyint(s); break;  // the default rounding mode: ties to even
    }
    return std::ldexp(r, q);
}
// The bits (sign, `ebits` exponent bits, `mant` fraction bits) of `r`, exact in the format.
inline uint32_t encode(long double r, int mant, int emin, int ebits) {
    uint32_t sign = std::signbit(r) ? 1u << (ebits + mant) : 0u;
    r = std::fabs(r);
    if (r == 0) return sign;
    if (r < std::ldexp(1.0L, emin))
        return sign | (uint32_t)std::ldexp(r, mant - emin);
    int lead = std::ilogb(r);
    uint32_t frac = (uint32_t)(std::ldexp(r, mant - lead) - std::ldexp(1.0L, mant));
    return sign | ((uint32_t)(lead - emin + 1) << mant) | frac;
}
// The value of the bits of a finite number in such a format.
inline float decode(uint32_t bits, int mant, int emin, int ebits) {
    uint32_t frac = bits & ((1u << mant) - 1), exp = (bits >> mant) & ((1u << ebits) - 1);
    float v = exp == 0 ? std::ldexp((float)frac, emin - mant)
                       : std::ldexp((float)(frac | (1u << mant)), (int)exp - 1 + emin - mant);
    return (bits >> (ebits + mant)) & 1 ? -v : v;
}
inline uint16_t to_f16(long double x, Round mode = RN) {
    if (std::isnan(x)) return 0x7fff;
    long double r = round_to(x, 10, -14, mode);
    if (std::fabs(r) > 65504.0L) {
        // Beyond the largest finite: inf, except where the mode rounds toward zero.
        bool toward = mode == RZ || (mode == RD && x > 0) || (mode == RU && x < 0);
        if (toward && std::isfinite(x)) return std::signbit(x) ? 0xfbff : 0x7bff;
        return std::signbit(x) ? 0xfc00 : 0x7c00;
    }
    return (uint16_t)encode(r, 10, -14, 5);
}
inline uint16_t to_bf16(long double x, Round mode = RN) {
    if (std::isnan(x)) return 0x7fff;
    long double r = round_to(x, 7, -126, mode);
    if (std::fabs(r) > 3.38953138925153547590470800371487867e38L) {
        bool toward = mode == RZ || (mode == RD && x > 0) || (mode == RU && x < 0);
        if (toward && std::isfinite(x)) return std::signbit(x) ? 0xff7f : 0x7f7f;
        return std::signbit(x) ? 0xff80 : 0x7f80;
    }
    return (uint16_t)encode(r, 7, -126, 8);
}
// float to integer, toward zero (or nearest even), saturating, NaN to 0: cvt.rzi / cvt.rni.
template <typename I>
inline I to_int(long double f, Round mode = RZ) {
    if (std::isnan(f)) return 0;
    f = mode == RZ ? std::trunc(f) : mode == RD ? std::floor(f) : mode == RU ? std::ceil(f)
                                                                          : std::nearbyint(f);
    if (f <= (long double)std::numeric_limits<I>::min()) return std::numeric_limits<I>::min();
    if (f >= (long double)std::numeric_limits<I>::max()) return std::numeric_limits<I>::max();
    return (I)f;
}
}  // namespace terse_fake

// ---- __half and __nv_bfloat16 (cuda_fp16.h, cuda_bf16.h): the same constructors, conversions
// and operators as CUDA's, so overloads resolve as under nvcc.
struct __half_raw {
    unsigned short x;
};
struct __nv_bfloat16_raw {
    unsigned short x;
};
struct __nv_bfloat16;

#define TERSE_FAKE_16BIT_CLASS(T, RAW, FROM_F32, TO_F32, FROM_LD)                           \
    struct __attribute__((aligned(2))) T {                                                  \
        unsigned short __x;                                                                 \
        T() = default;                                                                      \
        constexpr T(const RAW& r) : __x(r.x) {}                                             \
        T(float f) : __x(FROM_F32(f)) {}                                                    \
        T(double f) : __x(FROM_LD((long double)f)) {}                                       \
        T(short v) : __x(FROM_LD((long double)v)) {}                                        \
        T(unsigned short v) : __x(FROM_LD((long double)v)) {}                               \
        T(int v) : __x(FROM_LD((long double)v)) {}                                          \
        T(unsigned int v) : __x(FROM_LD((long double)v)) {}                                 \
        T(long v) : __x(FROM_LD((long double)v)) {}                                         \
        T(unsigned long v) : __x(FROM_LD((long double)v)) {}                                \
        T(long long v) : __x(FROM_LD((long double)v)) {}                                    \
        T(unsigned long long v) : __x(FROM_LD((long double)v)) {}                           \
        operator RAW() const { return RAW{__x}; }                                           \
        operator float() const { return TO_F32(__x); }                                      \
        operator signed char() const { return terse_fake::to_int<signed char>(TO_F32(__x)); } \
        operator unsigned char() const {                                                    \
            return terse_fake::to_int<unsigned char>(TO_F32(__x));                          \
        }                                                                                   \
        operator char() const { return terse_fake::to_int<char>(TO_F32(__x)); }             \
        operator short() const { return terse_fake::to_int<short>(TO_F32(__x)); }           \
        operator unsigned short() const {                                                   \
            return terse_fake::to_int<unsigned short>(TO_F32(__x));                         \
        }                                                                                   \
        operator int() const { return terse_fake::to_int<int>(TO_F32(__x)); }               \
        operator unsigned int() const { return terse_fake::to_int<unsigned int>(TO_F32(__x)); } \
        operator long() const { return terse_fake::to_int<long>(TO_F32(__x)); }             \
        operator unsigned long() const {                                                    \
            return terse_fake::to_int<unsigned long>(TO_F32(__x));                          \
        }                                                                                   \
        operator long long() const { return terse_fake::to_int<long long>(TO_F32(__x)); }   \
        operator unsigned long long() const {                                               \
            return terse_fake::to_int<unsigned long long>(TO_F32(__x));                     \
        }                                                                                   \
        constexpr operator bool() const { return (__x & 0x7fffu) != 0; }                    \
        TERSE_FAKE_16BIT_CROSS_##T                                                          \
    };

#define TERSE_FAKE_16BIT_CROSS___half explicit __half(const __nv_bfloat16& b);
#define TERSE_FAKE_16BIT_CROSS___nv_bfloat16 explicit __nv_bfloat16(const __half& h);

TERSE_FAKE_16BIT_CLASS(__half, __half_raw, terse_shim::f32_to_f16, terse_shim::f16_to_f32,
                       terse_fake::to_f16)
TERSE_FAKE_16BIT_CLASS(__nv_bfloat16, __nv_bfloat16_raw, terse_shim::f32_to_bf16,
                       terse_shim::bf16_to_f32, terse_fake::to_bf16)

inline __half::__half(const __nv_bfloat16& b) : __x(terse_shim::f32_to_f16(float(b))) {}
inline __nv_bfloat16::__nv_bfloat16(const __half& h) : __x(terse_shim::f32_to_bf16(float(h))) {}

typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;

struct __half2_raw {
    unsigned short x, y;
};
struct __nv_bfloat162_raw {
    unsigned short x, y;
};
#define TERSE_FAKE_16BIT_PAIR(T2, T, RAW2)                                                  \
    struct __attribute__((aligned(4))) T2 {                                                 \
        T x, y;                                                                             \
        T2() = default;                                                                     \
        constexpr T2(const T& a, const T& b) : x(a), y(b) {}                                \
        T2(const RAW2& r) : x(), y() {                                                      \
            x.__x = r.x;                                                                    \
            y.__x = r.y;                                                                    \
        }                                                                                   \
        operator RAW2() const { return RAW2{x.__x, y.__x}; }                                \
    };
TERSE_FAKE_16BIT_PAIR(__half2, __half, __half2_raw)
TERSE_FAKE_16BIT_PAIR(__nv_bfloat162, __nv_bfloat16, __nv_bfloat162_raw)
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

// Conversions with CUDA's names.
inline __half __float2half(float f) { return __half_raw{terse_shim::f32_to_f16(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline __half __float2half_rz(float f) { return __half_raw{terse_fake::to_f16(f, terse_fake::RZ)}; }
inline __half __float2half_rd(float f) { return __half_raw{terse_fake::to_f16(f, terse_fake::RD)}; }
inline __half __float2half_ru(float f) { return __half_raw{terse_fake::to_f16(f, terse_fake::RU)}; }
inline float __half2float(__half h) { return terse_shim::f16_to_f32(h.__x); }
inline __half __double2half(double d) { return __half_raw{terse_fake::to_f16(d)}; }
inline __nv_bfloat16 __float2bfloat16(float f) {
    return __nv_bfloat16_raw{terse_shim::f32_to_bf16(f)};
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rz(float f) {
    return __nv_bfloat16_raw{terse_fake::to_bf16(f, terse_fake::RZ)};
}
inline __nv_bfloat16 __float2bfloat16_rd(float f) {
    return __nv_bfloat16_raw{terse_fake::to_bf16(f, terse_fake::RD)};
}
inline __nv_bfloat16 __float2bfloat16_ru(float f) {
    return __nv_bfloat16_raw{terse_fake::to_bf16(f, terse_fake::RU)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return terse_shim::bf16_to_f32(h.__x); }
inline __nv_bfloat16 __double2bfloat16(double d) {
    return __nv_bfloat16_raw{terse_fake::to_bf16(d)};
}

#define TERSE_FAKE_INT_CONVERSIONS(T, N, FROM_LD, TO_F32)                                   \
    inline T __int2##N##_rn(int v) { return RAW_OF_##N{FROM_LD(v)}; }                        \
    inline T __int2##N##_rz(int v) { return RAW_OF_##N{FROM_LD(v, terse_fake::RZ)}; }        \
    inline T __int2##N##_rd(int v) { return RAW_OF_##N{FROM_LD(v, terse_fake::RD)}; }        \
    inline T __int2##N##_ru(int v) { return RAW_OF_##N{FROM_LD(v, terse_fake::RU)}; }        \
    inline T __uint2##N##_rn(unsigned v) { return RAW_OF_##N{FROM_LD(v)}; }                  \
    inline T __short2##N##_rn(short v) { return RAW_OF_##N{FROM_LD(v)}; }                    \
    inline T __ushort2##N##_rn(unsigned short v) { return RAW_OF_##N{FROM_LD(v)}; }          \
    inline T __ll2##N##_rn(long long v) { return RAW_OF_##N{FROM_LD(v)}; }                   \
    inline T __ull2##N##_rn(unsigned long long v) { return RAW_OF_##N{FROM_LD(v)}; }         \
    inline int __##N##2int_rz(T h) { return terse_fake::to_int<int>(TO_F32(h.__x)); }        \
    inline int __##N##2int_rn(T h) {                                                         \
        return terse_fake::to_int<int>(TO_F32(h.__x), terse_fake::RN);                       \
    }                                                                                        \
    inline int __##N##2int_rd(T h) {                                                         \
        return terse_fake::to_int<int>(TO_F32(h.__x), terse_fake::RD);                       \
    }                                                                                        \
    inline int __##N##2int_ru(T h) {                                                         \
        return terse_fake::to_int<int>(TO_F32(h.__x), terse_fake::RU);                       \
    }                                                                                        \
    inline unsigned __##N##2uint_rz(T h) { return terse_fake::to_int<unsigned>(TO_F32(h.__x)); } \
    inline unsigned __##N##2uint_rn(T h) {                                                   \
        return terse_fake::to_int<unsigned>(TO_F32(h.__x), terse_fake::RN);                  \
    }                                                                                        \
    inline short __##N##2short_rz(T h) { return terse_fake::to_int<short>(TO_F32(h.__x)); }  \
    inline unsigned short __##N##2ushort_rz(T h) {                                           \
        return terse_fake::to_int<unsigned short>(TO_F32(h.__x));                            \
    }                                                                                        \
    inline long long __##N##2ll_rz(T h) { return terse_fake::to_int<long long>(TO_F32(h.__x)); } \
    inline unsigned long long __##N##2ull_rz(T h) {                                          \
        return terse_fake::to_int<unsigned long long>(TO_F32(h.__x));                        \
    }                                                                                        \
    inline signed char __##N##2char_rz(T h) {                                                \
        return terse_fake::to_int<signed char>(TO_F32(h.__x));                               \
    }                                                                                        \
    inline unsigned char __##N##2uchar_rz(T h) {                                             \
        return terse_fake::to_int<unsigned char>(TO_F32(h.__x));                             \
    }                                                                                        \
    inline short __##N##_as_short(T h) { return (short)h.__x; }                              \
    inline unsigned short __##N##_as_ushort(T h) { return h.__x; }                           \
    inline T __short_as_##N(short v) { return RAW_OF_##N{(unsigned short)v}; }              \
    inline T __ushort_as_##N(unsigned short v) { return RAW_OF_##N{v}; }
#define RAW_OF_half __half_raw
#define RAW_OF_bfloat16 __nv_bfloat16_raw
TERSE_FAKE_INT_CONVERSIONS(__half, half, terse_fake::to_f16, terse_shim::f16_to_f32)
TERSE_FAKE_INT_CONVERSIONS(__nv_bfloat16, bfloat16, terse_fake::to_bf16, terse_shim::bf16_to_f32)
#undef RAW_OF_half
#undef RAW_OF_bfloat16

// Arithmetic, comparisons and math for both types: computed in f32 (exact for a product or a
// quotient of 16-bit values, and rounding twice to 24 then 11 or 8 bits is innocuous for +, -,
// *, /, sqrt), then rounded to nearest even. __hfma rounds the exact a*b+c once.
#define TERSE_FAKE_16BIT_OPS(T, TO, FROM)                                                    \
    inline T __hadd(T a, T b) { return FROM(TO(a) + TO(b)); }                                \
    inline T __hsub(T a, T b) { return FROM(TO(a) - TO(b)); }                                \
    inline T __hmul(T a, T b) { return FROM(TO(a) * TO(b)); }                                \
    inline T __hdiv(T a, T b) { return FROM(TO(a) / TO(b)); }                                \
    inline T __hadd_rn(T a, T b) { return __hadd(a, b); }                                    \
    inline T __hsub_rn(T a, T b) { return __hsub(a, b); }                                    \
    inline T __hmul_rn(T a, T b) { return __hmul(a, b); }                                    \
    inline T __hfma(T a, T b, T c) {                                                         \
        return T((double)TO(a) * (double)TO(b) + (double)TO(c));                             \
    }                                                                                        \
    inline T __hneg(T a) {                                                                   \
        T r = a;                                                                             \
        r.__x ^= 0x8000u;                                                                    \
        return r;                                                                            \
    }                                                                                        \
    inline T __habs(T a) {                                                                   \
        T r = a;                                                                             \
        r.__x &= 0x7fffu;                                                                    \
        return r;                                                                            \
    }                                                                                        \
    inline bool __hisnan(T a) { return std::isnan(TO(a)); }                                  \
    inline int __hisinf(T a) { return std::isinf(TO(a)) ? (TO(a) < 0 ? -1 : 1) : 0; }       \
    inline T __hmax(T a, T b) { return FROM(std::fmax(TO(a), TO(b))); }                      \
    inline T __hmin(T a, T b) { return FROM(std::fmin(TO(a), TO(b))); }                      \
    inline T __hmax_nan(T a, T b) {                                                          \
        return __hisnan(a) || __hisnan(b) ? FROM(NAN) : __hmax(a, b);                        \
    }                                                                                        \
    inline T __hmin_nan(T a, T b) {                                                          \
        return __hisnan(a) || __hisnan(b) ? FROM(NAN) : __hmin(a, b);                        \
    }                                                                                        \
    inline bool __heq(T a, T b) { return TO(a) == TO(b); }                                   \
    inline bool __hne(T a, T b) { return TO(a) < TO(b) || TO(a) > TO(b); }                   \
    inline bool __hlt(T a, T b) { return TO(a) < TO(b); }                                    \
    inline bool __hle(T a, T b) { return TO(a) <= TO(b); }                                   \
    inline bool __hgt(T a, T b) { return TO(a) > TO(b); }                                    \
    inline bool __hge(T a, T b) { return TO(a) >= TO(b); }                                   \
    inline bool __hequ(T a, T b) { return !(TO(a) < TO(b) || TO(a) > TO(b)); }               \
    inline bool __hneu(T a, T b) { return !(TO(a) == TO(b)); }                               \
    inline bool __hltu(T a, T b) { return !(TO(a) >= TO(b)); }                               \
    inline bool __hleu(T a, T b) { return !(TO(a) > TO(b)); }                                \
    inline bool __hgtu(T a, T b) { return !(TO(a) <= TO(b)); }                               \
    inline bool __hgeu(T a, T b) { return !(TO(a) < TO(b)); }                                \
    inline T hexp(T a) { return FROM(std::exp(TO(a))); }                                     \
    inline T hexp2(T a) { return FROM(std::exp2(TO(a))); }                                   \
    inline T hexp10(T a) { return FROM((float)std::pow(10.0, (double)TO(a))); }              \
    inline T hlog(T a) { return FROM(std::log(TO(a))); }                                     \
    inline T hlog2(T a) { return FROM(std::log2(TO(a))); }                                   \
    inline T hlog10(T a) { return FROM(std::log10(TO(a))); }                                 \
    inline T hsqrt(T a) { return FROM(std::sqrt(TO(a))); }                                   \
    inline T hrsqrt(T a) { return FROM(1.0f / std::sqrt(TO(a))); }                           \
    inline T hrcp(T a) { return FROM(1.0f / TO(a)); }                                        \
    inline T hsin(T a) { return FROM(std::sin(TO(a))); }                                     \
    inline T hcos(T a) { return FROM(std::cos(TO(a))); }                                     \
    inline T htanh(T a) { return FROM(std::tanh(TO(a))); }                                   \
    inline T htanh_approx(T a) { return htanh(a); }                                          \
    inline T hfloor(T a) { return FROM(std::floor(TO(a))); }                                 \
    inline T hceil(T a) { return FROM(std::ceil(TO(a))); }                                   \
    inline T htrunc(T a) { return FROM(std::trunc(TO(a))); }                                 \
    inline T hrint(T a) { return FROM(std::nearbyint(TO(a))); }                              \
    inline T operator+(const T& a, const T& b) { return __hadd(a, b); }                      \
    inline T operator-(const T& a, const T& b) { return __hsub(a, b); }                      \
    inline T operator*(const T& a, const T& b) { return __hmul(a, b); }                      \
    inline T operator/(const T& a, const T& b) { return __hdiv(a, b); }                      \
    inline T& operator+=(T& a, const T& b) { return a = __hadd(a, b); }                      \
    inline T& operator-=(T& a, const T& b) { return a = __hsub(a, b); }                      \
    inline T& operator*=(T& a, const T& b) { return a = __hmul(a, b); }                      \
    inline T& operator/=(T& a, const T& b) { return a = __hdiv(a, b); }                      \
    inline T operator+(const T& a) { return a; }                                             \
    inline T operator-(const T& a) { return __hneg(a); }                                     \
    inline T& operator++(T& a) { return a = __hadd(a, FROM(1.0f)); }                         \
    inline T& operator--(T& a) { return a = __hsub(a, FROM(1.0f)); }                         \
    inline T operator++(T& a, int) {                                                         \
        T r = a;                                                                             \
        ++a;                                                                                 \
        return r;                                                                            \
    }                                                                                        \
    inline T operator--(T& a, int) {                                                         \
        T r = a;                                                                             \
        --a;                                                                                 \
        return r;                                                                            \
    }                                                                                        \
    inline bool operator==(const T& a, const T& b) { return __heq(a, b); }                   \
    inline bool operator!=(const T& a, const T& b) { return __hneu(a, b); }                  \
    inline bool operator<(const T& a, const T& b) { return __hlt(a, b); }                    \
    inline bool operator<=(const T& a, const T& b) { return __hle(a, b); }                   \
    inline bool operator>(const T& a, const T& b) { return __hgt(a, b); }                    \
    inline bool operator>=(const T& a, const T& b) { return __hge(a, b); }
TERSE_FAKE_16BIT_OPS(__half, __half2float, __float2half)
TERSE_FAKE_16BIT_OPS(__nv_bfloat16, __bfloat162float, __float2bfloat16)

// The pairs: element-wise.
#define TERSE_FAKE_16BIT_PAIR_OPS(T2, T, TO, FROM, N)                                        \
    inline T2 __halves2##N##2(T a, T b) { return T2(a, b); }                                 \
    inline T2 __float2##N##2_rn(float f) { return T2(FROM(f), FROM(f)); }                   \
    inline T2 __floats2##N##2_rn(float a, float b) { return T2(FROM(a), FROM(b)); }          \
    inline T2 make_##N##2(T a, T b) { return T2(a, b); }                                     \
    inline T __low2##N(T2 a) { return a.x; }                                                 \
    inline T __high2##N(T2 a) { return a.y; }                                                \
    inline float __low2float(T2 a) { return TO(a.x); }                                       \
    inline float __high2float(T2 a) { return TO(a.y); }                                      \
    inline T2 __lows2##N##2(T2 a, T2 b) { return T2(a.x, b.x); }                             \
    inline T2 __highs2##N##2(T2 a, T2 b) { return T2(a.y, b.y); }                            \
    inline T2 __low2##N##2(T2 a) { return T2(a.x, a.x); }                                    \
    inline T2 __high2##N##2(T2 a) { return T2(a.y, a.y); }                                   \
    inline T2 __lowhigh2highlow(T2 a) { return T2(a.y, a.x); }                               \
    inline T2 __hadd2(T2 a, T2 b) { return T2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }         \
    inline T2 __hsub2(T2 a, T2 b) { return T2(__hsub(a.x, b.x), __hsub(a.y, b.y)); }         \
    inline T2 __hmul2(T2 a, T2 b) { return T2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }         \
    inline T2 __h2div(T2 a, T2 b) { return T2(__hdiv(a.x, b.x), __hdiv(a.y, b.y)); }         \
    inline T2 __hfma2(T2 a, T2 b, T2 c) {                                                    \
        return T2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));                             \
    }                                                                                        \
    inline T2 __hneg2(T2 a) { return T2(__hneg(a.x), __hneg(a.y)); }                         \
    inline T2 __habs2(T2 a) { return T2(__habs(a.x), __habs(a.y)); }                         \
    inline T2 __hmax2(T2 a, T2 b) { return T2(__hmax(a.x, b.x), __hmax(a.y, b.y)); }         \
    inline T2 __hmin2(T2 a, T2 b) { return T2(__hmin(a.x, b.x), __hmin(a.y, b.y)); }         \
    inline T2 h2exp(T2 a) { return T2(hexp(a.x), hexp(a.y)); }                               \
    inline T2 h2log(T2 a) { return T2(hlog(a.x), hlog(a.y)); }                               \
    inline T2 h2sqrt(T2 a) { return T2(hsqrt(a.x), hsqrt(a.y)); }                            \
    inline T2 operator+(const T2& a, const T2& b) { return __hadd2(a, b); }                  \
    inline T2 operator-(const T2& a, const T2& b) { return __hsub2(a, b); }                  \
    inline T2 operator*(const T2& a, const T2& b) { return __hmul2(a, b); }                  \
    inline T2 operator/(const T2& a, const T2& b) { return __h2div(a, b); }                  \
    inline T2& operator+=(T2& a, const T2& b) { return a = __hadd2(a, b); }                  \
    inline T2& operator-=(T2& a, const T2& b) { return a = __hsub2(a, b); }                  \
    inline T2& operator*=(T2& a, const T2& b) { return a = __hmul2(a, b); }                  \
    inline T2& operator/=(T2& a, const T2& b) { return a = __h2div(a, b); }                  \
    inline T2 operator-(const T2& a) { return __hneg2(a); }                                  \
    inline bool operator==(const T2& a, const T2& b) { return a.x == b.x && a.y == b.y; }    \
    inline bool operator!=(const T2& a, const T2& b) { return a.x != b.x && a.y != b.y; }
TERSE_FAKE_16BIT_PAIR_OPS(__half2, __half, __half2float, __float2half, half)
TERSE_FAKE_16BIT_PAIR_OPS(__nv_bfloat162, __nv_bfloat16, __bfloat162float, __float2bfloat16,
                          bfloat16)

// ---- fp8 (cuda_fp8.h): storage with saturating round-to-nearest-even conversions.
typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
typedef unsigned int __nv_fp8x4_storage_t;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };

namespace terse_fake {
inline __nv_fp8_storage_t to_fp8(long double x, __nv_saturation_t sat,
                                 __nv_fp8_interpretation_t fmt) {
    bool e4 = fmt == __NV_E4M3;
    int mant = e4 ? 3 : 2, emin = e4 ? -6 : -14, ebits = e4 ? 4 : 5;
    long double maxv = e4 ? 448.0L : 57344.0L;
    uint32_t sign = std::signbit(x) ? 0x80u : 0u;
    if (std::isnan(x)) return 0x7f;
    long double r = round_to(x, mant, emin);
    if (std::fabs(r) > maxv) {
        if (sat == __NV_SATFINITE)
            return (__nv_fp8_storage_t)(sign | encode(maxv, mant, emin, ebits));
        return (__nv_fp8_storage_t)(e4 ? 0x7f : (sign | 0x7c));  // e4m3 has no inf: NaN
    }
    return (__nv_fp8_storage_t)encode(r, mant, emin, ebits);
}
inline float fp8_to_f32(__nv_fp8_storage_t v, __nv_fp8_interpretation_t fmt) {
    if (fmt == __NV_E4M3) {
        if ((v & 0x7f) == 0x7f) return NAN;
        return decode(v, 3, -6, 4);
    }
    if ((v & 0x7f) > 0x7c) return NAN;
    if ((v & 0x7f) == 0x7c) return v & 0x80 ? -INFINITY : INFINITY;
    return decode(v, 2, -14, 5);
}
}  // namespace terse_fake

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat,
                                                __nv_fp8_interpretation_t fmt) {
    return terse_fake::to_fp8(x, sat, fmt);
}
inline __nv_fp8_storage_t __nv_cvt_double_to_fp8(double x, __nv_saturation_t sat,
                                                 __nv_fp8_interpretation_t fmt) {
    return terse_fake::to_fp8(x, sat, fmt);
}
inline __nv_fp8_storage_t __nv_cvt_halfraw_to_fp8(__half_raw x, __nv_saturation_t sat,
                                                  __nv_fp8_interpretation_t fmt) {
    return terse_fake::to_fp8(terse_shim::f16_to_f32(x.x), sat, fmt);
}
inline __nv_fp8_storage_t __nv_cvt_bfloat16raw_to_fp8(__nv_bfloat16_raw x, __nv_saturation_t sat,
                                                      __nv_fp8_interpretation_t fmt) {
    return terse_fake::to_fp8(terse_shim::bf16_to_f32(x.x), sat, fmt);
}
inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t fmt) {
    return __half_raw{terse_shim::f32_to_f16(terse_fake::fp8_to_f32(x, fmt))};
}

#define TERSE_FAKE_FP8(T, FMT)                                                              \
    struct __attribute__((aligned(1))) T {                                                  \
        __nv_fp8_storage_t __x;                                                             \
        T() = default;                                                                      \
        explicit T(const __half f)                                                          \
            : __x(__nv_cvt_halfraw_to_fp8(__half_raw(f), __NV_SATFINITE, FMT)) {}           \
        explicit T(const __nv_bfloat16 f)                                                   \
            : __x(__nv_cvt_bfloat16raw_to_fp8(__nv_bfloat16_raw(f), __NV_SATFINITE, FMT)) {} \
        explicit T(const float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, FMT)) {}   \
        explicit T(const double f) : __x(__nv_cvt_double_to_fp8(f, __NV_SATFINITE, FMT)) {} \
        T(const unsigned short v) : T((float)v) {}                                          \
        explicit T(const unsigned int v) : T((float)v) {}                                   \
        explicit T(const unsigned long v) : T((float)v) {}                                  \
        T(const unsigned long long v) : T((float)v) {}                                      \
        explicit T(const short v) : T((float)v) {}                                          \
        explicit T(const int v) : T((float)v) {}                                            \
        explicit T(const long v) : T((float)v) {}                                           \
        explicit T(const long long v) : T((float)v) {}                                      \
        explicit operator float() const { return terse_fake::fp8_to_f32(__x, FMT); }        \
        explicit operator double() const { return terse_fake::fp8_to_f32(__x, FMT); }       \
        explicit operator __half() const { return __nv_cvt_fp8_to_halfraw(__x, FMT); }      \
        explicit operator __nv_bfloat16() const { return __nv_bfloat16(float(*this)); }     \
        explicit operator unsigned char() const {                                           \
            return terse_fake::to_int<unsigned char>(float(*this));                         \
        }                                                                                   \
        explicit operator unsigned short() const {                                          \
            return terse_fake::to_int<unsigned short>(float(*this));                        \
        }                                                                                   \
        explicit operator unsigned int() const {                                            \
            return terse_fake::to_int<unsigned int>(float(*this));                          \
        }                                                                                   \
        explicit operator unsigned long() const {                                           \
            return terse_fake::to_int<unsigned long>(float(*this));                         \
        }                                                                                   \
        explicit operator unsigned long long() const {                                      \
            return terse_fake::to_int<unsigned long long>(float(*this));                    \
        }                                                                                   \
        explicit operator signed char() const {                                             \
            return terse_fake::to_int<signed char>(float(*this));                           \
        }                                                                                   \
        explicit operator short() const { return terse_fake::to_int<short>(float(*this)); } \
        explicit operator int() const { return terse_fake::to_int<int>(float(*this)); }     \
        explicit operator long() const { return terse_fake::to_int<long>(float(*this)); }   \
        explicit operator long long() const {                                               \
            return terse_fake::to_int<long long>(float(*this));                             \
        }                                                                                   \
        explicit operator bool() const { return float(*this) != 0.0f; }                     \
    };
TERSE_FAKE_FP8(__nv_fp8_e4m3, __NV_E4M3)
TERSE_FAKE_FP8(__nv_fp8_e5m2, __NV_E5M2)

// ---- Vector types (vector_types.h), with CUDA's alignments, and their make_ functions.
#define TERSE_FAKE_VEC(T, N)                                                                \
    struct N##1 {                                                                           \
        T x;                                                                                \
    };                                                                                      \
    struct alignas(2 * sizeof(T)) N##2 {                                                    \
        T x, y;                                                                             \
    };                                                                                      \
    struct N##3 {                                                                           \
        T x, y, z;                                                                          \
    };                                                                                      \
    struct alignas(4 * sizeof(T) > 16 ? 16 : 4 * sizeof(T)) N##4 {                          \
        T x, y, z, w;                                                                       \
    };                                                                                      \
    inline N##1 make_##N##1(T x) { return N##1{x}; }                                        \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }                                \
    inline N##3 make_##N##3(T x, T y, T z) { return N##3{x, y, z}; }                        \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
TERSE_FAKE_VEC(signed char, char)
TERSE_FAKE_VEC(unsigned char, uchar)
TERSE_FAKE_VEC(short, short)
TERSE_FAKE_VEC(unsigned short, ushort)
TERSE_FAKE_VEC(int, int)
TERSE_FAKE_VEC(unsigned int, uint)
TERSE_FAKE_VEC(long, long)
TERSE_FAKE_VEC(unsigned long, ulong)
TERSE_FAKE_VEC(long long, longlong)
TERSE_FAKE_VEC(unsigned long long, ulonglong)
TERSE_FAKE_VEC(float, float)
TERSE_FAKE_VEC(double, double)
inline dim3 make_dim3(unsigned x, unsigned y, unsigned z) { return dim3{x, y, z}; }
inline float2 __half22float2(__half2 a) { return float2{__half2float(a.x), __half2float(a.y)}; }
inline __half2 __float22half2_rn(float2 a) { return __half2(__float2half(a.x), __float2half(a.y)); }
inline float2 __bfloat1622float2(__nv_bfloat162 a) {
    return float2{__bfloat162float(a.x), __bfloat162float(a.y)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 a) {
    return __nv_bfloat162(__float2bfloat16(a.x), __float2bfloat16(a.y));
}

// ---- Reinterpretations, integer and bit intrinsics.
template <typename To, typename From>
inline To terse_fake_bitcast(From v) {
    static_assert(sizeof(To) == sizeof(From), "a bit cast between types of different sizes");
    To r;
    std::memcpy(&r, &v, sizeof(To));
    return r;
}
inline float __int_as_float(int v) { return terse_fake_bitcast<float>(v); }
inline int __float_as_int(float v) { return terse_fake_bitcast<int>(v); }
inline float __uint_as_float(unsigned v) { return terse_fake_bitcast<float>(v); }
inline unsigned __float_as_uint(float v) { return terse_fake_bitcast<unsigned>(v); }
inline double __longlong_as_double(long long v) { return terse_fake_bitcast<double>(v); }
inline long long __double_as_longlong(double v) { return terse_fake_bitcast<long long>(v); }
inline int __double2hiint(double v) {
    return (int)(terse_fake_bitcast<unsigned long long>(v) >> 32);
}
inline int __double2loint(double v) { return (int)terse_fake_bitcast<unsigned long long>(v); }
inline double __hiloint2double(int hi, int lo) {
    return terse_fake_bitcast<double>(((unsigned long long)(unsigned)hi << 32) | (unsigned)lo);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll((unsigned long long)v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline unsigned __brev(unsigned v) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((v >> i) & 1u) << (31 - i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
inline int __mul24(int a, int b) {
    return (int)(((long long)(a << 8 >> 8) * (long long)(b << 8 >> 8)));
}
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
inline long long __mul64hi(long long a, long long b) {
    return (long long)(((__int128)a * b) >> 64);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)((((unsigned long long)hi << 32 | lo) << (s & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned s) {
    return (unsigned)(((unsigned long long)hi << 32 | lo) >> (s & 31));
}
// Four signed (or unsigned) bytes: dot product with accumulate, saturating differences.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
inline int __vsubss4(int a, int b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        d = d < -128 ? -128 : d > 127 ? 127 : d;
        r |= (unsigned)(d & 0xff) << (8 * i);
    }
    return (int)r;
}
inline int __vaddss4(int a, int b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(int8_t)(a >> (8 * i)) + (int)(int8_t)(b >> (8 * i));
        d = d < -128 ? -128 : d > 127 ? 127 : d;
        r |= (unsigned)(d & 0xff) << (8 * i);
    }
    return (int)r;
}

// Cache-hinted loads and stores: plain ones here.
template <typename T>
inline T __ldg(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}
template <typename T>
inline T __ldca(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcs(const T* p) {
    return *p;
}
template <typename T>
inline T __ldlu(const T* p) {
    return *p;
}
template <typename T>
inline T __ldcv(const T* p) {
    return *p;
}
template <typename T>
inline void __stcg(T* p, T v) {
    *p = v;
}
template <typename T>
inline void __stcs(T* p, T v) {
    *p = v;
}
template <typename T>
inline void __stwb(T* p, T v) {
    *p = v;
}
template <typename T>
inline void __stwt(T* p, T v) {
    *p = v;
}

// ---- Float intrinsics and the math functions CUDA has beyond <cmath>. The explicitly
// rounded forms are exact IEEE operations here; the fast ones (__sinf...) the exact functions.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmaf_ieee_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frsqrt_rn(float a) { return 1.0f / std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __saturatef(float a) { return a != a ? 0.0f : a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float __sinf(float a) { return std::sin(a); }
inline float __cosf(float a) { return std::cos(a); }
inline float __tanf(float a) { return std::tan(a); }
inline void __sincosf(float a, float* s, float* c) {
    *s = std::sin(a);
    *c = std::cos(a);
}
inline float __exp10f(float a) { return (float)std::pow(10.0, (double)a); }
inline float __log2f(float a) { return std::log2(a); }
inline float __log10f(float a) { return std::log10(a); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float fdividef(float a, float b) { return a / b; }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float rcbrtf(float a) { return 1.0f / std::cbrt(a); }
inline double rcbrt(double a) { return 1.0 / std::cbrt(a); }
inline float normcdff(float a) { return (float)(0.5 * std::erfc(-(double)a * M_SQRT1_2)); }
inline double normcdf(double a) { return 0.5 * std::erfc(-a * M_SQRT1_2); }
inline float sinpif(float a) { return (float)std::sin(M_PI * (double)a); }
inline float cospif(float a) { return (float)std::cos(M_PI * (double)a); }
inline double sinpi(double a) { return std::sin(M_PI * a); }
inline double cospi(double a) { return std::cos(M_PI * a); }
inline int __float2int_rn(float f) { return terse_fake::to_int<int>(f, terse_fake::RN); }
inline int __float2int_rz(float f) { return terse_fake::to_int<int>(f, terse_fake::RZ); }
inline int __float2int_rd(float f) { return terse_fake::to_int<int>(f, terse_fake::RD); }
inline int __float2int_ru(float f) { return terse_fake::to_int<int>(f, terse_fake::RU); }
inline unsigned __float2uint_rn(float f) { return terse_fake::to_int<unsigned>(f, terse_fake::RN); }
inline unsigned __float2uint_rz(float f) { return terse_fake::to_int<unsigned>(f, terse_fake::RZ); }
inline long long __float2ll_rn(float f) { return terse_fake::to_int<long long>(f, terse_fake::RN); }
inline long long __float2ll_rz(float f) { return terse_fake::to_int<long long>(f, terse_fake::RZ); }
inline int __double2int_rn(double f) { return terse_fake::to_int<int>(f, terse_fake::RN); }
inline int __double2int_rz(double f) { return terse_fake::to_int<int>(f, terse_fake::RZ); }
inline float __int2float_rn(int v) { return (float)v; }
inline float __uint2float_rn(unsigned v) { return (float)v; }
inline float __ll2float_rn(long long v) { return (float)v; }
inline float __double2float_rn(double v) { return (float)v; }

// CUDA's min and max overloads beyond the shim's int and unsigned ones: the mixed signed and
// unsigned pairs compare as unsigned, as CUDA's do.
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned min(int a, unsigned b) { return min((unsigned)a, b); }
inline unsigned min(unsigned a, int b) { return min(a, (unsigned)b); }
inline unsigned max(int a, unsigned b) { return max((unsigned)a, b); }
inline unsigned max(unsigned a, int b) { return max(a, (unsigned)b); }
inline unsigned long min(long a, unsigned long b) { return min((unsigned long)a, b); }
inline unsigned long min(unsigned long a, long b) { return min(a, (unsigned long)b); }
inline unsigned long max(long a, unsigned long b) { return max((unsigned long)a, b); }
inline unsigned long max(unsigned long a, long b) { return max(a, (unsigned long)b); }
typedef unsigned long long terse_fake_ull;
inline terse_fake_ull min(long long a, terse_fake_ull b) { return min((terse_fake_ull)a, b); }
inline terse_fake_ull min(terse_fake_ull a, long long b) { return min(a, (terse_fake_ull)b); }
inline terse_fake_ull max(long long a, terse_fake_ull b) { return max((terse_fake_ull)a, b); }
inline terse_fake_ull max(terse_fake_ull a, long long b) { return max(a, (terse_fake_ull)b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline double min(float a, double b) { return std::fmin((double)a, b); }
inline double min(double a, float b) { return std::fmin(a, (double)b); }
inline double max(float a, double b) { return std::fmax((double)a, b); }
inline double max(double a, float b) { return std::fmax(a, (double)b); }

// ---- Atomics. Launches run one at a time on one OS thread, but the operations are atomic
// anyway (the host may touch the memory). Each returns the old value, as CUDA's do.
namespace terse_fake {
// Applies `f` to *p through a compare-and-swap on its bits.
template <typename T, typename F>
inline T atomic_update(T* p, F f) {
    using U = std::conditional_t<sizeof(T) == 2, uint16_t,
                                 std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
    static_assert(sizeof(T) == sizeof(U), "an atomic on a type of 2, 4 or 8 bytes");
    U* u = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(u, __ATOMIC_RELAXED), next;
    T o, n;
    do {
        std::memcpy(&o, &old, sizeof(T));
        n = f(o);
        std::memcpy(&next, &n, sizeof(T));
    } while (!__atomic_compare_exchange_n(u, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    return o;
}
}  // namespace terse_fake

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline double atomicAdd(double* p, double v) {
    return terse_fake::atomic_update(p, [v](double o) { return o + v; });
}
inline __half atomicAdd(__half* p, __half v) {
    return terse_fake::atomic_update(p, [v](__half o) { return __hadd(o, v); });
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
    return terse_fake::atomic_update(p, [v](__nv_bfloat16 o) { return __hadd(o, v); });
}
inline __half2 atomicAdd(__half2* p, __half2 v) {
    return terse_fake::atomic_update(p, [v](__half2 o) { return __hadd2(o, v); });
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* p, __nv_bfloat162 v) {
    return terse_fake::atomic_update(p, [v](__nv_bfloat162 o) { return __hadd2(o, v); });
}
inline int atomicSub(int* p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicSub(unsigned* p, unsigned v) {
    return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicExch(float* p, float v) {
    return terse_fake::atomic_update(p, [v](float) { return v; });
}
#define TERSE_FAKE_ATOMIC_MINMAX(T)                                                         \
    inline T atomicMin(T* p, T v) {                                                         \
        return terse_fake::atomic_update(p, [v](T o) { return v < o ? v : o; });            \
    }                                                                                       \
    inline T atomicMax(T* p, T v) {                                                         \
        return terse_fake::atomic_update(p, [v](T o) { return v > o ? v : o; });            \
    }
TERSE_FAKE_ATOMIC_MINMAX(int)
TERSE_FAKE_ATOMIC_MINMAX(unsigned)
TERSE_FAKE_ATOMIC_MINMAX(long long)
TERSE_FAKE_ATOMIC_MINMAX(unsigned long long)
#define TERSE_FAKE_ATOMIC_CAS(T)                                                            \
    inline T atomicCAS(T* p, T expected, T desired) {                                       \
        __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST,         \
                                    __ATOMIC_SEQ_CST);                                      \
        return expected;                                                                    \
    }
TERSE_FAKE_ATOMIC_CAS(int)
TERSE_FAKE_ATOMIC_CAS(unsigned)
TERSE_FAKE_ATOMIC_CAS(unsigned long long)
TERSE_FAKE_ATOMIC_CAS(unsigned short)
#define TERSE_FAKE_ATOMIC_BITS(T)                                                           \
    inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }    \
    inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }      \
    inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
TERSE_FAKE_ATOMIC_BITS(int)
TERSE_FAKE_ATOMIC_BITS(unsigned)
TERSE_FAKE_ATOMIC_BITS(unsigned long long)
inline unsigned atomicInc(unsigned* p, unsigned limit) {
    return terse_fake::atomic_update(p, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned limit) {
    return terse_fake::atomic_update(
        p, [limit](unsigned o) { return o == 0 || o > limit ? limit : o - 1; });
}
