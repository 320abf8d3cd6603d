// The private interface of the emulated device's cuBLAS (libcublas.so.13, the files of
// fake_gpu/cublas/): the storage types of its matrices with their conversions, and the Job a
// GEMM entry point (api.cpp) enqueues on the handle's stream for the blocked GEMM (kernel.cpp) to
// compute on the CPU.
#pragma once
#include <library_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "float16.h"

// Hidden: shared by the files of libcublas.so.13, exported by none of them.
namespace fake_cublas __attribute__((visibility("hidden"))) {

// ---- Storage types: the conversions are fake_gpu/float16.h's.
using fake_gpu::bf16_to_f32;
using fake_gpu::bits_f32;
using fake_gpu::f16_to_f32;
using fake_gpu::f32_bits;
using fake_gpu::f32_to_bf16;
using fake_gpu::f32_to_f16;

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
