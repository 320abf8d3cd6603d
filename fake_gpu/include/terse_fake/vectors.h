// The vector types of vector_types.h for the kernels' CPU builds of terse's emulated device (part
// of fake_gpu/include/terse_fake_cuda.h, after fp8.h): char1 ... double4 with CUDA's alignments,
// their make_ functions, and the conversions between float2 and the 16-bit float pairs.
#pragma once

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
