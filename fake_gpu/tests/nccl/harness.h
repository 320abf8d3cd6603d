// The harness of nccl_test.cpp (included by it alone): failure lines, device buffers, the
// results every rank publishes for the parent to compare, polling a collective the way terse
// does, and the test's own bf16 rounding.
#pragma once

#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "fake_gpu.h"

namespace {


const char* g_scenario = "";
int g_rank = -1;
int g_failures = 0;  // in this process

void fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::printf("FAIL %s rank %d: %s\n", g_scenario, g_rank, buf);
    std::fflush(stdout);
    g_failures++;
}

#define CHECK(cond, ...)            \
    do {                            \
        if (!(cond)) fail(__VA_ARGS__); \
    } while (0)

// Device memory (fake_gpu.h): ncclAllReduce & co. check that their buffers lie in live device
// blocks of libcuda.so.1.
template <class T>
struct DevAlloc {
    using value_type = T;
    DevAlloc() = default;
    template <class U>
    DevAlloc(const DevAlloc<U>&) {}
    T* allocate(size_t n) { return reinterpret_cast<T*>(fake_gpu::alloc(n * sizeof(T))); }
    void deallocate(T* p, size_t) { fake_gpu::release(reinterpret_cast<uint64_t>(p), "nccl_test"); }
    bool operator==(const DevAlloc&) const { return true; }
    bool operator!=(const DevAlloc&) const { return false; }
};
template <class T>
using dvec = std::vector<T, DevAlloc<T>>;
template <class T>
dvec<T> dev(const std::vector<T>& v) {
    return dvec<T>(v.begin(), v.end());
}
// One device value.
template <class T>
struct Dev {
    T* p;
    explicit Dev(T v) : p(reinterpret_cast<T*>(fake_gpu::alloc(sizeof(T)))) { *p = v; }
    ~Dev() { fake_gpu::release(reinterpret_cast<uint64_t>(p), "nccl_test"); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    T operator*() const { return *p; }
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Results every rank publishes, for the parent to compare bit for bit across ranks.
constexpr int kMaxRanks = 4, kMaxDigests = 64;
struct Shared {
    uint64_t digest[kMaxRanks][kMaxDigests];
    int used[kMaxRanks];
};
Shared* g_shared = nullptr;
ncclUniqueId g_id2;  // a second id, for the scenario with two communicators
constexpr int kRounds = 40;
ncclUniqueId g_round_ids[kRounds];  // fresh ids for the teardown scenario

uint64_t fnv(const void* p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
    return h;
}

void publish(const void* p, size_t n) {
    int& u = g_shared->used[g_rank];
    if (u < kMaxDigests) g_shared->digest[g_rank][u++] = fnv(p, n);
}

std::string shm_name(const ncclUniqueId& id) { return std::string(id.internal + 24); }

bool shm_exists(const ncclUniqueId& id) {
    return access(("/dev/shm" + shm_name(id)).c_str(), F_OK) == 0;
}

ncclConfig_t nonblocking() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

// Like terse's deadline.rs: poll ncclCommGetAsyncError until it is not ncclInProgress (or the
// deadline passes); returns what it saw.
// Synchronises the default stream first (the collectives' work runs there; in the late mode,
// TERSE_FAKE_GPU_LATE=1, only at a synchronisation point).
ncclResult_t poll_async(ncclComm_t comm, double timeout_s, bool* saw_progress = nullptr) {
    fake_gpu::sync_stream(nullptr);
    double end = now_s() + timeout_s;
    for (;;) {
        ncclResult_t st = ncclNumResults;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess) return r;
        if (st != ncclInProgress) return st;
        if (saw_progress) *saw_progress = true;
        if (now_s() > end) return ncclInProgress;
        usleep(200);
    }
}

// A non-blocking communicator, polled to success.
ncclComm_t init(int nranks, const ncclUniqueId& id) {
    ncclComm_t comm = nullptr;
    ncclConfig_t cfg = nonblocking();
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, g_rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        fail("ncclCommInitRankConfig: %s", ncclGetErrorString(r));
        return nullptr;
    }
    ncclResult_t st = poll_async(comm, 20);
    if (st != ncclSuccess) {
        fail("initialisation ended with %s", ncclGetErrorString(st));
        ncclCommAbort(comm);
        return nullptr;
    }
    return comm;
}

// Runs one collective and polls it like terse does; false (with a failure line) on an error.
bool ok(const char* what, ncclResult_t r, ncclComm_t comm) {
    if (r != ncclSuccess) {
        fail("%s returned %s", what, ncclGetErrorString(r));
        return false;
    }
    ncclResult_t st = poll_async(comm, 20);
    if (st != ncclSuccess) {
        fail("%s: asynchronous %s", what, ncclGetErrorString(st));
        return false;
    }
    return true;
}

uint32_t fbits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}
uint64_t dbits(double f) {
    uint64_t b;
    std::memcpy(&b, &f, 8);
    return b;
}
float bf16f(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
// The test's own f32 -> bf16 rounding: exact in double, nearest with ties to even mantissa.
uint16_t to_bf16(float f) {
    uint32_t b = fbits(f);
    uint16_t lo = (uint16_t)(b >> 16), hi = (uint16_t)(lo + 1);
    double dl = bf16f(lo), dh = bf16f(hi), x = f;
    double el = std::fabs(x - dl), eh = std::fabs(dh - x);
    if (el < eh) return lo;
    if (eh < el) return hi;
    return (lo & 1) ? hi : lo;
}

}  // namespace
