// The entry point of the SIMT runtime of terse's emulated CUDA device (fake_gpu/fibers/, linked
// into libcuda.so.1): cuLaunchKernel (modules.cpp) calls terse_fake_run with a kernel's
// trampoline from its module's CPU build (libterse_fake_<module>.so, written by
// xtask/src/fake_gpu/kernels/), and the kernel code calls back into what the SIMT shim's header
// declares (kernels/shim/cuda_shim.h: the indices, the barriers, the warp exchange, fail) plus
// the dynamic shared memory (fake_gpu/include). terse_fake_run checks the launch's geometry, lays
// out the block's fibers and warps, runs the blocks one after another (scheduler.cpp) and
// reports the first error, which names the kernel, the block and the thread (record). The model
// is described in fibers.h.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "fibers.h"

using namespace terse_fibers;

namespace terse_shim {
dim3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
}  // namespace terse_shim

namespace {
std::mutex mu;
}  // namespace

Run terse_fibers::R;
Stacks terse_fibers::stacks;

namespace {
std::string thread_name(const Fiber& f) {
    if (terse_shim::block_dim.y == 1 && terse_shim::block_dim.z == 1) return std::to_string(f.tid);
    return "(" + std::to_string(f.idx.x) + "," + std::to_string(f.idx.y) + "," +
           std::to_string(f.idx.z) + ")";
}
}  // namespace

void terse_fibers::record(const Fiber* f, const std::string& what) {
    if (R.failed) return;
    R.failed = true;
    const dim3& b = terse_shim::block_idx;
    R.error = std::string("kernel ") + R.kernel + " block (" + std::to_string(b.x) + "," +
              std::to_string(b.y) + "," + std::to_string(b.z) + ")" +
              (f ? " thread " + thread_name(*f) : std::string()) + ": " + what;
}

extern "C" int terse_fake_run(const char* name, const unsigned grid[3], const unsigned block[3],
                              unsigned shared_bytes, void (*body)(void**), void** params, char* err,
                              size_t err_len) {
    std::lock_guard<std::mutex> one_at_a_time(mu);
    auto refuse = [&](const std::string& why) {
        std::snprintf(err, err_len, "kernel %s: %s", name, why.c_str());
        return 1;
    };
    unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    if (block[0] == 0 || block[1] == 0 || block[2] == 0 || threads > 1024 || block[0] > 1024 ||
        block[1] > 1024 || block[2] > 64)
        return refuse("a block of " + std::to_string(block[0]) + "x" + std::to_string(block[1]) +
                      "x" + std::to_string(block[2]) +
                      " threads (1 to 1024 in all, at most 1024 x 1024 x 64)");
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || grid[0] > 0x7fffffffu ||
        grid[1] > 65535 || grid[2] > 65535)
        return refuse("a grid of " + std::to_string(grid[0]) + "x" + std::to_string(grid[1]) +
                      "x" + std::to_string(grid[2]) +
                      " blocks (1 to 2^31 - 1 x 65535 x 65535)");

    R.kernel = name;
    R.body = body;
    R.params = params;
    R.n = (unsigned)threads;
    R.failed = false;
    R.error.clear();
    R.fibers.assign(R.n, Fiber{});
    dim3 idx{0, 0, 0};
    for (unsigned t = 0; t < R.n; t++) {
        Fiber& f = R.fibers[t];
        f.tid = t;
        f.idx = idx;
        if (++idx.x == block[0]) {
            idx.x = 0;
            if (++idx.y == block[1]) {
                idx.y = 0;
                idx.z++;
            }
        }
    }
    R.warps.assign((R.n + 31) / 32, Warp{});
    for (size_t w = 0; w < R.warps.size(); w++)
        R.warps[w].size = std::min(32u, R.n - 32 * (unsigned)w);
    for (Fiber& f : R.fibers) f.warp = &R.warps[f.tid / 32];
    R.fp_control = fp_control();
    unsigned ring = 1;
    while (ring < R.n) ring *= 2;
    R.ready.assign(ring, nullptr);
    R.mask = ring - 1;
    // Dynamic shared memory: uninitialised on the device, NaN-filled here.
    R.shared.assign((size_t)shared_bytes + 256, 0xff);
    R.shared_base =
        reinterpret_cast<unsigned char*>(((uintptr_t)R.shared.data() + 127) & ~(uintptr_t)127);
    R.shared_bytes = shared_bytes;
    // Gather's slots (scheduler.cpp): two halves of 64 bytes per thread of every warp.
    size_t wide = 2 * R.warps.size() * 32 * 64;
    if (R.wide.size() < wide) R.wide.resize(wide);
    terse_shim::grid_dim = dim3{grid[0], grid[1], grid[2]};
    terse_shim::block_dim = dim3{block[0], block[1], block[2]};

    for (unsigned z = 0; z < grid[2] && !R.failed; z++)
        for (unsigned y = 0; y < grid[1] && !R.failed; y++)
            for (unsigned x = 0; x < grid[0] && !R.failed; x++) {
                terse_shim::block_idx = dim3{x, y, z};
                // Undefined at every block's start on the device: NaN bytes again (as the shim).
                if (shared_bytes) std::memset(R.shared_base, 0xff, shared_bytes);
                run_block();
            }

    // The fibers a failure left blocked give their stacks back.
    for (Fiber& f : R.fibers)
        if (f.stack >= 0) {
            stacks.give(f.stack);
            f.stack = -1;
        }
    R.current = nullptr;
    if (R.failed) {
        std::snprintf(err, err_len, "%s", R.error.c_str());
        return 1;
    }
    return 0;
}
