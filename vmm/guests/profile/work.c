/* The built-in workload domains of `vpmu profile`: CPL3 loops (work_loops.S) whose functions'
 * time shares are known by construction, run in chunks of 50 M TSC ticks (~20 ms) through
 * user_call (a round trip through CPL0 costs 120-250 us here, CPL0 being emulated). In self and
 * hv mode the domain samples itself through its own page (sampler.c) and ships its samples between
 * chunks; in all mode it never touches the PMU and runs until the VMM stops the run.
 * Every vCPU of the domain runs the same workload with its own stack, page and counters.
 * `work_stats[vCPU]` tells the VMM how much work was done (the slowdown under profiling). */
#include "profile.h"

volatile struct profile_config profile_config;
/* Per vCPU (LAPIC ID): completed rounds and the TSC ticks they took (whole chunks only). */
volatile struct {
    u64 rounds, ticks;
} work_stats[MAX_CPUS];

u64 w1_main(u64 deadline);
u64 w2_main(u64 deadline);
u64 w3_main(u64 deadline);

#define CHUNK_TICKS 50000000ul
static u8 work_stack[MAX_CPUS][16384] __attribute__((aligned(16)));

int main(u64 arg, u64 domain) {
    (void)arg;
    (void)domain;
    rt_init();
    if (profile_config.magic != PROFILE_CONFIG_MAGIC || profile_config.role != ROLE_WORKLOAD) {
        puts("work: no profile_config from the VMM\n");
        return 2;
    }
    u64 (*fn)(u64) = profile_config.workload == 1   ? w1_main
                     : profile_config.workload == 2 ? w2_main
                     : profile_config.workload == 3 ? w3_main
                                                    : 0;
    if (!fn) {
        puts("work: unknown workload\n");
        return 2;
    }
    detect();
    u32 cpu = cpu_id();
    int sampling = profile_config.mode != XENPMU_MODE_ALL && profile_config.period != 0;
    if (sampling && sampler_start() != 0) {
        puts("work: cannot start sampling\n");
        return 4;
    }
    u64 t0 = rdtsc();
    while (!sampling || rdtsc() - t0 < profile_config.duration) {
        u64 c0 = rdtsc();
        u64 rounds = user_call(fn, c0 + CHUNK_TICKS, work_stack[cpu] + sizeof(work_stack[cpu]));
        work_stats[cpu].ticks += rdtsc() - c0;
        work_stats[cpu].rounds += rounds;
        if (sampling && sampler_ship_due()) sampler_ship();
    }
    int stop_failed = sampling ? sampler_stop() : 0;
    puts("work: samples ");
    put_dec(sampler_samples[cpu]);
    puts(", lost ");
    put_dec(sampler_lost[cpu]);
    puts(", errors ");
    put_dec(sampler_errors[cpu]);
    puts("\n");
    return stop_failed || sampler_errors[cpu] ? 1 : 0;
}
