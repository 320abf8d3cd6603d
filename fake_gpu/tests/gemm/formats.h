// gemm_test.cpp's storage formats (included by it alone), written independently of the
// library: decode, round a double to the format, encode an exactly representable value; and the
// test's failure count.
#pragma once

#include <cublas_v2.h>
#include <library_types.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>
#include "../../fake_gpu.h"

namespace {


int failures = 0;
void fail(const std::string& what) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
}

// ---- Storage formats, written independently of the library: decode, round a double to the
// format (nearest even, from the double directly), encode an exactly representable value.
enum class Fmt { F32, F64, F16, BF16 };
const char* fmt_name(Fmt f) {
    switch (f) {
        case Fmt::F32: return "f32";
        case Fmt::F64: return "f64";
        case Fmt::F16: return "f16";
        case Fmt::BF16: return "bf16";
    }
    return "?";
}
size_t fmt_size(Fmt f) { return f == Fmt::F64 ? 8 : f == Fmt::F32 ? 4 : 2; }
cudaDataType fmt_type(Fmt f) {
    switch (f) {
        case Fmt::F32: return CUDA_R_32F;
        case Fmt::F64: return CUDA_R_64F;
        case Fmt::F16: return CUDA_R_16F;
        case Fmt::BF16: return CUDA_R_16BF;
    }
    return CUDA_R_32F;
}
// significand bits (with the implicit one), smallest normal exponent, largest finite value
int fmt_digits(Fmt f) { return f == Fmt::F16 ? 11 : f == Fmt::BF16 ? 8 : f == Fmt::F32 ? 24 : 53; }
int fmt_emin(Fmt f) { return f == Fmt::F16 ? -14 : f == Fmt::F64 ? -1022 : -126; }
double fmt_max(Fmt f) {
    switch (f) {
        case Fmt::F16: return 65504.0;
        case Fmt::BF16: return std::ldexp(255.0, 120);  // 0x7f7f
        case Fmt::F32: return double(3.4028234663852886e38);
        case Fmt::F64: return 1.7976931348623157e308;
    }
    return 0;
}
// The spacing of the format's values at |v|.
double ulp(Fmt f, double v) {
    int e = 0;
    std::frexp(std::fabs(v), &e);
    int lead = std::max(e - 1, fmt_emin(f));
    return std::ldexp(1.0, lead - (fmt_digits(f) - 1));
}
double round_to(Fmt f, double v) {
    if (f == Fmt::F64 || v == 0 || !std::isfinite(v)) return v;
    double q = ulp(f, v);
    double r = std::nearbyint(v / q) * q;  // default rounding mode: ties to even
    if (std::fabs(r) > fmt_max(f)) return std::copysign(INFINITY, v);
    return r;
}
double decode(Fmt f, const unsigned char* p) {
    switch (f) {
        case Fmt::F32: {
            float v;
            std::memcpy(&v, p, 4);
            return v;
        }
        case Fmt::F64: {
            double v;
            std::memcpy(&v, p, 8);
            return v;
        }
        case Fmt::BF16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            uint32_t u = uint32_t(h) << 16;
            float v;
            std::memcpy(&v, &u, 4);
            return v;
        }
        case Fmt::F16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            int e = (h >> 10) & 31, m = h & 1023;
            double s = (h & 0x8000) ? -1.0 : 1.0;
            if (e == 0) return s * std::ldexp(double(m), -24);
            if (e == 31) return m ? NAN : s * INFINITY;
            return s * std::ldexp(double(1024 + m), e - 25);
        }
    }
    return NAN;
}
// `v` must be exactly representable in `f` (or infinite).
void encode(Fmt f, unsigned char* p, double v) {
    switch (f) {
        case Fmt::F32: {
            float x = float(v);
            std::memcpy(p, &x, 4);
            return;
        }
        case Fmt::F64: std::memcpy(p, &v, 8); return;
        case Fmt::BF16: {
            float x = float(v);
            uint32_t u;
            std::memcpy(&u, &x, 4);
            uint16_t h = uint16_t(u >> 16);
            std::memcpy(p, &h, 2);
            return;
        }
        case Fmt::F16: {
            uint16_t h = std::signbit(v) ? 0x8000 : 0;
            double a = std::fabs(v);
            if (std::isinf(a)) {
                h |= 0x7c00;
            } else if (a < std::ldexp(1.0, -14)) {
                h |= uint16_t(a * std::ldexp(1.0, 24));
            } else if (a != 0) {
                int e;
                std::frexp(a, &e);
                int lead = e - 1;
                h |= uint16_t((lead + 15) << 10) | uint16_t(a / std::ldexp(1.0, lead - 10) - 1024);
            }
            std::memcpy(p, &h, 2);
            return;
        }
    }
}

}  // namespace
