// The blocked GEMM of the emulated device's cuBLAS (fake_gpu/cublas/, internal.h): computes on
// the CPU the Job a GEMM entry point (api.cpp) enqueued, when the handle's stream runs it.
//
// The GEMM is blocked GotoBLAS-style: op(A) and op(B) are packed into panels converted to the
// compute type, a register-tiled micro-kernel (MR x NR) accumulates over KC-long slices into a
// compute-type tile of C, and an epilogue applies alpha/beta and rounds. Tiles of C are spread
// over threads; every element is summed in the same order whatever the split, so results do not
// depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "internal.h"

namespace fake_cublas {

namespace {

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

}  // namespace

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

template void run_gemm<float>(const Job<float>& job);
template void run_gemm<double>(const Job<double>& job);

}  // namespace fake_cublas
