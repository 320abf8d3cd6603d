// fake_gpu/tests/gemm_test.cpp: unit test of the emulated cuBLAS (fake_gpu/cublas/) against a
// naive triple loop in double: every transpose pair, odd sizes, padded leading dimensions, batch
// strides (0 included), alpha/beta, f32/f16/bf16/f64, exact rounding, NaN safety, bad arguments.
// Prints one line per failure; exits nonzero if any.
#include <cublas_v2.h>
#include <library_types.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../fake_gpu.h"

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

// ---- A strided batch of column-major matrices in (emulated) device memory. Every byte that is
// not one of the batch's elements is all-ones (NaN), so reading one shows in the result.
struct Mat {
    Fmt fmt;
    int64_t rows, cols, ld, stride, batch;
    size_t count;  // elements in the allocation
    uint64_t ptr;
    std::vector<unsigned char> gaps;  // snapshot of the allocation, to check untouched bytes
    Mat(Fmt f, int64_t r, int64_t c, int64_t l, int64_t s, int64_t b)
        : fmt(f), rows(r), cols(c), ld(l), stride(s), batch(b) {
        int64_t extent = (cols - 1) * ld + rows;
        count = size_t((batch - 1) * stride + extent);
        ptr = fake_gpu::alloc(count * fmt_size(f));
        std::memset(reinterpret_cast<void*>(ptr), 0xff, count * fmt_size(f));
    }
    ~Mat() { fake_gpu::release(ptr, "gemm_test"); }
    Mat(const Mat&) = delete;
    unsigned char* at(int64_t b, int64_t i, int64_t j) const {
        return reinterpret_cast<unsigned char*>(ptr) + (b * stride + i + j * ld) * fmt_size(fmt);
    }
    double get(int64_t b, int64_t i, int64_t j) const { return decode(fmt, at(b, i, j)); }
    void set(int64_t b, int64_t i, int64_t j, double v) { encode(fmt, at(b, i, j), v); }
    void fill_random(std::mt19937_64& rng) {
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        int64_t batches = stride == 0 ? 1 : batch;
        for (int64_t b = 0; b < batches; ++b)
            for (int64_t j = 0; j < cols; ++j)
                for (int64_t i = 0; i < rows; ++i) set(b, i, j, round_to(fmt, u(rng)));
    }
    void snapshot() {
        auto* p = reinterpret_cast<unsigned char*>(ptr);
        gaps.assign(p, p + count * fmt_size(fmt));
    }
    // True when every byte outside the batch's elements is as at the snapshot.
    bool gaps_intact() const {
        std::vector<bool> inside(count, false);
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t j = 0; j < cols; ++j)
                for (int64_t i = 0; i < rows; ++i) inside[size_t(b * stride + i + j * ld)] = true;
        auto* p = reinterpret_cast<unsigned char*>(ptr);
        size_t es = fmt_size(fmt);
        for (size_t e = 0; e < count; ++e)
            if (!inside[e] && std::memcmp(p + e * es, gaps.data() + e * es, es) != 0) return false;
        return true;
    }
};

enum class Api { StridedBatchedEx, GemmEx, Sgemm, SgemmStridedBatched, Dgemm, DgemmStridedBatched };
const char* api_name(Api a) {
    switch (a) {
        case Api::StridedBatchedEx: return "GemmStridedBatchedEx";
        case Api::GemmEx: return "GemmEx";
        case Api::Sgemm: return "Sgemm";
        case Api::SgemmStridedBatched: return "SgemmStridedBatched";
        case Api::Dgemm: return "Dgemm";
        case Api::DgemmStridedBatched: return "DgemmStridedBatched";
    }
    return "?";
}

struct Case {
    Api api = Api::StridedBatchedEx;
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int m = 1, n = 1, k = 1;
    int pad = 0;         // added to each minimal leading dimension
    int batch = 1;
    int zero_stride = 0;  // 0: none, 1: A broadcast (stride 0), 2: B broadcast
    double alpha = 1, beta = 0;
    Fmt ab = Fmt::F32, c = Fmt::F32;
    std::string name() const {
        char s[256];
        std::snprintf(s, sizeof s,
                      "%s compute=%d %s*%s->%s op=%c%c m=%d n=%d k=%d pad=%d batch=%d zstride=%d "
                      "alpha=%g beta=%g",
                      api_name(api), int(compute), fmt_name(ab), fmt_name(ab), fmt_name(c),
                      ta == CUBLAS_OP_N ? 'N' : ta == CUBLAS_OP_T ? 'T' : 'C',
                      tb == CUBLAS_OP_N ? 'N' : tb == CUBLAS_OP_T ? 'T' : 'C', m, n, k, pad, batch,
                      zero_stride, alpha, beta);
        return s;
    }
};

cublasStatus_t call(cublasHandle_t h, const Case& t, const Mat& A, const Mat& B, Mat& C) {
    int lda = int(A.ld), ldb = int(B.ld), ldc = int(C.ld);
    long long sa = A.stride, sb = B.stride, sc = C.stride;
    void* a = reinterpret_cast<void*>(A.ptr);
    void* b = reinterpret_cast<void*>(B.ptr);
    void* c = reinterpret_cast<void*>(C.ptr);
    float af = float(t.alpha), bf = float(t.beta);
    double ad = t.alpha, bd = t.beta;
    bool f64 = t.compute == CUBLAS_COMPUTE_64F || t.compute == CUBLAS_COMPUTE_64F_PEDANTIC;
    const void* alpha = f64 ? static_cast<const void*>(&ad) : &af;
    const void* beta = f64 ? static_cast<const void*>(&bd) : &bf;
    switch (t.api) {
        case Api::StridedBatchedEx:
            return cublasGemmStridedBatchedEx(h, t.ta, t.tb, t.m, t.n, t.k, alpha, a,
                                              fmt_type(t.ab), lda, sa, b, fmt_type(t.ab), ldb, sb,
                                              beta, c, fmt_type(t.c), ldc, sc, t.batch, t.compute,
                                              CUBLAS_GEMM_DEFAULT_TENSOR_OP);
        case Api::GemmEx:
            return cublasGemmEx(h, t.ta, t.tb, t.m, t.n, t.k, alpha, a, fmt_type(t.ab), lda, b,
                                fmt_type(t.ab), ldb, beta, c, fmt_type(t.c), ldc, t.compute,
                                CUBLAS_GEMM_DEFAULT);
        case Api::Sgemm:
            return cublasSgemm_v2(h, t.ta, t.tb, t.m, t.n, t.k, &af, (const float*)a, lda,
                                  (const float*)b, ldb, &bf, (float*)c, ldc);
        case Api::SgemmStridedBatched:
            return cublasSgemmStridedBatched(h, t.ta, t.tb, t.m, t.n, t.k, &af, (const float*)a,
                                             lda, sa, (const float*)b, ldb, sb, &bf, (float*)c,
                                             ldc, sc, t.batch);
        case Api::Dgemm:
            return cublasDgemm_v2(h, t.ta, t.tb, t.m, t.n, t.k, &ad, (const double*)a, lda,
                                  (const double*)b, ldb, &bd, (double*)c, ldc);
        case Api::DgemmStridedBatched:
            return cublasDgemmStridedBatched(h, t.ta, t.tb, t.m, t.n, t.k, &ad, (const double*)a,
                                             lda, sa, (const double*)b, ldb, sb, &bd, (double*)c,
                                             ldc, sc, t.batch);
    }
    return CUBLAS_STATUS_INTERNAL_ERROR;
}

// Runs one case and compares every element of C with the double reference.
void run_case(cublasHandle_t h, const Case& t, std::mt19937_64& rng) {
    bool ta = t.ta != CUBLAS_OP_N, tb = t.tb != CUBLAS_OP_N;
    int64_t ar = ta ? t.k : t.m, ac = ta ? t.m : t.k;  // A as stored
    int64_t br = tb ? t.n : t.k, bc = tb ? t.k : t.n;
    int64_t lda = std::max<int64_t>(1, ar) + t.pad, ldb = std::max<int64_t>(1, br) + t.pad;
    int64_t ldc = std::max<int64_t>(1, t.m) + t.pad;
    // Batch strides leave a gap of 5 elements between matrices (or broadcast with 0).
    int64_t sa = t.zero_stride == 1 ? 0 : (ac - 1) * lda + ar + 5;
    int64_t sb = t.zero_stride == 2 ? 0 : (bc - 1) * ldb + br + 5;
    int64_t sc = (t.n - 1) * ldc + t.m + 5;
    Mat A(t.ab, ar, ac, lda, sa, t.batch), B(t.ab, br, bc, ldb, sb, t.batch),
        C(t.c, t.m, t.n, ldc, sc, t.batch);
    A.fill_random(rng);
    B.fill_random(rng);
    if (t.beta != 0) C.fill_random(rng);  // else C stays NaN: it must not be read
    std::vector<double> c0(size_t(t.batch * t.m * t.n));
    for (int64_t b = 0; b < t.batch; ++b)
        for (int64_t j = 0; j < t.n; ++j)
            for (int64_t i = 0; i < t.m; ++i) c0[size_t((b * t.n + j) * t.m + i)] = C.get(b, i, j);
    C.snapshot();

    cublasStatus_t st = call(h, t, A, B, C);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fail(t.name() + ": status " + std::to_string(int(st)));
        return;
    }
    fake_gpu::sync_all();

    int bad = 0;
    std::string first;
    for (int64_t b = 0; b < t.batch; ++b)
        for (int64_t j = 0; j < t.n; ++j)
            for (int64_t i = 0; i < t.m; ++i) {
                double sum = 0, mag = 0;
                if (t.alpha != 0)
                    for (int64_t p = 0; p < t.k; ++p) {
                        double a = ta ? A.get(b, p, i) : A.get(b, i, p);
                        double v = tb ? B.get(b, j, p) : B.get(b, p, j);
                        sum += a * v;
                        mag += std::fabs(a * v);
                    }
                double cv = c0[size_t((b * t.n + j) * t.m + i)];
                double ref = t.alpha * sum + (t.beta != 0 ? t.beta * cv : 0.0);
                mag = std::fabs(t.alpha) * mag + (t.beta != 0 ? std::fabs(t.beta * cv) : 0.0);
                double got = C.get(b, i, j);
                double want = round_to(t.c, ref), tol;
                if (t.c == Fmt::F64)
                    tol = 1e-12 * mag + 1e-300;
                else if (t.c == Fmt::F32 || t.ab == Fmt::F32)
                    tol = 1e-5 * mag + 1e-30;
                else  // 16-bit storage: 1 ulp of storage (plus f32 accumulation under cancellation)
                    tol = std::max(ulp(t.c, want), ulp(t.c, got)) + 1e-5 * mag;
                if (!(std::fabs(got - want) <= tol)) {
                    if (bad++ == 0) {
                        char s[200];
                        std::snprintf(s, sizeof s, " first at batch %lld (%lld,%lld): got %.9g want %.9g",
                                      (long long)b, (long long)i, (long long)j, got, want);
                        first = s;
                    }
                }
            }
    if (bad) fail(t.name() + ": " + std::to_string(bad) + " wrong elements;" + first);
    if (!C.gaps_intact()) fail(t.name() + ": wrote outside C's elements");
}

// The matrix of cases: every transpose pair x sizes x padding x batching x alpha/beta x types.
void test_matrix(cublasHandle_t h) {
    std::mt19937_64 rng(12345);
    struct Types {
        Api api;
        Fmt ab, c;
    };
    const Types types[] = {
        {Api::StridedBatchedEx, Fmt::F32, Fmt::F32},   {Api::StridedBatchedEx, Fmt::F16, Fmt::F16},
        {Api::StridedBatchedEx, Fmt::BF16, Fmt::BF16}, {Api::StridedBatchedEx, Fmt::F16, Fmt::F32},
        {Api::StridedBatchedEx, Fmt::BF16, Fmt::F32},  {Api::DgemmStridedBatched, Fmt::F64, Fmt::F64},
        {Api::StridedBatchedEx, Fmt::F64, Fmt::F64},
    };
    const cublasComputeType_t f32_computes[] = {
        CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_COMPUTE_32F_FAST_16F,
        CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_COMPUTE_32F_FAST_TF32};
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    const int ms[] = {1, 7, 37}, ns[] = {1, 6, 13}, ks[] = {1, 9, 37};
    const double ab[][2] = {{1, 0}, {0.5, 1}, {0.5, 0.5}, {0, 0.5}, {0, 0}, {-1.25, 0}};
    struct Batching {
        int batch, zero_stride;
    };
    const Batching batchings[] = {{1, 0}, {3, 0}, {3, 1}, {3, 2}};
    long cases = 0;
    for (const Types& ty : types)
        for (cublasOperation_t ta : ops)
            for (cublasOperation_t tb : ops)
                for (int m : ms)
                    for (int n : ns)
                        for (int k : ks)
                            for (int pad = 0; pad <= 3; pad += 3)
                                for (const Batching& bt : batchings)
                                    for (const auto& al : ab) {
                                        Case t;
                                        t.api = ty.api;
                                        t.ab = ty.ab;
                                        t.c = ty.c;
                                        t.compute = ty.ab == Fmt::F64
                                                        ? (cases % 2 ? CUBLAS_COMPUTE_64F_PEDANTIC
                                                                     : CUBLAS_COMPUTE_64F)
                                                        : f32_computes[cases % 5];
                                        t.ta = ta;
                                        t.tb = tb;
                                        t.m = m;
                                        t.n = n;
                                        t.k = k;
                                        t.pad = pad;
                                        t.batch = bt.batch;
                                        t.zero_stride = bt.zero_stride;
                                        t.alpha = al[0];
                                        t.beta = al[1];
                                        // The unbatched entry points, on single-matrix cases.
                                        if (t.batch == 1 && cases % 3 == 1) {
                                            if (t.ab == Fmt::F32 && t.c == Fmt::F32)
                                                t.api = cases % 2 ? Api::Sgemm : Api::GemmEx;
                                            else if (t.api == Api::DgemmStridedBatched)
                                                t.api = Api::Dgemm;
                                            else
                                                t.api = Api::GemmEx;
                                        }
                                        if (t.ab == Fmt::F32 && t.c == Fmt::F32 &&
                                            t.api == Api::StridedBatchedEx && cases % 7 == 3)
                                            t.api = Api::SgemmStridedBatched;
                                        run_case(h, t, rng);
                                        ++cases;
                                    }
    std::printf("gemm_test: %ld matrix cases run\n", cases);
}

// Cases past the block sizes (several row and column tiles, several depth slices, threads).
void test_large(cublasHandle_t h) {
    std::mt19937_64 rng(777);
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    for (Fmt f : {Fmt::F32, Fmt::BF16, Fmt::F64})
        for (cublasOperation_t ta : ops)
            for (cublasOperation_t tb : ops) {
                Case t;
                t.api = f == Fmt::F64 ? Api::DgemmStridedBatched : Api::StridedBatchedEx;
                t.compute = f == Fmt::F64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
                t.ab = t.c = f;
                t.ta = ta;
                t.tb = tb;
                t.m = 300;
                t.n = 400;
                t.k = f == Fmt::F32 ? 600 : 270;
                t.pad = 2;
                t.batch = 2;
                t.zero_stride = ta == CUBLAS_OP_T && tb == CUBLAS_OP_N ? 2 : 0;
                t.alpha = 0.5;
                t.beta = f == Fmt::BF16 ? 0.0 : 1.0;
                run_case(h, t, rng);
            }
    // OP_C is OP_T for real types.
    for (Fmt f : {Fmt::F32, Fmt::F16}) {
        Case t;
        t.ab = t.c = f;
        t.ta = CUBLAS_OP_C;
        t.tb = CUBLAS_OP_C;
        t.m = 19;
        t.n = 23;
        t.k = 29;
        t.pad = 1;
        t.batch = 2;
        t.beta = 0.5;
        run_case(h, t, rng);
    }
}

// Products of two 16-bit values are exact in f32, so with k = 1, alpha = 1, beta = 0 the result
// must be the correctly rounded product, bit for bit: this checks the rounding (ties, subnormals,
// overflow to infinity) of the f32 -> f16 / bf16 conversions.
void test_exact_rounding(cublasHandle_t h) {
    std::mt19937_64 rng(99);
    for (Fmt f : {Fmt::F16, Fmt::BF16}) {
        const int m = 257, n = 263;
        Mat A(f, m, 1, m, 0, 1), B(f, 1, n, 1, 0, 1), C(f, m, n, m, 0, 1);
        auto random_value = [&]() {
            for (;;) {
                uint16_t bits = uint16_t(rng());
                unsigned char p[8] = {};
                std::memcpy(p, &bits, 2);
                double v = decode(f, p);
                if (!std::isfinite(v)) continue;
                // bf16: keep products normal in f32 (tiny ones would round twice); f16: all.
                if (f == Fmt::BF16 && v != 0 && (std::fabs(v) < 1e-15 || std::fabs(v) > 1e15))
                    continue;
                return v;
            }
        };
        for (int i = 0; i < m; ++i) A.set(0, i, 0, random_value());
        for (int j = 0; j < n; ++j) B.set(0, 0, j, random_value());
        A.set(0, 0, 0, f == Fmt::F16 ? 256.0 : 1.0);  // 256 * 256 overflows f16
        B.set(0, 0, 0, f == Fmt::F16 ? 256.0 : 1.0);
        float one = 1, zero = 0;
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 1, &one, reinterpret_cast<void*>(A.ptr),
            fmt_type(f), m, 0, reinterpret_cast<void*>(B.ptr), fmt_type(f), 1, 0, &zero,
            reinterpret_cast<void*>(C.ptr), fmt_type(f), m, 0, 1, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        fake_gpu::sync_all();
        if (st != CUBLAS_STATUS_SUCCESS) {
            fail(std::string("exact rounding ") + fmt_name(f) + ": status " +
                 std::to_string(int(st)));
            continue;
        }
        int bad = 0;
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                double want = round_to(f, A.get(0, i, 0) * B.get(0, 0, j));
                double got = C.get(0, i, j);
                if (!(got == want && std::signbit(got) == std::signbit(want)) &&
                    !(std::isnan(got) && std::isnan(want))) {
                    if (bad++ < 3) {
                        char s[200];
                        std::snprintf(s, sizeof s, "exact rounding %s: %.17g * %.17g gave %.17g, want %.17g",
                                      fmt_name(f), A.get(0, i, 0), B.get(0, 0, j), got, want);
                        fail(s);
                    }
                }
            }
        if (bad > 3) fail(std::string("exact rounding ") + fmt_name(f) + ": " + std::to_string(bad) + " wrong in all");
    }
}

// beta == 0 over C full of NaN gives finite output; NaN in a used element of A does propagate.
void test_nan(cublasHandle_t h) {
    const int m = 5, n = 4, k = 3;
    Mat A(Fmt::F32, m, k, m, 0, 1), B(Fmt::F32, k, n, k, 0, 1), C(Fmt::F32, m, n, m, 0, 1);
    for (int p = 0; p < k; ++p) {
        for (int i = 0; i < m; ++i) A.set(0, i, p, 1.0);
        for (int j = 0; j < n; ++j) B.set(0, p, j, 2.0);
    }
    float one = 1, zero = 0;
    auto run = [&]() {
        return cublasSgemm_v2(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, (const float*)A.ptr, m,
                              (const float*)B.ptr, k, &zero, (float*)C.ptr, m);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) fail("nan: status");
    fake_gpu::sync_all();
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i)
            if (C.get(0, i, j) != 6.0) {
                fail("nan: beta = 0 over NaN C gave " + std::to_string(C.get(0, i, j)));
                return;
            }
    // alpha = 0, beta = 0 also writes zeros without reading C.
    std::memset(reinterpret_cast<void*>(C.ptr), 0xff, size_t(m * n * 4));
    if (cublasSgemm_v2(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &zero, (const float*)A.ptr, m,
                       (const float*)B.ptr, k, &zero, (float*)C.ptr, m) != CUBLAS_STATUS_SUCCESS)
        fail("nan: alpha = 0 status");
    fake_gpu::sync_all();
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i)
            if (C.get(0, i, j) != 0.0) {
                fail("nan: alpha = beta = 0 over NaN C gave " + std::to_string(C.get(0, i, j)));
                return;
            }
    A.set(0, 2, 1, NAN);
    run();
    fake_gpu::sync_all();
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i)
            if (std::isnan(C.get(0, i, j)) != (i == 2)) {
                fail("nan: NaN in A(2,1) did not give NaN in row 2 only");
                return;
            }
}

// Bad arguments return the documented status and touch nothing.
void test_invalid(cublasHandle_t h) {
    const int m = 4, n = 3, k = 5;
    Mat A(Fmt::F32, 16, 16, 16, 0, 1), B(Fmt::F32, 16, 16, 16, 0, 1), C(Fmt::F32, 16, 16, 16, 0, 1);
    std::mt19937_64 rng(1);
    A.fill_random(rng);
    C.snapshot();
    float one = 1, zero = 0;
    struct Bad {
        const char* what;
        cublasOperation_t ta, tb;
        int m, n, k, lda, ldb, ldc, batch;
        cublasStatus_t want;
    };
    const Bad bads[] = {
        {"lda < m (N)", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m - 1, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"lda < k (T)", CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, k - 1, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"lda = 0 with m = 0", CUBLAS_OP_N, CUBLAS_OP_N, 0, n, k, 0, k, 1, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"ldb < k (N)", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k - 1, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"ldb < n (T)", CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, m, n - 1, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"ldc < m", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k, m - 1, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"m < 0", CUBLAS_OP_N, CUBLAS_OP_N, -1, n, k, m, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"n < 0", CUBLAS_OP_N, CUBLAS_OP_N, m, -1, k, m, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"k < 0", CUBLAS_OP_N, CUBLAS_OP_N, m, n, -1, m, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"batch < 0", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k, m, -1, CUBLAS_STATUS_INVALID_VALUE},
        {"transa = CONJG", CUBLAS_OP_CONJG, CUBLAS_OP_N, m, n, k, m, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"transb = 7", CUBLAS_OP_N, cublasOperation_t(7), m, n, k, m, k, m, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"valid, lda > m", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m + 2, k, m, 1, CUBLAS_STATUS_SUCCESS},
        {"valid, m = 0", CUBLAS_OP_N, CUBLAS_OP_N, 0, n, k, 1, k, 1, 1, CUBLAS_STATUS_SUCCESS},
        {"valid, batch = 0", CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, m, k, m, 0, CUBLAS_STATUS_SUCCESS},
    };
    for (const Bad& b : bads) {
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            h, b.ta, b.tb, b.m, b.n, b.k, &one, (void*)A.ptr, CUDA_R_32F, b.lda, 0, (void*)B.ptr,
            CUDA_R_32F, b.ldb, 0, &zero, (void*)C.ptr, CUDA_R_32F, b.ldc, 0, b.batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != b.want)
            fail(std::string("invalid: ") + b.what + " gave status " + std::to_string(int(st)) +
                 ", want " + std::to_string(int(b.want)));
        fake_gpu::sync_all();
        if (b.want != CUBLAS_STATUS_SUCCESS && std::memcmp((void*)C.ptr, C.gaps.data(), C.gaps.size()))
            fail(std::string("invalid: ") + b.what + " wrote C");
        C.snapshot();
    }
    // Dgemm has the same checks.
    double oned = 1, zerod = 0;
    if (cublasDgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &oned, (const double*)A.ptr,
                                  m - 1, 0, (const double*)B.ptr, k, 0, &zerod, (double*)C.ptr, m,
                                  0, 1) != CUBLAS_STATUS_INVALID_VALUE)
        fail("invalid: Dgemm lda < m not rejected");
    // Null alpha/beta, unsupported types and compute types, null handle.
    if (cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, nullptr, (void*)A.ptr,
                                   CUDA_R_32F, m, 0, (void*)B.ptr, CUDA_R_32F, k, 0, &zero,
                                   (void*)C.ptr, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_INVALID_VALUE)
        fail("invalid: null alpha not rejected");
    if (cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, (void*)A.ptr,
                                   CUDA_R_16F, m, 0, (void*)B.ptr, CUDA_R_16BF, k, 0, &zero,
                                   (void*)C.ptr, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_SUPPORTED)
        fail("invalid: mixed f16/bf16 inputs not rejected");
    if (cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, (void*)A.ptr,
                                   CUDA_R_32F, m, 0, (void*)B.ptr, CUDA_R_32F, k, 0, &zero,
                                   (void*)C.ptr, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_64F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_SUPPORTED)
        fail("invalid: f32 data with 64F compute not rejected");
    if (cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, (void*)A.ptr,
                                   CUDA_R_32F, m, 0, (void*)B.ptr, CUDA_R_32F, k, 0, &zero,
                                   (void*)C.ptr, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_32I,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_SUPPORTED)
        fail("invalid: 32I compute not rejected");
    if (cublasGemmStridedBatchedEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, (void*)A.ptr,
                                   CUDA_R_32F, m, 0, (void*)B.ptr, CUDA_R_32F, k, 0, &zero,
                                   (void*)C.ptr, CUDA_R_32F, m, 0, 1, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_NOT_INITIALIZED)
        fail("invalid: null handle not rejected");
    fake_gpu::sync_all();
    if (std::memcmp((void*)C.ptr, C.gaps.data(), C.gaps.size())) fail("invalid: a rejected call wrote C");
}

// The 16F compute type takes alpha/beta as half.
void test_compute_16f(cublasHandle_t h) {
    std::mt19937_64 rng(5);
    const int m = 9, n = 7, k = 11;
    Mat A(Fmt::F16, m, k, m, 0, 1), B(Fmt::F16, k, n, k, 0, 1), C(Fmt::F16, m, n, m, 0, 1);
    A.fill_random(rng);
    B.fill_random(rng);
    uint16_t alpha = 0x3800, beta = 0;  // 0.5, 0
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, (void*)A.ptr, CUDA_R_16F, m,
                     (void*)B.ptr, CUDA_R_16F, k, &beta, (void*)C.ptr, CUDA_R_16F, m,
                     CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        fail("compute 16F: status");
        return;
    }
    fake_gpu::sync_all();
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double s = 0, mag = 0;
            for (int p = 0; p < k; ++p) {
                s += A.get(0, i, p) * B.get(0, p, j);
                mag += std::fabs(A.get(0, i, p) * B.get(0, p, j));
            }
            double want = round_to(Fmt::F16, 0.5 * s), got = C.get(0, i, j);
            if (!(std::fabs(got - want) <= ulp(Fmt::F16, want) + 1e-5 * mag)) {
                fail("compute 16F: got " + std::to_string(got) + " want " + std::to_string(want));
                return;
            }
        }
}

void test_handle(cublasHandle_t h) {
    cudaStream_t s = nullptr;
    if (cublasSetStream_v2(h, reinterpret_cast<cudaStream_t>(0x1234)) != CUBLAS_STATUS_SUCCESS ||
        cublasGetStream_v2(h, &s) != CUBLAS_STATUS_SUCCESS || s != reinterpret_cast<cudaStream_t>(0x1234))
        fail("handle: stream not kept");
    cublasSetStream_v2(h, nullptr);
    cublasPointerMode_t mode = CUBLAS_POINTER_MODE_DEVICE;
    if (cublasGetPointerMode_v2(h, &mode) != CUBLAS_STATUS_SUCCESS || mode != CUBLAS_POINTER_MODE_HOST)
        fail("handle: default pointer mode is not host");
}

}  // namespace

int main() {
    cublasHandle_t h = nullptr;
    if (cublasCreate_v2(&h) != CUBLAS_STATUS_SUCCESS || h == nullptr) {
        std::printf("FAIL cublasCreate_v2\n");
        return 1;
    }
    test_handle(h);
    test_invalid(h);
    test_nan(h);
    test_exact_rounding(h);
    test_compute_16f(h);
    test_matrix(h);
    test_large(h);
    if (cublasDestroy_v2(h) != CUBLAS_STATUS_SUCCESS) fail("cublasDestroy_v2");
    std::printf("gemm_test: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
