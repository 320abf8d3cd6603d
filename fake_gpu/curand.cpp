// fake_gpu/curand.cpp: the emulated device's cuRAND (libcurand.so.10): pseudorandom generators
// whose output is computed on the CPU, in order on the generator's stream.
//
// Every pseudorandom generator type gives the same stream here (not NVIDIA's XORWOW/Philox bits):
// number q of the sequence for a seed is the SplitMix64 output (Steele, Lea & Flood, 2014) for the
// state key(seed) + (q + 1) * 0x9E3779B97F4A7C15, with key(seed) = SplitMix64's mix of seed, so it
// is a pure function of (seed, q): deterministic, and independent of how calls split the
// sequence. Each call takes the next `num` positions (cuRAND's generator offset moves the same way).
//   uniform float:  ((top 24 bits) + 1) * 2^-24, in (0, 1] as cuRAND documents;
//   uniform double: ((top 53 bits) + 1) * 2^-53, in (0, 1];
//   normal: Box-Muller on the uniform doubles at positions 2i, 2i+1 of the call, giving outputs 2i
//   (cosine) and 2i+1 (sine); n must be even, as cuRAND requires of pseudorandom generators;
//   log-normal: exp of the normal.
#include <curand.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

#include "fake_gpu.h"

struct curandGenerator_st {
    curandRngType_t type = CURAND_RNG_PSEUDO_DEFAULT;
    unsigned long long seed = 0;    // cuRAND's default seed
    unsigned long long offset = 0;  // set by curandSetGeneratorOffset
    unsigned long long position = 0;  // the next position of the sequence to hand out
    fake_gpu::Stream stream = nullptr;
};

namespace {

// With TERSE_FAKE_GPU_TRACE=1: one line per call on stderr.
void trace(const char* function, const std::string& detail = std::string()) {
    if (fake_gpu::settings().trace)
        std::fprintf(stderr, "terse fake-gpu: %s%s%s\n", function, detail.empty() ? "" : " ",
                     detail.c_str());
}

std::mutex generators_mutex;
std::unordered_set<curandGenerator_t>& live_generators() {
    static auto* set = new std::unordered_set<curandGenerator_t>();
    return *set;
}
// NOT_INITIALIZED for a null generator (as cuRAND); dies for one that is not live.
bool generator_ok(curandGenerator_t g, const char* function) {
    trace(function);
    if (g == nullptr) return false;
    std::lock_guard<std::mutex> lock(generators_mutex);
    if (!live_generators().count(g))
        fake_gpu::die(std::string(function) + ": the generator was never created or was destroyed");
    return true;
}

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
inline uint64_t mix64(uint64_t z) {  // SplitMix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
inline uint64_t key_of(unsigned long long seed) { return mix64(uint64_t(seed) + kGamma); }
inline uint64_t bits_at(uint64_t key, uint64_t q) { return mix64(key + (q + 1) * kGamma); }
inline float uniform_f32(uint64_t bits) { return float((bits >> 40) + 1) * (1.0f / 16777216.0f); }
inline double uniform_f64(uint64_t bits) {
    return double((bits >> 11) + 1) * (1.0 / 9007199254740992.0);
}

// What one call hands to its stream: everything by value.
struct Draw {
    uint64_t key, start;
    size_t num;
};

// Takes the next `num` positions of g's sequence (now, at call time) and the stream to run on.
Draw take(curandGenerator_t g, size_t num, fake_gpu::Stream* stream) {
    std::lock_guard<std::mutex> lock(generators_mutex);
    Draw d{key_of(g->seed), g->position, num};
    g->position += num;
    *stream = g->stream;
    return d;
}

template <class T>
curandStatus_t normal(const char* function, curandGenerator_t g, T* out, size_t num, T mean,
                      T stddev, bool log_normal) {
    if (!generator_ok(g, function)) return CURAND_STATUS_NOT_INITIALIZED;
    if (num % 2 != 0) {
        trace(function, "rejected: an odd count (Box-Muller makes pairs)");
        return CURAND_STATUS_LENGTH_NOT_MULTIPLE;
    }
    if (num == 0) return CURAND_STATUS_SUCCESS;
    fake_gpu::check_range(uint64_t(uintptr_t(out)), num * sizeof(T), function);
    fake_gpu::Stream stream;
    Draw d = take(g, num, &stream);
    double mu = double(mean), sigma = double(stddev);
    fake_gpu::count(fake_gpu::kLibraryLaunches);
    fake_gpu::enqueue(stream, [d, out, mu, sigma, log_normal]() {
        const double two_pi = 6.283185307179586476925286766559;
        for (size_t i = 0; i < d.num; i += 2) {
            double u1 = uniform_f64(bits_at(d.key, d.start + i));
            double u2 = uniform_f64(bits_at(d.key, d.start + i + 1));
            double r = std::sqrt(-2.0 * std::log(u1));  // u1 in (0, 1]: finite
            double z0 = mu + sigma * r * std::cos(two_pi * u2);
            double z1 = mu + sigma * r * std::sin(two_pi * u2);
            if (log_normal) {
                z0 = std::exp(z0);
                z1 = std::exp(z1);
            }
            out[i] = T(z0);
            out[i + 1] = T(z1);
        }
    });
    return CURAND_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

curandStatus_t curandCreateGenerator(curandGenerator_t* generator, curandRngType_t rng_type) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    trace("curandCreateGenerator");
    if (generator == nullptr) return CURAND_STATUS_NOT_INITIALIZED;
    switch (rng_type) {
        case CURAND_RNG_PSEUDO_DEFAULT:
        case CURAND_RNG_PSEUDO_XORWOW:
        case CURAND_RNG_PSEUDO_MRG32K3A:
        case CURAND_RNG_PSEUDO_MTGP32:
        case CURAND_RNG_PSEUDO_MT19937:
        case CURAND_RNG_PSEUDO_PHILOX4_32_10: break;
        case CURAND_RNG_QUASI_DEFAULT:
        case CURAND_RNG_QUASI_SOBOL32:
        case CURAND_RNG_QUASI_SCRAMBLED_SOBOL32:
        case CURAND_RNG_QUASI_SOBOL64:
        case CURAND_RNG_QUASI_SCRAMBLED_SOBOL64:
            fake_gpu::die("curandCreateGenerator: quasirandom generators are not emulated");
        default: return CURAND_STATUS_TYPE_ERROR;
    }
    auto* g = new curandGenerator_st();
    g->type = rng_type;
    {
        std::lock_guard<std::mutex> lock(generators_mutex);
        live_generators().insert(g);
    }
    *generator = g;
    return CURAND_STATUS_SUCCESS;
}

// Work already queued captured what it needs by value, so the generator can go at once.
curandStatus_t curandDestroyGenerator(curandGenerator_t generator) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandDestroyGenerator")) return CURAND_STATUS_NOT_INITIALIZED;
    {
        std::lock_guard<std::mutex> lock(generators_mutex);
        live_generators().erase(generator);
    }
    delete generator;
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGetVersion(int* version) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (version == nullptr) return CURAND_STATUS_OUT_OF_RANGE;
    *version = CURAND_VERSION;
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandSetStream(curandGenerator_t generator, cudaStream_t stream) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandSetStream")) return CURAND_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(generators_mutex);
    generator->stream = static_cast<fake_gpu::Stream>(stream);
    return CURAND_STATUS_SUCCESS;
}

// A new seed restarts the sequence (at the generator's offset).
curandStatus_t curandSetPseudoRandomGeneratorSeed(curandGenerator_t generator,
                                                  unsigned long long seed) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandSetPseudoRandomGeneratorSeed"))
        return CURAND_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(generators_mutex);
    generator->seed = seed;
    generator->position = generator->offset;
    return CURAND_STATUS_SUCCESS;
}

// The offset is absolute: the next number handed out is number `offset` of the sequence.
curandStatus_t curandSetGeneratorOffset(curandGenerator_t generator, unsigned long long offset) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandSetGeneratorOffset")) return CURAND_STATUS_NOT_INITIALIZED;
    std::lock_guard<std::mutex> lock(generators_mutex);
    generator->offset = offset;
    generator->position = offset;
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGenerate(curandGenerator_t generator, unsigned int* outputPtr, size_t num) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandGenerate")) return CURAND_STATUS_NOT_INITIALIZED;
    if (num == 0) return CURAND_STATUS_SUCCESS;
    fake_gpu::check_range(uint64_t(uintptr_t(outputPtr)), num * sizeof(unsigned int),
                          "curandGenerate");
    fake_gpu::Stream stream;
    Draw d = take(generator, num, &stream);
    fake_gpu::count(fake_gpu::kLibraryLaunches);
    fake_gpu::enqueue(stream, [d, outputPtr]() {
        for (size_t i = 0; i < d.num; ++i)
            outputPtr[i] = unsigned(bits_at(d.key, d.start + i) >> 32);
    });
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGenerateUniform(curandGenerator_t generator, float* outputPtr, size_t num) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandGenerateUniform")) return CURAND_STATUS_NOT_INITIALIZED;
    if (num == 0) return CURAND_STATUS_SUCCESS;
    fake_gpu::check_range(uint64_t(uintptr_t(outputPtr)), num * sizeof(float),
                          "curandGenerateUniform");
    fake_gpu::Stream stream;
    Draw d = take(generator, num, &stream);
    fake_gpu::count(fake_gpu::kLibraryLaunches);
    fake_gpu::enqueue(stream, [d, outputPtr]() {
        for (size_t i = 0; i < d.num; ++i) outputPtr[i] = uniform_f32(bits_at(d.key, d.start + i));
    });
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGenerateUniformDouble(curandGenerator_t generator, double* outputPtr,
                                           size_t num) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    if (!generator_ok(generator, "curandGenerateUniformDouble"))
        return CURAND_STATUS_NOT_INITIALIZED;
    if (num == 0) return CURAND_STATUS_SUCCESS;
    fake_gpu::check_range(uint64_t(uintptr_t(outputPtr)), num * sizeof(double),
                          "curandGenerateUniformDouble");
    fake_gpu::Stream stream;
    Draw d = take(generator, num, &stream);
    fake_gpu::count(fake_gpu::kLibraryLaunches);
    fake_gpu::enqueue(stream, [d, outputPtr]() {
        for (size_t i = 0; i < d.num; ++i) outputPtr[i] = uniform_f64(bits_at(d.key, d.start + i));
    });
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGenerateNormal(curandGenerator_t generator, float* outputPtr, size_t n,
                                    float mean, float stddev) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    return normal<float>("curandGenerateNormal", generator, outputPtr, n, mean, stddev, false);
}

curandStatus_t curandGenerateNormalDouble(curandGenerator_t generator, double* outputPtr,
                                          size_t n, double mean, double stddev) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    return normal<double>("curandGenerateNormalDouble", generator, outputPtr, n, mean, stddev,
                          false);
}

curandStatus_t curandGenerateLogNormal(curandGenerator_t generator, float* outputPtr, size_t n,
                                       float mean, float stddev) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    return normal<float>("curandGenerateLogNormal", generator, outputPtr, n, mean, stddev, true);
}

curandStatus_t curandGenerateLogNormalDouble(curandGenerator_t generator, double* outputPtr,
                                             size_t n, double mean, double stddev) {
    fake_gpu::ApiScope api_scope_(fake_gpu::Api::Library);
    if (fake_gpu::sticky_error()) return CURAND_STATUS_LAUNCH_FAILURE;  // faults.cpp
    return normal<double>("curandGenerateLogNormalDouble", generator, outputPtr, n, mean, stddev,
                          true);
}

}  // extern "C"
