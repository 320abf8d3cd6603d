// The CUDA driver API of the emulated device (libcuda.so.1): one device, "an H200" in its
// attributes (device_attributes.h), whose memory (memory.cpp), streams and events (streams.cpp)
// and modules (modules.cpp) live on the host. What the `cuda` binary calls and the emulation
// does not model ends the run naming the function (driver_rest.cpp), never a silent success.
// Each entry point counts itself (ENTER) and what it does (launches, syncs, allocations, bytes
// each way: fake_gpu.h's `Counter`, read through terse_fake_gpu_counters).
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <map>
#include <string>

#include "device_attributes.h"
#include "fake_gpu.h"
#include "modules.h"

using namespace fake_gpu;

namespace {
// The one context's handle: a distinct address nobody dereferences.
int context_tag;
CUcontext const kContext = reinterpret_cast<CUcontext>(&context_tag);
int pool_tag;
CUmemoryPool const kPool = reinterpret_cast<CUmemoryPool>(&pool_tag);
thread_local CUcontext current = nullptr;
bool initialised = false;

// Pinned host allocations (cuMemHostAlloc): copies from and to them stay asynchronous.
std::mutex pinned_mu;
// Pinned blocks: start -> size.
std::map<uint64_t, size_t>& pinned() {
    static auto* s = new std::map<uint64_t, size_t>;
    return *s;
}
bool is_pinned(const void* p) {
    std::lock_guard<std::mutex> g(pinned_mu);
    auto& s = pinned();
    auto a = reinterpret_cast<uint64_t>(p);
    auto it = s.upper_bound(a);
    if (it == s.begin()) return false;
    --it;
    return a < it->first + it->second;
}

CUresult trace(const char* f) {
    if (settings().trace) std::fprintf(stderr, "terse fake-gpu: %s\n", f);
    return CUDA_SUCCESS;
}

// Every driver entry point: counted and timed (fake_gpu.h, ApiScope), traced, refused before
// cuInit, and after a sticky fault (faults.cpp).
#define ENTER(name)                                 \
    ApiScope api_scope_(Api::Driver);               \
    trace(name);                                    \
    if (!initialised) return CUDA_ERROR_NOT_INITIALIZED; \
    if (int sticky_ = sticky_error()) return (CUresult)sticky_

// A call CUDA refuses during a capture it could disturb (fake_gpu.h, refuse_while_capturing).
#define REFUSE_WHILE_CAPTURING(name) \
    if (int c_ = refuse_while_capturing(name)) return (CUresult)c_
// A call CUDA refuses on a capturing stream (fake_gpu.h, refuse_on_capturing).
#define REFUSE_ON_CAPTURING(s, name) \
    if (int c_ = refuse_on_capturing(s, name)) return (CUresult)c_

size_t total_memory() {
    const char* g = std::getenv("TERSE_FAKE_GPU_MEM_GIB");
    double gib = g ? std::atof(g) : 16.0;
    return (size_t)(gib * 1073741824.0);
}

// The allocation itself, for cuMemAlloc_v2 and cuMemAllocAsync.
CUresult allocate(CUdeviceptr* p, size_t bytes) {
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult f = (CUresult)fault(Fault::kAlloc)) return f;
    if (used_bytes() + bytes > total_memory()) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = alloc(bytes);
    if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
    count(kAllocs);
    return CUDA_SUCCESS;
}
CUresult copy_check(CUdeviceptr p, size_t n, const char* f) {
    if (n) check_range(p, n, f);
    return CUDA_SUCCESS;
}
}  // namespace

namespace fake_gpu {
int device_attribute(int a) { return attribute(static_cast<CUdevice_attribute>(a)); }
}  // namespace fake_gpu

extern "C" {

CUresult cuInit(unsigned int flags) {
    ApiScope api_scope_(Api::Driver);
    trace("cuInit");
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    initialised = true;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
    ApiScope api_scope_(Api::Driver);
    trace("cuDriverGetVersion");
    *v = 13000;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
    ENTER("cuDeviceGetCount");
    const char* c = std::getenv("TERSE_FAKE_GPU_DEVICES");
    *n = c ? std::atoi(c) : 8;  // an 8-GPU node: rank r of `--nproc` uses cuda:r
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
    ENTER("cuDeviceGet");
    int n;
    cuDeviceGetCount(&n);
    if (ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    ENTER("cuDeviceGetName");
    std::snprintf(name, (size_t)len, "terse fake-gpu (emulated H200 on the CPU)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* u, CUdevice d) {
    ENTER("cuDeviceGetUuid_v2");
    std::memset(u->bytes, 0, sizeof u->bytes);
    u->bytes[0] = 0x7e;
    u->bytes[15] = (char)d;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
    ENTER("cuDeviceGetAttribute");
    *v = attribute(a);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    ENTER("cuDeviceTotalMem_v2");
    *bytes = total_memory();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    ENTER("cuDevicePrimaryCtxRetain");
    set_device(d);
    *c = kContext;
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) {
    ENTER("cuDevicePrimaryCtxRelease_v2");
    sync_all();
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext c) {
    ENTER("cuCtxSetCurrent");
    if (c && c != kContext) return CUDA_ERROR_INVALID_CONTEXT;
    current = c;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
    ENTER("cuCtxGetCurrent");
    *c = current;
    return CUDA_SUCCESS;
}
CUresult cuCtxDestroy_v2(CUcontext c) {
    ENTER("cuCtxDestroy_v2");
    if (c != kContext) return CUDA_ERROR_INVALID_CONTEXT;
    sync_all();
    return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
    ENTER("cuCtxGetDevice");
    *d = 0;
    return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize() {
    ENTER("cuCtxSynchronize");
    REFUSE_WHILE_CAPTURING("cuCtxSynchronize");
    count(kSyncs);
    sync_all();
    pool_synchronised();
    return CUDA_SUCCESS;
}
CUresult cuCtxSetFlags(unsigned int) {
    ENTER("cuCtxSetFlags");
    return CUDA_SUCCESS;
}
CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
    ENTER("cuCtxGetStreamPriorityRange");
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

// ---- Memory
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    ENTER("cuMemAlloc_v2");
    REFUSE_WHILE_CAPTURING("cuMemAlloc_v2");
    return allocate(p, bytes);
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream s) {
    ENTER("cuMemAllocAsync");
    CUresult r = allocate(p, bytes);
    if (r == CUDA_SUCCESS) {
        capture_alloc(s, *p);  // inside a capture: the graph's block
        pool_allocated(bytes);
    }
    return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    ENTER("cuMemFree_v2");
    REFUSE_WHILE_CAPTURING("cuMemFree_v2");
    sync_all();  // cuMemFree waits for the device's work
    if (p) {
        release(p, "cuMemFree_v2");
        count(kFrees);
    }
    return CUDA_SUCCESS;
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    ENTER("cuMemFreeAsync");
    if (p && capturing(s)) {
        // The capture's own block stays the graph's; one from outside is refused.
        if (int c = capture_free(s, p)) return (CUresult)c;
        count(kFrees);
        return CUDA_SUCCESS;
    }
    if (p) {
        enqueue(s, [p] { pool_freed(release(p, "cuMemFreeAsync")); });
        count(kFrees);
    }
    return CUDA_SUCCESS;
}
// The default memory pool (kPool): one per device; its release threshold is the one attribute
// kept.
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice) {
    ENTER("cuDeviceGetDefaultMemPool");
    *pool = kPool;
    return CUDA_SUCCESS;
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void* v) {
    ENTER("cuMemPoolSetAttribute");
    if (pool != kPool || !v) return CUDA_ERROR_INVALID_VALUE;
    if (a != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return CUDA_ERROR_NOT_SUPPORTED;
    set_pool_threshold(*static_cast<const cuuint64_t*>(v));
    return CUDA_SUCCESS;
}
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void* v) {
    ENTER("cuMemPoolGetAttribute");
    if (pool != kPool || !v) return CUDA_ERROR_INVALID_VALUE;
    auto* out = static_cast<cuuint64_t*>(v);
    switch (a) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *out = pool_threshold(); break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *out = pool_used(); break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *out = pool_used() + pool_held(); break;
        default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}
// As a GPU reports it: the memory the default pool holds for this process counts as used.
CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total) {
    ENTER("cuMemGetInfo_v2");
    size_t t = total_memory(), u = used_bytes() + pool_held();
    *total = t;
    *free_bytes = u < t ? t - u : 0;
    return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned int) {
    ENTER("cuMemHostAlloc");
    *p = std::malloc(bytes ? bytes : 1);
    std::lock_guard<std::mutex> g(pinned_mu);
    pinned()[reinterpret_cast<uint64_t>(*p)] = bytes ? bytes : 1;
    count(kAllocs);
    return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void* p) {
    ENTER("cuMemFreeHost");
    sync_all();
    {
        std::lock_guard<std::mutex> g(pinned_mu);
        pinned().erase(reinterpret_cast<uint64_t>(p));
    }
    if (p) count(kFrees);
    std::free(p);
    return CUDA_SUCCESS;
}

// Copies. Device-to-host into pageable memory returns once the copy is done, and host-to-device
// from pageable memory reads the source before returning (the CUDA runtime's documented
// behaviour); pinned memory stays asynchronous, so a missing sync reads stale data.
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
    ENTER("cuMemcpyHtoDAsync_v2");
    // A graph reads pinned memory when it runs; pageable memory cannot be captured.
    if (!is_pinned(src)) REFUSE_ON_CAPTURING(s, "cuMemcpyHtoDAsync_v2 from pageable memory");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    copy_check(dst, n, "cuMemcpyHtoDAsync_v2");
    count(kH2DBytes, n);
    if (is_pinned(src)) {
        enqueue(s, [dst, src, n] { std::memcpy(reinterpret_cast<void*>(dst), src, n); });
    } else {
        std::string staged(static_cast<const char*>(src), n);
        enqueue(s, [dst, staged] { std::memcpy(reinterpret_cast<void*>(dst), staged.data(), staged.size()); });
    }
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER("cuMemcpyDtoHAsync_v2");
    if (!is_pinned(dst)) REFUSE_ON_CAPTURING(s, "cuMemcpyDtoHAsync_v2 to pageable memory");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    copy_check(src, n, "cuMemcpyDtoHAsync_v2");
    count(kD2HBytes, n);
    enqueue(s, [dst, src, n] { std::memcpy(dst, reinterpret_cast<const void*>(src), n); });
    if (!is_pinned(dst)) sync_stream(s);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    ENTER("cuMemcpyDtoDAsync_v2");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    copy_check(dst, n, "cuMemcpyDtoDAsync_v2 (destination)");
    copy_check(src, n, "cuMemcpyDtoDAsync_v2 (source)");
    enqueue(s, [dst, src, n] {
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    });
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    ENTER("cuMemcpyHtoD_v2");
    REFUSE_WHILE_CAPTURING("cuMemcpyHtoD_v2");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    sync_blocking();
    copy_check(dst, n, "cuMemcpyHtoD_v2");
    count(kH2DBytes, n);
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    ENTER("cuMemcpyDtoH_v2");
    REFUSE_WHILE_CAPTURING("cuMemcpyDtoH_v2");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    sync_blocking();
    copy_check(src, n, "cuMemcpyDtoH_v2");
    count(kD2HBytes, n);
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER("cuMemcpyDtoD_v2");
    REFUSE_WHILE_CAPTURING("cuMemcpyDtoD_v2");
    if (CUresult f = (CUresult)fault(Fault::kCopy)) return f;
    sync_blocking();
    copy_check(dst, n, "cuMemcpyDtoD_v2 (destination)");
    copy_check(src, n, "cuMemcpyDtoD_v2 (source)");
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
}
// One device: a peer copy is a device-to-device copy.
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t n,
                           CUstream s) {
    ENTER("cuMemcpyPeerAsync");
    return cuMemcpyDtoDAsync_v2(dst, src, n, s);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
    ENTER("cuMemsetD8Async");
    copy_check(dst, n, "cuMemsetD8Async");
    enqueue(s, [dst, v, n] { std::memset(reinterpret_cast<void*>(dst), v, n); });
    return CUDA_SUCCESS;
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    ENTER("cuMemsetD8_v2");
    REFUSE_WHILE_CAPTURING("cuMemsetD8_v2");
    sync_blocking();
    copy_check(dst, n, "cuMemsetD8_v2");
    std::memset(reinterpret_cast<void*>(dst), v, n);
    return CUDA_SUCCESS;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
    ENTER("cuMemsetD32Async");
    copy_check(dst, n * 4, "cuMemsetD32Async");
    enqueue(s, [dst, v, n] {
        auto* p = reinterpret_cast<unsigned*>(dst);
        for (size_t i = 0; i < n; i++) p[i] = v;
    });
    return CUDA_SUCCESS;
}

// ---- Streams and events
CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
    ENTER("cuStreamCreate");
    *s = static_cast<CUstream>(create_stream(flags & CU_STREAM_NON_BLOCKING));
    return CUDA_SUCCESS;
}
CUresult cuStreamCreateWithPriority(CUstream* s, unsigned int flags, int) {
    ENTER("cuStreamCreateWithPriority");
    return cuStreamCreate(s, flags);
}
CUresult cuStreamDestroy_v2(CUstream s) {
    ENTER("cuStreamDestroy_v2");
    destroy_stream(s);
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream s) {
    ENTER("cuStreamSynchronize");
    REFUSE_ON_CAPTURING(s, "cuStreamSynchronize");
    count(kSyncs);
    sync_stream(s);
    pool_synchronised();
    return CUDA_SUCCESS;
}
CUresult cuStreamQuery(CUstream s) {
    ENTER("cuStreamQuery");
    REFUSE_ON_CAPTURING(s, "cuStreamQuery");
    return query_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int) {
    ENTER("cuStreamWaitEvent");
    wait_event(s, e);
    return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* e, unsigned int) {
    ENTER("cuEventCreate");
    *e = static_cast<CUevent>(create_event());
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent e) {
    ENTER("cuEventDestroy_v2");
    destroy_event(e);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
    ENTER("cuEventRecord");
    record_event(e, s);
    return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent e) {
    ENTER("cuEventSynchronize");
    count(kSyncs);
    sync_event(e);
    pool_synchronised();
    return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e) {
    ENTER("cuEventQuery");
    return query_event(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
    ENTER("cuEventElapsedTime_v2");
    *ms = elapsed_ms(a, b);
    return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
    ENTER("cuStreamIsCapturing");
    *status = (CUstreamCaptureStatus)capture_status(s);
    return CUDA_SUCCESS;
}

// ---- Stream capture and graphs (streams.cpp records and replays)
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    ENTER("cuStreamBeginCapture_v2");
    return (CUresult)begin_capture(s, mode);
}
CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
    ENTER("cuStreamEndCapture");
    void* g = nullptr;
    auto r = (CUresult)end_capture(s, &g);
    *graph = static_cast<CUgraph>(g);
    return r;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
    ENTER("cuGraphInstantiateWithFlags");
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    // Auto-free-on-launch and the others change what a launch does with the graph's blocks.
    if (flags) unimplemented("cuGraphInstantiateWithFlags with flags");
    *exec = static_cast<CUgraphExec>(instantiate_graph(graph));
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    ENTER("cuGraphLaunch");
    if (!exec) return CUDA_ERROR_INVALID_VALUE;
    graph_step(exec);
    CUresult r = (CUresult)launch_graph(exec, s);
    if (r == CUDA_SUCCESS) count(kGraphLaunches);
    return r;
}
CUresult cuGraphUpload(CUgraphExec exec, CUstream) {
    ENTER("cuGraphUpload");
    return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuGraphExecDestroy(CUgraphExec exec) {
    ENTER("cuGraphExecDestroy");
    graph_forget(exec);
    if (exec) destroy_graph_exec(exec);
    return CUDA_SUCCESS;
}
CUresult cuGraphDestroy(CUgraph graph) {
    ENTER("cuGraphDestroy");
    if (graph) destroy_graph(graph);
    return CUDA_SUCCESS;
}
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
    ENTER("cuLaunchHostFunc");
    enqueue(s, [fn, data] { fn(data); });
    return CUDA_SUCCESS;
}

// ---- Modules and launches
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
    ENTER("cuModuleLoadData");
    *m = reinterpret_cast<CUmodule>(load_module(image));
    return CUDA_SUCCESS;
}
CUresult cuModuleLoad(CUmodule* m, const char* path) {
    ENTER("cuModuleLoad");
    FILE* f = std::fopen(path, "rb");
    if (!f) return CUDA_ERROR_FILE_NOT_FOUND;
    std::string text;
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
    *m = reinterpret_cast<CUmodule>(load_module(text.c_str()));
    return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) {
    ENTER("cuModuleUnload");
    return CUDA_SUCCESS;  // kept: a queued launch may still name its functions
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    ENTER("cuModuleGetFunction");
    auto* mod = reinterpret_cast<Module*>(m);
    auto it = mod->functions.find(name);
    if (it == mod->functions.end()) return CUDA_ERROR_NOT_FOUND;
    *f = reinterpret_cast<CUfunction>(&it->second);
    return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
    ENTER("cuFuncSetAttribute");
    auto* fn = reinterpret_cast<Function*>(f);
    if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        if (v < 0 || v > attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
            return CUDA_ERROR_INVALID_VALUE;
        fn->max_dynamic_shared = (unsigned)v;
    }
    return CUDA_SUCCESS;
}
CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
    ENTER("cuFuncGetAttribute");
    auto* fn = reinterpret_cast<Function*>(f);
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = (int)fn->max_dynamic_shared; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) {
    ENTER("cuFuncSetCacheConfig");
    return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream s, void** params,
                        void** extra) {
    ENTER("cuLaunchKernel");
    if (extra) unimplemented("cuLaunchKernel with `extra` parameters");
    if (!gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned long long)bx * by * bz > 1024 || bz > 64) return CUDA_ERROR_INVALID_VALUE;
    if (gy > 65535 || gz > 65535) return CUDA_ERROR_INVALID_VALUE;
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    if (CUresult f = (CUresult)fault(Fault::kLaunch)) return f;
    count_launch(s, kLaunches);  // a recorded one runs, and counts, as its graph
    launch(reinterpret_cast<Function*>(f), grid, block, shared, s, params);
    return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction, int block, size_t) {
    ENTER("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    *n = block > 0 ? std::max(1, 2048 / block) : 0;
    return CUDA_SUCCESS;
}

// cuGetErrorName and cuGetErrorString are in faults.cpp, beside the faults that return them.
}  // extern "C"
