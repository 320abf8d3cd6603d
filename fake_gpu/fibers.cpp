// The SIMT runtime of terse's emulated CUDA device, linked into libcuda.so.1: cuLaunchKernel
// (modules.cpp) calls terse_fake_run with a kernel's trampoline from its module's CPU build
// (libterse_fake_<module>.so, written by xtask/src/fake_gpu/kernels.rs), and the kernel code calls
// back into what the SIMT shim's header declares (kernels/shim/cuda_shim.h: the indices, the
// barriers, the warp exchange, fail) plus the dynamic shared memory (fake_gpu/include).
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
//
// The context switch is hand-written for x86-64 (callee-saved registers, MXCSR and the x87
// control word, then the stack pointer; the control words are reloaded only when their control
// bits differ from the running fiber's, so the exception flags, which calls do not preserve
// either, are then left as they are): swapcontext's signal-mask system call would cost more
// than most threads' work. Other architectures use ucontext. Every thread starts with the
// launching thread's control words. Each stack's top is offset by a different multiple of 64
// bytes, so the frames the fibers switch in (all at the same depth) do not compete for the
// same L1 sets.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
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
#include "../kernels/shim/cuda_shim.h"
namespace terse_shim {
void* dynamic_shared_base();
}
extern "C" int terse_fake_run(const char* name, const unsigned grid[3], const unsigned block[3],
                              unsigned shared_bytes, void (*body)(void**), void** params, char* err,
                              size_t err_len);
#pragma GCC visibility pop

namespace terse_shim {
dim3 thread_idx, block_idx;
dim3 block_dim, grid_dim;
}  // namespace terse_shim

#define TERSE_COLD __attribute__((noinline, cold))

namespace {
// Each fiber's stack; a guard page below it turns an overflow into a fault, not a corruption.
constexpr size_t kStackBytes = 512 * 1024;

// ---- Context switching.
#if TERSE_FIBERS_ASM
struct Context {
    void* sp = nullptr;
};
#else
struct Context {
    ucontext_t uc;
};
#endif
}  // namespace

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
asm(R"(
    .text
    .p2align 4
    .globl terse_fiber_switch
    .hidden terse_fiber_switch
    .type terse_fiber_switch, @function
terse_fiber_switch:
    .cfi_startproc
    pushq %rbp
    .cfi_adjust_cfa_offset 8
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    pushq %r12
    .cfi_adjust_cfa_offset 8
    pushq %r13
    .cfi_adjust_cfa_offset 8
    pushq %r14
    .cfi_adjust_cfa_offset 8
    pushq %r15
    .cfi_adjust_cfa_offset 8
    subq $8, %rsp
    .cfi_adjust_cfa_offset 8
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movl (%rsp), %eax
    movzwl 4(%rsp), %ecx
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    xorl (%rsp), %eax
    xorw 4(%rsp), %cx
    andl $0xffc0, %eax
    orl %ecx, %eax
    jnz 2f
1:
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
2:
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    jmp 1b
    .cfi_endproc
    .size terse_fiber_switch, .-terse_fiber_switch

    .p2align 4
    .globl terse_fiber_start
    .hidden terse_fiber_start
    .type terse_fiber_start, @function
terse_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    xorl %ebp, %ebp
    movq %r12, %rdi
    call terse_fiber_main
    ud2
    .cfi_endproc
    .size terse_fiber_start, .-terse_fiber_start
)");
#endif

namespace {
enum State : uint8_t { Fresh, Running, Ready, Waiting, Done };
enum At : uint8_t { AtBlock, AtWarp };
enum Collective : uint8_t { SyncWarp = 1, Shuffle = 2 };

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
    uint64_t key = 0;    // which collective they wait in, from which line (collective_key)
    Collective kind() const { return (Collective)(key >> 32); }
    int line() const { return (int)(uint32_t)key; }
};

const char* collective_name(Collective c) { return c == Shuffle ? "warp shuffle" : "__syncwarp"; }

// The pool of fiber stacks: mapped on first need, kept for the process. Each stack's top is
// offset by a multiple of 64 bytes that depends on its index, so the hot frames of the fibers
// (which all sit at the same depth) do not all fall in the same sets of the L1 cache.
struct Stacks {
    std::vector<char*> top;  // where each stack starts (below its highest byte)
    std::vector<int> free;
    int take() {
        if (free.empty()) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
            if (m == MAP_FAILED) fake_gpu::die("fibers: cannot map a fiber stack");
            if (mprotect(m, page, PROT_NONE) != 0)
                fake_gpu::die("fibers: cannot guard a fiber stack");
            size_t color = (top.size() * 7 % 64) * 64;
            top.push_back(static_cast<char*>(m) + page + kStackBytes - color);
            free.push_back((int)top.size() - 1);
        }
        int i = free.back();
        free.pop_back();
        return i;
    }
    void give(int i) { free.push_back(i); }
};

// The launch in progress (one at a time: `mu`).
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
};

std::mutex mu;
Run R;
Stacks stacks;

std::string thread_name(const Fiber& f) {
    if (terse_shim::block_dim.y == 1 && terse_shim::block_dim.z == 1) return std::to_string(f.tid);
    return "(" + std::to_string(f.idx.x) + "," + std::to_string(f.idx.y) + "," +
           std::to_string(f.idx.z) + ")";
}

TERSE_COLD void record(const Fiber* f, const std::string& what) {
    if (R.failed) return;
    R.failed = true;
    const dim3& b = terse_shim::block_idx;
    R.error = std::string("kernel ") + R.kernel + " block (" + std::to_string(b.x) + "," +
              std::to_string(b.y) + "," + std::to_string(b.z) + ")" +
              (f ? " thread " + thread_name(*f) : std::string()) + ": " + what;
}

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

#if TERSE_FIBERS_ASM
inline void ctx_switch(Context& from, Context& to) { terse_fiber_switch(&from.sp, to.sp); }
void ctx_make(Context& c, char* top, Fiber* f) {
    // After the switch's `ret` into terse_fiber_start the stack pointer is 16-byte aligned.
    uint64_t* sp = reinterpret_cast<uint64_t*>(((uintptr_t)top & ~(uintptr_t)15) - 16);
    *--sp = (uint64_t)(uintptr_t)&terse_fiber_start;  // return address
    *--sp = 0;                                         // rbp
    *--sp = 0;                                         // rbx
    *--sp = (uint64_t)(uintptr_t)f;                    // r12: the fiber
    *--sp = 0;                                         // r13
    *--sp = 0;                                         // r14
    *--sp = 0;                                         // r15
    *--sp = R.fp_control;
    c.sp = sp;
}
#else
void fiber_entry();
inline void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void ctx_make(Context& c, char* top, Fiber*) {
    getcontext(&c.uc);
#if defined(__x86_64__)
    c.uc.uc_mcontext.fpregs->mxcsr = (uint32_t)R.fp_control;
    c.uc.uc_mcontext.fpregs->cwd = (uint16_t)(R.fp_control >> 32);
#endif
    c.uc.uc_stack.ss_sp = top - (kStackBytes - 4096);
    c.uc.uc_stack.ss_size = kStackBytes - 4096;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, fiber_entry, 0);
}
#endif

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

// Runs the threads of a block (on the launching thread's stack) until all returned, one
// failed, or none can go on.
void run_block() {
    // The fibers' states: Done from the last block (or Fresh), each made Fresh when it starts.
    for (Warp& w : R.warps) {
        w.live = w.size;
        w.count = 0;
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
}  // namespace

// The fiber's body: the kernel for its thread; then a switch to the next released fiber for
// good, else the next thread not yet started on the same stack, else back to the scheduler. The
// stack goes back to the pool before the switch away from it: nothing takes a stack before the
// switch, and what runs next may reuse it.
#if TERSE_FIBERS_ASM
extern "C" void terse_fiber_main(void* fiber) {
    Fiber* f = static_cast<Fiber*>(fiber);
#else
namespace {
void fiber_entry() {
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
#if !TERSE_FIBERS_ASM
}  // namespace
#endif

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
}  // namespace terse_shim

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
    terse_shim::grid_dim = dim3{grid[0], grid[1], grid[2]};
    terse_shim::block_dim = dim3{block[0], block[1], block[2]};

    for (unsigned z = 0; z < grid[2] && !R.failed; z++)
        for (unsigned y = 0; y < grid[1] && !R.failed; y++)
            for (unsigned x = 0; x < grid[0] && !R.failed; x++) {
                terse_shim::block_idx = dim3{x, y, z};
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
