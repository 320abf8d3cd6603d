// fake_gpu/tests/gemm_test.cpp: unit test of the emulated cuBLAS (fake_gpu/cublas/) against a
// naive triple loop in double: every transpose pair, odd sizes, padded leading dimensions, batch
// strides (0 included), alpha/beta, f32/f16/bf16/f64, exact rounding, NaN safety, bad arguments.
// Prints one line per failure; exits nonzero if any.
// The formats and the case runner are in gemm/ (formats.h, cases.h); this file holds the
// tests.
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

#include "gemm/cases.h"
#include "gemm/formats.h"

namespace {

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
