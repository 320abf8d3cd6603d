// The scheduler of the SIMT runtime of terse's emulated CUDA device (fake_gpu/fibers/, in
// libcuda.so.1): runs a block's CUDA threads as fibers (run_block, from launch.cpp's
// terse_fake_run), the fiber's body around the kernel's trampoline, and what the kernel code
// calls back through the SIMT shim (kernels/shim/cuda_shim.h): __syncthreads, __syncwarp, the
// shuffles' exchange, fail, and the dynamic shared memory. The barriers and warp collectives
// queue the fibers they release and switch (context.cpp) straight to the next one to run;
// divergence, partial-warp collectives and deadlocks end the launch with an error (launch.cpp
// records it).
#include <cstring>
#include <exception>
#include <string>

#include "fibers.h"

using namespace terse_fibers;

namespace {
const char* collective_name(Collective c) {
    return c == Shuffle  ? "warp shuffle"
           : c == Gather ? "warp collective (mma.sync or ldmatrix)"
                         : "__syncwarp";
}

// From a fiber whose launch has failed: back to the scheduler for good.
[[noreturn]] void abandon(Fiber* f) {
    f->state = Waiting;
    ctx_switch(f->ctx, R.sched);
    __builtin_unreachable();
}

TERSE_COLD [[noreturn]] void outside(const char* what) {
    fake_gpu::die(std::string(what) + " called outside a kernel launch");
}

inline Fiber* on_fiber(const char* what) {
    if (__builtin_expect(!R.current, 0)) outside(what);
    return R.current;
}

TERSE_COLD [[noreturn]] void fail_on(Fiber* f, const std::string& what) {
    record(f, what);
    abandon(f);
}

inline void push_ready(Fiber& f) {
    f.state = Ready;
    R.ready[(R.head + R.queued++) & R.mask] = &f;
}

// The first released fiber to resume, or null.
inline Fiber* pop_ready() {
    if (R.queued == 0) return nullptr;
    Fiber* f = R.ready[R.head];
    R.head = (R.head + 1) & R.mask;
    R.queued--;
    return f;
}

// The next thread to start (made Fresh, without a stack), or null.
inline Fiber* next_fresh() {
    if (R.next == R.n) return nullptr;
    Fiber* f = &R.fibers[R.next++];
    f->state = Fresh;
    return f;
}

// Makes `f` the running fiber (its indices the kernel's).
inline void enter(Fiber* f) {
    terse_shim::thread_idx = f->idx;
    R.current = f;
    f->state = Running;
}

// Gives the fresh fiber `f` a stack of its own, ready to start.
void start_on_new_stack(Fiber* f) {
    f->stack = stacks.take();
    ctx_make(f->ctx, stacks.top[(size_t)f->stack], f);
}

// From the fiber `f`, which now waits: on to the next fiber to run (the first released one,
// else the next thread to start) until `f` is resumed (if ever), or to the scheduler when none
// can run.
inline void suspend(Fiber* f) {
    Fiber* g = pop_ready();
    if (!g) {
        g = next_fresh();
        if (__builtin_expect(!g, 0)) {
            R.current = nullptr;
            ctx_switch(f->ctx, R.sched);
            return;
        }
        start_on_new_stack(g);
    }
    enter(g);
    ctx_switch(f->ctx, g->ctx);
}

// As suspend, for the fiber whose arrival released its barrier: it may be the first to resume.
inline void suspend_released(Fiber* f) {
    if (R.ready[R.head] == f) {
        pop_ready();
        f->state = Running;
        return;
    }
    suspend(f);
}

void release_block() {
    for (Fiber& f : R.fibers)
        if (f.state == Waiting && f.at == AtBlock) push_ready(f);
    R.bar_count = 0;
}

inline void release_warp(Warp& wp) {
    Fiber* lanes = &R.fibers[(size_t)(&wp - R.warps.data()) * 32];
    for (unsigned l = 0; l < wp.size; l++) {
        Fiber& f = lanes[l];
        if (f.state != Waiting || f.at != AtWarp) continue;
        if (wp.kind() == Shuffle) f.result = lanes[(unsigned)f.src].value;
        push_ready(f);
    }
    if (wp.kind() == Gather) wp.gathers++;
    wp.count = 0;
}

TERSE_COLD [[noreturn]] void divergent_collective(Fiber* f, const Warp& wp, Collective kind,
                                                  int line) {
    if (wp.kind() != kind)
        fail_on(f, std::string("the lanes of a warp wait in different collectives (") +
                       collective_name(wp.kind()) + " at line " + std::to_string(wp.line()) + ", " +
                       collective_name(kind) + " at line " + std::to_string(line) +
                       "): divergent control flow");
    fail_on(f, std::string(collective_name(kind)) + " reached from different lines (first at line " +
                   std::to_string(wp.line()) + ", this one at " + std::to_string(line) +
                   "): divergent control flow");
}

// A lane arrives at its warp's collective `kind` from `line` and waits for the others.
inline void arrive_warp(Fiber* f, Collective kind, int line) {
    Warp& wp = *f->warp;
    uint64_t key = collective_key(kind, line);
    if (wp.count == 0) {
        wp.key = key;
    } else if (__builtin_expect(wp.key != key, 0)) {
        divergent_collective(f, wp, kind, line);
    }
    f->state = Waiting;
    f->at = AtWarp;
    f->line = line;
    if (++wp.count == wp.live) {
        release_warp(wp);
        suspend_released(f);
    } else {
        suspend(f);
    }
}

// On the scheduler: every live thread waits and none can go on.
TERSE_COLD void deadlock() {
    const Fiber* first = nullptr;
    for (const Fiber& f : R.fibers)
        if (f.state == Waiting) {
            first = &f;
            break;
        }
    std::string what = "waits at line " + std::to_string(first ? first->line : 0) +
                       " but no barrier can complete (a deadlock: a thread skipped a barrier or "
                       "waits in another one):";
    if (R.bar_count > 0)
        what += " " + std::to_string(R.bar_count) + " of " + std::to_string(R.live) +
                " threads wait in __syncthreads at line " + std::to_string(R.bar_line) + ";";
    int shown = 0;
    for (size_t w = 0; w < R.warps.size() && shown < 4; w++) {
        const Warp& wp = R.warps[w];
        if (wp.count == 0) continue;
        what += " warp " + std::to_string(w) + ": " + std::to_string(wp.count) + " of " +
                std::to_string(wp.live) + " lanes wait in " + collective_name(wp.kind()) +
                " at line " + std::to_string(wp.line()) + ";";
        shown++;
    }
    what.pop_back();
    record(first, what);
}

TERSE_COLD void exited_in_collective(Fiber* f, const Warp& wp) {
    record(f, std::string("returned while lanes of its warp wait in a ") +
                  collective_name(wp.kind()) + " at line " + std::to_string(wp.line()) +
                  " (a partial-warp collective)");
}

// On the fiber of `f`, which returned from the kernel.
inline void exited(Fiber* f) {
    f->state = Done;
    R.live--;
    Warp& wp = *f->warp;
    wp.live--;
    if (__builtin_expect(wp.count > 0, 0)) {
        exited_in_collective(f, wp);
        return;
    }
    if (R.bar_count > 0 && R.bar_count == R.live) release_block();
}
}  // namespace

// Runs the threads of a block (on the launching thread's stack) until all returned, one
// failed, or none can go on.
void terse_fibers::run_block() {
    // The fibers' states: Done from the last block (or Fresh), each made Fresh when it starts.
    for (Warp& w : R.warps) {
        w.live = w.size;
        w.count = 0;
        w.gathers = 0;
    }
    // Copies a block left unwaited end with it.
    for (AsyncGroups& a : R.async) {
        a.open.clear();
        a.groups.clear();
    }
    R.head = 0;
    R.queued = 0;
    R.next = 0;
    R.live = R.n;
    R.bar_count = 0;
    Fiber* f = next_fresh();
    start_on_new_stack(f);
    enter(f);
    ctx_switch(R.sched, f->ctx);
    R.current = nullptr;
    if (!R.failed && R.live > 0) deadlock();
}

// The fiber's body: the kernel for its thread; then a switch to the next released fiber for
// good, else the next thread not yet started on the same stack, else back to the scheduler. The
// stack goes back to the pool before the switch away from it: nothing takes a stack before the
// switch, and what runs next may reuse it.
#if TERSE_FIBERS_ASM
extern "C" void terse_fiber_main(void* fiber) {
    Fiber* f = static_cast<Fiber*>(fiber);
#else
void terse_fibers::fiber_entry() {
    Fiber* f = R.current;
#endif
    for (;;) {
        try {
            R.body(R.params);
        } catch (const std::exception& e) {
            record(f, std::string("a C++ exception escaped the kernel: ") + e.what());
        } catch (...) {
            record(f, "a C++ exception escaped the kernel");
        }
        if (!R.failed) exited(f);
        if (__builtin_expect(R.failed, 0)) {
            f->state = Done;
            R.current = nullptr;
            ctx_switch(f->ctx, R.sched);
            __builtin_unreachable();
        }
        Fiber* g = pop_ready();
        if (!g) {
            g = next_fresh();
            if (g) {
                g->stack = f->stack;
                f->stack = -1;
                restore_fp_control();
                enter(g);
                f = g;
                continue;
            }
        }
        stacks.give(f->stack);
        f->stack = -1;
        if (g) {
            enter(g);
            ctx_switch(f->ctx, g->ctx);
        } else {
            R.current = nullptr;
            ctx_switch(f->ctx, R.sched);
        }
        __builtin_unreachable();
    }
}

namespace terse_shim {
void fail(const char* what) { fail_on(on_fiber("terse_shim::fail"), what); }

namespace {
TERSE_COLD [[noreturn]] void divergent_sync(Fiber* f, int line) {
    fail_on(f, "__syncthreads reached from different lines (first at line " +
                   std::to_string(R.bar_line) + ", this one at " + std::to_string(line) +
                   "): divergent control flow");
}
TERSE_COLD [[noreturn]] void partial_warp_shuffle(Fiber* f, const Warp& wp, int line) {
    if (wp.size != 32)
        fail_on(f, "a warp shuffle at line " + std::to_string(line) + " in a warp of " +
                       std::to_string(wp.size) +
                       " threads (the block's last, partial warp: a partial-warp collective)");
    fail_on(f, "a warp shuffle at line " + std::to_string(line) +
                   " after some lanes of the warp returned (a partial-warp collective)");
}
}  // namespace

void sync_block(int line) {
    Fiber* f = on_fiber("__syncthreads");
    if (R.bar_count == 0) {
        R.bar_line = line;
    } else if (__builtin_expect(line != R.bar_line, 0)) {
        divergent_sync(f, line);
    }
    f->state = Waiting;
    f->at = AtBlock;
    f->line = line;
    if (++R.bar_count == R.live) {
        release_block();
        suspend_released(f);
    } else {
        suspend(f);
    }
}

void sync_warp(int line) { arrive_warp(on_fiber("__syncwarp"), SyncWarp, line); }

uint64_t exchange(uint64_t v, int src, int line) {
    Fiber* f = on_fiber("a warp shuffle");
    const Warp& wp = *f->warp;
    // live <= size <= 32
    if (__builtin_expect(wp.live != 32, 0)) partial_warp_shuffle(f, wp, line);
    f->value = v;
    f->src = src & 31;
    arrive_warp(f, Shuffle, line);
    return f->result;
}

void* dynamic_shared_base() { return R.shared_base; }

// kernels/shim/mma_sync.h's collectives and copies, with the semantics of the shim's threads
// (kernels/shim/cuda_shim.cpp): a gather through the warp, cp.async completed at its wait.

void gather(const void* mine, unsigned bytes, void* all, int line) {
    Fiber* f = on_fiber("a warp collective (mma.sync or ldmatrix)");
    const Warp& wp = *f->warp;
    if (bytes > 64) fail_on(f, "a warp collective of more than 64 bytes per lane");
    if (__builtin_expect(wp.live != 32, 0))
        fail_on(f, "a warp collective (mma.sync or ldmatrix) at line " + std::to_string(line) +
                       (wp.size != 32 ? " in the block's last, partial warp"
                                      : " after some lanes of the warp returned") +
                       " (a partial-warp collective)");
    size_t warp = f->tid / 32, half = (size_t)R.warps.size() * 32 * 64;
    unsigned char* slots = R.wide.data() + (wp.gathers & 1) * half + warp * 32 * 64;
    std::memcpy(slots + (f->tid % 32) * 64, mine, bytes);
    arrive_warp(f, Gather, line);
    for (unsigned i = 0; i < 32; i++)
        std::memcpy(static_cast<unsigned char*>(all) + i * bytes, slots + i * 64, bytes);
}

unsigned char* dynamic_shared() {
    Fiber* f = on_fiber("dynamic shared memory");
    if (R.shared_bytes == 0) fail_on(f, "dynamic shared memory, but the launch gave it 0 bytes");
    return R.shared_base;
}

void async_copy16(void* dst, const void* src) {
    Fiber* f = on_fiber("cp.async");
    if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
        fail_on(f, "a 16-byte cp.async with an address that is not 16-byte aligned");
    if (R.async.size() < R.n) R.async.resize(R.n);
    // Until the wait, the destination holds 0xff bytes: a read before the wait sees NaN.
    std::memset(dst, 0xff, 16);
    R.async[f->tid].open.push_back({dst, src});
}

void async_commit() {
    Fiber* f = on_fiber("cp.async.commit_group");
    if (R.async.size() < R.n) R.async.resize(R.n);
    AsyncGroups& a = R.async[f->tid];
    a.groups.push_back(std::move(a.open));
    a.open.clear();
}

void async_wait(int pending) {
    Fiber* f = on_fiber("cp.async.wait_group");
    if (R.async.size() < R.n) return;  // nothing was copied in this launch
    AsyncGroups& a = R.async[f->tid];
    size_t done = a.groups.size() > (size_t)pending ? a.groups.size() - (size_t)pending : 0;
    for (size_t g = 0; g < done; g++)
        for (const AsyncCopy& c : a.groups[g]) std::memcpy(c.dst, c.src, 16);
    a.groups.erase(a.groups.begin(), a.groups.begin() + (std::ptrdiff_t)done);
}
}  // namespace terse_shim
