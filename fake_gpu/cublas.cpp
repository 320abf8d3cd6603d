// fake_gpu/cublas.cpp: the emulated device's cuBLAS (libcublas.so.13): handles and the GEMMs the
// `cuda` binary calls (candle's matmul through cudarc), computed on the CPU on the handle's stream.
//
// Semantics follow the cuBLAS documentation: column-major matrices, op(X) = X (N) or X^T (T; C is
// T for real types), C = alpha * op(A) op(B) + beta * C, leading dimensions and batch strides in
// elements, alpha/beta read from host memory at call time (pointer mode host only). Products are
// accumulated in f32 (f64 for the 64F compute type) and rounded to C's type once, at the end
// (round to nearest even). With beta == 0, C is never read, so NaN in fresh memory does not leak.
// The "fast" compute types (32F_FAST_16F, _16BF, _TF32) are computed at full f32 precision, which
// those modes allow; the 16F compute type also accumulates in f32 (more precise than a GPU).
//
// The GEMM is blocked GotoBLAS-style: op(A) and op(B) are packed into panels converted to the
// compute type, a register-tiled micro-kernel (MR x NR) accumulates over KC-long slices into a
// compute-type tile of C, and an epilogue applies alpha/beta and rounds. Tiles of C are spread
// over threads; every element is summed in the same order whatever the split, so results do not
// depend on the thread count.
#include <cublas_v2.h>
#include <library_types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "fake_gpu.h"

struct cublasContext {
    fake_gpu::Stream stream = nullptr;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
    cublasMath_t math_mode = CUBLAS_DEFAULT_MATH;
    cublasAtomicsMode_t atomics_mode = CUBLAS_ATOMICS_NOT_ALLOWED;
};

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

// ---- Storage types: conversions written out (round to nearest even, NaN stays NaN).
uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float bits_f32(uint32_t u) {
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
bool storage_type(cudaDataType t, Type* out) {
    switch (t) {
        case CUDA_R_32F: *out = Type::F32; return true;
        case CUDA_R_64F: *out = Type::F64; return true;
        case CUDA_R_16F: *out = Type::F16; return true;
        case CUDA_R_16BF: *out = Type::BF16; return true;
        default: return false;
    }
}
size_t type_size(Type t) {
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

// ---- The blocked GEMM. T (float or double) is the compute type.
typedef float vf8 __attribute__((vector_size(32)));
typedef double vd4 __attribute__((vector_size(32)));
template <class T> struct Vec;
template <> struct Vec<float> { typedef vf8 type; };
template <> struct Vec<double> { typedef vd4 type; };

constexpr int NR = 6;         // columns of the micro-tile
constexpr int64_t KC = 256;   // depth of one packed slice
constexpr int64_t MC = 256;   // rows of a tile of C (one work item)
constexpr int64_t NC = 384;   // columns of a tile of C (a multiple of NR)
template <class T> constexpr int mr() { return int(32 / sizeof(T)); }  // one vector of rows

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

template <class T>
struct Buffers {
    std::vector<T> a, b, acc;
    void reserve(size_t na, size_t nb, size_t nacc) {
        // Packed panels are read as whole vectors; keep a vector's worth of slack at the end.
        if (a.size() < na + 8) a.resize(na + 8);
        if (b.size() < nb + 8) b.resize(nb + 8);
        if (acc.size() < nacc) acc.resize(nacc);
    }
};

// Packs rows [i0, i0+mc) x depth [p0, p0+kc) of op(A) into panels of MR rows: panel r holds, for
// each p, MR consecutive rows (zero past m). Converts to T.
template <class T, Type S>
void pack_a_typed(const Job<T>& job, const char* a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                  T* out) {
    constexpr int MR = mr<T>();
    for (int64_t ir = 0; ir < mc; ir += MR) {
        T* panel = out + ir * kc;
        int rows = int(std::min<int64_t>(MR, mc - ir));
        if (!job.ta) {  // op(A)(i, p) = A[i + p*lda]: rows contiguous
            for (int64_t p = 0; p < kc; ++p) {
                int64_t base = (i0 + ir) + (p0 + p) * job.lda;
                T* dst = panel + p * MR;
                for (int r = 0; r < rows; ++r) dst[r] = load<T>(S, a, base + r);
                for (int r = rows; r < MR; ++r) dst[r] = T(0);
            }
        } else {  // op(A)(i, p) = A[p + i*lda]: depth contiguous
            for (int r = 0; r < rows; ++r) {
                int64_t base = (p0) + (i0 + ir + r) * job.lda;
                for (int64_t p = 0; p < kc; ++p) panel[p * MR + r] = load<T>(S, a, base + p);
            }
            for (int r = rows; r < MR; ++r)
                for (int64_t p = 0; p < kc; ++p) panel[p * MR + r] = T(0);
        }
    }
}
// Packs depth [p0, p0+kc) x columns [j0, j0+nc) of op(B) into panels of NR columns: panel c holds,
// for each p, NR consecutive columns (zero past n).
template <class T, Type S>
void pack_b_typed(const Job<T>& job, const char* b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                  T* out) {
    for (int64_t jr = 0; jr < nc; jr += NR) {
        T* panel = out + jr * kc;
        int cols = int(std::min<int64_t>(NR, nc - jr));
        if (!job.tb) {  // op(B)(p, j) = B[p + j*ldb]: depth contiguous
            for (int c = 0; c < cols; ++c) {
                int64_t base = p0 + (j0 + jr + c) * job.ldb;
                for (int64_t p = 0; p < kc; ++p) panel[p * NR + c] = load<T>(S, b, base + p);
            }
        } else {  // op(B)(p, j) = B[j + p*ldb]: columns contiguous
            for (int64_t p = 0; p < kc; ++p) {
                int64_t base = (j0 + jr) + (p0 + p) * job.ldb;
                for (int c = 0; c < cols; ++c) panel[p * NR + c] = load<T>(S, b, base + c);
            }
        }
        for (int c = cols; c < NR; ++c)
            for (int64_t p = 0; p < kc; ++p) panel[p * NR + c] = T(0);
    }
}
template <class T>
void pack_a(const Job<T>& job, const char* a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            T* out) {
    switch (job.at) {
        case Type::F32: return pack_a_typed<T, Type::F32>(job, a, i0, mc, p0, kc, out);
        case Type::F64: return pack_a_typed<T, Type::F64>(job, a, i0, mc, p0, kc, out);
        case Type::F16: return pack_a_typed<T, Type::F16>(job, a, i0, mc, p0, kc, out);
        case Type::BF16: return pack_a_typed<T, Type::BF16>(job, a, i0, mc, p0, kc, out);
    }
}
template <class T>
void pack_b(const Job<T>& job, const char* b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            T* out) {
    switch (job.bt) {
        case Type::F32: return pack_b_typed<T, Type::F32>(job, b, p0, kc, j0, nc, out);
        case Type::F64: return pack_b_typed<T, Type::F64>(job, b, p0, kc, j0, nc, out);
        case Type::F16: return pack_b_typed<T, Type::F16>(job, b, p0, kc, j0, nc, out);
        case Type::BF16: return pack_b_typed<T, Type::BF16>(job, b, p0, kc, j0, nc, out);
    }
}

// acc[0..rows) x [0..cols) (column-major, leading dimension ldacc) += the MR x NR product of an
// A panel and a B panel over kc. Each element sums its kc products in order p = 0, 1, ...
template <class T>
inline __attribute__((always_inline)) void micro_kernel(int64_t kc, const T* __restrict a,
                                                        const T* __restrict b, T* __restrict acc,
                                                        int64_t ldacc, int rows, int cols) {
    typedef typename Vec<T>::type V;
    constexpr int MR = mr<T>();
    V c0 = {}, c1 = {}, c2 = {}, c3 = {}, c4 = {}, c5 = {};
    for (int64_t p = 0; p < kc; ++p) {
        V av;
        std::memcpy(&av, a + p * MR, sizeof av);
        const T* bp = b + p * NR;
        c0 += av * bp[0];
        c1 += av * bp[1];
        c2 += av * bp[2];
        c3 += av * bp[3];
        c4 += av * bp[4];
        c5 += av * bp[5];
    }
    V cs[NR] = {c0, c1, c2, c3, c4, c5};
    if (rows == MR) {
        for (int j = 0; j < cols; ++j) {
            V old;
            std::memcpy(&old, acc + j * ldacc, sizeof old);
            old += cs[j];
            std::memcpy(acc + j * ldacc, &old, sizeof old);
        }
    } else {
        for (int j = 0; j < cols; ++j)
            for (int i = 0; i < rows; ++i) acc[i + j * ldacc] += cs[j][i];
    }
}

// One work item: the tile [i0, i0+mc) x [j0, j0+nc) of C in batch `bi`, computed in full.
template <class T>
inline __attribute__((always_inline)) void tile_impl(const Job<T>& job, int64_t bi, int64_t i0,
                                                     int64_t mc, int64_t j0, int64_t nc,
                                                     Buffers<T>& buf) {
    constexpr int MR = mr<T>();
    const char* a = job.a + bi * job.sa * int64_t(type_size(job.at));
    const char* b = job.b + bi * job.sb * int64_t(type_size(job.bt));
    char* c = job.c + bi * job.sc * int64_t(type_size(job.ct));
    int64_t mc_pad = (mc + MR - 1) / MR * MR, nc_pad = (nc + NR - 1) / NR * NR;
    int64_t kc_max = std::min(KC, job.k);
    buf.reserve(size_t(mc_pad * kc_max), size_t(nc_pad * kc_max), size_t(mc_pad * nc));
    T* acc = buf.acc.data();
    const int64_t ldacc = mc_pad;
    std::fill(acc, acc + mc_pad * nc, T(0));
    for (int64_t p0 = 0; p0 < job.k; p0 += KC) {
        int64_t kc = std::min(KC, job.k - p0);
        pack_b(job, b, p0, kc, j0, nc, buf.b.data());
        pack_a(job, a, i0, mc, p0, kc, buf.a.data());
        for (int64_t jr = 0; jr < nc; jr += NR) {
            int cols = int(std::min<int64_t>(NR, nc - jr));
            const T* bp = buf.b.data() + jr * kc;
            for (int64_t ir = 0; ir < mc; ir += MR) {
                int rows = int(std::min<int64_t>(MR, mc - ir));
                micro_kernel<T>(kc, buf.a.data() + ir * kc, bp, acc + ir + jr * ldacc, ldacc, rows,
                                cols);
            }
        }
    }
    // Epilogue: C = alpha * acc + beta * C, rounded once; C is not read when beta == 0.
    for (int64_t j = 0; j < nc; ++j) {
        const T* col = acc + j * ldacc;
        int64_t cbase = i0 + (j0 + j) * job.ldc;
        if (job.beta == T(0)) {
            for (int64_t i = 0; i < mc; ++i) store<T>(job.ct, c, cbase + i, job.alpha * col[i]);
        } else {
            for (int64_t i = 0; i < mc; ++i)
                store<T>(job.ct, c, cbase + i,
                         job.alpha * col[i] + job.beta * load<T>(job.ct, c, cbase + i));
        }
    }
}

// The hot loops, compiled twice (AVX2 and baseline x86-64) and picked at load time. Neither clone
// contracts a*b+c into an FMA, so both give the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FAKE_GPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FAKE_GPU_CLONES
#endif
FAKE_GPU_CLONES void tile_f32(const Job<float>& job, int64_t bi, int64_t i0, int64_t mc,
                              int64_t j0, int64_t nc, Buffers<float>& buf) {
    tile_impl<float>(job, bi, i0, mc, j0, nc, buf);
}
FAKE_GPU_CLONES void tile_f64(const Job<double>& job, int64_t bi, int64_t i0, int64_t mc,
                              int64_t j0, int64_t nc, Buffers<double>& buf) {
    tile_impl<double>(job, bi, i0, mc, j0, nc, buf);
}
inline void tile(const Job<float>& job, int64_t bi, int64_t i0, int64_t mc, int64_t j0,
                 int64_t nc, Buffers<float>& buf) {
    tile_f32(job, bi, i0, mc, j0, nc, buf);
}
inline void tile(const Job<double>& job, int64_t bi, int64_t i0, int64_t mc, int64_t j0,
                 int64_t nc, Buffers<double>& buf) {
    tile_f64(job, bi, i0, mc, j0, nc, buf);
}

// C = beta * C (or 0 without reading C when beta == 0): the whole GEMM when k == 0 or alpha == 0.
template <class T>
void scale_c(const Job<T>& job) {
    for (int64_t bi = 0; bi < job.batch; ++bi) {
        char* c = job.c + bi * job.sc * int64_t(type_size(job.ct));
        for (int64_t j = 0; j < job.n; ++j)
            for (int64_t i = 0; i < job.m; ++i) {
                int64_t idx = i + j * job.ldc;
                store<T>(job.ct, c, idx,
                         job.beta == T(0) ? T(0) : job.beta * load<T>(job.ct, c, idx));
            }
    }
}

// Runs items [0, count) of `fn(item, buffers)` on up to `threads` threads.
template <class T, class F>
void parallel_items(int64_t count, int threads, F fn) {
    if (threads <= 1 || count <= 1) {
        thread_local Buffers<T> buf;
        for (int64_t i = 0; i < count; ++i) fn(i, buf);
        return;
    }
    std::atomic<int64_t> next{0};
    auto worker = [&]() {
        Buffers<T> buf;
        for (int64_t i; (i = next.fetch_add(1)) < count;) fn(i, buf);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
}

template <class T>
void run_gemm(const Job<T>& job) {
    if (job.m == 0 || job.n == 0 || job.batch == 0) return;
    if (job.k == 0 || job.alpha == T(0)) return scale_c(job);
    const int64_t mt = (job.m + MC - 1) / MC, nt = (job.n + NC - 1) / NC, tiles = mt * nt;
    // Threads only pay for themselves on big products; each gets at least ~2M multiply-adds.
    double macs = double(job.m) * double(job.n) * double(job.k) * double(job.batch);
    int hw = int(std::max(1u, std::thread::hardware_concurrency()));
    int threads = int(std::min<double>({double(hw), macs / double(1 << 21), 64.0}));
    // Batches whose C overlap (stride 0, say) run one after the other, as their writes would race.
    int64_t c_extent = (job.n - 1) * job.ldc + job.m;
    bool c_disjoint = job.batch == 1 || job.sc >= c_extent || -job.sc >= c_extent;
    auto item = [&](int64_t bi, int64_t t, Buffers<T>& buf) {
        int64_t it = t % mt, jt = t / mt;
        int64_t i0 = it * MC, j0 = jt * NC;
        tile(job, bi, i0, std::min(MC, job.m - i0), j0, std::min(NC, job.n - j0), buf);
    };
    if (c_disjoint) {
        parallel_items<T>(job.batch * tiles, std::min<int64_t>(threads, job.batch * tiles),
                          [&](int64_t i, Buffers<T>& buf) { item(i / tiles, i % tiles, buf); });
    } else {
        for (int64_t bi = 0; bi < job.batch; ++bi)
            parallel_items<T>(tiles, int(std::min<int64_t>(threads, tiles)),
                              [&](int64_t i, Buffers<T>& buf) { item(bi, i, buf); });
    }
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
    trace("cublasGetVersion_v2");
    if (!handle_ok(handle, "cublasGetVersion_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (version == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *version = CUBLAS_VERSION;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    trace("cublasSetStream_v2");
    if (!handle_ok(handle, "cublasSetStream_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->stream = static_cast<fake_gpu::Stream>(stream);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
    trace("cublasGetStream_v2");
    if (!handle_ok(handle, "cublasGetStream_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *stream = static_cast<cudaStream_t>(handle->stream);
    return CUBLAS_STATUS_SUCCESS;
}

// Device pointer mode may be set (cudarc can); a GEMM under it dies, as it is not emulated.
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
    trace("cublasSetPointerMode_v2");
    if (!handle_ok(handle, "cublasSetPointerMode_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t* mode) {
    trace("cublasGetPointerMode_v2");
    if (!handle_ok(handle, "cublasGetPointerMode_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

// The math mode only permits faster, less precise paths; the emulation keeps full precision.
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    trace("cublasSetMathMode");
    if (!handle_ok(handle, "cublasSetMathMode")) return CUBLAS_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(handles_mutex);
    handle->math_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
    trace("cublasGetMathMode");
    if (!handle_ok(handle, "cublasGetMathMode")) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(handles_mutex);
    *mode = handle->math_mode;
    return CUBLAS_STATUS_SUCCESS;
}

// The emulation needs no device workspace; the buffer is accepted and unused.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void*, size_t) {
    trace("cublasSetWorkspace_v2");
    if (!handle_ok(handle, "cublasSetWorkspace_v2")) return CUBLAS_STATUS_NOT_INITIALIZED;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- GEMMs
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* A, int lda, const float* B, int ldb, const float* beta,
                              float* C, int ldc) {
    return gemm("cublasSgemm_v2", handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B,
                CUDA_R_32F, ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, Compute::F32);
}

cublasStatus_t cublasDgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const double* alpha,
                              const double* A, int lda, const double* B, int ldb,
                              const double* beta, double* C, int ldc) {
    return gemm("cublasDgemm_v2", handle, transa, transb, m, n, k, alpha, A, CUDA_R_64F, lda, 0, B,
                CUDA_R_64F, ldb, 0, beta, C, CUDA_R_64F, ldc, 0, 1, Compute::F64);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb,
                                         long long int strideB, const float* beta, float* C,
                                         int ldc, long long int strideC, int batchCount) {
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
