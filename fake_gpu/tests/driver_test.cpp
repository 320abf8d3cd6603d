// The emulated driver's own checks (`cargo xtask fake-gpu --self-test`): fresh memory reads as
// NaN, a copy past a block's end and a use after free end the process naming them, and in the
// late mode a device-to-host copy into pinned memory is stale until the stream is synchronised
// (the same copy into pageable memory completes before it returns, as CUDA documents); and the
// counters (fake_gpu.h, `Counter`) count each call once, with its bytes, syncs, allocations and
// launches, and time inside the library within the wall time around the calls; and stream
// capture: the recorded work runs only when its graph launches, each launch reading the pinned
// input as it is then, the capture's own blocks kept for every launch and released with the
// graph, and what CUDA refuses during a capture refused and the capture invalidated.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "fake_gpu.h"

static int failures = 0;
#define CHECK(c)                                                           \
    do {                                                                   \
        if (!(c)) {                                                        \
            std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);       \
            failures++;                                                    \
        }                                                                  \
    } while (0)

// Runs `f` in a child; true when the child ended with the emulation's exit code (86).
static bool dies(const std::function<void()>& f) {
    pid_t pid = fork();
    if (pid == 0) {
        f();
        std::_Exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 86;
}

// A PTX module with one entry of fake_gpu/tests/test_kernels.cu (its CPU build is in the test
// modules' directory): out[t] = t ^ 1 over a warp.
static const char kPtx[] = R"(.version 8.0
.target sm_90
.address_size 64
.visible .entry t_partial_warp_shuffle(
    .param .u64 t_partial_warp_shuffle_param_0
)
{
    ret;
}
)";

// Every call below is counted once (cuMemAllocAsync's own cuMemAlloc_v2 and
// cuStreamCreateWithPriority's cuStreamCreate are not second ones), the copies' bytes by
// direction (device-to-device ones in neither), each explicit sync, allocation, free and launch.
static void counters(bool with_module) {
    using namespace fake_gpu;
    uint64_t a[kReadingCount], b[kReadingCount];
    CHECK(terse_fake_gpu_counters(a, kReadingCount) == kReadingCount);
    // A short buffer gets only what fits.
    uint64_t two[3] = {0, 0, 12345};
    CHECK(terse_fake_gpu_counters(two, 2) == kReadingCount && two[2] == 12345);
    auto t0 = std::chrono::steady_clock::now();
    uint64_t calls = 0;
    auto call = [&](CUresult r, const char* what) {
        calls++;
        if (r != CUDA_SUCCESS) {
            std::printf("FAIL %s:%d: %s returned %d\n", __FILE__, __LINE__, what, (int)r);
            failures++;
        }
    };
    CUstream s;
    call(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0), "cuStreamCreateWithPriority");
    CUdeviceptr d;
    call(cuMemAllocAsync(&d, 4096, s), "cuMemAllocAsync");
    unsigned char host[4096];
    std::memset(host, 7, sizeof host);
    call(cuMemcpyHtoDAsync(d, host, 4096, s), "cuMemcpyHtoDAsync");
    call(cuMemcpyHtoD(d, host, 100), "cuMemcpyHtoD");
    call(cuMemcpyDtoHAsync(host, d, 1000, s), "cuMemcpyDtoHAsync");
    call(cuMemcpyDtoH(host, d, 10), "cuMemcpyDtoH");
    call(cuMemcpyDtoDAsync(d + 2048, d, 1024, s), "cuMemcpyDtoDAsync");
    CUevent e;
    call(cuEventCreate(&e, 0), "cuEventCreate");
    call(cuEventRecord(e, s), "cuEventRecord");
    call(cuEventSynchronize(e), "cuEventSynchronize");
    call(cuStreamSynchronize(s), "cuStreamSynchronize");
    call(cuCtxSynchronize(), "cuCtxSynchronize");
    call(cuEventDestroy(e), "cuEventDestroy");
    void* pinned;
    call(cuMemHostAlloc(&pinned, 256, 0), "cuMemHostAlloc");
    call(cuMemFreeHost(pinned), "cuMemFreeHost");
    uint64_t launches = 0, syncs = 3;
    if (with_module) {
        CUmodule m;
        CUfunction f;
        call(cuModuleLoadData(&m, kPtx), "cuModuleLoadData");
        call(cuModuleGetFunction(&f, m, "t_partial_warp_shuffle"), "cuModuleGetFunction");
        void* params[] = {&d};
        call(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr), "cuLaunchKernel");
        call(cuStreamSynchronize(s), "cuStreamSynchronize");
        float out[32];
        call(cuMemcpyDtoH(out, d, sizeof out), "cuMemcpyDtoH");
        CHECK(out[0] == 1.f && out[1] == 0.f && out[31] == 30.f);
        launches = 1;
        syncs = 4;
    }
    call(cuMemFreeAsync(d, s), "cuMemFreeAsync");
    call(cuStreamDestroy(s), "cuStreamDestroy");
    auto wall = (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    CHECK(terse_fake_gpu_counters(b, kReadingCount) == kReadingCount);
    auto delta = [&](size_t c) { return b[c] - a[c]; };
    CHECK(delta(kDriverCalls) == calls);
    CHECK(delta(kLaunches) == launches);
    CHECK(delta(kGraphLaunches) == 0);
    CHECK(delta(kSyncs) == syncs);
    CHECK(delta(kAllocs) == 2);
    CHECK(delta(kFrees) == 2);
    CHECK(delta(kAllocBytes) == 4096);  // the device block; pinned host memory is not counted
    CHECK(delta(kH2DBytes) == 4096 + 100);
    CHECK(delta(kD2HBytes) == 1000 + 10 + (with_module ? 128 : 0));
    CHECK(delta(kInsideNs) > 0 && delta(kInsideNs) <= wall);
    CHECK(delta(kLibraryCalls) == 0 && delta(kLibraryLaunches) == 0);
    CHECK(delta(kThreadInsideCpuNs) > 0 && delta(kThreadInsideCpuNs) <= delta(kThreadCpuNs));
    std::printf("counters: %llu calls, %llu of %llu ns inside the driver\n",
                (unsigned long long)calls, (unsigned long long)delta(kInsideNs),
                (unsigned long long)wall);
}

// The calling thread's clocks: 20 ms of host arithmetic outside any call count in its CPU time
// and not inside; 50 ms asleep count in neither; a call's own work counts inside.
static void thread_clocks() {
    using namespace fake_gpu;
    uint64_t a[kReadingCount], b[kReadingCount];
    terse_fake_gpu_counters(a, kReadingCount);
    volatile double x = 0;
    auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(20)) x = x + 1.0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 1 << 20) == CUDA_SUCCESS);
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    terse_fake_gpu_counters(b, kReadingCount);
    uint64_t cpu = b[kThreadCpuNs] - a[kThreadCpuNs];
    uint64_t inside = b[kThreadInsideCpuNs] - a[kThreadInsideCpuNs];
    // At least 5 ms of the spin ran on this thread's CPU even on a loaded machine; the sleep
    // adds at most a few scheduler ticks.
    CHECK(cpu - inside >= 5000000 && cpu - inside < 45000000);
    CHECK(inside > 0 && inside < cpu);
    std::printf("thread clocks: %llu ns of CPU, %llu inside\n", (unsigned long long)cpu,
                (unsigned long long)inside);
}

// The default memory pool: with the release threshold at its default (0) a synchronisation hands
// the memory freed into the pool back (one kPoolReleases); with it raised, nothing goes back.
static void pool() {
    using namespace fake_gpu;
    CUmemoryPool mp;
    CHECK(cuDeviceGetDefaultMemPool(&mp, 0) == CUDA_SUCCESS);
    cuuint64_t threshold = 1;
    CHECK(cuMemPoolGetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == CUDA_SUCCESS);
    CHECK(threshold == 0);
    CHECK(cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &threshold) ==
          CUDA_ERROR_NOT_SUPPORTED);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    auto releases = [&](cuuint64_t set) {
        CHECK(cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &set) == CUDA_SUCCESS);
        uint64_t a[kCounterCount], b[kCounterCount];
        terse_fake_gpu_counters(a, kCounterCount);
        for (int step = 0; step < 3; step++) {
            CUdeviceptr d;
            CHECK(cuMemAllocAsync(&d, 1 << 20, s) == CUDA_SUCCESS);
            CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS);
            CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
            CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);  // nothing freed since: no release
        }
        terse_fake_gpu_counters(b, kCounterCount);
        return b[kPoolReleases] - a[kPoolReleases];
    };
    CHECK(releases(0) == 3);
    CHECK(releases(~cuuint64_t(0)) == 0);
    CHECK(cuMemPoolGetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == CUDA_SUCCESS);
    CHECK(threshold == ~cuuint64_t(0));
    // As a GPU reports it: memory freed into the pool stays used for cuMemGetInfo; the pool's
    // reserved less its used memory is what it holds, and the next allocation reuses it.
    auto attr = [&](CUmemPool_attribute a) {
        cuuint64_t v = 0;
        CHECK(cuMemPoolGetAttribute(mp, a, &v) == CUDA_SUCCESS);
        return v;
    };
    const size_t mib4 = 4 << 20;
    CUdeviceptr d;
    CHECK(cuMemAllocAsync(&d, mib4, s) == CUDA_SUCCESS);
    cuuint64_t used0 = attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    size_t free0, free1, total;
    CHECK(cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS);
    cuuint64_t used1 = attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    cuuint64_t reserved1 = attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    CHECK(free1 == free0);
    CHECK(used1 + mib4 == used0);
    CHECK(reserved1 - used1 == mib4);
    CHECK(cuMemAllocAsync(&d, mib4, s) == CUDA_SUCCESS);
    CHECK(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == reserved1);
    CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    cuuint64_t zero = 0;
    CHECK(cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

// Stream capture and graph launches (streams.cpp).
static void graphs(bool with_module) {
    using namespace fake_gpu;
    uint64_t a[kCounterCount], b[kCounterCount];
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CUdeviceptr in, out;
    CHECK(cuMemAlloc(&in, 256) == CUDA_SUCCESS);
    CHECK(cuMemAlloc(&out, 256) == CUDA_SUCCESS);
    void* up;
    void* down;
    CHECK(cuMemHostAlloc(&up, 256, 0) == CUDA_SUCCESS);
    CHECK(cuMemHostAlloc(&down, 256, 0) == CUDA_SUCCESS);
    auto* r = static_cast<unsigned char*>(down);
    CHECK(cuMemsetD8Async(out, 0, 256, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CUmodule m;
    CUfunction f = nullptr;
    if (with_module) {
        CHECK(cuModuleLoadData(&m, kPtx) == CUDA_SUCCESS);
        CHECK(cuModuleGetFunction(&f, m, "t_partial_warp_shuffle") == CUDA_SUCCESS);
    }
    size_t free0, total;
    CHECK(cuMemGetInfo(&free0, &total) == CUDA_SUCCESS);
    CHECK(terse_fake_gpu_counters(a, kCounterCount) == kReadingCount);

    // The capture: pinned input up, through a block of the capture's own, to `out`; a kernel.
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CHECK(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    std::memset(up, 5, 256);
    CHECK(cuMemcpyHtoDAsync(in, up, 256, s) == CUDA_SUCCESS);
    CUdeviceptr tmp;
    CHECK(cuMemAllocAsync(&tmp, 256, s) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoDAsync(tmp, in, 256, s) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoDAsync(out, tmp, 128, s) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync(tmp, s) == CUDA_SUCCESS);
    if (with_module) {
        CUdeviceptr k = out + 128;
        void* params[] = {&k};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, params, nullptr) == CUDA_SUCCESS);
    }
    CUgraph g;
    CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g);
    CHECK(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_NONE);
    CUgraphExec x;
    CHECK(cuGraphInstantiateWithFlags(&x, g, 0) == CUDA_SUCCESS);
    // Nothing ran.
    CHECK(cuMemcpyDtoH(r, out, 256) == CUDA_SUCCESS);
    CHECK(r[0] == 0 && r[200] == 0);
    // Each launch reads the pinned input as it is when the launch runs.
    for (unsigned char v : {9, 17}) {
        std::memset(up, v, 256);
        CHECK(cuGraphLaunch(x, s) == CUDA_SUCCESS);
        CHECK(cuMemcpyDtoHAsync(down, out, 256, s) == CUDA_SUCCESS);
        CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
        CHECK(r[0] == v && r[127] == v);
        if (v == 9) {  // between the two launches: 10 ms of host arithmetic, and calls
            volatile double x = 0;
            auto t0 = std::chrono::steady_clock::now();
            while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(10)) x = x + 1.0;
            // ... whose own time (filling 256 MiB twice, tens of ms) is not host work.
            CUdeviceptr big;
            CHECK(cuMemAlloc(&big, 256 << 20) == CUDA_SUCCESS);
            CHECK(cuMemsetD8(big, 1, 256 << 20) == CUDA_SUCCESS);
            CHECK(cuMemFree(big) == CUDA_SUCCESS);
        }
        if (with_module) {
            float k[32];
            std::memcpy(k, r + 128, sizeof k);
            CHECK(k[0] == 1.f && k[31] == 30.f);
        }
    }
    CHECK(terse_fake_gpu_counters(b, kCounterCount) == kReadingCount);
    CHECK(b[kGraphLaunches] - a[kGraphLaunches] == 2);
    CHECK(b[kLaunches] - a[kLaunches] == 0);  // the recorded kernel ran as its graph
    // One step between two launches of the graph; its host work is the spin (at least 2 ms of
    // it on this thread's CPU on a loaded machine, at most its 10 ms and a little), not the
    // calls' own time.
    uint64_t gap = b[kGraphStepHostNs] - a[kGraphStepHostNs];
    CHECK(b[kGraphSteps] - a[kGraphSteps] == 1);
    CHECK(gap < 15000000);
    CHECK(b[kGraphKernels] - a[kGraphKernels] == (with_module ? 2u : 0u));  // 1 node, 2 launches
    CHECK(gap >= 2000000);
    // The capture's block lives as long as the graph.
    size_t free1;
    CHECK(cuMemGetInfo(&free1, &total) == CUDA_SUCCESS);
    CHECK(free1 + 256 <= free0);  // free memory fell by at least the block
    CHECK(cuGraphDestroy(g) == CUDA_SUCCESS);
    CHECK(cuGraphExecDestroy(x) == CUDA_SUCCESS);
    size_t free2;
    CHECK(cuMemGetInfo(&free2, &total) == CUDA_SUCCESS);
    CHECK(free2 == free0);

    // What CUDA refuses during a capture: refused, and the capture invalidated.
    auto refused = [&](const std::function<CUresult()>& call) {
        CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
        CHECK(call() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CUgraph none = nullptr;
        CHECK(cuStreamEndCapture(s, &none) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !none);
    };
    unsigned char pageable[16];
    CUdeviceptr p2;
    refused([&] { return cuStreamSynchronize(s); });
    refused([&] { return cuStreamQuery(s); });
    refused([&] { return cuCtxSynchronize(); });
    refused([&] { return cuMemAlloc(&p2, 64); });
    refused([&] { return cuMemcpyDtoH(pageable, out, 16); });
    refused([&] { return cuMemcpyHtoDAsync(out, pageable, 16, s); });
    refused([&] { return cuMemcpyDtoHAsync(pageable, out, 16, s); });
    refused([&] { return cuMemFreeAsync(in, s); });  // a block from outside the capture
    // The legacy stream cannot capture; a capture cannot be begun twice.
    CHECK(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS);
    CHECK(cuMemAlloc(&p2, 64) == CUDA_SUCCESS);  // relaxed: allowed
    CUgraph empty;
    CHECK(cuStreamEndCapture(s, &empty) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(empty) == CUDA_SUCCESS);
    CHECK(cuMemFree(p2) == CUDA_SUCCESS);
    CHECK(cuMemFree(in) == CUDA_SUCCESS && cuMemFree(out) == CUDA_SUCCESS);
    CHECK(cuMemFreeHost(up) == CUDA_SUCCESS && cuMemFreeHost(down) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

int main(int argc, char** argv) {
    setenv("TERSE_FAKE_GPU_LATE", "1", 1);  // read once, at the first call
    // The test modules (`--self-test` passes the modules' directory; they are in its test/).
    std::string test_modules = argc > 1 ? std::string(argv[1]) + "/test" : std::string();
    if (argc > 1) setenv("TERSE_FAKE_GPU_KERNELS", test_modules.c_str(), 1);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);

    // Fresh device memory: NaN in f32.
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, 64 * sizeof(float)) == CUDA_SUCCESS);
    float host[64];
    CHECK(cuMemcpyDtoH(host, d, sizeof host) == CUDA_SUCCESS);
    CHECK(std::isnan(host[0]) && std::isnan(host[63]));

    // Late mode: a memset queued on `s`, then a copy into pinned memory, both pending.
    void* pinned;
    CHECK(cuMemHostAlloc(&pinned, sizeof host, 0) == CUDA_SUCCESS);
    std::memset(pinned, 0, sizeof host);
    CHECK(cuMemsetD8Async(d, 0x3f, sizeof host, s) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoHAsync(pinned, d, sizeof host, s) == CUDA_SUCCESS);
    CHECK(static_cast<unsigned char*>(pinned)[0] == 0);  // stale: nothing synchronised yet
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(static_cast<unsigned char*>(pinned)[0] == 0x3f);
    // Into pageable memory the copy completes before it returns.
    CHECK(cuMemsetD8Async(d, 0x40, sizeof host, s) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoHAsync(host, d, sizeof host, s) == CUDA_SUCCESS);
    CHECK(reinterpret_cast<unsigned char*>(host)[0] == 0x40);
    // An event orders another stream after the work before it.
    CUevent e;
    CUstream t;
    CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&e, 0) == CUDA_SUCCESS);
    CHECK(cuMemsetD8Async(d, 0x41, sizeof host, s) == CUDA_SUCCESS);
    CHECK(cuEventRecord(e, s) == CUDA_SUCCESS);
    CHECK(cuStreamWaitEvent(t, e, 0) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoHAsync(pinned, d, sizeof host, t) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(t) == CUDA_SUCCESS);
    CHECK(static_cast<unsigned char*>(pinned)[0] == 0x41);

    counters(argc > 1);
    pool();
    thread_clocks();
    graphs(argc > 1);

    // Bounds and lifetime.
    CHECK(dies([&] { cuMemcpyDtoH(host, d + 8, sizeof host); }));
    CHECK(dies([&] { cuMemsetD8Async(d, 0, 65 * sizeof(float), s); }));
    CHECK(!dies([&] { cuMemsetD8Async(d, 0, 64 * sizeof(float), s); cuStreamSynchronize(s); }));
    CHECK(cuMemFree(d) == CUDA_SUCCESS);
    CHECK(dies([&] { cuMemcpyDtoH(host, d, 4); }));
    CHECK(dies([&] { cuMemFree(d); }));

    if (failures) {
        std::printf("driver_test: %d failures\n", failures);
        return 1;
    }
    std::printf("driver_test: ok\n");
    return 0;
}
