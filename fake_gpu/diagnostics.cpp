// The emulated device's settings (read once from TERSE_FAKE_GPU_* variables), its one way to
// fail (a line on stderr naming what went wrong, then exit, as a sticky CUDA error would end
// the run on a real device), and its counters (fake_gpu.h, `Counter`): per process, what the
// binary asked of the device (launches, driver calls, synchronisations, allocations, bytes each
// way) and the wall time its threads spent inside the emulated libraries, so that `cargo xtask
// fake-gpu -- bench decode` reports a decode step's dispatch cost and host time without a GPU.
//
// Time inside: each thread's outermost API call (an ApiScope at depth 0) adds the time between
// its entry and its exit; the calls it makes (cuMemAllocAsync -> cuMemAlloc_v2, ncclBcast ->
// the collective) and the kernels or GEMMs that run inside it belong to that one interval, so
// nothing is counted twice. Calls on several threads at once add up (the sum can then exceed
// the wall time; a rollout calls the device from one thread). The same interval is also
// measured on the thread's CPU clock, kept per thread, so that a reader can take the thread's
// host work as its CPU time outside the libraries; each outermost call pays one reading of that
// clock (a system call, about 0.3 us) at each end, half of which lands outside.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "fake_gpu.h"

namespace fake_gpu {
void die(const std::string& what) {
    std::fprintf(stderr, "terse fake-gpu: %s\n", what.c_str());
    std::fflush(stderr);
    std::_Exit(86);
}

void unimplemented(const char* function) {
    die(std::string(function) + " is not emulated (the `cuda` binary called it; fake_gpu/ has no model of it)");
}

const Settings& settings() {
    static const Settings s = [] {
        Settings s;
        auto on = [](const char* k) {
            const char* v = std::getenv(k);
            return v && *v && std::strcmp(v, "0") != 0;
        };
        s.late = on("TERSE_FAKE_GPU_LATE");
        const char* fill = std::getenv("TERSE_FAKE_GPU_FILL");
        if (fill && std::strcmp(fill, "zero") == 0) s.zero_fill = true;
        else if (fill && *fill && std::strcmp(fill, "nan") != 0)
            die(std::string("TERSE_FAKE_GPU_FILL=") + fill + ": expected nan or zero");
        s.trace = on("TERSE_FAKE_GPU_TRACE");
        if (const char* k = std::getenv("TERSE_FAKE_GPU_KERNELS")) s.kernels = k;
        return s;
    }();
    return s;
}
}  // namespace fake_gpu

namespace fake_gpu {
namespace {
std::atomic<uint64_t> counters[kCounterCount];
thread_local int depth = 0;
thread_local uint64_t inside_cpu_ns = 0;
thread_local uint64_t outer_start_cpu_ns = 0;  // the current outermost call's entry
// The thread's last graph launch: its graph, and the thread's clocks at its entry.
thread_local const void* last_graph = nullptr;
thread_local uint64_t last_graph_cpu_ns = 0, last_graph_inside_ns = 0;

uint64_t now_ns() {
    using namespace std::chrono;
    return (uint64_t)duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count();
}

uint64_t thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}
}  // namespace

void count(Counter c, uint64_t n) { counters[c].fetch_add(n, std::memory_order_relaxed); }

ApiScope::ApiScope(Api api) : outer_(depth == 0), start_ns_(0), start_cpu_ns_(0) {
    depth++;
    if (outer_) {
        count(api == Api::Driver ? kDriverCalls : kLibraryCalls);
        start_cpu_ns_ = thread_cpu_ns();
        outer_start_cpu_ns = start_cpu_ns_;
        start_ns_ = now_ns();
    }
}

ApiScope::~ApiScope() {
    depth--;
    if (outer_) {
        count(kInsideNs, now_ns() - start_ns_);
        inside_cpu_ns += thread_cpu_ns() - start_cpu_ns_;
    }
}
}  // namespace fake_gpu

namespace fake_gpu {
void graph_step(const void* exec) {
    // Entry to entry: the CPU time between includes the previous launch call and every call
    // since, all of which `inside_cpu_ns` has added; this call's own has not started counting.
    uint64_t cpu = outer_start_cpu_ns, inside = inside_cpu_ns;
    if (exec == last_graph) {
        count(kGraphSteps);
        count(kGraphStepHostNs, (cpu - last_graph_cpu_ns) - (inside - last_graph_inside_ns));
    }
    last_graph = exec;
    last_graph_cpu_ns = cpu;
    last_graph_inside_ns = inside;
}

void graph_forget(const void* exec) {
    if (exec == last_graph) last_graph = nullptr;
}
}  // namespace fake_gpu

extern "C" size_t terse_fake_gpu_counters(uint64_t* out, size_t n) {
    using namespace fake_gpu;
    for (size_t i = 0; i < n && i < kCounterCount; i++)
        out[i] = counters[i].load(std::memory_order_relaxed);
    if (n > kThreadCpuNs) out[kThreadCpuNs] = thread_cpu_ns();
    if (n > kThreadInsideCpuNs) out[kThreadInsideCpuNs] = inside_cpu_ns;
    return kReadingCount;
}
