// The arithmetic of CUDA's 16-bit float types for the kernels' CPU builds of terse's emulated
// device (part of fake_gpu/include/terse_fake_cuda.h, after float16.h): the intrinsics and
// operators of __half and __nv_bfloat16 (add, compare, math functions) and of their pairs.
#pragma once

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
