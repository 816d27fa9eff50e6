/* Timed-source conformance cases (numbers 200..). */
#include "pmu.h"

/*
 * Timed-source cases (numbers 200..): core/reference cycles from the TSC while the vCPU runs.
 * Cycles here are guest TSC ticks spent in KVM_RUN, so they track RDTSC minus the time the VMM
 * spent handling exits.
 */

static void spin(u64 iterations) {
    __asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(iterations) : : "cc");
}

static void timed_cycles_track_tsc(void) {
    wrmsr(ctr_msr(0), 0);
    if (has_global()) wrmsr(global_ctrl_msr(), 0);
    wrmsr(ctl_msr(0), ev_cycles() | OS | (has_global() ? EN : 0));
    u64 t0 = rdtsc();
    if (has_global())
        wrmsr(global_ctrl_msr(), 1);
    else
        wrmsr(ctl_msr(0), ev_cycles() | OS | EN);
    spin(20000);
    if (has_global())
        wrmsr(global_ctrl_msr(), 0);
    else
        wrmsr(ctl_msr(0), ev_cycles() | OS);
    u64 t1 = rdtsc();
    u64 c = rdmsr(ctr_msr(0));
    wrmsr(ctl_msr(0), 0);
    u64 dt = t1 - t0;
    puts("  cycles ");
    put_dec(c);
    puts(" tsc delta ");
    put_dec(dt);
    puts("\n");
    report("cycles counted while running", c > 0);
    report("cycles <= TSC delta of the window", c <= dt);
    /* Unhalted cycles count while the vCPU runs; the TSC also while the host runs other
     * threads on a loaded machine, so only a loose bound is load-independent. */
    report("cycles >= 1% of the TSC delta (the loop has no exits)", c >= dt / 100);
    u64 ins = count_gp(1, ev_instructions() | OS | EN, N);
    report_val("instructions do not count under the timed source", ins == 0, ins, 0);
    if (intel) {
        u32 a, b, cc, d;
        cpuid(0xa, 0, &a, &b, &cc, &d);
        report("leaf 0xA: cycles and ref cycles available, instructions not", (b & 0x7) == 0x2);
    }
}

static void timed_overflow_pmi(void) {
    const u64 period = 5000000; /* cycles = TSC ticks: about 2 ms */
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    u64 before = pmi_count;
    u64 preset = (0 - period) & (intel && !fw_write ? 0xfffffffful : mask48());
    u32 wmsr = intel && fw_write ? INTEL_A_PMC0 : ctr_msr(0);
    if (intel && !fw_write && period > 0x7fffffff) {
        report_skip("period too large for legacy writes");
        return;
    }
    if (has_global()) wrmsr(global_ctrl_msr(), 0);
    wrmsr(wmsr, preset);
    wrmsr(ctl_msr(0), ev_cycles() | OS | INT | (has_global() ? EN : 0));
    u64 t0 = rdtsc();
    if (has_global())
        wrmsr(global_ctrl_msr(), 1);
    else
        wrmsr(ctl_msr(0), ev_cycles() | OS | INT | EN);
    /* The loop makes no exit, so only the VMM's kick at the predicted overflow can bring the
     * PMI. How late it comes is host scheduling (a figure, printed below), not a property:
     * the wait is long enough for any load, and ends as soon as the PMI arrives. */
    const u64 patience = 2000 * period;
    while (pmi_count == before && rdtsc() - t0 < patience)
        ;
    /* Cycles only accrue while the vCPU is in KVM_RUN, a subset of the TSC's time. */
    u64 late = pmi_count == before ? patience : pmi_tsc - t0;
    if (has_global())
        wrmsr(global_ctrl_msr(), 0);
    wrmsr(ctl_msr(0), 0);
    puts("  PMI after ");
    put_dec(late);
    puts(" TSC ticks for a period of ");
    put_dec(period);
    puts("\n");
    report_val("one PMI from the cycles counter, while spinning without exits",
               pmi_count - before == 1, pmi_count - before, 1);
    report("PMI not before the period elapsed", late >= period);
    if (has_global()) {
        u64 st = rdmsr(global_status_msr());
        report("overflow status bit 0 set", st & 1);
        wrmsr(ack_msr(), 1);
    }
}

static void timed_fixed_cycles(void) {
    if (!intel) {
        report_skip("fixed counters: none on AMD");
        return;
    }
    u32 a, b, c, d;
    cpuid(0xa, 0, &a, &b, &c, &d);
    int has1 = (c & 2) || (d & 0x1f) >= 2;
    if (!has1) {
        report_skip("fixed counter 1 absent");
        return;
    }
    wrmsr(INTEL_GLOBAL_CTRL, 0);
    wrmsr(INTEL_FIXED_CTR0 + 1, 0);
    wrmsr(INTEL_FIXED_CTR_CTRL, 0x1 << 4); /* fixed 1: OS */
    wrmsr(INTEL_GLOBAL_CTRL, 1ul << 33);
    spin(20000);
    wrmsr(INTEL_GLOBAL_CTRL, 0);
    wrmsr(INTEL_FIXED_CTR_CTRL, 0);
    u64 v = rdmsr(INTEL_FIXED_CTR0 + 1);
    report("fixed counter 1 (core cycles) counts", v > 0);
}

const struct case_entry timed_cases[] = {
    {"timed_cycles_track_tsc", timed_cycles_track_tsc},
    {"timed_overflow_pmi", timed_overflow_pmi},
    {"timed_fixed_cycles", timed_fixed_cycles},
    {"timed_user_workload", timed_user_workload},
};

const u32 timed_case_count = sizeof(timed_cases) / sizeof(timed_cases[0]);
