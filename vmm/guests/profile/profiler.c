/* The privileged profiling domain of `vpmu profile` (domain 0): sets the run's mode, samples
 * through its xenpmu page (all mode: every domain on the pCPU; hv mode: itself and the
 * hypervisor), and ships the samples to the VMM in batches. Between samples it yields the
 * pCPU. In self mode it only sets the mode and idles: the workloads sample themselves. */
#include "profile.h"

volatile struct profile_config profile_config;

int main(u64 arg, u64 domain) {
    (void)arg;
    (void)domain;
    if (profile_config.magic != PROFILE_CONFIG_MAGIC || profile_config.role != ROLE_PROFILER) {
        puts("profiler: no profile_config from the VMM\n");
        return 2;
    }
    /* Before anybody touches the PMU: the first thing the first domain does. */
    struct params m = {1, 0, profile_config.mode, 0, 0};
    i64 set = hypercall(XENPMU_OP_MODE_SET, &m);
    rt_init();
    detect();
    if (set != 0) {
        puts("profiler: MODE_SET failed: -");
        put_dec((u64)-set);
        puts("\n");
        return 3;
    }
    int sampling = profile_config.mode != XENPMU_MODE_SELF && profile_config.period != 0;
    if (sampling && sampler_start() != 0) {
        puts("profiler: cannot start sampling\n");
        return 4;
    }
    u64 t0 = rdtsc();
    /* All and self mode: block between samples, yielding the pCPU; the PMU VIRQ brings the
     * profiler back at once (the VMM runs a vCPU sent the VIRQ next). CPL0 code runs emulated
     * and slowly here, so an idle loop that kept the pCPU would cost the workloads dearly.
     * hv mode profiles the hypervisor, whose time the profiler's counters see only while the
     * profiler is the vCPU being served: it idles with port reads, each one VMM work. */
    int hv = profile_config.mode == XENPMU_MODE_HV;
    while (rdtsc() - t0 < profile_config.duration) {
        if (hv)
            (void)inl(PORT_SLICES);
        else
            outl(PORT_YIELD, 0);
        if (sampling && sampler_ship_due()) sampler_ship();
    }
    int stop_failed = sampling ? sampler_stop() : 0;
    u32 cpu = cpu_id();
    puts("profiler: samples ");
    put_dec(sampler_samples[cpu]);
    puts(", lost ");
    put_dec(sampler_lost[cpu]);
    puts(", dropped by the hypervisor ");
    put_dec(sampler_pages[cpu].dropped_samples);
    puts(", errors ");
    put_dec(sampler_errors[cpu]);
    puts("\n");
    return stop_failed || sampler_errors[cpu] ? 1 : 0;
}
