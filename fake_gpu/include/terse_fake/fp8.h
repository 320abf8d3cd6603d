// The fp8 types of cuda_fp8.h for the kernels' CPU builds of terse's emulated device (part of
// fake_gpu/include/terse_fake_cuda.h, after float16_math.h): storage with saturating
// round-to-nearest-even conversions from and to floats, 16-bit floats and integers.
#pragma once

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
