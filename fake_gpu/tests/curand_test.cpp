// fake_gpu/tests/curand_test.cpp: unit test of the emulated cuRAND (fake_gpu/curand.cpp):
// determinism per seed, different seeds differ, the sequence continues across calls and honours
// offsets, uniform in (0, 1] with the right moments, normal/log-normal moments, documented errors.
// Prints one line per failure; exits nonzero if any.
#include <curand.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../fake_gpu.h"

namespace {

int failures = 0;
void fail(const std::string& what) {
    ++failures;
    std::printf("FAIL %s\n", what.c_str());
}

// A buffer of emulated device memory.
template <class T>
struct Buf {
    size_t n;
    T* p;
    explicit Buf(size_t count) : n(count) {
        p = reinterpret_cast<T*>(fake_gpu::alloc(count * sizeof(T)));
        std::memset(p, 0xff, count * sizeof(T));
    }
    ~Buf() { fake_gpu::release(reinterpret_cast<uint64_t>(p), "curand_test"); }
    Buf(const Buf&) = delete;
    std::vector<T> host() const {
        fake_gpu::sync_all();
        return std::vector<T>(p, p + n);
    }
};

curandGenerator_t make(unsigned long long seed) {
    curandGenerator_t g = nullptr;
    if (curandCreateGenerator(&g, CURAND_RNG_PSEUDO_DEFAULT) != CURAND_STATUS_SUCCESS || !g) {
        fail("curandCreateGenerator");
        return nullptr;
    }
    if (curandSetStream(g, nullptr) != CURAND_STATUS_SUCCESS) fail("curandSetStream");
    if (curandSetPseudoRandomGeneratorSeed(g, seed) != CURAND_STATUS_SUCCESS)
        fail("curandSetPseudoRandomGeneratorSeed");
    return g;
}

template <class T>
std::vector<T> normals(curandGenerator_t g, size_t n, T mean, T stddev);
template <>
std::vector<float> normals(curandGenerator_t g, size_t n, float mean, float stddev) {
    Buf<float> b(n);
    if (curandGenerateNormal(g, b.p, n, mean, stddev) != CURAND_STATUS_SUCCESS)
        fail("curandGenerateNormal status");
    return b.host();
}
template <>
std::vector<double> normals(curandGenerator_t g, size_t n, double mean, double stddev) {
    Buf<double> b(n);
    if (curandGenerateNormalDouble(g, b.p, n, mean, stddev) != CURAND_STATUS_SUCCESS)
        fail("curandGenerateNormalDouble status");
    return b.host();
}
std::vector<float> uniforms(curandGenerator_t g, size_t n) {
    Buf<float> b(n);
    if (curandGenerateUniform(g, b.p, n) != CURAND_STATUS_SUCCESS) fail("curandGenerateUniform status");
    return b.host();
}
std::vector<double> uniforms_d(curandGenerator_t g, size_t n) {
    Buf<double> b(n);
    if (curandGenerateUniformDouble(g, b.p, n) != CURAND_STATUS_SUCCESS)
        fail("curandGenerateUniformDouble status");
    return b.host();
}

template <class T>
void moments(const std::vector<T>& v, double* mean, double* var) {
    double s = 0, s2 = 0;
    for (T x : v) s += double(x);
    *mean = s / double(v.size());
    for (T x : v) s2 += (double(x) - *mean) * (double(x) - *mean);
    *var = s2 / double(v.size() - 1);
}

// Checks sample mean/variance against the distribution's, at ~6 standard errors.
template <class T>
void check_moments(const char* what, const std::vector<T>& v, double mu, double var,
                   double fourth_central) {
    double n = double(v.size()), m, s2;
    moments(v, &m, &s2);
    double se_mean = std::sqrt(var / n), se_var = std::sqrt((fourth_central - var * var) / n);
    if (!(std::fabs(m - mu) < 6 * se_mean))
        fail(std::string(what) + ": mean " + std::to_string(m) + ", want " + std::to_string(mu));
    if (!(std::fabs(s2 - var) < 6 * se_var))
        fail(std::string(what) + ": variance " + std::to_string(s2) + ", want " + std::to_string(var));
}

template <class T>
size_t count_equal(const std::vector<T>& a, const std::vector<T>& b) {
    size_t same = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) same += std::memcmp(&a[i], &b[i], sizeof(T)) == 0;
    return same;
}

// The documented sequence (curand.cpp's header): number q for a seed is SplitMix64's output for
// the state mix(seed + G) + (q + 1) * G; a uniform float is ((top 24 bits) + 1) * 2^-24.
constexpr uint64_t G = 0x9E3779B97F4A7C15ull;
uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
uint64_t bits_at(unsigned long long seed, uint64_t q) { return mix(mix(seed + G) + (q + 1) * G); }

// The generator follows its documented formula, and the ends of (0, 1] are reached exactly:
// the position whose top 24 bits are all zero gives 2^-24 (never 0), all ones gives 1.
void test_documented_sequence() {
    const unsigned long long seed = 5;
    curandGenerator_t g = make(seed);
    auto u = uniforms(g, 1000);
    for (uint64_t q = 0; q < 1000; ++q) {
        float want = float((bits_at(seed, q) >> 40) + 1) * (1.0f / 16777216.0f);
        if (u[q] != want) {
            fail("uniform " + std::to_string(q) + " is not the documented SplitMix64 value");
            break;
        }
    }
    // Doubles take the top 53 bits; normals are Box-Muller on the pair (2i, 2i+1).
    curandSetGeneratorOffset(g, 0);
    auto d = uniforms_d(g, 1000);
    for (uint64_t q = 0; q < 1000; ++q)
        if (d[q] != double((bits_at(seed, q) >> 11) + 1) * (1.0 / 9007199254740992.0)) {
            fail("uniform double " + std::to_string(q) + " is not the documented value");
            break;
        }
    curandSetGeneratorOffset(g, 0);
    auto z = normals<double>(g, 1000, 1.0, 2.0);
    for (uint64_t i = 0; i < 1000; i += 2) {
        double u1 = double((bits_at(seed, i) >> 11) + 1) * (1.0 / 9007199254740992.0);
        double u2 = double((bits_at(seed, i + 1) >> 11) + 1) * (1.0 / 9007199254740992.0);
        double r = std::sqrt(-2 * std::log(u1)), t = 2 * M_PI * u2;
        if (std::fabs(z[i] - (1 + 2 * r * std::cos(t))) > 1e-12 * (1 + std::fabs(z[i])) ||
            std::fabs(z[i + 1] - (1 + 2 * r * std::sin(t))) > 1e-12 * (1 + std::fabs(z[i + 1]))) {
            fail("normal pair " + std::to_string(i) + " is not the documented Box-Muller value");
            break;
        }
    }
    uint64_t q_min = UINT64_MAX, q_max = UINT64_MAX;
    for (uint64_t q = 0; q < (uint64_t(1) << 27) && (q_min == UINT64_MAX || q_max == UINT64_MAX); ++q) {
        uint64_t top = bits_at(seed, q) >> 40;
        if (top == 0 && q_min == UINT64_MAX) q_min = q;
        if (top == 0xffffff && q_max == UINT64_MAX) q_max = q;
    }
    if (q_min == UINT64_MAX || q_max == UINT64_MAX) {
        fail("no position with extreme top bits found (test setup)");
    } else {
        curandSetGeneratorOffset(g, q_min);
        float lo = uniforms(g, 1)[0];
        curandSetGeneratorOffset(g, q_max);
        float hi = uniforms(g, 1)[0];
        if (lo != 1.0f / 16777216.0f) fail("smallest uniform is " + std::to_string(lo) + ", want 2^-24");
        if (hi != 1.0f) fail("largest uniform is " + std::to_string(hi) + ", want 1");
    }
    curandDestroyGenerator(g);
}

void test_determinism() {
    const size_t n = 4096;
    curandGenerator_t g1 = make(299792458), g2 = make(299792458), g3 = make(299792459);
    auto a = normals<float>(g1, n, 0.f, 1.f), b = normals<float>(g2, n, 0.f, 1.f),
         c = normals<float>(g3, n, 0.f, 1.f);
    if (count_equal(a, b) != n) fail("same seed gave different normals");
    if (count_equal(a, c) > n / 100) fail("different seeds gave the same normals");
    // Next call continues the sequence, identically for equal seeds.
    auto a2 = normals<float>(g1, n, 0.f, 1.f), b2 = normals<float>(g2, n, 0.f, 1.f);
    if (count_equal(a2, b2) != n) fail("same seed, second call differs");
    if (count_equal(a, a2) > n / 100) fail("second call repeated the first");
    // Two calls of n give what one call of 2n gives.
    curandGenerator_t g4 = make(299792458);
    auto whole = normals<float>(g4, 2 * n, 0.f, 1.f);
    std::vector<float> joined(a);
    joined.insert(joined.end(), a2.begin(), a2.end());
    if (count_equal(whole, joined) != 2 * n) fail("the sequence is not continued across calls");
    // Reseeding restarts the sequence.
    curandSetPseudoRandomGeneratorSeed(g4, 299792458);
    if (count_equal(normals<float>(g4, n, 0.f, 1.f), a) != n) fail("reseeding did not restart");
    // An absolute offset skips that many numbers.
    curandSetGeneratorOffset(g4, 100);
    auto off = normals<float>(g4, n - 100, 0.f, 1.f);
    if (count_equal(off, std::vector<float>(a.begin() + 100, a.end())) != n - 100)
        fail("curandSetGeneratorOffset(100) is not the sequence from number 100");
    // Double, uniform: deterministic too.
    curandGenerator_t d1 = make(7), d2 = make(7), d3 = make(8);
    auto x = uniforms_d(d1, n), y = uniforms_d(d2, n), z = uniforms_d(d3, n);
    if (count_equal(x, y) != n) fail("same seed gave different uniform doubles");
    if (count_equal(x, z) > 0) fail("different seeds gave equal uniform doubles");
    auto u = uniforms(d1, n), w = uniforms(d2, n);
    if (count_equal(u, w) != n) fail("same seed gave different uniform floats");
    for (curandGenerator_t g : {g1, g2, g3, g4, d1, d2, d3})
        if (curandDestroyGenerator(g) != CURAND_STATUS_SUCCESS) fail("curandDestroyGenerator");
}

void test_uniform() {
    const size_t n = 1 << 20;
    curandGenerator_t g = make(42);
    auto u = uniforms(g, n);
    float lo = 2, hi = -1;
    for (float x : u) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    if (!(lo > 0.f && hi <= 1.f)) fail("uniform float out of (0, 1]: min " + std::to_string(lo) + " max " + std::to_string(hi));
    if (!(lo < 1e-4f && hi > 1 - 1e-4f)) fail("uniform float does not span (0, 1]");
    check_moments("uniform float", u, 0.5, 1.0 / 12, 1.0 / 80);
    auto d = uniforms_d(g, n);
    double dlo = 2, dhi = -1;
    for (double x : d) {
        dlo = std::min(dlo, x);
        dhi = std::max(dhi, x);
    }
    if (!(dlo > 0.0 && dhi <= 1.0)) fail("uniform double out of (0, 1]");
    check_moments("uniform double", d, 0.5, 1.0 / 12, 1.0 / 80);
    // Ten equal bins each get about a tenth.
    size_t bins[10] = {};
    for (float x : u) bins[std::min(9, int(x * 10))]++;
    for (size_t b : bins)
        if (std::fabs(double(b) / n - 0.1) > 0.003) fail("uniform float bins uneven: " + std::to_string(b));
    // Neighbouring values are not correlated.
    double c = 0;
    for (size_t i = 1; i < n; ++i) c += (u[i] - 0.5) * (u[i - 1] - 0.5);
    c /= double(n - 1) / 12.0;
    if (std::fabs(c) > 6 / std::sqrt(double(n))) fail("uniform lag-1 correlation " + std::to_string(c));
    curandDestroyGenerator(g);
}

void test_normal() {
    const size_t n = 1 << 20;
    curandGenerator_t g = make(1234);
    auto f = normals<float>(g, n, 2.f, 3.f);
    check_moments("normal float (2, 3)", f, 2.0, 9.0, 3 * 81.0);
    size_t within = 0;
    for (float x : f) within += std::fabs(x - 2.f) < 3.f;
    if (std::fabs(double(within) / n - 0.682689) > 0.003)
        fail("normal float: fraction within 1 sigma " + std::to_string(double(within) / n));
    auto d = normals<double>(g, n, -1.0, 0.5);
    check_moments("normal double (-1, 0.5)", d, -1.0, 0.25, 3 * 0.0625);
    for (double x : d)
        if (!std::isfinite(x)) {
            fail("normal double not finite");
            break;
        }
    // Log-normal: the log is normal.
    Buf<float> ln(n);
    if (curandGenerateLogNormal(g, ln.p, n, 0.5f, 0.25f) != CURAND_STATUS_SUCCESS) fail("curandGenerateLogNormal status");
    auto lv = ln.host();
    std::vector<double> logs;
    for (float x : lv) logs.push_back(std::log(double(x)));
    check_moments("log-normal float (0.5, 0.25)", logs, 0.5, 0.0625, 3 * 0.0625 * 0.0625);
    curandDestroyGenerator(g);
}

void test_errors() {
    curandGenerator_t g = make(1);
    Buf<float> b(8);
    if (curandGenerateNormal(g, b.p, 7, 0.f, 1.f) != CURAND_STATUS_LENGTH_NOT_MULTIPLE)
        fail("odd count of normals not rejected with LENGTH_NOT_MULTIPLE");
    if (curandGenerateNormal(nullptr, b.p, 8, 0.f, 1.f) != CURAND_STATUS_NOT_INITIALIZED)
        fail("null generator not rejected");
    if (curandGenerateUniform(g, b.p, 0) != CURAND_STATUS_SUCCESS) fail("zero uniforms not accepted");
    curandGenerator_t q = nullptr;
    if (curandCreateGenerator(&q, curandRngType_t(12345)) != CURAND_STATUS_TYPE_ERROR)
        fail("bad generator type not rejected with TYPE_ERROR");
    // The odd call did not consume numbers: the sequence still starts at 0.
    curandGenerator_t h = make(1);
    std::vector<float> x = normals<float>(g, 8, 0.f, 1.f), y = normals<float>(h, 8, 0.f, 1.f);
    if (count_equal(x, y) != 8) fail("a rejected call moved the sequence");
    int version = 0;
    if (curandGetVersion(&version) != CURAND_STATUS_SUCCESS || version <= 0) fail("curandGetVersion");
    curandDestroyGenerator(g);
    curandDestroyGenerator(h);
}

}  // namespace

int main() {
    test_determinism();
    test_documented_sequence();
    test_uniform();
    test_normal();
    test_errors();
    std::printf("curand_test: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    return failures ? 1 : 0;
}
