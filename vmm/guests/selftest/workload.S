/* The CPL3 workload of timed_user_workload (timed.c): hot_a spins 3 units, hot_b 1 unit, in
 * a loop (work_loop) until the TSC (read natively at CPL3) passes the deadline in RDI or
 * MAX_ROUNDS rounds ran; returns the rounds. Plain assembly so the functions' bounds
 * (the *_end labels) are exact and nothing is inlined; hot_a/hot_b touch only RCX. */
    .set UNIT, 100000       /* dec/jnz iterations: ~74k TSC ticks natively */
    .set MAX_ROUNDS, 100000
    .text
    .globl work_loop, work_loop_end, hot_a, hot_a_end, hot_b, hot_b_end
    .p2align 4
work_loop:
    mov %rdi, %r8
    xor %r9d, %r9d
1:  call hot_a
    call hot_b
    inc %r9
    cmp $MAX_ROUNDS, %r9
    jae 2f
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    cmp %r8, %rax
    jb 1b
2:  mov %r9, %rax
    ret
work_loop_end:

    .p2align 4
hot_a:
    mov $3 * UNIT, %ecx
1:  dec %rcx
    jnz 1b
    ret
hot_a_end:

    .p2align 4
hot_b:
    mov $UNIT, %ecx
1:  dec %rcx
    jnz 1b
    ret
hot_b_end:
