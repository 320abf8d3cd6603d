// terse's emulated CUDA device: the interface shared by the libraries of fake_gpu/ (the driver and
// runtime in libcuda.so.1 / libcudart.so.13, cuBLAS, cuRAND, NCCL) that turn the CPU into a CUDA
// device for the unchanged `cuda` binary (`cargo xtask fake-gpu`, docs/gpu.md).
//
// Device memory is host memory (memory.cpp): guard zones around each allocation, fresh blocks
// filled with all-ones bytes (NaN in f32, bf16 and f16), freed blocks poisoned and quarantined.
// Work on a stream runs in order (streams.cpp): at once by default, or, in the late mode, only at
// the next synchronisation point, so a host read that lacks its sync sees stale memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fake_gpu {

// Ends the process with one line on stderr: "terse fake-gpu: <what>".
[[noreturn]] void die(const std::string& what);
// For a symbol the emulation defines but does not implement: dies naming it.
[[noreturn]] void unimplemented(const char* function);
// Once per process: the settings read from the environment.
struct Settings {
    bool late = false;       // TERSE_FAKE_GPU_LATE=1: streams complete only at sync points
    bool zero_fill = false;  // TERSE_FAKE_GPU_FILL=zero: fresh allocations read as zeros
    bool trace = false;      // TERSE_FAKE_GPU_TRACE=1: one line per API call and launch on stderr
    std::string kernels;     // TERSE_FAKE_GPU_KERNELS: the directory of the kernels' CPU builds
};
const Settings& settings();

// The device's attribute `a` (a CUdevice_attribute; the runtime's numbers are the same).
int device_attribute(int a);

// ---- Device memory (memory.cpp)
// A device pointer is the host address of the block's first byte.
uint64_t alloc(size_t bytes);
// Frees `ptr` (which must be the start of a live block): poisons it and puts it in quarantine.
// Returns the block's size.
size_t release(uint64_t ptr, const char* function);
// Checks that [ptr, ptr + bytes) lies inside one live block; dies naming `function` otherwise.
void check_range(uint64_t ptr, size_t bytes, const char* function);
// True when `ptr` points into a live block (used to tell device pointers from host ones).
bool is_device(uint64_t ptr);
// Checks the guard zones of the live block holding `ptr` (after a launch that was given it).
void check_guards_of(uint64_t ptr, const char* when);
// Bytes in live blocks (cuMemGetInfo's "used").
size_t used_bytes();
// The device's default memory pool (cuMemAllocAsync's). A driver hands the memory freed into it
// back to the OS at the next synchronisation when the pool holds more than its release
// threshold (0 unless set), so the next allocations go to the OS again: `pool_freed` notes a
// cuMemFreeAsync's bytes, `pool_synchronised` (after every synchronisation) counts a hand-back
// in kPoolReleases when the held bytes pass the threshold. As on a GPU, cuMemGetInfo counts
// the held bytes as used; `pool_allocated` notes a cuMemAllocAsync's bytes, which reuse held
// ones first; cuMemPoolGetAttribute reports the pool's used and reserved (used + held) bytes.
void pool_allocated(size_t bytes);
void pool_freed(size_t bytes);
uint64_t pool_held();
uint64_t pool_used();
void pool_synchronised();
void set_pool_threshold(uint64_t bytes);
uint64_t pool_threshold();

// ---- Streams (streams.cpp). A null stream is the default stream.
using Stream = void*;
// Runs `work` on `stream`, in order with its earlier work: now, or at the next sync (late mode).
void enqueue(Stream stream, std::function<void()> work);
// Completes every piece of work queued on `stream` (and what it waits on).
void sync_stream(Stream stream);
// Completes every stream's work.
void sync_all();
// What a blocking copy waits for: the default stream and every stream not made non-blocking.
void sync_blocking();
// True when the stream had no pending work (its pending work is then completed).
bool query_stream(Stream stream);
Stream create_stream(bool non_blocking);
void destroy_stream(Stream stream);
// Events mark a point in a stream's work.
using Event = void*;
Event create_event();
void destroy_event(Event e);
void record_event(Event e, Stream stream);
// `stream`'s later work waits for the work before `e`.
void wait_event(Stream stream, Event e);
void sync_event(Event e);
bool query_event(Event e);
// Host milliseconds between the completions of two events' work (not a device time).
float elapsed_ms(Event start, Event end);

// ---- Stream capture and graphs (streams.cpp). A stream in capture records its work (kernels,
// GEMMs, copies, memsets) into a graph instead of running it; a graph launch runs the recorded
// work in order on a stream, reading the same addresses each time. What CUDA refuses during a
// capture is refused here (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture invalidated), so a
// binary that captures cleanly here makes no call a real capture would reject.
// The CUresult of cuStreamBeginCapture: `mode` is a CUstreamCaptureMode.
int begin_capture(Stream stream, int mode);
// The CUresult of cuStreamEndCapture; `*graph` the recorded graph (null on an error).
int end_capture(Stream stream, void** graph);
// A CUstreamCaptureStatus: 0 none, 1 active, 2 invalidated.
int capture_status(Stream stream);
// Whether `stream` records rather than runs (its capture active or invalidated).
bool capturing(Stream stream);
// For a call CUDA forbids on a capturing stream (a sync, a query, a copy to or from pageable
// memory): when `stream` captures, invalidates the capture and returns
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, naming `function` on stderr; else 0.
int refuse_on_capturing(Stream stream, const char* function);
// For a call CUDA forbids while a capture it could disturb is active (cuMemAlloc, cuMemFree,
// the synchronous copies and memsets, cuCtxSynchronize): a capture in the global mode on any
// thread, or in the thread-local mode on this thread. Same result as above.
int refuse_while_capturing(const char* function);
// cuMemAllocAsync on a capturing stream: the graph owns the block (its address is fixed for
// every launch) until the graph is destroyed.
void capture_alloc(Stream stream, uint64_t ptr);
// cuMemFreeAsync on a capturing stream: a block the capture allocated stays the graph's (the
// free is part of the graph; 0). A block from outside would be freed by every launch:
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture invalidated.
int capture_free(Stream stream, uint64_t ptr);
// cuGraphInstantiate: an executable graph sharing `graph`'s recorded work.
void* instantiate_graph(void* graph);
// cuGraphLaunch: the recorded work, in order, as one piece of `stream`'s work (a CUresult).
int launch_graph(void* exec, Stream stream);
// cuGraphDestroy and cuGraphExecDestroy: the graph's own blocks are released with the last.
void destroy_graph(void* graph);
void destroy_graph_exec(void* exec);

// ---- Counters (diagnostics.cpp): what the process asked of the device, per process, read through
// `terse_fake_gpu_counters` below in this order (`cargo xtask bench decode` divides them by
// the rollout's steps).
enum Counter : size_t {
    kLaunches = 0,     // kernel launches: cuLaunchKernel (not those a capture records)
    kGraphLaunches,    // cuGraphLaunch (the work it replays counts in no other counter)
    kDriverCalls,      // driver API calls the binary makes (not those the emulation makes itself)
    kSyncs,            // cuCtx/cuStream/cuEventSynchronize, cudaStreamSynchronize
    kAllocs,           // cuMemAlloc(Async), cuMemHostAlloc, cudaMalloc(Async): successful ones
    kH2DBytes,         // bytes copied host -> device (every cuMemcpyHtoD variant)
    kD2HBytes,         // bytes copied device -> host (every cuMemcpyDtoH variant)
    kInsideNs,         // ns between entering and leaving the outermost API call of a thread
    kLibraryCalls,     // cudart, cuBLAS, cuRAND calls and NCCL collectives the binary makes
    kLibraryLaunches,  // work that is a kernel on a GPU: GEMMs, cuRAND generations, collectives
    kFrees,            // cuMemFree(Async), cuMemFreeHost, cudaFree(Async)
    kAllocBytes,       // bytes of device memory allocated (memory.cpp's alloc: cuMemAlloc, cudaMalloc)
    kPoolReleases,     // synchronisations that hand the default pool's freed memory back (memory.cpp)
    kGraphSteps,       // graph launches that follow a launch of the same graph on the same thread
    kGraphStepHostNs,  // ... and the thread's CPU time outside API calls since that launch
    kGraphKernels,     // kernels and library launches graph launches replay (a graph's nodes)
    kCounterCount
};
// After the counters, `terse_fake_gpu_counters` writes two clocks of the *calling* thread, so that
// host time resolves to microseconds whatever else runs on the machine: its CPU time now, and its
// CPU time spent inside outermost API calls so far. Their difference between two readings is the
// thread's own host work (not the time it was descheduled, nor the GEMM pool's threads).
enum Reading : size_t {
    kThreadCpuNs = kCounterCount,  // the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
    kThreadInsideCpuNs,            // ... of which inside its outermost API calls
    kReadingCount
};
void count(Counter c, uint64_t n = 1);
// A kernel or library launch on `stream`: counted in `c` when it runs now, or recorded as one
// of the capture's graph's kernels (kGraphKernels counts it at each graph launch).
void count_launch(Stream stream, Counter c);
// Called by cuGraphLaunch: when the calling thread's previous graph launch was of `exec` too,
// the host work between the two (the thread's CPU time outside API calls: one replayed step's
// own host cost, free of whatever ran once before the loop) counts in kGraphStepHostNs.
void graph_step(const void* exec);
// Called by cuGraphExecDestroy: a later graph at the same address starts afresh.
void graph_forget(const void* exec);
// Which API a call belongs to: a driver call counts in kDriverCalls, another in kLibraryCalls.
enum class Api { Driver, Library };
// Marks one API call for its lifetime: counted, and timed, when it is the thread's outermost
// (a call made inside another, such as cuMemAllocAsync's cuMemAlloc, is neither counted nor
// timed twice; kernels that run inside a call count as time inside).
class ApiScope {
   public:
    explicit ApiScope(Api api);
    ~ApiScope();
    ApiScope(const ApiScope&) = delete;
    ApiScope& operator=(const ApiScope&) = delete;

   private:
    bool outer_;
    uint64_t start_ns_;
    uint64_t start_cpu_ns_;
};

}  // namespace fake_gpu

// The counters in `Counter` order, then the calling thread's clocks (`Reading`): writes
// min(n, kReadingCount) values into `out` and returns kReadingCount (exported by libcuda.so.1;
// absent from a real driver).
// ---- Injected faults (faults.cpp): TERSE_FAKE_GPU_FAULT and TERSE_FAKE_GPU_KILL_RANK.
namespace fake_gpu {
enum class Fault : size_t { kAlloc = 0, kLaunch, kCopy, kCount };
// Counts one call of `kind`; the error it must return (a CUresult), CUDA_SUCCESS (0) for none.
int fault(Fault kind);
// The sticky error every later call returns after a failed launch (a CUresult; 0: none). A rank
// marked to die dies here, at its next call.
int sticky_error();
// The device the process made its context on (cuDevicePrimaryCtxRetain): a rank's ordinal.
void set_device(int ordinal);
// An NVTX range was pushed (nvtx.cpp): arms the kill of TERSE_FAKE_GPU_KILL_RANK on a match.
void range_pushed(const char* name);
}  // namespace fake_gpu

extern "C" size_t terse_fake_gpu_counters(uint64_t* out, size_t n);

// ---- Kernels' CPU builds (xtask/src/fake_gpu/kernels/ writes them; modules.cpp loads them).
// Each module's shared library (libterse_fake_<module>.so in TERSE_FAKE_GPU_KERNELS) exports
// `terse_fake_kernels`: every `extern "C" __global__` entry of its .cu source with a trampoline
// that unpacks cuLaunchKernel's kernelParams into the kernel's parameters.
extern "C" {
struct terse_fake_kernel {
    const char* name;
    void (*body)(void** params);
};
typedef const terse_fake_kernel* (*terse_fake_kernels_fn)(size_t* count);
// The SIMT runtime (fake_gpu/fibers/, in libcuda.so.1): runs `body` over grid x block CUDA threads
// (three-dimensional), with `shared_bytes` of dynamic shared memory; 0, or 1 with the error
// (naming the kernel, block, thread and line) in `err`.
int terse_fake_run(const char* name, const unsigned grid[3], const unsigned block[3],
                   unsigned shared_bytes, void (*body)(void**), void** params, char* err,
                   size_t err_len);
}
