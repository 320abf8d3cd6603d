// CUDA's integer, bit and float intrinsics for the kernels' CPU builds of terse's emulated device
// (part of fake_gpu/include/terse_fake_cuda.h, after vectors.h): reinterpretations, bit counts
// and byte operations, cache-hinted loads and stores, explicitly rounded float operations, the
// math functions beyond <cmath>, and CUDA's min and max overloads.
#pragma once

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
// rounded forms are exact IEEE operations here (__fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn and
// __fsqrt_rn are the shim's, kernels/shim/cuda_shim.h); the fast ones (__sinf...) the exact
// functions.
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmaf_ieee_rn(float a, float b, float c) { return std::fma(a, b, c); }
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
