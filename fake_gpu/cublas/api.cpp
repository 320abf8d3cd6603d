// The exported API of the emulated device's cuBLAS (libcublas.so.13; fake_gpu/cublas/,
// internal.h): handles and the GEMMs the `cuda` binary calls (candle's matmul through cudarc). A
// GEMM entry point validates its arguments as cuBLAS does and enqueues a Job on the handle's
// stream; the blocked GEMM (kernel.cpp) computes it on the CPU when the stream work runs.
//
// Semantics follow the cuBLAS documentation: column-major matrices, op(X) = X (N) or X^T (T; C is
// T for real types), C = alpha * op(A) op(B) + beta * C, leading dimensions and batch strides in
// elements, alpha/beta read from host memory at call time (pointer mode host only). Products are
// accumulated in f32 (f64 for the 64F compute type) and rounded to C's type once, at the end
// (round to nearest even). With beta == 0, C is never read, so NaN in fresh memory does not leak.
// The "fast" compute types (32F_FAST_16F, _16BF, _TF32) are computed at full f32 precision, which
// those modes allow; the 16F compute type also accumulates in f32 (more precise than a GPU).
#include <cublas_v2.h>
#include <library_types.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#include "fake_gpu.h"
#include "internal.h"

struct cublasContext {
    fake_gpu::Stream stream = nullptr;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
    cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
    cublasAtomicsMode_t atomics_mode = CUBLAS_ATOMICS_NOT_ALLOWED;
};

using namespace fake_cublas;

namespace {

// With TERSE_FAKE_GPU_TRACE=1: one line per call on stderr.
void trace(const char* function, const std::string& detail = std::string()) {
    if (fake_gpu::settings().trace)
        std::fprintf(stderr, "terse fake-gpu: %s%s%s\n", function, detail.empty() ? "" : " ",
                     detail.c_str());
}

// ---- Live handles: a destroyed or foreign handle is a bug in the caller; say so and stop.
std::mutex handles_mutex;
std::unordered_set<cublasHandle_t>& live_handles() {
    static auto* set = new std::unordered_set<cublasHandle_t>();
    return *set;
}
// NOT_INITIALIZED for a null handle (as cuBLAS); dies for one that is not live.
bool handle_ok(cublasHandle_t handle, const char* function) {
    if (handle == nullptr) return false;
    std::lock_guard<std::mutex> lock(handles_mutex);
    if (!live_handles().count(handle))
        fake_gpu::die(std::string(function) + ": the handle was never created or was destroyed");
    return true;
}

// ---- Argument checks shared by every GEMM entry point.
bool op_ok(cublasOperation_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// Checks the bytes a strided batch of rows x cols matrices (leading dimension ld) spans.
void check_matrix(const void* ptr, size_t elem, int64_t rows, int64_t cols, int64_t ld,
                  int64_t stride, int64_t batch, const char* function, const char* which) {
    if (rows == 0 || cols == 0 || batch == 0) return;
    __int128 extent = __int128(cols - 1) * ld + rows;  // last element + 1
    __int128 last = __int128(batch - 1) * stride;
    __int128 lo = std::min<__int128>(0, last), hi = std::max<__int128>(0, last) + extent;
    __int128 bytes = (hi - lo) * __int128(elem), start = __int128(uintptr_t(ptr)) + lo * elem;
    if (start < 0 || bytes > (__int128(1) << 62))
        fake_gpu::die(std::string(function) + ": matrix " + which + " spans an impossible range");
    fake_gpu::check_range(uint64_t(start), size_t(bytes), function);
}

enum class Compute { F32, F64, F16 };

// The common GEMM: validates as cuBLAS does, reads alpha/beta now, checks ranges, enqueues.
cublasStatus_t gemm(const char* function, cublasHandle_t handle, cublasOperation_t transa,
                    cublasOperation_t transb, int64_t m, int64_t n, int64_t k, const void* alpha,
                    const void* A, cudaDataType atype, int64_t lda, int64_t stride_a,
                    const void* B, cudaDataType btype, int64_t ldb, int64_t stride_b,
                    const void* beta, void* C, cudaDataType ctype, int64_t ldc, int64_t stride_c,
                    int64_t batch, Compute compute) {
    auto reject = [&](cublasStatus_t status, const char* why) {
        trace(function, std::string("rejected: ") + why);
        return status;
    };
    if (!handle_ok(handle, function)) return reject(CUBLAS_STATUS_NOT_INITIALIZED, "null handle");
    if (!op_ok(transa) || !op_ok(transb))
        return reject(CUBLAS_STATUS_INVALID_VALUE, "transa/transb not N, T or C");
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return reject(CUBLAS_STATUS_INVALID_VALUE, "m, n, k or batchCount negative");
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    if (lda < std::max<int64_t>(1, ta ? k : m))
        return reject(CUBLAS_STATUS_INVALID_VALUE, "lda below the rows of A");
    if (ldb < std::max<int64_t>(1, tb ? n : k))
        return reject(CUBLAS_STATUS_INVALID_VALUE, "ldb below the rows of B");
    if (ldc < std::max<int64_t>(1, m))
        return reject(CUBLAS_STATUS_INVALID_VALUE, "ldc below m");
    if (alpha == nullptr || beta == nullptr)
        return reject(CUBLAS_STATUS_INVALID_VALUE, "null alpha or beta");

    Type at, bt, ct;
    if (!storage_type(atype, &at) || !storage_type(btype, &bt) || !storage_type(ctype, &ct))
        return reject(CUBLAS_STATUS_NOT_SUPPORTED, "a data type other than R_32F/64F/16F/16BF");
    // The type combinations cuBLAS lists for these compute types (real ones).
    bool supported = false;
    switch (compute) {
        case Compute::F64: supported = at == Type::F64 && bt == Type::F64 && ct == Type::F64; break;
        case Compute::F16: supported = at == Type::F16 && bt == Type::F16 && ct == Type::F16; break;
        case Compute::F32:
            supported = at == bt && at != Type::F64 && (ct == at || ct == Type::F32);
            break;
    }
    if (!supported)
        return reject(CUBLAS_STATUS_NOT_SUPPORTED, "data types the compute type does not take");

    cublasPointerMode_t mode;
    fake_gpu::Stream stream;
    {
        std::lock_guard<std::mutex> lock(handles_mutex);
        mode = handle->pointer_mode;
        stream = handle->stream;
    }
    if (mode != CUBLAS_POINTER_MODE_HOST)
        fake_gpu::die(std::string(function) +
                      ": alpha/beta in device memory (CUBLAS_POINTER_MODE_DEVICE) are not emulated");
    if (fake_gpu::settings().trace) {
        char detail[200];
        std::snprintf(detail, sizeof detail,
                      "op %c%c m %lld n %lld k %lld lda %lld ldb %lld ldc %lld strides %lld %lld "
                      "%lld batch %lld types %d %d %d",
                      ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k,
                      (long long)lda, (long long)ldb, (long long)ldc, (long long)stride_a,
                      (long long)stride_b, (long long)stride_c, (long long)batch, int(atype),
                      int(btype), int(ctype));
        trace(function, detail);
    }
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;

    auto launch = [&](auto job) {
        using T = decltype(job.alpha);
        job.ta = ta;
        job.tb = tb;
        job.m = m;
        job.n = n;
        job.k = k;
        job.batch = batch;
        job.a = static_cast<const char*>(A);
        job.b = static_cast<const char*>(B);
        job.c = static_cast<char*>(C);
        job.at = at;
        job.bt = bt;
        job.ct = ct;
        job.lda = lda;
        job.ldb = ldb;
        job.ldc = ldc;
        job.sa = stride_a;
        job.sb = stride_b;
        job.sc = stride_c;
        if (k > 0 && job.alpha != T(0)) {
            check_matrix(A, type_size(at), ta ? k : m, ta ? m : k, lda, stride_a, batch, function,
                         "A");
            check_matrix(B, type_size(bt), tb ? n : k, tb ? k : n, ldb, stride_b, batch, function,
                         "B");
        }
        check_matrix(C, type_size(ct), m, n, ldc, stride_c, batch, function, "C");
        // A GEMM a capture records runs, and counts, as its graph.
        fake_gpu::count_launch(stream, fake_gpu::kLibraryLaunches);
        fake_gpu::enqueue(stream, [job]() { run_gemm(job); });
    };
    switch (compute) {
        case Compute::F64: {
            Job<double> job;
            std::memcpy(&job.alpha, alpha, sizeof(double));
            std::memcpy(&job.beta, beta, sizeof(double));
            launch(job);
            break;
        }
        case Compute::F32: {
            Job<float> job;
            std::memcpy(&job.alpha, alpha, sizeof(float));
            std::memcpy(&job.beta, beta, sizeof(float));
            launch(job);
            break;
        }
        case Compute::F16: {
            Job<float> job;
            uint16_t h;
            std::memcpy(&h, alpha, 2);
            job.alpha = f16_to_f32(h);
            std::memcpy(&h, beta, 2);
            job.beta = f16_to_f32(h);
            launch(job);
            break;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

bool compute_of(cublasComputeType_t c, Compute* out) {
    switch (c) {
        case CUBLAS_COMPUTE_32F:
        case CUBLAS_COMPUTE_32F_PEDANTIC:
        case CUBLAS_COMPUTE_32F_FAST_16F:
        case CUBLAS_COMPUTE_32F_FAST_16BF:
        case CUBLAS_COMPUTE_32F_FAST_TF32: *out = Compute::F32; return true;
        case CUBLAS_COMPUTE_64F:
        case CUBLAS_COMPUTE_64F_PEDANTIC: *out = Compute::F64; return true;
        case CUBLAS_COMPUTE_16F:
        case CUBLAS_COMPUTE_16F_PEDANTIC: *out = Compute::F16; return true;
        default: return false;
    }
}
bool algo_ok(cublasGemmAlgo_t algo) {
    int a = int(algo);
    return (a >= CUBLAS_GEMM_DEFAULT && a <= CUBLAS_GEMM_ALGO23) ||
           (a >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

}  // namespace

extern "C" {

// ---- Handles
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasCreate_v2");
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    auto* h = new cublasContext();
    {
        std::lock_guard<std::mutex> lock(handles_mutex);
        live_handles().insert(h);
    }
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS documents that destroying a handle synchronises the device.
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasDestroy_v2");
    if (!handle_ok(handle, "cublasDestroy_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    fake_gpu::sync_all();
    {
        std::lock_guard<std::mutex> lock(handles_mutex);
        live_handles().erase(handle);
    }
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasGetVersion_v2");
    if (!handle_ok(handle, "cublasGetVersion_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasSetStream_v2");
    if (!handle_ok(handle, "cublasSetStream_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->stream = static_cast<fake_gpu::Stream>(stream);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasGetStream_v2");
    if (!handle_ok(handle, "cublasGetStream_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *stream = static_cast<cudaStream_t>(handle->stream);
    return CUBLAS_STATUS_SUCCESS;
}

// Device pointer mode may be set (cudarc can); a GEMM under it dies, as it is not emulated.
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasSetPointerMode_v2");
    if (!handle_ok(handle, "cublasSetPointerMode_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasGetPointerMode_v2");
    if (!handle_ok(handle, "cublasGetPointerMode_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

// The math mode only permits faster, less precise paths; the emulation keeps full precision.
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasSetMathMode");
    if (!handle_ok(handle, "cublasSetMathMode")) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasGetMathMode");
    if (!handle_ok(handle, "cublasGetMathMode")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

// The emulation needs no device workspace; the buffer is accepted and unused.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void*, size_t) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    trace("cublasSetWorkspace_v2");
    if (!handle_ok(handle, "cublasSetWorkspace_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- GEMMs
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    return gemm("cublasSgemm_v2", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B,
                CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, Compute::F32);
}

cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const double* alpha,
                              const double* A, int lda, const double* B, int ldb,
                              const double* beta, double* C, int ldc) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    return gemm("cublasDgemm_v2", handle, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B,
                CUDA_R_64F, ldb, 0, beta, C, CUDA_R_64F, ldc, 0, 1, Compute::F64);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb,
                                         long long int strideB, const float* beta, float* C,
                                         int ldc, long long int strideC, int batchCount) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    return gemm("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F,
                lda, strideA, B, CUDA_R_32F, ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC,
                batchCount, Compute::F32);
}

cublasStatus_t cublasDgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const double* alpha, const double* A, int lda,
                                         long long int strideA, const double* B, int ldb,
                                         long long int strideB, const double* beta, double* C,
                                         int ldc, long long int strideC, int batchCount) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    return gemm("cublasDgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A, CUDA_R_64F,
                lda, strideA, B, CUDA_R_64F, ldb, strideB, beta, C, CUDA_R_64F, ldc, strideC,
                batchCount, Compute::F64);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    Compute compute;
    if (!handle_ok(handle, "cublasGemmEx")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!compute_of(computeType, &compute) || !algo_ok(algo)) {
        trace("cublasGemmEx", "rejected: compute type or algorithm not emulated");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                ldb, 0, beta, C, Ctype, ldc, 0, 1, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CUBLAS_STATUS_EXECUTION_FAILED;  // faults.cpp
    Compute compute;
    if (!handle_ok(handle, "cublasGemmStridedBatchedEx")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!compute_of(computeType, &compute) || !algo_ok(algo)) {
        trace("cublasGemmStridedBatchedEx", "rejected: compute type or algorithm not emulated");
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype,
                lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                compute);
}

}  // extern "C"
