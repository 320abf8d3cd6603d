// The SIMT shim's runtime (see cuda_shim.h): one OS thread per CUDA thread of a block, blocks of
// a launch in order on the same threads, barriers with a deadline, one launch at a time.
// crates/simt calls `terse_shim_run` through the generated trampolines.
#include "cuda_shim.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <new>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace terse_shim {
thread_local dim3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

void restore();

namespace {
// Thrown out of the kernel body of every thread once a launch has failed.
struct Abort {};

// A reusable barrier over `n` threads whose waits end at a deadline; `poisoned` wakes every
// waiter of a failed launch. `lines` records where each arrival came from.
struct Barrier {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0, arrived = 0;
    uint64_t generation = 0;
    int line = -1;
    bool mixed = false;
};

struct Launch {
    const char* kernel = "";
    std::chrono::milliseconds deadline{10000};
    std::mutex mu;  // guards `error`; taken only when a launch fails
    // Read relaxed in the barriers' wait loops: a mutex there would order every thread after
    // every other and hide the races ThreadSanitizer is run to find.
    std::atomic<bool> failed{false};
    std::string error;
    Barrier block;
    std::vector<Barrier> warps;
    std::vector<uint64_t> slots;  // one exchange slot per thread
    std::vector<unsigned char> wide;  // 64 bytes per thread: `gather`'s slots
    unsigned char* dynamic = nullptr;  // dynamic shared memory, `dynamic_bytes` long
    unsigned dynamic_bytes = 0;
    std::vector<int> exited;      // threads of the current block that returned, per warp
};

Launch* current = nullptr;
std::mutex launch_mu;  // one launch at a time: `__shared__` statics are per block

// One cp.async: 16 bytes from `src` to `dst`, done when its group is waited for.
struct Copy {
    void* dst;
    const void* src;
};
// The calling thread's copies since its last commit, and its committed groups, oldest first.
thread_local std::vector<Copy> open_copies;
thread_local std::deque<std::vector<Copy>> groups;

// Dynamic shared memory's contents are undefined at a block's start: 0xff bytes (NaN in f32
// and bf16) make a read before the block's own write visible.
void poison_dynamic() {
    if (current->dynamic) std::memset(current->dynamic, 0xff, current->dynamic_bytes);
}

void record(const std::string& what) {
    Launch& l = *current;
    std::lock_guard<std::mutex> g(l.mu);
    if (!l.failed.load(std::memory_order_relaxed)) {
        l.failed.store(true, std::memory_order_relaxed);
        l.error = std::string("kernel ") + l.kernel + " block (" + std::to_string(block_idx.x) + "," +
                  std::to_string(block_idx.y) + "," + std::to_string(block_idx.z) + ") thread " +
                  std::to_string(thread_idx.x) + ": " + what;
    }
}

// Wakes every waiter of every barrier so the failed launch unwinds.
void poison_all() {
    Launch& l = *current;
    {
        std::lock_guard<std::mutex> g(l.block.mu);
        l.block.cv.notify_all();
    }
    for (auto& w : l.warps) {
        std::lock_guard<std::mutex> g(w.mu);
        w.cv.notify_all();
    }
}

bool failed() { return current->failed.load(std::memory_order_relaxed); }

// Arrives at `b` from `line` and waits for the others (or the deadline, or a failure).
void arrive(Barrier& b, int line, const char* what) {
    std::unique_lock<std::mutex> g(b.mu);
    if (b.arrived == 0) {
        b.line = line;
        b.mixed = false;
    } else if (line != b.line) {
        b.mixed = true;
    }
    uint64_t gen = b.generation;
    if (++b.arrived == b.n) {
        if (line == -2) restore();  // the end-of-block barrier: every thread is here
        bool mixed = b.mixed;
        int first = b.line;
        b.arrived = 0;
        b.generation++;
        b.cv.notify_all();
        if (mixed) {
            g.unlock();
            record(std::string(what) + " reached from different lines (first at line " +
                   std::to_string(first) + ", this one at " + std::to_string(line) +
                   "): divergent control flow");
            poison_all();
            throw Abort{};
        }
        return;
    }
    auto until = std::chrono::steady_clock::now() + current->deadline;
    while (b.generation == gen) {
        if (failed()) throw Abort{};
        if (b.cv.wait_until(g, until) == std::cv_status::timeout && b.generation == gen) {
            int got = b.arrived, want = b.n;
            g.unlock();
            record(std::string(what) + " at line " + std::to_string(line) + ": " +
                   std::to_string(got) + " of " + std::to_string(want) +
                   " threads arrived before the deadline (a thread skipped it or returned)");
            poison_all();
            throw Abort{};
        }
    }
    if (failed()) throw Abort{};
}
}  // namespace

void fail(const char* what) {
    record(what);
    poison_all();
    throw Abort{};
}

// A thread whose kernel body returned leaves the block's barrier (as an exited thread does on
// the device) and its warp's; a warp collective that some lanes are already waiting in is a
// partial-warp collective and fails the launch.
void drop_out() {
    Launch& l = *current;
    {
        std::lock_guard<std::mutex> g(l.block.mu);
        l.block.n--;
        if (l.block.arrived > 0 && l.block.arrived == l.block.n) {
            l.block.arrived = 0;
            l.block.generation++;
            l.block.cv.notify_all();
        }
    }
    Barrier& w = l.warps[thread_idx.x / 32];
    bool waiting;
    int line;
    {
        std::lock_guard<std::mutex> g(w.mu);
        w.n--;
        waiting = w.arrived > 0;
        line = w.line;
    }
    if (waiting)
        fail(("a lane returned while its warp waits in a collective at line " +
              std::to_string(line) + " (a partial-warp collective)")
                 .c_str());
}

// Back to whole blocks and warps, between two blocks (every thread is at the end-of-block
// barrier, so nobody is in another).
void restore() {
    Launch& l = *current;
    l.block.n = (int)l.slots.size();
    l.block.arrived = 0;
    for (auto& w : l.warps) {
        w.n = 32;
        w.arrived = 0;
    }
    poison_dynamic();
}

void sync_block(int line) { arrive(current->block, line, "__syncthreads"); }

void sync_warp(int line) {
    arrive(current->warps[thread_idx.x / 32], line, "__syncwarp");
}

uint64_t exchange(uint64_t v, int src, int line) {
    Launch& l = *current;
    unsigned warp = thread_idx.x / 32;
    bool partial;
    {
        std::lock_guard<std::mutex> g(l.warps[warp].mu);
        partial = l.warps[warp].n != 32;
    }
    if (partial)
        fail(("a warp shuffle at line " + std::to_string(line) +
              " after some lanes of the warp returned (a partial-warp collective)")
                 .c_str());
    l.slots[thread_idx.x] = v;
    arrive(l.warps[warp], line, "warp shuffle");
    uint64_t got = l.slots[warp * 32 + src];
    // Nobody rewrites a slot until every lane has read.
    arrive(l.warps[warp], line, "warp shuffle");
    return got;
}

void gather(const void* mine, unsigned bytes, void* all, int line) {
    Launch& l = *current;
    unsigned warp = thread_idx.x / 32;
    if (bytes > 64) fail("a warp collective of more than 64 bytes per lane");
    bool partial;
    {
        std::lock_guard<std::mutex> g(l.warps[warp].mu);
        partial = l.warps[warp].n != 32;
    }
    if (partial)
        fail(("a warp collective (mma.sync or ldmatrix) at line " + std::to_string(line) +
              " after some lanes of the warp returned (a partial-warp collective)")
                 .c_str());
    std::memcpy(&l.wide[thread_idx.x * 64], mine, bytes);
    arrive(l.warps[warp], line, "warp collective");
    for (unsigned i = 0; i < 32; i++)
        std::memcpy(static_cast<unsigned char*>(all) + i * bytes, &l.wide[(warp * 32 + i) * 64], bytes);
    arrive(l.warps[warp], line, "warp collective");
}

unsigned char* dynamic_shared() {
    if (!current->dynamic) fail("dynamic shared memory, but the launch gave it 0 bytes");
    return current->dynamic;
}

void async_copy16(void* dst, const void* src) {
    if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
        fail("a 16-byte cp.async with an address that is not 16-byte aligned");
    // Until the wait, the destination holds 0xff bytes: a read before the wait sees NaN.
    std::memset(dst, 0xff, 16);
    open_copies.push_back({dst, src});
}

void async_commit() {
    groups.push_back(std::move(open_copies));
    open_copies.clear();
}

void async_wait(int pending) {
    while ((int)groups.size() > pending) {
        for (const Copy& c : groups.front()) std::memcpy(c.dst, c.src, 16);
        groups.pop_front();
    }
}
}  // namespace terse_shim

using namespace terse_shim;

// Runs `body` as kernel `name` over `grid` x `block` threads; returns 0, or 1 with the error
// in `err` (at most `err_len` bytes, NUL-terminated).
extern "C" int terse_shim_run(const char* name, const unsigned* grid, const unsigned* block,
                              unsigned shared_bytes, void (*body)(void**), void** args,
                              unsigned deadline_ms, char* err, size_t err_len) {
    std::lock_guard<std::mutex> one_at_a_time(launch_mu);
    unsigned threads = block[0] * block[1] * block[2];
    auto fail_now = [&](const std::string& e) {
        std::snprintf(err, err_len, "%s", e.c_str());
        return 1;
    };
    if (threads == 0 || threads > 1024)
        return fail_now(std::string("kernel ") + name + ": " + std::to_string(threads) +
                        " threads per block (1 to 1024)");
    if (block[1] != 1 || block[2] != 1 || threads % 32 != 0)
        return fail_now(std::string("kernel ") + name +
                        ": the shim runs one-dimensional blocks of whole warps");
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
        return fail_now(std::string("kernel ") + name + ": an empty grid");
    Launch l;
    l.kernel = name;
    l.deadline = std::chrono::milliseconds(deadline_ms);
    l.block.n = (int)threads;
    l.warps = std::vector<Barrier>(threads / 32);
    for (auto& w : l.warps) w.n = 32;
    l.slots.assign(threads, 0);
    l.wide.assign(threads * 64, 0);
    // Exactly `shared_bytes` (AddressSanitizer sees a read past them), 128-byte aligned.
    struct Free {
        void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t(128)); }
    };
    std::unique_ptr<unsigned char[], Free> dynamic;
    if (shared_bytes) {
        dynamic.reset(static_cast<unsigned char*>(::operator new[](shared_bytes, std::align_val_t(128))));
        l.dynamic = dynamic.get();
        l.dynamic_bytes = shared_bytes;
    }
    current = &l;
    poison_dynamic();
    grid_dim = {grid[0], grid[1], grid[2]};
    block_dim = {block[0], block[1], block[2]};
    // Blocks in order; every thread finishes a block (returns or falls off the end) before the
    // next starts, through `done`, a barrier that does not count as a __syncthreads.
    Barrier done;
    done.n = (int)threads;
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (unsigned t = 0; t < threads; t++) {
        pool.emplace_back([&, t] {
            thread_idx = {t, 0, 0};
            for (unsigned z = 0; z < grid[2]; z++)
                for (unsigned y = 0; y < grid[1]; y++)
                    for (unsigned x = 0; x < grid[0]; x++) {
                        block_idx = {x, y, z};
                        // Copies a block left unwaited end with it.
                        open_copies.clear();
                        groups.clear();
                        try {
                            body(args);
                            drop_out();
                            arrive(done, -2, "the end of a block");
                        } catch (Abort&) {
                            return;
                        }
                    }
        });
    }
    for (auto& th : pool) th.join();
    current = nullptr;
    if (l.failed.load()) return fail_now(l.error);
    return 0;
}
