/* The CPL3 workloads of all_mode_profiles_other_domains (all.c): domain 1 runs dom1_loop,
 * domain 2 dom2_loop (distinct functions, so that a sample's RIP names its domain's code).
 * domN_loop(deadline TSC in RDI) calls domN_hot (UNIT `dec; jnz` iterations) until the TSC
 * passes the deadline; returns the rounds. Bounds from the *_end labels. */
    .set UNIT, 100000
    .text
    .globl dom1_loop, dom1_loop_end, dom1_hot, dom1_hot_end
    .globl dom2_loop, dom2_loop_end, dom2_hot, dom2_hot_end
    .p2align 4
dom1_loop:
    mov %rdi, %r8
    xor %r9d, %r9d
1:  call dom1_hot
    inc %r9
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    cmp %r8, %rax
    jb 1b
    mov %r9, %rax
    ret
dom1_loop_end:

    .p2align 4
dom1_hot:
    mov $UNIT, %ecx
1:  dec %rcx
    jnz 1b
    ret
dom1_hot_end:

    .p2align 4
dom2_loop:
    mov %rdi, %r8
    xor %r9d, %r9d
1:  call dom2_hot
    inc %r9
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    cmp %r8, %rax
    jb 1b
    mov %r9, %rax
    ret
dom2_loop_end:

    .p2align 4
dom2_hot:
    mov $UNIT, %ecx
1:  dec %rcx
    jnz 1b
    ret
dom2_hot_end:
