/* An example of a user-supplied guest for `vpmu profile --guest FILE`: any static ELF64 that
 * the VMM can load (linked at physical addresses inside its 4 MiB, entered at CPL0 in long mode
 * with RDI = 0 and RSI = its domain; with `--vcpus N` every vCPU enters there, its LAPIC ID
 * telling which) and that keeps a symbol table. It needs nothing from the
 * profile protocol: without a `profile_config` symbol it is profiled passively (all mode) and
 * simply runs until the profiler is done. This one runs two CPL3 functions, example_sort three
 * times as long as example_hash, so its report is easy to read. */
#include "rt.h"

/* One user stack per vCPU: the domain's vCPUs run this same program. */
static u8 example_stack[MAX_CPUS][16384] __attribute__((aligned(16)));

#define SPIN(n)                                                                                \
    do {                                                                                       \
        u64 i = (n);                                                                           \
        __asm__ volatile("1: dec %0; jnz 1b" : "+r"(i));                                       \
    } while (0)

__attribute__((noinline)) void example_sort(void) { SPIN(150000); }
__attribute__((noinline)) void example_hash(void) { SPIN(50000); }

/* CPL3: until the TSC passes the deadline. */
static u64 example_main(u64 deadline) {
    u64 rounds = 0;
    do {
        example_sort();
        example_hash();
        rounds++;
    } while (rdtsc() < deadline);
    return rounds;
}

int main(void) {
    rt_init();
    u8 *stack = example_stack[cpu_id()] + sizeof(example_stack[0]);
    for (;;) user_call(example_main, rdtsc() + 50000000ul, stack);
}
