// Element types and reductions of the emulated NCCL (fake_gpu/nccl/, internal.h): the sizes of
// NCCL's data types, and the rank-ordered reduction collectives.cpp applies to the staging areas'
// chunks, so every rank computes the same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "float16.h"
#include "internal.h"

namespace fake_nccl {

size_t elt_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

bool reducible(ncclDataType_t t) {
    return elt_size(t) != 0 && t != ncclFloat8e4m3 && t != ncclFloat8e5m2;
}

namespace {

// ---- Element types: f16 and bf16 are reduced in f32 and rounded (to nearest even) once, with
// fake_gpu/float16.h's conversions.
using fake_gpu::bf16_to_f32;
using fake_gpu::f16_to_f32;
using fake_gpu::f32_to_bf16;
using fake_gpu::f32_to_f16;

template <class T>
struct Plain {
    using Elem = T;
    using Acc = T;
    static Acc load(T v) { return v; }
    static T store(Acc a) { return a; }
};
struct Bf16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return bf16_to_f32(v); }
    static uint16_t store(Acc a) { return f32_to_bf16(a); }
};
struct F16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(uint16_t v) { return f16_to_f32(v); }
    static uint16_t store(Acc a) { return f32_to_f16(a); }
};

// Integer sums and products wrap (as on the device), without signed-overflow UB.
template <class A>
A op_add(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return (A)(U)((U)a + (U)b);
    } else {
        return a + b;
    }
}
template <class A>
A op_mul(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
        using U = std::make_unsigned_t<A>;
        return (A)(U)((U)a * (U)b);
    } else {
        return a * b;
    }
}

// dst[i] = srcs[0][i] op srcs[1][i] op ... (rank order), for i < count; avg divides the sum.
template <class Tr, class F>
void reduce_with(const void* const* srcs, int n, void* dst, size_t count, F f, bool avg) {
    using E = typename Tr::Elem;
    using A = typename Tr::Acc;
    constexpr size_t kBlock = 1024;
    A acc[kBlock];
    E* out = static_cast<E*>(dst);
    for (size_t base = 0; base < count; base += kBlock) {
        size_t m = std::min(kBlock, count - base);
        const E* s0 = static_cast<const E*>(srcs[0]) + base;
        for (size_t j = 0; j < m; j++) acc[j] = Tr::load(s0[j]);
        for (int k = 1; k < n; k++) {
            const E* sk = static_cast<const E*>(srcs[k]) + base;
            for (size_t j = 0; j < m; j++) acc[j] = f(acc[j], Tr::load(sk[j]));
        }
        if (avg) {
            A div = (A)n;
            for (size_t j = 0; j < m; j++) acc[j] = acc[j] / div;
        }
        for (size_t j = 0; j < m; j++) out[base + j] = Tr::store(acc[j]);
    }
}

template <class Tr>
void reduce_typed(const void* const* srcs, int n, void* dst, size_t count, ncclRedOp_t op) {
    using A = typename Tr::Acc;
    switch (op) {
        case ncclSum: reduce_with<Tr>(srcs, n, dst, count, op_add<A>, false); break;
        case ncclAvg: reduce_with<Tr>(srcs, n, dst, count, op_add<A>, true); break;
        case ncclProd: reduce_with<Tr>(srcs, n, dst, count, op_mul<A>, false); break;
        case ncclMax:
            reduce_with<Tr>(srcs, n, dst, count, [](A a, A b) { return a < b ? b : a; }, false);
            break;
        case ncclMin:
            reduce_with<Tr>(srcs, n, dst, count, [](A a, A b) { return b < a ? b : a; }, false);
            break;
        default: break;  // rejected before enqueueing
    }
}

}  // namespace

void reduce(const void* const* srcs, int n, void* dst, size_t count, ncclDataType_t t,
            ncclRedOp_t op) {
    switch (t) {
        case ncclInt8: reduce_typed<Plain<int8_t>>(srcs, n, dst, count, op); break;
        case ncclUint8: reduce_typed<Plain<uint8_t>>(srcs, n, dst, count, op); break;
        case ncclInt32: reduce_typed<Plain<int32_t>>(srcs, n, dst, count, op); break;
        case ncclUint32: reduce_typed<Plain<uint32_t>>(srcs, n, dst, count, op); break;
        case ncclInt64: reduce_typed<Plain<int64_t>>(srcs, n, dst, count, op); break;
        case ncclUint64: reduce_typed<Plain<uint64_t>>(srcs, n, dst, count, op); break;
        case ncclFloat16: reduce_typed<F16>(srcs, n, dst, count, op); break;
        case ncclFloat32: reduce_typed<Plain<float>>(srcs, n, dst, count, op); break;
        case ncclFloat64: reduce_typed<Plain<double>>(srcs, n, dst, count, op); break;
        case ncclBfloat16: reduce_typed<Bf16>(srcs, n, dst, count, op); break;
        default: break;  // rejected before enqueueing
    }
}

}  // namespace fake_nccl
