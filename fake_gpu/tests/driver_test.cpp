// The emulated driver's own checks (`cargo xtask fake-gpu --self-test`): fresh memory reads as
// NaN, a copy past a block's end and a use after free end the process naming them, and in the
// late mode a device-to-host copy into pinned memory is stale until the stream is synchronised
// (the same copy into pageable memory completes before it returns, as CUDA documents).
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

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

int main() {
    setenv("TERSE_FAKE_GPU_LATE", "1", 1);  // read once, at the first call
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
