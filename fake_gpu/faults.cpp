// Device faults the emulated device injects on request (`cargo xtask fake-gpu --fault`,
// docs/gpu.md), so that a run's handling of them is tested without a GPU that misbehaves:
//
//   TERSE_FAKE_GPU_FAULT=alloc:N   the Nth device allocation (cuMemAlloc, cuMemAllocAsync) of the
//                                  process fails with CUDA_ERROR_OUT_OF_MEMORY; the context stays
//                                  usable, as after a real out-of-memory;
//   TERSE_FAKE_GPU_FAULT=launch:N  the Nth kernel launch (cuLaunchKernel) fails with
//                                  CUDA_ERROR_LAUNCH_FAILED, and the error is sticky: every later
//                                  driver call, cuBLAS, cuRAND and NCCL call of the process fails
//                                  with it, as after a real kernel fault (the launch reports it
//                                  itself, as under CUDA_LAUNCH_BLOCKING=1);
//   TERSE_FAKE_GPU_FAULT=copy:N    the Nth copy (every cuMemcpy* variant) fails with
//                                  CUDA_ERROR_UNKNOWN and copies nothing; not sticky;
//   TERSE_FAKE_GPU_KILL_RANK=R@S:PHASE  the process on device R dies (SIGKILL, as a crashed rank)
//                                  at its first driver call inside the NVTX range "step S PHASE"
//                                  (terse marks its phases with NVTX ranges; nvtx.cpp is the
//                                  emulated libnvToolsExt.so.1 that reports them here).
//
// N counts from 1 at process start (tests/faults_test.cpp checks each switch). The errors' names
// and descriptions (cuGetErrorName, cuGetErrorString) are here too. TERSE_FAKE_GPU_COUNTS_OUT=PATH writes, at exit, how many
// allocations, launches and copies the process made (`alloc N`, `launch N`, `copy N` lines), so
// that a fault campaign can choose its Ns from an uninterrupted run.
#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "fake_gpu.h"

namespace fake_gpu {
namespace {
struct Plan {
    Fault kind = Fault::kCount;  // kCount: no fault
    uint64_t at = 0;
    int kill_device = -1;
    std::string kill_range;  // "step S PHASE"
    std::string counts_out;
};

// Leaked, so that it outlives the exit-time writer of the counts below.
const Plan& plan() {
    static const Plan* p = [] {
        auto* q = new Plan;
        Plan& p = *q;
        if (const char* f = std::getenv("TERSE_FAKE_GPU_FAULT"); f && *f) {
            std::string s(f);
            auto colon = s.find(':');
            std::string kind = s.substr(0, colon);
            char* end = nullptr;
            unsigned long long n =
                colon == std::string::npos ? 0 : std::strtoull(s.c_str() + colon + 1, &end, 10);
            if (kind == "alloc") p.kind = Fault::kAlloc;
            else if (kind == "launch") p.kind = Fault::kLaunch;
            else if (kind == "copy") p.kind = Fault::kCopy;
            if (p.kind == Fault::kCount || n == 0 || !end || *end)
                die(std::string("TERSE_FAKE_GPU_FAULT=") + f +
                    ": expected alloc:N, launch:N or copy:N with N >= 1");
            p.at = n;
        }
        if (const char* k = std::getenv("TERSE_FAKE_GPU_KILL_RANK"); k && *k) {
            int rank = -1, step = -1, used = 0;
            char phase[64] = {0};
            if (std::sscanf(k, "%d@%d:%63[a-z_]%n", &rank, &step, phase, &used) != 3 ||
                k[used] != 0 || rank < 0 || step < 0)
                die(std::string("TERSE_FAKE_GPU_KILL_RANK=") + k +
                    ": expected RANK@STEP:PHASE, such as 1@2:checkpoint");
            p.kill_device = rank;
            p.kill_range = "step " + std::to_string(step) + " " + phase;
        }
        if (const char* o = std::getenv("TERSE_FAKE_GPU_COUNTS_OUT")) p.counts_out = o;
        return q;
    }();
    return *p;
}

std::atomic<uint64_t> seen[(size_t)Fault::kCount];
std::atomic<int> sticky{0};
std::atomic<int> device{-1};
std::atomic<bool> armed{false};

// The counts at exit, for a campaign's choice of N.
struct CountsAtExit {
    ~CountsAtExit() {
        const std::string& out = plan().counts_out;
        if (out.empty()) return;
        FILE* f = std::fopen(out.c_str(), "w");
        if (!f) return;
        std::fprintf(f, "alloc %llu\nlaunch %llu\ncopy %llu\n",
                     (unsigned long long)seen[(size_t)Fault::kAlloc].load(),
                     (unsigned long long)seen[(size_t)Fault::kLaunch].load(),
                     (unsigned long long)seen[(size_t)Fault::kCopy].load());
        std::fclose(f);
    }
} counts_at_exit;
}  // namespace

int fault(Fault kind) {
    uint64_t n = seen[(size_t)kind].fetch_add(1) + 1;
    const Plan& p = plan();
    if (p.kind != kind || n != p.at) return CUDA_SUCCESS;
    switch (kind) {
    case Fault::kAlloc: return CUDA_ERROR_OUT_OF_MEMORY;
    case Fault::kLaunch: sticky.store(CUDA_ERROR_LAUNCH_FAILED); return CUDA_ERROR_LAUNCH_FAILED;
    case Fault::kCopy: return CUDA_ERROR_UNKNOWN;
    default: return CUDA_SUCCESS;
    }
}

int sticky_error() {
    if (armed.load(std::memory_order_relaxed)) {
        // The rank dies where it stands: no exit handlers, no flushed buffers, as in a crash.
        raise(SIGKILL);
    }
    return sticky.load(std::memory_order_relaxed);
}

void set_device(int ordinal) { device.store(ordinal); }

void range_pushed(const char* name) {
    const Plan& p = plan();
    if (p.kill_device >= 0 && p.kill_device == device.load() && p.kill_range == name)
        armed.store(true);
}
}  // namespace fake_gpu

extern "C" {
// The names and descriptions of the errors the emulation returns (cudarc prints both).
CUresult cuGetErrorName(CUresult e, const char** s) {
    switch (e) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "CUDA_ERROR_LAUNCH_FAILED"; break;
    default: *s = "CUDA_ERROR_UNKNOWN";
    }
    return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult e, const char** s) {
    switch (e) {
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *s = "unspecified launch failure"; break;
    case CUDA_ERROR_UNKNOWN: *s = "unknown error"; break;
    default: cuGetErrorName(e, s);
    }
    return CUDA_SUCCESS;
}
}  // extern "C"
