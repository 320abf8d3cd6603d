// kernels_test.cpp's harness (included by it alone): the launch geometry the modules were built
// with, loading a module, launching an entry point through the fiber runtime, and references
// written independently of the emulation's headers.
#pragma once

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
#include "../../fake_gpu.h"

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

}  // namespace
