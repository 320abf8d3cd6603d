// The context switch and the stacks of the SIMT runtime of terse's emulated CUDA device
// (fake_gpu/fibers/, in libcuda.so.1): how a fiber starts on a stack of its own and how the
// scheduler (scheduler.cpp) switches between fibers, and the pool the stacks come from.
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

#include "fibers.h"

using namespace terse_fibers;

namespace {
// Each fiber's stack; a guard page below it turns an overflow into a fault, not a corruption.
constexpr size_t kStackBytes = 512 * 1024;
}  // namespace

#if TERSE_FIBERS_ASM
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

// Each stack's top is offset by a multiple of 64 bytes that depends on its index, so the hot
// frames of the fibers (which all sit at the same depth) do not all fall in the same sets of
// the L1 cache.
void Stacks::grow() {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) fake_gpu::die("fibers: cannot map a fiber stack");
    if (mprotect(m, page, PROT_NONE) != 0) fake_gpu::die("fibers: cannot guard a fiber stack");
    size_t color = (top.size() * 7 % 64) * 64;
    top.push_back(static_cast<char*>(m) + page + kStackBytes - color);
    free.push_back((int)top.size() - 1);
}

#if TERSE_FIBERS_ASM
void terse_fibers::ctx_make(Context& c, char* top, Fiber* f) {
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
void terse_fibers::ctx_make(Context& c, char* top, Fiber*) {
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
