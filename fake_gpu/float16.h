// The host side of the emulated device's 16-bit storage types: bf16 and f16 to and from f32,
// round to nearest even, NaN stays NaN. cuBLAS (fake_gpu/cublas/) rounds its GEMMs' results with
// them and NCCL (fake_gpu/nccl/) its f16/bf16 reductions: one rounding for both.
#pragma once
#include <cstdint>
#include <cstring>

namespace fake_gpu {
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24, exact
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
static inline uint16_t f32_to_f16(float f) {
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
}  // namespace fake_gpu
