// The private interface of the SIMT runtime of terse's emulated CUDA device (the files of
// fake_gpu/fibers/, linked into libcuda.so.1): the fibers, warps and launch state that the entry
// point (launch.cpp: terse_fake_run and its errors), the scheduler with the barriers and warp
// collectives (scheduler.cpp) and the context switch with its stack pool (context.cpp) share.
//
// Model: the CUDA threads of a block are fibers on the launching OS thread, started in order of
// their linear index (x fastest); a fiber runs until it returns or reaches a barrier
// (__syncthreads, __syncwarp, a shuffle's exchange). A barrier completes when every thread of
// the block (or lane of the warp) that has not returned waits at it; its fibers are then queued
// to resume in order of their index. Whenever the running fiber blocks or returns, the next one
// is the first of that queue, else the next thread not yet started, so a warp collective is 32
// switches (lane i to lane i + 1, the last lane completing it and switching to lane 0) and a
// __syncthreads a round robin over the block. The fibers switch to one another directly; the
// scheduler (on the launching thread's stack) runs only to start a block and when none can run
// (the block is done, deadlocked or failed). A thread that returns while no released fiber waits
// runs the next thread on its own stack, without a switch, so a barrier-free kernel is a loop
// over its threads. Blocks run one after another (so `__shared__` statics are per block),
// launches one at a time. Stacks come from a pool mapped once (with a guard page) and reused
// across launches.
//
// Errors end the launch, never hang it, and name the kernel, the block, the thread and the
// line: a barrier reached from different lines (divergent control flow), a partial-warp
// collective (a shuffle in a warp some lanes left or never had, a lane returning while its
// warp waits in one), a deadlock (every thread waits, no barrier can complete), terse_shim::fail
// (the shim's checks, a device-side assert). A failing fiber never unwinds: it records the error
// and switches back to the scheduler for good, its stack and those of the blocked fibers return
// to the pool.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

// The hand-written switch on x86-64; ucontext elsewhere, or when TERSE_FAKE_GPU_UCONTEXT is
// defined (to test that path).
#if defined(__x86_64__) && !defined(TERSE_FAKE_GPU_UCONTEXT)
#define TERSE_FIBERS_ASM 1
#else
#define TERSE_FIBERS_ASM 0
#include <ucontext.h>
#endif

#include "fake_gpu.h"

// The declarations the kernels' CPU builds resolve against this library: exported whatever
// the library's default visibility.
#define TERSE_SHIM_PLAIN_INDICES
#pragma GCC visibility push(default)
#include "../../kernels/shim/cuda_shim.h"
namespace terse_shim {
void* dynamic_shared_base();
}
extern "C" int terse_fake_run(const char* name, const unsigned grid[3], const unsigned block[3],
                              unsigned shared_bytes, void (*body)(void**), void** params, char* err,
                              size_t err_len);
#pragma GCC visibility pop

#define TERSE_COLD __attribute__((noinline, cold))

#if TERSE_FIBERS_ASM
extern "C" {
// Saves the callee-saved state on the current stack, stores the stack pointer in *save, and
// continues on the stack `load` with the state saved there. MXCSR and the x87 control word
// are loaded only when their control bits differ from the current ones (their status flags
// are not preserved across calls in the ABI either): the loads cost more than the rest.
__attribute__((visibility("hidden"))) void terse_fiber_switch(void** save, void* load);
// A fresh fiber's first return address: calls terse_fiber_main(r12); the bottom frame.
__attribute__((visibility("hidden"))) void terse_fiber_start();
__attribute__((visibility("hidden"))) [[noreturn]] void terse_fiber_main(void* fiber);
}
#endif

// Hidden: shared by the files of fibers/, exported by none of them.
namespace terse_fibers __attribute__((visibility("hidden"))) {
// A fiber's saved context (context.cpp switches between them).
#if TERSE_FIBERS_ASM
struct Context {
    void* sp = nullptr;
};
#else
struct Context {
    ucontext_t uc;
};
#endif

enum State : uint8_t { Fresh, Running, Ready, Waiting, Done };
enum At : uint8_t { AtBlock, AtWarp };
// Gather: terse_shim::gather, the exchange under kernels/shim/mma_sync.h's mma.sync and
// ldmatrix (every lane hands the warp up to 64 bytes and reads all 32 lanes').
enum Collective : uint8_t { SyncWarp = 1, Shuffle = 2, Gather = 3 };

struct Warp;

struct alignas(64) Fiber {
    Context ctx;
    int stack = -1;  // index in the pool, while the fiber holds one
    unsigned tid = 0;  // linear index in the block
    Warp* warp = nullptr;  // its warp (tid / 32)
    dim3 idx;
    State state = Fresh;
    At at = AtBlock;
    int line = 0;
    int src = 0;  // a shuffle's source lane
    uint64_t value = 0, result = 0;
};

// A collective and its line, compared in one go.
inline uint64_t collective_key(Collective kind, int line) {
    return (uint64_t)(uint32_t)line | ((uint64_t)kind << 32);
}

struct Warp {
    unsigned size = 0;   // lanes the block gives it (32 but for a partial last warp)
    unsigned live = 0;   // lanes that have not returned
    unsigned count = 0;  // lanes waiting in its collective
    unsigned gathers = 0;  // gathers completed: their parity picks the slots of the next
    uint64_t key = 0;    // which collective they wait in, from which line (collective_key)
    Collective kind() const { return (Collective)(key >> 32); }
    int line() const { return (int)(uint32_t)key; }
};

// One cp.async of kernels/shim/mma_sync.h: 16 bytes, copied when its group is waited for.
struct AsyncCopy {
    void* dst;
    const void* src;
};
// A thread's copies since its last commit, and its committed groups, oldest first.
struct AsyncGroups {
    std::vector<AsyncCopy> open;
    std::vector<std::vector<AsyncCopy>> groups;
};

// The pool of fiber stacks: mapped on first need (context.cpp), kept for the process.
struct Stacks {
    std::vector<char*> top;  // where each stack starts (below its highest byte)
    std::vector<int> free;
    int take() {
        if (free.empty()) grow();
        int i = free.back();
        free.pop_back();
        return i;
    }
    void give(int i) { free.push_back(i); }
    // Maps one more stack and makes it free.
    void grow();
};

// The launch in progress (one at a time: launch.cpp's mutex).
struct Run {
    const char* kernel = "";
    void (*body)(void**) = nullptr;
    void** params = nullptr;
    unsigned n = 0;  // threads per block
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    // The fibers to resume, in order: a ring of `mask + 1` (a power of two >= n) entries; a
    // fiber is in it at most once.
    std::vector<Fiber*> ready;
    unsigned mask = 0, head = 0, queued = 0;
    unsigned next = 0;  // the next thread to start
    unsigned live = 0;  // threads of the block that have not returned
    unsigned bar_count = 0;  // threads waiting in __syncthreads
    int bar_line = 0;
    Fiber* current = nullptr;
    Context sched;
    // The launching thread's MXCSR and x87 control word (as the switch saves them): every
    // thread starts with them.
    uint64_t fp_control = 0;
    bool failed = false;
    std::string error;
    std::vector<unsigned char> shared;  // dynamic shared memory (128-byte aligned inside)
    unsigned char* shared_base = nullptr;
    unsigned shared_bytes = 0;  // as the launch gave them
    // Gather's slots: 64 bytes per thread, twice (by the parity of the warp's `gathers`: a lane
    // that leaves a gather and reaches the next writes the other half while its warp still
    // reads this one; it cannot reach a third before every lane has read).
    std::vector<unsigned char> wide;
    // cp.async per thread (sized on the first copy of a launch; emptied at each block's start,
    // as copies a block left unwaited end with it).
    std::vector<AsyncGroups> async;
};

// Defined in launch.cpp.
extern Run R;
extern Stacks stacks;

// Records the launch's first error, naming the kernel, the block and the thread `f` (if any);
// later ones are dropped (launch.cpp).
TERSE_COLD void record(const Fiber* f, const std::string& what);

// Every thread starts with the launching thread's MXCSR and x87 control word (as a fresh fiber
// did before stacks were reused); a thread that changes them keeps its own across its switches.
#if defined(__x86_64__)
// The current MXCSR and x87 control word, laid out as the switch saves them.
inline uint64_t fp_control() {
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    return (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
}
// Back to the launch's control words, where the thread that returned on this stack changed
// their control bits.
inline void restore_fp_control() {
    uint64_t now = fp_control();
    if (__builtin_expect(((now ^ R.fp_control) & 0xffff0000ffc0ull) != 0, 0)) {
        uint32_t mxcsr = (uint32_t)R.fp_control;
        uint16_t fpucw = (uint16_t)(R.fp_control >> 32);
        asm volatile("ldmxcsr %0" : : "m"(mxcsr));
        asm volatile("fldcw %0" : : "m"(fpucw));
    }
}
#else
inline uint64_t fp_control() { return 0; }
inline void restore_fp_control() {}
#endif

// Saves the running context in `from` and continues with `to`.
#if TERSE_FIBERS_ASM
inline void ctx_switch(Context& from, Context& to) { terse_fiber_switch(&from.sp, to.sp); }
#else
// The body of every fiber on the ucontext path (scheduler.cpp).
void fiber_entry();
inline void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif
// Makes `c` start the fiber `f` on the stack that starts at `top`, with the launch's control
// words (context.cpp).
void ctx_make(Context& c, char* top, Fiber* f);

// Runs the threads of the current block until all returned, one failed, or none can go on
// (scheduler.cpp).
void run_block();
}  // namespace terse_fibers
