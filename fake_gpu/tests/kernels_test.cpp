// The test of the emulated CUDA device's kernel side: loads the kernels' CPU builds (the
// libterse_fake_<module>.so that xtask/src/fake_gpu/kernels/ writes) and runs candle's and
// terse's kernels through the fiber runtime (fake_gpu/fibers/, linked in here as libcuda.so.1 links
// it) with candle's own launch shapes, each against a CPU reference; then the runtime's errors
// (crates/simt/faulty.cu, fake_gpu/tests/test_kernels.cu) and its speed.
//
// Linked against libcuda.so.1 (whose fake_gpu/fibers/ the modules resolve terse_shim::* against) by
// `cargo xtask fake-gpu --self-test`, and run as `kernels_test <modules dir> [<test modules
// dir>]`: the test modules (crates/simt/faulty.cu, fake_gpu/tests/test_kernels.cu) are built by
// kernels.rs into <modules dir>/test. Exits non-zero on the first failed check, naming it.
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fake_gpu.h"

namespace {
std::map<std::string, void (*)(void**)> kernels;
int checks = 0;
// crates/model's launch geometry, as the modules were built with it (t_geometry).
unsigned rmsnorm_block = 0, logprob_block = 0;

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    std::exit(1);
}

void check(bool ok, const std::string& what) {
    checks++;
    if (!ok) fail(what);
}

void load(const std::string& path) {
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) fail(std::string("dlopen: ") + dlerror());
    auto table = reinterpret_cast<terse_fake_kernels_fn>(dlsym(h, "terse_fake_kernels"));
    if (!table) fail(path + " exports no terse_fake_kernels");
    size_t n = 0;
    const terse_fake_kernel* k = table(&n);
    for (size_t i = 0; i < n; i++) kernels[k[i].name] = k[i].body;
}

struct Dim {
    unsigned x = 1, y = 1, z = 1;
};

// Launches `name`; "" when it ran, else the runtime's error.
std::string launch(const std::string& name, Dim grid, Dim block, std::vector<void*> params,
                   unsigned shared = 0) {
    auto it = kernels.find(name);
    if (it == kernels.end()) fail("no CPU build of kernel " + name);
    unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    char err[1024] = {0};
    int rc = terse_fake_run(name.c_str(), g, b, shared, it->second, params.data(), err, sizeof err);
    return rc == 0 ? std::string() : std::string(err);
}

void ok(const std::string& name, Dim grid, Dim block, std::vector<void*> params,
        unsigned shared = 0) {
    std::string e = launch(name, grid, block, std::move(params), shared);
    if (!e.empty()) fail(name + ": " + e);
}

void expect_error(const std::string& name, Dim grid, Dim block, std::vector<void*> params,
                  std::vector<std::string> parts, unsigned shared = 0) {
    std::string e = launch(name, grid, block, std::move(params), shared);
    check(!e.empty(), name + " ran, but should have failed");
    for (const auto& p : parts)
        check(e.find(p) != std::string::npos, name + ": `" + p + "` not in: " + e);
    std::printf("  %s -> %s\n", name.c_str(), e.c_str());
}

// ---- References, written independently of the emulation's headers.
float bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// Round to nearest even by comparing the two neighbours' distances in double.
uint16_t bf16_of(double v) {
    if (std::isnan(v)) return 0x7fff;
    double limit = std::ldexp(2.0 - std::ldexp(1.0, -8), 127);  // halfway to 2^128
    if (std::fabs(v) >= limit) return std::signbit(v) ? 0xff80 : 0x7f80;
    float f = (float)v;  // only to find a neighbour; the decision is made on v
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16);
    double dlo = bf16_value(lo);
    uint16_t other = std::fabs(dlo) > std::fabs(v) ? (uint16_t)(lo - 1) : (uint16_t)(lo + 1);
    double a = std::fabs(v - dlo), b = std::fabs(v - (double)bf16_value(other));
    if (a < b) return lo;
    if (b < a) return other;
    return (lo & 1) ? other : lo;
}
int ulps(uint16_t a, uint16_t b) {
    auto key = [](uint16_t x) { return x & 0x8000 ? -(int)(x & 0x7fff) : (int)x; };
    return std::abs(key(a) - key(b));
}
template <typename T>
void close(const std::vector<T>& got, const std::vector<double>& want, double tol,
           const std::string& what) {
    check(got.size() == want.size(), what + ": size");
    for (size_t i = 0; i < got.size(); i++) {
        double d = std::fabs((double)got[i] - want[i]);
        if (!(d <= tol * std::max(1.0, std::fabs(want[i]))))
            fail(what + ": element " + std::to_string(i) + " is " + std::to_string((double)got[i]) +
                 ", want " + std::to_string(want[i]));
    }
    checks++;
}
std::vector<float> ramp(size_t n, float scale, float shift = 0.f) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = std::sin(0.37f * (float)i + 0.1f) * scale + shift;
    return v;
}
template <typename T>
void* P(T& v) {
    return (void*)&v;
}

// ---- candle's kernels, launched as candle-core and candle-nn launch them.
void candle_affine() {
    size_t n = 1000, dims = 1;
    const size_t* info = nullptr;
    auto x = ramp(n, 3.f);
    std::vector<float> out(n);
    const float* xp = x.data();
    float* op = out.data();
    float mul = 1.5f, add = -0.25f;
    ok("affine_f32", {1, 1, 1}, {1024, 1, 1},
       {P(n), P(dims), P(info), P(xp), P(op), P(mul), P(add)});
    for (size_t i = 0; i < n; i++) check(out[i] == x[i] * mul + add, "affine_f32 contiguous");
    // Strided: the transpose of a (10, 100) matrix.
    size_t nd = 2;
    std::vector<size_t> layout = {100, 10, 1, 100};
    const size_t* lp = layout.data();
    ok("affine_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(nd), P(lp), P(xp), P(op), P(mul), P(add)});
    for (size_t i = 0; i < n; i++)
        check(out[i] == x[(i % 10) * 100 + i / 10] * mul + add, "affine_f32 strided");
}

void candle_binary() {
    // lhs (4, 64) contiguous times rhs (64) broadcast over the rows.
    size_t rows = 4, cols = 64, n = rows * cols, nd = 2;
    std::vector<uint16_t> l(n), r(cols), out(n);
    auto lv = ramp(n, 2.f), rv = ramp(cols, 3.f, 0.5f);
    for (size_t i = 0; i < n; i++) l[i] = bf16_of(lv[i]);
    for (size_t i = 0; i < cols; i++) r[i] = bf16_of(rv[i]);
    std::vector<size_t> ds = {rows, cols, cols, 1, 0, 1};
    const size_t* dp = ds.data();
    const uint16_t *lp = l.data(), *rp = r.data();
    uint16_t* op = out.data();
    ok("bmul_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(nd), P(dp), P(lp), P(rp), P(op)});
    for (size_t i = 0; i < n; i++)
        check(out[i] == bf16_of((double)bf16_value(l[i]) * bf16_value(r[i % cols])),
              "bmul_bf16 broadcast element " + std::to_string(i));
    // Contiguous and 16-byte aligned: the float4 path, with a tail.
    size_t m = 1003;
    std::vector<uint16_t> a(m + 8), b(m + 8), c(m + 8);
    auto av = ramp(m, 5.f), bv = ramp(m, 0.7f, 0.1f);
    for (size_t i = 0; i < m; i++) {
        a[i] = bf16_of(av[i]);
        b[i] = bf16_of(bv[i]);
    }
    const size_t* none = nullptr;
    const uint16_t *ap = a.data(), *bp = b.data();
    uint16_t* cp = c.data();
    check((uintptr_t)ap % 16 == 0 && (uintptr_t)cp % 16 == 0, "aligned buffers");
    size_t one = 1;
    ok("badd_bf16", {1, 1, 1}, {1024, 1, 1}, {P(m), P(one), P(none), P(ap), P(bp), P(cp)});
    for (size_t i = 0; i < m; i++)
        check(c[i] == bf16_of((double)bf16_value(a[i]) + bf16_value(b[i])), "badd_bf16 contiguous");
}

void candle_cast() {
    // Ties (to even, both ways), the largest finite, overflow, NaN, subnormals, signs.
    std::vector<float> x = {1.0f, 1.00390625f, 1.01171875f, -1.00390625f, 3.3895314e38f,
                            3.4e38f, NAN, -INFINITY, 1e-40f, -0.0f, 0.1f, 123.456f};
    std::vector<uint16_t> want = {0x3f80, 0x3f80, 0x3f82, 0xbf80, 0x7f7f, 0x7f80,
                                  0x7fff, 0xff80, bf16_of((double)1e-40f), 0x8000, 0x3dcd, 0x42f7};
    size_t n = x.size(), dims = 1;
    const size_t* info = nullptr;
    std::vector<uint16_t> b(n);
    std::vector<float> back(n);
    const float* xp = x.data();
    uint16_t* bp = b.data();
    ok("cast_f32_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(xp), P(bp)});
    for (size_t i = 0; i < n; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f32_bf16(%g) = %04x, want %04x", x[i], b[i], want[i]);
        check(b[i] == want[i], msg);
    }
    const uint16_t* cb = b.data();
    float* backp = back.data();
    ok("cast_bf16_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(cb), P(backp)});
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        std::memcpy(&u, &back[i], 4);
        check(u == (uint32_t)b[i] << 16, "cast_bf16_f32 is exact");
    }
}

void candle_cast_16_and_8() {
    // f64 to f16 rounds once, from the double (1 + 2^-11 + 2^-40 is above the tie a rounding
    // through f32 would make), to nearest even, overflowing to inf, underflowing to subnormals.
    std::vector<double> x = {1.0, 1.0 + std::ldexp(1.0, -11), 1.0 + 3 * std::ldexp(1.0, -11),
                             1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 65504.0, 65520.0,
                             1e-8, 3e-8, NAN, -2.0};
    std::vector<uint16_t> want = {0x3c00, 0x3c00, 0x3c02, 0x3c01, 0x7bff,
                                  0x7c00, 0x0000, 0x0001, 0x7fff, 0xc000};
    size_t n = x.size(), dims = 1;
    const size_t* info = nullptr;
    std::vector<uint16_t> h(n);
    const double* xp = x.data();
    uint16_t* hp = h.data();
    ok("cast_f64_f16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(info), P(xp), P(hp)});
    for (size_t i = 0; i < n; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f64_f16(%.17g) = %04x, want %04x", x[i], h[i],
                      want[i]);
        check(h[i] == want[i], msg);
    }
    // f32 to fp8 e4m3: saturating to 448, ties to even, subnormals down to 2^-9; and back.
    std::vector<float> f = {1.0f, 448.f, 500.f, 1e6f, -1e6f, NAN, 1.0625f, 1.1875f,
                            std::ldexp(1.f, -9), std::ldexp(1.f, -10), 3 * std::ldexp(1.f, -10)};
    std::vector<uint8_t> want8 = {0x38, 0x7e, 0x7e, 0x7e, 0xfe, 0x7f, 0x38, 0x3a, 0x01, 0x00, 0x02};
    size_t m = f.size();
    std::vector<uint8_t> e(m);
    std::vector<float> back(m);
    const float* fp = f.data();
    uint8_t* ep = e.data();
    ok("cast_f32_f8_e4m3", {1, 1, 1}, {1024, 1, 1}, {P(m), P(dims), P(info), P(fp), P(ep)});
    for (size_t i = 0; i < m; i++) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "cast_f32_f8_e4m3(%g) = %02x, want %02x", f[i], e[i],
                      want8[i]);
        check(e[i] == want8[i], msg);
    }
    const uint8_t* cep = e.data();
    float* bp = back.data();
    ok("cast_f8_e4m3_f32", {1, 1, 1}, {1024, 1, 1}, {P(m), P(dims), P(info), P(cep), P(bp)});
    check(back[0] == 1.f && back[1] == 448.f && back[4] == -448.f && std::isnan(back[5]) &&
              back[8] == std::ldexp(1.f, -9) && back[10] == std::ldexp(1.f, -8),
          "cast_f8_e4m3_f32");
}

void candle_fill_and_index() {
    size_t n = 777;
    std::vector<float> buf(n, 0.f);
    float* bp = buf.data();
    float v = 2.5f;
    ok("fill_f32", {1, 1, 1}, {1024, 1, 1}, {P(bp), P(v), P(n)});
    for (float f : buf) check(f == 2.5f, "fill_f32");
    // index_select over dim 1 of a (2, 5, 3) tensor with ids [4, 0, 2, 2].
    size_t left = 2, src_dim = 5, right = 3, ids_dim = 4, numel = left * ids_dim * right, nd = 3;
    auto src = ramp(left * src_dim * right, 10.f);
    std::vector<uint32_t> ids = {4, 0, 2, 2};
    std::vector<size_t> info = {2, 5, 3, 15, 3, 1};
    std::vector<float> out(numel);
    const size_t* ip = info.data();
    const uint32_t* idp = ids.data();
    const float* sp = src.data();
    float* op = out.data();
    ok("is_u32_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(nd), P(ip), P(idp), P(sp), P(op), P(left), P(src_dim), P(ids_dim), P(right)});
    for (size_t l = 0; l < left; l++)
        for (size_t j = 0; j < ids_dim; j++)
            for (size_t r = 0; r < right; r++)
                check(out[(l * ids_dim + j) * right + r] == src[(l * src_dim + ids[j]) * right + r],
                      "is_u32_f32");
    // gather along dim 1: ids of the output's shape (2, 4, 3).
    std::vector<uint32_t> gids(numel);
    for (size_t i = 0; i < numel; i++) gids[i] = (uint32_t)((i * 7) % src_dim);
    const uint32_t* gp = gids.data();
    ok("gather_u32_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(gp), P(sp), P(op), P(left), P(src_dim), P(ids_dim), P(right)});
    for (size_t i = 0; i < numel; i++) {
        size_t pre = i / (right * ids_dim), post = i % right;
        check(out[i] == src[(pre * src_dim + gids[i]) * right + post], "gather_u32_f32");
    }
}

void candle_softmax_rmsnorm() {
    // softmax-last-dim: a block of (1, 32, 1) per row (candle-nn ops.rs).
    int rows = 3, cols = 100;
    auto x = ramp((size_t)(rows * cols), 4.f);
    std::vector<float> y(x.size());
    const float* xp = x.data();
    float* yp = y.data();
    ok("softmax_f32", {(unsigned)rows, 1, 1}, {1, 32, 1}, {P(xp), P(yp), P(cols)});
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; r++) {
        double m = -1e300, s = 0;
        for (int c = 0; c < cols; c++) m = std::max(m, (double)x[r * cols + c]);
        for (int c = 0; c < cols; c++) s += std::exp((double)x[r * cols + c] - m);
        for (int c = 0; c < cols; c++)
            want[r * cols + c] = std::exp((double)x[r * cols + c] - m) / s;
    }
    close(y, want, 1e-6, "softmax_f32");
    // rmsnorm: a block of 32 threads per row below 1024 columns, 1024 from there.
    for (int n_cols : {64, 2048}) {
        int n_rows = 4, block_size = n_cols < 1024 ? 32 : 1024;
        float eps = 1e-6f;
        auto a = ramp((size_t)(n_rows * n_cols), 2.f);
        auto alpha = ramp((size_t)n_cols, 0.5f, 1.f);
        std::vector<float> dst(a.size());
        const float *ap = a.data(), *alp = alpha.data();
        float* dp = dst.data();
        ok("rmsnorm_f32", {(unsigned)n_rows, 1, 1}, {(unsigned)block_size, 1, 1},
           {P(ap), P(dp), P(alp), P(n_cols), P(block_size), P(eps)});
        std::vector<double> w(a.size());
        for (int r = 0; r < n_rows; r++) {
            double ss = 0;
            for (int c = 0; c < n_cols; c++) ss += (double)a[r * n_cols + c] * a[r * n_cols + c];
            double scale = 1.0 / std::sqrt(ss / n_cols + eps);
            for (int c = 0; c < n_cols; c++)
                w[r * n_cols + c] = scale * a[r * n_cols + c] * alpha[c];
        }
        close(dst, w, 1e-5, "rmsnorm_f32 cols " + std::to_string(n_cols));
    }
}

void candle_reductions() {
    // Sum over the last dim of (3, 1000): a block of 1024 per output (FastReduce).
    size_t rows = 3, cols = 1000, numel = rows * cols, per = cols, nd = 2;
    auto x = ramp(numel, 1.f, 0.25f);
    std::vector<size_t> info = {rows, cols, cols, 1};
    std::vector<float> s(rows);
    const size_t* ip = info.data();
    const float* xp = x.data();
    float* sp = s.data();
    ok("fast_sum_f32", {(unsigned)rows, 1, 1}, {1024, 1, 1},
       {P(numel), P(per), P(nd), P(ip), P(xp), P(sp)});
    std::vector<double> want(rows, 0.0);
    for (size_t i = 0; i < numel; i++) want[i / cols] += x[i];
    close(s, want, 1e-5, "fast_sum_f32");
    // Argmax over 50 columns: a block of 64.
    size_t c2 = 50, n2 = rows * c2;
    std::vector<size_t> info2 = {rows, c2, c2, 1};
    std::vector<uint32_t> arg(rows);
    const size_t* ip2 = info2.data();
    uint32_t* ap = arg.data();
    ok("fast_argmax_f32", {(unsigned)rows, 1, 1}, {64, 1, 1},
       {P(n2), P(c2), P(nd), P(ip2), P(xp), P(ap)});
    for (size_t r = 0; r < rows; r++) {
        size_t best = 0;
        for (size_t c = 1; c < c2; c++)
            if (x[r * c2 + c] > x[r * c2 + best]) best = c;
        check(arg[r] == best, "fast_argmax_f32 row " + std::to_string(r));
    }
    // Max of bf16 over 50 columns.
    std::vector<uint16_t> xb(n2), mb(rows);
    for (size_t i = 0; i < n2; i++) xb[i] = bf16_of(x[i]);
    const uint16_t* xbp = xb.data();
    uint16_t* mbp = mb.data();
    ok("fast_max_bf16", {(unsigned)rows, 1, 1}, {64, 1, 1},
       {P(n2), P(c2), P(nd), P(ip2), P(xbp), P(mbp)});
    for (size_t r = 0; r < rows; r++) {
        float m = -INFINITY;
        for (size_t c = 0; c < c2; c++) m = std::max(m, bf16_value(xb[r * c2 + c]));
        check(bf16_value(mb[r]) == m, "fast_max_bf16");
    }
}

void candle_where_and_unary() {
    // where over (3, 4): the condition broadcast over rows, f read transposed.
    size_t numel = 12, nd = 2;
    std::vector<uint8_t> ids = {1, 0, 0, 1};
    auto t = ramp(12, 1.f), f = ramp(12, 1.f, 5.f);
    std::vector<size_t> info = {3, 4, 0, 1, 4, 1, 1, 3};
    std::vector<float> out(numel);
    const size_t* ip = info.data();
    const uint8_t* idp = ids.data();
    const float *tp = t.data(), *fp = f.data();
    float* op = out.data();
    ok("where_u8_f32", {1, 1, 1}, {1024, 1, 1},
       {P(numel), P(nd), P(ip), P(idp), P(tp), P(fp), P(op)});
    for (size_t i = 0; i < numel; i++) {
        size_t r = i / 4, c = i % 4;
        check(out[i] == (ids[c] ? t[r * 4 + c] : f[r + c * 3]), "where_u8_f32");
    }
    // uexp_bf16: within one bf16 ulp of the exact exponential (the device's ex2.approx too).
    size_t n = 500, dims = 1;
    const size_t* none = nullptr;
    auto xv = ramp(n, 6.f);
    std::vector<uint16_t> xb(n), yb(n);
    for (size_t i = 0; i < n; i++) xb[i] = bf16_of(xv[i]);
    const uint16_t* xbp = xb.data();
    uint16_t* ybp = yb.data();
    ok("uexp_bf16", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(none), P(xbp), P(ybp)});
    for (size_t i = 0; i < n; i++)
        check(ulps(yb[i], bf16_of(std::exp((double)bf16_value(xb[i])))) <= 1, "uexp_bf16");
    // usilu_f32.
    std::vector<float> ys(n);
    const float* xfp = xv.data();
    float* ysp = ys.data();
    ok("usilu_f32", {1, 1, 1}, {1024, 1, 1}, {P(n), P(dims), P(none), P(xfp), P(ysp)});
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++) want[i] = xv[i] / (1.0 + std::exp(-(double)xv[i]));
    close(ys, want, 1e-6, "usilu_f32");
}

void candle_sort_and_quantized() {
    // asort: a block per row, the padded row's indices in dynamic shared memory (candle-core
    // sort.rs), here 300 columns padded to 512.
    int nrows = 2, ncols = 300, pad = 512;
    auto x = ramp((size_t)(nrows * ncols), 9.f);
    std::vector<uint32_t> dst((size_t)(nrows * ncols));
    const float* xp = x.data();
    uint32_t* dp = dst.data();
    ok("asort_asc_f32", {(unsigned)nrows, 1, 1}, {(unsigned)pad, 1, 1},
       {P(xp), P(dp), P(ncols), P(pad)},
       pad * sizeof(int));
    for (int r = 0; r < nrows; r++) {
        std::vector<bool> seen(ncols, false);
        for (int c = 0; c < ncols; c++) {
            uint32_t i = dst[r * ncols + c];
            check(i < (uint32_t)ncols && !seen[i], "asort_asc_f32 is a permutation");
            seen[i] = true;
            if (c > 0)
                check(x[r * ncols + dst[r * ncols + c - 1]] <= x[r * ncols + i],
                      "asort_asc_f32 order");
        }
    }
    // dequantize q8_0: blocks of (f16 scale, 32 int8), 32 threads per 256 values.
    int elems = 512, nb32 = elems / 32;
    std::vector<uint8_t> q((size_t)nb32 * 34);
    const uint16_t scales[4] = {0x3400, 0x3800, 0x3a00, 0x3c00};  // 0.25, 0.5, 0.75, 1
    std::vector<double> want((size_t)elems);
    for (int b = 0; b < nb32; b++) {
        std::memcpy(&q[(size_t)b * 34], &scales[b % 4], 2);
        for (int j = 0; j < 32; j++) {
            int8_t v = (int8_t)((b * 37 + j * 11) % 255 - 127);
            q[(size_t)b * 34 + 2 + j] = (uint8_t)v;
            want[(size_t)(b * 32 + j)] = 0.25 * (b % 4 + 1) * v;
        }
    }
    std::vector<float> y((size_t)elems);
    const void* qp = q.data();
    float* yp = y.data();
    ok("dequantize_block_q8_0_f32", {(unsigned)((elems + 255) / 256), 1, 1}, {32, 1, 1},
       {P(qp), P(yp), P(nb32)});
    close(y, want, 0.0, "dequantize_block_q8_0_f32");
}

// ---- terse's kernels, with crates/model's launch geometry.
void terse_kernels() {
    int rows = 3, cols = 700;
    float eps = 1e-6f;
    auto x = ramp((size_t)(rows * cols), 2.f), w = ramp((size_t)cols, 0.5f, 1.f);
    std::vector<float> y(x.size()), rstd(rows);
    const float *xp = x.data(), *wp = w.data();
    float *yp = y.data(), *rp = rstd.data();
    ok("rmsnorm_fwd_f32", {(unsigned)rows, 1, 1}, {rmsnorm_block, 1, 1},
       {P(xp), P(wp), P(yp), P(rp), P(cols), P(eps)});
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int c = 0; c < cols; c++) ss += (double)x[r * cols + c] * x[r * cols + c];
        double k = 1.0 / std::sqrt(ss / cols + eps);
        for (int c = 0; c < cols; c++) want[r * cols + c] = x[r * cols + c] * k * w[c];
    }
    close(y, want, 1e-5, "rmsnorm_fwd_f32");

    int n = 4, v = 3000;
    auto logits = ramp((size_t)(n * v), 5.f);
    std::vector<uint32_t> targets = {0, 17, 2999, 1234};
    std::vector<float> stats((size_t)(3 * n));
    const float* lp = logits.data();
    const uint32_t* tp = targets.data();
    float* sp = stats.data();
    ok("logprob_fwd_f32", {(unsigned)n, 1, 1}, {logprob_block, 1, 1}, {P(lp), P(tp), P(sp), P(v)});
    std::vector<double> ref;
    for (int r = 0; r < n; r++) {
        const float* row = &logits[(size_t)r * v];
        double m = -1e300, s = 0, t = 0;
        for (int i = 0; i < v; i++) m = std::max(m, (double)row[i]);
        for (int i = 0; i < v; i++) {
            double e = std::exp((double)row[i] - m);
            s += e;
            t += e * row[i];
        }
        double z = m + std::log(s);
        ref.push_back(row[targets[r]] - z);
        ref.push_back(z);
        ref.push_back(z - t / s);
    }
    close(stats, ref, 1e-4, "logprob_fwd_f32");
}

// ---- The runtime's errors and shapes.
void faults() {
    std::vector<float> out(64 * 8);
    float* op = out.data();
    expect_error("fault_divergent_sync", {2, 1, 1}, {64, 1, 1}, {P(op)},
                 {"kernel fault_divergent_sync", "block (0,0,0)", "thread 32", "__syncthreads",
                  "different lines", "first at line 8", "this one at 10"});
    // The shim's deadline case: here thread 33's __syncthreads is seen to come from another
    // line than its block's at once.
    expect_error("fault_deadline", {2, 1, 1}, {64, 1, 1}, {P(op)},
                 {"kernel fault_deadline", "block (0,0,0)", "thread 33", "different lines",
                  "first at line 24, this one at 20"});
    expect_error("fault_divergent_shuffle", {1, 1, 1}, {32, 1, 1}, {P(op)},
                 {"warp shuffle", "different lines"});
    expect_error("fault_partial_warp", {1, 1, 1}, {32, 1, 1}, {P(op)}, {"partial-warp"});
    expect_error("fault_wmma_misaligned", {1, 1, 1}, {32, 1, 1}, {P(op)}, {"not 32-byte aligned"});
    expect_error("t_deadlock", {1, 1, 1}, {64, 1, 1}, {P(op)},
                 {"kernel t_deadlock", "thread 0", "deadlock", "__syncwarp at line",
                  "__syncthreads at line"});
    expect_error("t_exit_in_collective", {1, 1, 1}, {32, 1, 1}, {P(op)},
                 {"thread 5", "returned while lanes of its warp wait", "partial-warp"});
    expect_error("t_partial_warp_shuffle", {1, 1, 1}, {48, 1, 1}, {P(op)},
                 {"thread 32", "partial warp", "partial-warp collective"});
    std::vector<int> xs(64, 1);
    xs[37] = -1;
    const int* xsp = xs.data();
    expect_error("t_assert", {1, 1, 1}, {64, 1, 1}, {P(xsp)},
                 {"thread 37", "device-side assert", "test_kernels.cu:"});
    expect_error("t_assert", {1, 1, 1}, {8, 8, 1}, {P(xsp)},
                 {"thread (5,4,0)", "device-side assert"});
    expect_error("fault_none", {1, 1, 1}, {2048, 1, 1}, {P(op), P(op)}, {"1 to 1024"});
    expect_error("fault_none", {0, 1, 1}, {32, 1, 1}, {P(op), P(op)}, {"grid"});

    // A correct reduction with early-returning warps still runs after the failures.
    auto x = ramp(3 * 128, 1.f);
    std::vector<float> sums(3);
    const float* xp = x.data();
    float* sp = sums.data();
    ok("fault_none", {3, 1, 1}, {128, 1, 1}, {P(xp), P(sp)});
    std::vector<double> want(3, 0.0);
    for (size_t i = 0; i < x.size(); i++) want[i / 128] += x[i];
    close(sums, want, 1e-5, "fault_none");

    // Lanes of 2-D and 3-D blocks in a 3-D grid: warps by linear index.
    Dim grid{2, 3, 2}, block{4, 8, 2};
    unsigned threads = 64, blocks = 12;
    std::vector<float> ws(threads * blocks);
    std::vector<unsigned> ids(6 * threads * blocks);
    float* wsp = ws.data();
    unsigned* idp = ids.data();
    ok("t_warp_sum", grid, block, {P(wsp), P(idp)});
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned t = 0; t < threads; t++) {
            unsigned w = t / 32;
            check(ws[b * threads + t] == (float)(32 * 32 * w + 496), "t_warp_sum");
            const unsigned* id = &ids[6 * (b * threads + t)];
            check(id[0] == b % 2 && id[1] == (b / 2) % 3 && id[2] == b / 6, "block indices");
            check(id[3] == t % 4 && id[4] == (t / 4) % 8 && id[5] == t / 32, "thread indices");
        }
    // A partial last warp without collectives, and dynamic shared memory.
    auto px = ramp(2 * 48, 1.f);
    std::vector<float> ps(2);
    const float* pxp = px.data();
    float* psp = ps.data();
    ok("t_partial_block_sum", {2, 1, 1}, {48, 1, 1}, {P(pxp), P(psp)});
    std::vector<double> pw(2, 0.0);
    for (size_t i = 0; i < px.size(); i++) pw[i / 48] += px[i];
    close(ps, pw, 1e-5, "t_partial_block_sum");
    std::vector<int> in(300), rev(300);
    for (int i = 0; i < 300; i++) in[i] = i * 3 + 1;
    const int* inp = in.data();
    int* revp = rev.data();
    ok("t_dynamic_shared", {3, 1, 1}, {100, 1, 1}, {P(inp), P(revp)}, 100 * sizeof(int));
    for (int i = 0; i < 300; i++)
        check(rev[i] == in[(i / 100) * 100 + 99 - i % 100], "t_dynamic_shared");
}

// Launches from two host threads at once run one after the other, each correct.
void concurrent_launches() {
    size_t n = 100000, dims = 1;
    const size_t* none = nullptr;
    std::vector<float> x(n, 1.f), y1(n), y2(n);
    auto work = [&](float* out, float mul) {
        const float* xp = x.data();
        float add = 0.f;
        for (int k = 0; k < 5; k++)
            ok("affine_f32", {(unsigned)((n + 1023) / 1024), 1, 1}, {1024, 1, 1},
               {P(n), P(dims), P(none), P(xp), P(out), P(mul), P(add)});
    };
    std::thread a(work, y1.data(), 2.f), b(work, y2.data(), 3.f);
    a.join();
    b.join();
    for (size_t i = 0; i < n; i += 997) check(y1[i] == 2.f && y2[i] == 3.f, "concurrent launches");
}

double seconds_of(const std::function<void()>& f) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void speed() {
    size_t n = 1 << 20, dims = 1;
    const size_t* none = nullptr;
    std::vector<float> x(n, 1.f), y(n);
    const float* xp = x.data();
    float* yp = y.data();
    float mul = 2.f, add = 1.f;
    unsigned grid = (unsigned)((n + 1023) / 1024);
    ok("affine_f32", {grid, 1, 1}, {1024, 1, 1},
       {P(n), P(dims), P(none), P(xp), P(yp), P(mul), P(add)});
    double t = seconds_of([&] {
        ok("affine_f32", {grid, 1, 1}, {1024, 1, 1},
           {P(n), P(dims), P(none), P(xp), P(yp), P(mul), P(add)});
    });
    for (size_t i = 0; i < n; i += 4097) check(y[i] == 3.f, "affine_f32 1M");
    std::printf("  affine_f32 over %zu elements (%u blocks of 1024): %.1f ms\n", n, grid, t * 1e3);
    int steps = 8;
    std::vector<float> out(16 * 1024);
    float* op = out.data();
    t = seconds_of([&] { ok("t_barrier_loop", {16, 1, 1}, {1024, 1, 1}, {P(op), P(steps)}); });
    std::printf("  t_barrier_loop, 16 blocks of 1024 threads, %d steps (%d barriers and %d shuffles "
                "per thread): %.1f ms\n", steps, 2 * steps, steps, t * 1e3);
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: %s <modules dir> [<test modules dir>]\n", argv[0]);
        return 2;
    }
    std::string dir = argv[1], test_dir = argc == 3 ? argv[2] : dir + "/test";
    const char* modules[] = {"affine", "binary", "cast",    "fill",    "indexing", "quantized",
                             "reduce", "sort",   "ternary", "unary",   "rmsnorm",  "logprob"};
    for (const char* m : modules) load(dir + "/libterse_fake_" + m + ".so");
    load(test_dir + "/libterse_fake_faulty.so");
    load(test_dir + "/libterse_fake_test_kernels.so");
    unsigned geometry[2] = {0, 0};
    unsigned* gp = geometry;
    ok("t_geometry", {1, 1, 1}, {1, 1, 1}, {P(gp)});
    rmsnorm_block = geometry[0];
    logprob_block = geometry[1];
    std::printf("candle's kernels\n");
    candle_affine();
    candle_binary();
    candle_cast();
    candle_cast_16_and_8();
    candle_fill_and_index();
    candle_softmax_rmsnorm();
    candle_reductions();
    candle_where_and_unary();
    candle_sort_and_quantized();
    std::printf("terse's kernels (rmsnorm block %u, logprob block %u)\n", rmsnorm_block,
                logprob_block);
    terse_kernels();
    std::printf("the runtime's errors and shapes\n");
    faults();
    concurrent_launches();
    std::printf("speed\n");
    speed();
    std::printf("ok: %d checks\n", checks);
    return 0;
}
