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
// The harness and candle's kernels are in kernels/ (harness.h, candle.h); this file holds
// terse's kernels, the runtime's errors and speed, and main.
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

#include "kernels/candle.h"
#include "kernels/harness.h"

namespace {

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
