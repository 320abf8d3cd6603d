// CUDA's 16-bit float types for the kernels' CPU builds of terse's emulated device (part of
// fake_gpu/include/terse_fake_cuda.h, which includes it first of its parts, after the shim): the
// exact rounding to the small float formats that every conversion here and in fp8.h uses, then
// __half and __nv_bfloat16, their pairs, and their conversions from and to floats and integers.
#pragma once

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
