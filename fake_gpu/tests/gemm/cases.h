// gemm_test.cpp's cases (included by it alone): a strided batch of column-major matrices in
// device memory with NaN between its elements, one GEMM call through any of the APIs, and the
// run of a case against the double-precision reference.
#pragma once

#include "formats.h"

namespace {

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

}  // namespace
