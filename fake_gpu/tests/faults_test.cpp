// The injected faults' own checks (`cargo xtask fake-gpu --self-test`, fake_gpu/faults.cpp): each
// in a child process that sets its switch before its first call, as a run's environment would.
// The Nth allocation fails out of memory and the next succeeds; the Nth launch fails and every
// later call fails with it (sticky); the Nth copy fails and the next succeeds; a rank marked to
// die is killed (SIGKILL) at its first driver call inside the NVTX range named, not before; and
// the counts a campaign reads are written at exit.
#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

extern "C" int nvtxRangePushA(const char* message);
extern "C" int nvtxRangePop();

static int failures = 0;
#define CHECK(c)                                                      \
    do {                                                              \
        if (!(c)) {                                                   \
            std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);  \
            failures++;                                               \
        }                                                             \
    } while (0)

// Runs `f` in a child with `key`=`value` set; returns its wait status. `f` returns the child's
// exit code (0: its checks held).
static int in_child(const char* key, const char* value, const std::function<int()>& f) {
    pid_t pid = fork();
    if (pid == 0) {
        setenv(key, value, 1);
        std::_Exit(f());
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

static CUresult start() {
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 1) || cuDevicePrimaryCtxRetain(&c, d)) return CUDA_ERROR_UNKNOWN;
    return cuCtxSetCurrent(c);
}

int main() {
    // The second allocation is out of memory; the context still works.
    CHECK(exited_ok(in_child("TERSE_FAKE_GPU_FAULT", "alloc:2", [] {
        CUdeviceptr a, b, c;
        if (start()) return 1;
        if (cuMemAlloc(&a, 64) != CUDA_SUCCESS) return 2;
        if (cuMemAlloc(&b, 64) != CUDA_ERROR_OUT_OF_MEMORY) return 3;
        if (cuMemAlloc(&c, 64) != CUDA_SUCCESS) return 4;
        return cuMemFree(a) == CUDA_SUCCESS ? 0 : 5;
    })));
    // The first launch fails (before it touches its function), and so does everything after.
    CHECK(exited_ok(in_child("TERSE_FAKE_GPU_FAULT", "launch:1", [] {
        CUdeviceptr a;
        if (start()) return 1;
        if (cuMemAlloc(&a, 64) != CUDA_SUCCESS) return 2;
        CUfunction none = nullptr;
        if (cuLaunchKernel(none, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) !=
            CUDA_ERROR_LAUNCH_FAILED)
            return 3;
        if (cuMemAlloc(&a, 64) != CUDA_ERROR_LAUNCH_FAILED) return 4;
        if (cuCtxSynchronize() != CUDA_ERROR_LAUNCH_FAILED) return 5;
        const char* name = nullptr;
        cuGetErrorName(CUDA_ERROR_LAUNCH_FAILED, &name);
        return std::strcmp(name, "CUDA_ERROR_LAUNCH_FAILED") == 0 ? 0 : 6;
    })));
    // The second copy fails and copies nothing; the third works.
    CHECK(exited_ok(in_child("TERSE_FAKE_GPU_FAULT", "copy:2", [] {
        CUdeviceptr a;
        float x = 1.5f, y = 0;
        if (start() || cuMemAlloc(&a, 4)) return 1;
        if (cuMemcpyHtoD(a, &x, 4) != CUDA_SUCCESS) return 2;
        if (cuMemcpyDtoH(&y, a, 4) != CUDA_ERROR_UNKNOWN || y != 0) return 3;
        if (cuMemcpyDtoH(&y, a, 4) != CUDA_SUCCESS || y != 1.5f) return 4;
        return 0;
    })));
    // Rank (device) 1 dies at its first call inside "step 2 checkpoint", not inside another range.
    int killed = in_child("TERSE_FAKE_GPU_KILL_RANK", "1@2:checkpoint", [] {
        CUdeviceptr a;
        if (start()) return 1;
        nvtxRangePushA("step 1 checkpoint");
        if (cuMemAlloc(&a, 64)) return 2;
        nvtxRangePop();
        nvtxRangePushA("step 2 checkpoint");
        cuMemAlloc(&a, 64);
        return 3;  // not reached
    });
    CHECK(WIFSIGNALED(killed) && WTERMSIG(killed) == SIGKILL);
    // A malformed switch ends the process with one line (exit 86).
    int bad = in_child("TERSE_FAKE_GPU_FAULT", "alloc:x", [] {
        CUdeviceptr a;
        if (start()) return 1;
        cuMemAlloc(&a, 64);
        return 0;
    });
    CHECK(WIFEXITED(bad) && WEXITSTATUS(bad) == 86);
    // The counts at exit.
    char path[] = "/tmp/terse-fake-gpu-countsXXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK(exited_ok(in_child("TERSE_FAKE_GPU_COUNTS_OUT", path, [] {
        CUdeviceptr a;
        float x = 0;
        if (start() || cuMemAlloc(&a, 4) || cuMemAlloc(&a, 4)) return 1;
        cuMemcpyHtoD(a, &x, 4);
        std::exit(0);  // the writer runs at exit
    })));
    FILE* f = std::fopen(path, "r");
    char text[128] = {0};
    if (f) {
        size_t n = std::fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        std::fclose(f);
    }
    std::remove(path);
    CHECK(std::string(text) == "alloc 2\nlaunch 0\ncopy 1\n");
    if (failures) return 1;
    std::printf("faults_test: every injected fault as documented\n");
    return 0;
}
