// The emulated libnvToolsExt.so.1 (NVTX): the two calls terse makes to mark its phases on a
// profiler's timeline (nvtxRangePushA, nvtxRangePop; crates/train/src/run/phase.rs). Each thread
// keeps its stack of ranges, as NVTX does; a push is reported to libcuda.so.1 (faults.cpp), where
// TERSE_FAKE_GPU_KILL_RANK=R@S:PHASE kills rank R inside the range "step S PHASE".
#include <string>
#include <vector>

#include "fake_gpu.h"

namespace {
thread_local std::vector<std::string> ranges;
}

extern "C" {
int nvtxRangePushA(const char* message) {
    ranges.emplace_back(message ? message : "");
    fake_gpu::range_pushed(ranges.back().c_str());
    return (int)ranges.size() - 1;
}

int nvtxRangePop() {
    if (ranges.empty()) return -2;  // NVTX's answer to a pop without a push
    ranges.pop_back();
    return (int)ranges.size();
}
}
