// The private interface of the emulated device's cuBLAS (libcublas.so.13, the files of
// fake_gpu/cublas/): the storage types of its matrices with their conversions, and the Job a
// GEMM entry point (api.cpp) enqueues on the handle's stream for the blocked GEMM (kernel.cpp) to
// compute on the CPU.
#pragma once
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

// Hidden: shared by the files of libcublas.so.13, exported by none of them.
namespace fake_cublas __attribute__((visibility("hidden"))) {

// ---- Storage types: conversions written out (round to nearest even, NaN stays NaN).
inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
inline uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)  // inf or NaN (quiet, keep the top payload bits)
        return sign | (x > 0x7f800000u ? uint16_t(0x7e00u | ((x >> 13) & 0x3ffu)) : 0x7c00u);
    if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
    if (x < 0x38800000u) {                         // below 2^-14: subnormal half (or zero)
        if (x < 0x33000000u) return sign;          // <= 2^-25 (a tie with 0 goes to 0)
        uint32_t e = x >> 23, mant = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;  // value / 2^-24 = mant >> shift, shift in [14, 24]
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return sign | uint16_t(q);
    }
    uint32_t r = x - (112u << 23);  // rebias the exponent from 127 to 15
    uint32_t q = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) ++q;  // a carry into the exponent is right
    return sign | uint16_t(q);
}

enum class Type { F32, F64, F16, BF16 };
inline bool storage_type(cudaDataType t, Type* out) {
    switch (t) {
        case CUDA_R_32F: *out = Type::F32; return true;
        case CUDA_R_64F: *out = Type::F64; return true;
        case CUDA_R_16F: *out = Type::F16; return true;
        case CUDA_R_16BF: *out = Type::BF16; return true;
        default: return false;
    }
}
inline size_t type_size(Type t) {
    switch (t) {
        case Type::F32: return 4;
        case Type::F64: return 8;
        default: return 2;
    }
}
template <class T>
inline T load(Type t, const char* base, int64_t index) {
    switch (t) {
        case Type::F32: {
            float v;
            std::memcpy(&v, base + index * 4, 4);
            return T(v);
        }
        case Type::F64: {
            double v;
            std::memcpy(&v, base + index * 8, 8);
            return T(v);
        }
        case Type::F16: {
            uint16_t v;
            std::memcpy(&v, base + index * 2, 2);
            return T(f16_to_f32(v));
        }
        case Type::BF16: {
            uint16_t v;
            std::memcpy(&v, base + index * 2, 2);
            return T(bf16_to_f32(v));
        }
    }
    return T(0);
}
template <class T>
inline void store(Type t, char* base, int64_t index, T value) {
    switch (t) {
        case Type::F32: {
            float v = float(value);
            std::memcpy(base + index * 4, &v, 4);
            return;
        }
        case Type::F64: {
            double v = double(value);
            std::memcpy(base + index * 8, &v, 8);
            return;
        }
        case Type::F16: {
            uint16_t v = f32_to_f16(float(value));
            std::memcpy(base + index * 2, &v, 2);
            return;
        }
        case Type::BF16: {
            uint16_t v = f32_to_bf16(float(value));
            std::memcpy(base + index * 2, &v, 2);
            return;
        }
    }
}

// ---- The GEMM (kernel.cpp). T (float or double) is the compute type.
// One strided-batched GEMM, everything captured by value at call time.
template <class T>
struct Job {
    bool ta = false, tb = false;
    int64_t m = 0, n = 0, k = 0, batch = 0;
    const char* a = nullptr;
    const char* b = nullptr;
    char* c = nullptr;
    Type at = Type::F32, bt = Type::F32, ct = Type::F32;
    int64_t lda = 0, ldb = 0, ldc = 0, sa = 0, sb = 0, sc = 0;  // in elements
    T alpha = 0, beta = 0;
};

// Computes `job` (C = alpha * op(A) op(B) + beta * C for each batch); for T = float or double.
template <class T>
void run_gemm(const Job<T>& job);

}  // namespace fake_cublas
