/*
 * MSR-exit cost: BATCHES batches of ITERS RDMSRs of a PMU MSR, alternately answered by the
 * vpmu and by the VMM's null handler (selected through the control port), timed with RDTSC.
 * Prints "BENCH vpmu <ticks per rdmsr>" and "BENCH null <ticks>" per batch, and "BENCH loop
 * <ticks>" for the same loop without the RDMSR (the cost of the emulated loop itself).
 */
#include "rt.h"

#define ITERS 2000
#define BATCHES 6

int main(u64 arg) {
    (void)arg;
    rt_init();
    u32 a, b, c, d;
    cpuid(0, 0, &a, &b, &c, &d);
    u32 msr = b == 0x756e6547 ? 0x186 : 0xc0010000u; /* PERFEVTSEL0 / K7 PERF_CTL0 */
    /* The same loop with a NOP instead of the RDMSR: the emulated-CPL0 loop overhead. */
    for (int batch = 0; batch < BATCHES; batch++) {
        u64 t0 = rdtsc();
        u32 n = ITERS;
        __asm__ volatile("1: nop\n\tdec %%ebx\n\tjnz 1b" : "+b"(n) : : "memory", "cc");
        u64 t1 = rdtsc();
        puts("BENCH loop ");
        put_dec((t1 - t0) / ITERS);
        puts("\n");
    }
    for (int batch = 0; batch < BATCHES; batch++) {
        for (int null = 0; null < 2; null++) {
            outl(PORT_CONTROL, (u32)null);
            u64 t0 = rdtsc();
            u32 n = ITERS;
            __asm__ volatile("1: rdmsr\n\tdec %%ebx\n\tjnz 1b" : "+b"(n) : "c"(msr) : "rax", "rdx", "memory", "cc");
            u64 t1 = rdtsc();
            puts(null ? "BENCH null " : "BENCH vpmu ");
            put_dec((t1 - t0) / ITERS);
            puts("\n");
        }
    }
    return 0;
}
