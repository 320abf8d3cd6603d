// CUDA's atomics for the kernels' CPU builds of terse's emulated device (part of
// fake_gpu/include/terse_fake_cuda.h, its last, after intrinsics.h): add, exchange, min, max,
// compare-and-swap, the bitwise ones, increment and decrement, on the types CUDA has them for.
#pragma once

// Launches run one at a time on one OS thread, but the operations are atomic anyway (the host
// may touch the memory). Each returns the old value, as CUDA's do.
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
