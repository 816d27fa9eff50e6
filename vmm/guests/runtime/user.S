/* CPL3 entry and return for the guest kernel (see user_call in rt.c).
 *
 * user_enter(fn, arg, user_rsp, saved_rsp, tss_rsp0, active) saves the callee-saved registers
 * on the kernel stack, stores that stack pointer in *saved_rsp and in the vCPU's TSS.RSP0 (so
 * interrupts and exceptions taken at CPL3 push their frames just below it), pushes the address
 * of user_return on the user stack as fn's return address, sets *active = 1 and irets to fn(arg)
 * at CPL3 (CS 0x2b, SS 0x23, IF set) with RBP = 0, the outermost frame of fn's call chain. fn returns onto `ud2`; the #UD handler (rt.c) recognizes
 * user_return, clears *active and irets to user_resume at CPL0 on the saved stack, which
 * restores the registers and returns fn's RAX to user_enter's caller. */
    .text
    .globl user_enter, user_return, user_resume
    .p2align 4
user_enter:
    push %rbx
    push %rbp
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, (%rcx)
    mov %rsp, (%r8)
    mov %rdi, %rax
    mov %rsi, %rdi
    lea user_return(%rip), %r10
    sub $8, %rdx
    mov %r10, (%rdx)
    pushq $0x23             /* SS: user data, RPL3 */
    push %rdx               /* RSP */
    pushq $0x202            /* RFLAGS: IF */
    pushq $0x2b             /* CS: user 64-bit code, RPL3 */
    push %rax               /* RIP */
    movq $1, (%r9)
    xor %ebp, %ebp          /* fn's frame-pointer chain starts here: it ends the call chain */
    iretq
user_return:
    ud2
user_resume:
    mov $0x10, %ecx         /* the iret to CPL3 nulled DS/ES */
    mov %ecx, %ds
    mov %ecx, %es
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbp
    pop %rbx
    ret

/* virq_entry: the PMU VIRQ's gate. An `__attribute__((interrupt))` handler pushes RBP right
 * below the hardware's interrupt frame, so its frame's "return address" slot holds the
 * interrupted RIP: a call-chain walk from a sample taken inside the handler (ring mode keeps
 * the counters running there) appends that exact RIP, which a profiler symbolizes one byte
 * early, as a return address, in whatever precedes it. This entry saves the registers the C
 * ABI lets virq_body clobber without making a frame of its own, then calls it with RBP = 0:
 * the chain of a sample in virq_body ends there (COMPLETE), as a kernel's entry code ends the
 * frame chain at an interrupt, and a sample on these few instructions walks the interrupted
 * code's own frames, whose return addresses are genuine. */
    .globl virq_entry
    .type virq_entry, @function
    .p2align 4
virq_entry:
    push %rax
    push %rcx
    push %rdx
    push %rsi
    push %rdi
    push %r8
    push %r9
    push %r10
    push %r11
    push %rbp
    xor %ebp, %ebp
    sub $8, %rsp            /* the frame (40 bytes) + 10 pushes: realign to 16 for the call */
    cld
    call virq_body
    add $8, %rsp
    pop %rbp
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rdi
    pop %rsi
    pop %rdx
    pop %rcx
    pop %rax
    iretq
    .size virq_entry, . - virq_entry
