/*
 * The pattern window of the compat32 case: with interrupts off, enable the counter (WRMSR,
 * EDI = MSR, ESI:EDX = value low:high), load every GPR (RSP included) with its
 * COMPAT_PATTERN(i), and retire eight NOPs; the counter, preset to overflow on the third NOP,
 * is sampled there with all sixteen patterns live. Then restore RSP and the callee-saved
 * registers and return; the VIRQ is taken once interrupts are back on.
 */
/* COMPAT_PATTERN(i) of compat.h (C only), as an assembler expression. */
#define PAT(i) ((((0xA5000000 | ((i) << 16) | 0x5A5A)) << 32) | (0xC3000000 | ((i) << 16) | 0x3C3C))

    .text
    .globl pattern_window, window_lo, window_hi
pattern_window:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    pushfq
    cli
    mov %rsp, saved_rsp(%rip)
    mov %edi, %ecx
    mov %esi, %eax
    wrmsr                       /* counted: 1 */
    movabs $PAT(0), %rax        /* 2 .. 17 */
    movabs $PAT(1), %rbx
    movabs $PAT(2), %rcx
    movabs $PAT(3), %rdx
    movabs $PAT(4), %rsi
    movabs $PAT(5), %rdi
    movabs $PAT(6), %rbp
    movabs $PAT(7), %rsp
    movabs $PAT(8), %r8
    movabs $PAT(9), %r9
    movabs $PAT(10), %r10
    movabs $PAT(11), %r11
    movabs $PAT(12), %r12
    movabs $PAT(13), %r13
    movabs $PAT(14), %r14
    movabs $PAT(15), %r15
window_lo:
    nop                         /* 18 */
    nop                         /* 19 */
    nop                         /* 20: the overflow (preset -20) */
    nop
    nop
    nop
    nop
    nop
window_hi:
    mov saved_rsp(%rip), %rsp
    popfq
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret

    .bss
    .balign 8
saved_rsp:
    .quad 0
