// The emulated device's test of kernels/mma.cuh's collectives (mma.sync and ldmatrix through
// terse_shim::gather, cp.async groups completed at their waits, dynamic shared memory refilled
// with 0xff bytes for every block) on the fiber runtime (fake_gpu/fibers/): runs
// kernels/flash_fa2.cu's forward from its CPU build (libterse_fake_flash_fa2.so) over several
// row blocks and key tiles, causal and packed, GQA 2, at head sizes 64 and 128, against a
// double-precision reference written here; then a launch without the dynamic shared memory it
// needs, which must fail.
//
// Linked against libcuda.so.1 and run as `flash_fa2_test <modules dir>` by
// `cargo xtask fake-gpu --self-test`. Exits non-zero on the first failed check, naming it.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fake_gpu.h"

namespace {
// crates/model's launch geometry for the tensor-core flash kernels (kernels/geometry.rs's
// FLASH_TC_WARPS = 4: 16 query rows a warp) and kernels/flash/launch.rs's flash_fa2_shared.
constexpr unsigned WARPS = 4, ROWS = 16 * WARPS, KEYS = 64;
unsigned shared_bytes(int d) { return 2 * 2 * KEYS * (unsigned)(d + 8) * 2; }

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    std::exit(1);
}

float bf16_value(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// Truncation is enough here: the inputs only need to be bf16 values, the same on both sides.
uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

struct Case {
    const char* name;
    int b, hq, hkv, t, d;
    std::vector<uint32_t> starts;  // (B, T): each query's first key
};

std::string run(void (*body)(void**), const Case& c, const std::vector<uint16_t>& q,
                const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                std::vector<float>& out, std::vector<float>& lse, unsigned shared) {
    const uint16_t *qp = q.data(), *kp = k.data(), *vp = v.data();
    const uint32_t* sp = c.starts.data();
    float *op = out.data(), *lp = lse.data();
    int hq = c.hq, hkv = c.hkv, t = c.t;
    float scale = 1.f / std::sqrt((float)c.d);
    void* params[] = {&qp, &kp, &vp, &sp, &op, &lp, &hq, &hkv, &t, &scale};
    unsigned grid[3] = {(unsigned)(c.t + ROWS - 1) / ROWS, (unsigned)(c.b * c.hq), 1};
    unsigned block[3] = {32 * WARPS, 1, 1};
    char err[1024] = {0};
    std::string name = "flash_fa2_fwd_d" + std::to_string(c.d);
    int rc = terse_fake_run(name.c_str(), grid, block, shared, body, params, err, sizeof err);
    return rc == 0 ? std::string() : std::string(err);
}

void check_case(void* lib, const Case& c) {
    std::string name = "flash_fa2_fwd_d" + std::to_string(c.d);
    auto table = reinterpret_cast<terse_fake_kernels_fn>(dlsym(lib, "terse_fake_kernels"));
    if (!table) fail("libterse_fake_flash_fa2.so exports no terse_fake_kernels");
    size_t n = 0;
    const terse_fake_kernel* k = table(&n);
    void (*body)(void**) = nullptr;
    for (size_t i = 0; i < n; i++)
        if (name == k[i].name) body = k[i].body;
    if (!body) fail("no CPU build of " + name);
    size_t nq = (size_t)c.b * c.hq * c.t * c.d, nk = (size_t)c.b * c.hkv * c.t * c.d;
    std::vector<uint16_t> q(nq), kk(nk), v(nk);
    for (size_t i = 0; i < nq; i++) q[i] = bf16_bits(std::sin(0.37f * (float)i + 0.1f));
    for (size_t i = 0; i < nk; i++) kk[i] = bf16_bits(std::cos(0.23f * (float)i + 0.4f));
    for (size_t i = 0; i < nk; i++) v[i] = bf16_bits(std::sin(0.11f * (float)i + 1.3f));
    std::vector<float> out(nq, -7.f), lse((size_t)c.b * c.hq * c.t, -7.f);
    std::string e = run(body, c, q, kk, v, out, lse, shared_bytes(c.d));
    if (!e.empty()) fail(std::string(c.name) + ": " + e);
    // The reference in double; out within 2^-7 of max |ref| (P is bf16 in the kernel).
    std::vector<double> want(nq), want_lse(lse.size());
    double scale = 1.0 / std::sqrt((double)c.d), top = 0;
    for (int b = 0; b < c.b; b++)
        for (int h = 0; h < c.hq; h++) {
            int g = b * c.hkv + h / (c.hq / c.hkv);
            size_t bh = (size_t)b * c.hq + h;
            for (int i = 0; i < c.t; i++) {
                int lo = (int)c.starts[(size_t)b * c.t + i];
                std::vector<double> s;
                double m = -INFINITY;
                for (int j = lo; j <= i; j++) {
                    double dot = 0;
                    for (int x = 0; x < c.d; x++)
                        dot += (double)bf16_value(q[(bh * c.t + i) * c.d + x]) *
                               bf16_value(kk[((size_t)g * c.t + j) * c.d + x]);
                    s.push_back(dot * scale);
                    m = std::max(m, dot * scale);
                }
                double sum = 0;
                for (double& x : s) sum += (x = std::exp(x - m));
                want_lse[bh * c.t + i] = s.empty() ? -INFINITY : m + std::log(sum);
                for (int x = 0; x < c.d; x++) {
                    double o = 0;
                    for (size_t j = 0; j < s.size(); j++)
                        o += s[j] * bf16_value(v[((size_t)g * c.t + lo + j) * c.d + x]);
                    want[(bh * c.t + i) * c.d + x] = s.empty() ? 0 : o / sum;
                    top = std::max(top, std::fabs(want[(bh * c.t + i) * c.d + x]));
                }
            }
        }
    double tol = top / 128;
    for (size_t i = 0; i < nq; i++)
        if (!(std::fabs(out[i] - want[i]) <= tol))
            fail(std::string(c.name) + ": out element " + std::to_string(i) + " is " +
                 std::to_string(out[i]) + ", want " + std::to_string(want[i]));
    for (size_t i = 0; i < lse.size(); i++) {
        bool ok = std::isinf(want_lse[i]) ? lse[i] == -INFINITY
                                          : std::fabs(lse[i] - want_lse[i]) <= 1e-3;
        if (!ok)
            fail(std::string(c.name) + ": lse row " + std::to_string(i) + " is " +
                 std::to_string(lse[i]) + ", want " + std::to_string(want_lse[i]));
    }
    std::printf("  %s: ok (max |ref| %.3f)\n", c.name, top);
    // Without its dynamic shared memory the launch fails, naming it.
    e = run(body, c, q, kk, v, out, lse, 0);
    if (e.find("dynamic shared memory, but the launch gave it 0 bytes") == std::string::npos)
        fail(std::string(c.name) + " without shared memory: `" + e + "`");
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <modules dir>\n", argv[0]);
        return 2;
    }
    std::string path = std::string(argv[1]) + "/libterse_fake_flash_fa2.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail(std::string("dlopen: ") + dlerror());
    // Causal over three row blocks and three key tiles (T = 150), and a packed batch row whose
    // sequences start at keys 63 (a tile's last) and 127, at D = 128; left padding at D = 64.
    Case big{"d128 causal + packed, GQA 2", 2, 4, 2, 150, 128, {}};
    for (int i = 0; i < 150; i++) big.starts.push_back(0);
    for (int i = 0; i < 150; i++) big.starts.push_back(i < 63 ? 0 : i < 127 ? 63 : 127);
    Case small{"d64 left padding", 1, 2, 1, 70, 64, {}};
    for (int i = 0; i < 70; i++) small.starts.push_back(i < 5 ? (uint32_t)i + 1 : 5);
    check_case(lib, big);
    check_case(lib, small);
    std::printf("flash_fa2: ok\n");
    return 0;
}
