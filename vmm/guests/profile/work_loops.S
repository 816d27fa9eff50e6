/* The CPL3 workloads of `vpmu profile` (work.c). wN_main(deadline TSC in RDI) calls its
 * domain's functions in a fixed pattern until the TSC passes the deadline and returns the
 * rounds. Every function is the same `dec; jnz` loop run for a different number of UNITs, so
 * the time shares are known by construction (src/profile/workloads.rs):
 *   workload 1: w1_deflate 3, w1_checksum 1          (75 %, 25 %)
 *   workload 2: w2_parse 1, w2_lookup 3, w2_render 2  (16.7 %, 50 %, 33.3 %)
 *   workload 3: w3_scan 1, w3_sort 2, w3_merge 4      (14.3 %, 28.6 %, 57.1 %)
 * (distinct shares, so that the ranking of a domain's functions is well defined)
 * The mains' own instructions are a few per round (~0.01 %).
 * Every function builds a frame-pointer frame (push %rbp; mov %rsp, %rbp), as the C code
 * compiled with -fno-omit-frame-pointer does, so that the call chain the hypervisor walks at a
 * sample names the caller: w1_deflate called from w1_main (user_enter starts the CPL3 stack
 * with RBP = 0, which ends the chain). A sample on the prologue's two instructions misses its
 * caller, as frame-pointer unwinding always does. */
    .set UNIT, 50000

    .macro SPIN name, units
    .p2align 5
    .globl \name
    .type \name, @function
\name:
    push %rbp
    mov %rsp, %rbp
    mov $\units * UNIT, %ecx
1:  dec %rcx
    jnz 1b
    pop %rbp
    ret
    .size \name, . - \name
    .endm

    .macro MAIN name, f1, f2, f3
    .p2align 5
    .globl \name
    .type \name, @function
\name:
    push %rbp
    mov %rsp, %rbp
    push %rbx
    mov %rdi, %r8
    xor %ebx, %ebx
1:  call \f1
    call \f2
    .ifnb \f3
    call \f3
    .endif
    inc %rbx
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    cmp %r8, %rax
    jb 1b
    mov %rbx, %rax
    pop %rbx
    pop %rbp
    ret
    .size \name, . - \name
    .endm

    .text
    MAIN w1_main, w1_deflate, w1_checksum
    SPIN w1_deflate, 3
    SPIN w1_checksum, 1
    MAIN w2_main, w2_parse, w2_lookup, w2_render
    SPIN w2_parse, 1
    SPIN w2_lookup, 3
    SPIN w2_render, 2
    MAIN w3_main, w3_scan, w3_sort, w3_merge
    SPIN w3_scan, 1
    SPIN w3_sort, 2
    SPIN w3_merge, 4
