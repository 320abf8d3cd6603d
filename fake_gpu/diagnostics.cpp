// The emulated device's settings (read once from TERSE_FAKE_GPU_* variables) and its one way to
// fail: a line on stderr naming what went wrong, then exit, as a sticky CUDA error would end
// the run on a real device.
#include <cstdio>
#include <cstdlib>
#include <cstring>

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
