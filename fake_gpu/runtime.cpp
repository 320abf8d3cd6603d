// The CUDA runtime API of the emulated device (libcudart.so.13): what the `cuda` binary
// references, which is candle-kernels' statically linked kernels (registered from static
// initialisers at start-up, so registration must work) and the runtime calls around them.
// Memory and streams are the driver's (fake_gpu.h); launching a statically linked kernel ends
// the run naming it: those kernels (quantized matmuls, MoE) have no CPU build, and terse does
// not call them. The calls that do work count and time themselves (fake_gpu.h, ApiScope); the
// runtime has no copies.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "fake_gpu.h"

using namespace fake_gpu;

namespace {
struct Registered {
    std::string name;  // the kernel's device name
};
std::mutex mu;
std::map<const void*, Registered>& functions() {
    static auto* m = new std::map<const void*, Registered>;
    return *m;
}
thread_local cudaError_t last_error = cudaSuccess;

// The launch configuration pushed by `<<<...>>>` until the stub pops it.
struct CallConfig {
    dim3 grid, block;
    size_t shared = 0;
    void* stream = nullptr;
};
thread_local CallConfig pushed;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}
}  // namespace

extern "C" {

void** __cudaRegisterFatBinary(void* fat_cubin) {
    return static_cast<void**>(fat_cubin);
}
void __cudaRegisterFatBinaryEnd(void**) {}
void __cudaUnregisterFatBinary(void**) {}

void __cudaRegisterFunction(void**, const char* host_fun, char*, const char* device_name, int,
                            uint3*, uint3*, dim3*, dim3*, int*) {
    std::lock_guard<std::mutex> g(mu);
    functions()[host_fun] = Registered{device_name};
}

void __cudaRegisterVar(void**, char*, char*, const char*, int, size_t, int, int) {
    // Device variables of the statically linked kernels: nothing to do until one launches.
}

cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* entry) {
    std::lock_guard<std::mutex> g(mu);
    if (!functions().count(entry)) return cudaErrorInvalidDeviceFunction;
    *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(entry));
    return cudaSuccess;
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, void* stream) {
    pushed = CallConfig{grid, block, shared, stream};
    return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
    *grid = pushed.grid;
    *block = pushed.block;
    *shared = pushed.shared;
    *static_cast<void**>(stream) = pushed.stream;
    return cudaSuccess;
}

static cudaError_t launch_static(const void* kernel) {
    std::string name = "(unregistered)";
    {
        std::lock_guard<std::mutex> g(mu);
        auto it = functions().find(kernel);
        if (it != functions().end()) name = it->second.name;
    }
    die("kernel " + name +
        " is statically linked into the binary (candle-kernels' quantized/MoE kernels) and has "
        "no CPU build");
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3, dim3, void**, size_t, cudaStream_t) {
    return launch_static(kernel);
}
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3, dim3, void**, size_t, cudaStream_t) {
    return launch_static(kernel);
}

// ---- Devices
cudaError_t cudaGetDeviceCount(int* n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
    // The runtime's attribute numbers are the driver's.
    *v = device_attribute((int)a);
    return cudaSuccess;
}
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
    std::memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = 90;
    attr->binaryVersion = 90;
    attr->maxDynamicSharedSizeBytes = 49152;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, const void*, int block,
                                                                   size_t, unsigned) {
    *n = block > 0 ? (2048 / block > 0 ? 2048 / block : 1) : 0;
    return cudaSuccess;
}

// ---- Errors
cudaError_t cudaGetLastError() {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorUnknown"; }
const char* cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : "an error of the emulated device";
}

// ---- Memory and streams (the driver's)
cudaError_t cudaMalloc(void** p, size_t bytes) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    uint64_t d = alloc(bytes);
    if (!d) return fail(cudaErrorMemoryAllocation);
    count(kAllocs);
    *p = reinterpret_cast<void*>(d);
    return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    sync_all();
    if (p) {
        release(reinterpret_cast<uint64_t>(p), "cudaFree");
        count(kFrees);
    }
    return cudaSuccess;
}
cudaError_t cudaMallocAsync_ptsz(void** p, size_t bytes, cudaStream_t) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    if (p) {
        enqueue(s, [p] { release(reinterpret_cast<uint64_t>(p), "cudaFreeAsync"); });
        count(kFrees);
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync_ptsz(void* p, int v, size_t n, cudaStream_t s) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    if (n) check_range(reinterpret_cast<uint64_t>(p), n, "cudaMemsetAsync");
    enqueue(s, [p, v, n] { std::memset(p, v, n); });
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
    ApiScope scope(Api::Library);
    if (sticky_error()) return fail(cudaErrorLaunchFailure);  // faults.cpp
    count(kSyncs);
    sync_stream(s);
    pool_synchronised();
    return cudaSuccess;
}
}  // extern "C"
