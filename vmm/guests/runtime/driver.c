/* The guest PMU "driver" shared by the case files: vendor detection, counter MSRs, the
 * measured loop. */
#include "pmu.h"

volatile int intel;
volatile u32 gp, fixed, width;
volatile int fw_write, amd_ext, amd_v2;

void detect(void) {
    u32 a, b, c, d;
    cpuid(0, 0, &a, &b, &c, &d);
    intel = b == 0x756e6547; /* "Genu" */
    if (intel) {
        cpuid(0xa, 0, &a, &b, &c, &d);
        gp = (a >> 8) & 0xff;
        width = (a >> 16) & 0xff;
        fixed = d & 0x1f;
        cpuid(1, 0, &a, &b, &c, &d);
        u64 caps = 0;
        if (c & (1u << 15)) caps = rdmsr(INTEL_PERF_CAPS);
        fw_write = (caps >> 13) & 1;
    } else {
        cpuid(0x80000001, 0, &a, &b, &c, &d);
        amd_ext = (c >> 23) & 1;
        cpuid(0x80000000, 0, &a, &b, &c, &d);
        u32 max = a;
        if (max >= 0x80000022) {
            cpuid(0x80000022, 0, &a, &b, &c, &d);
            amd_v2 = a & 1;
            if (amd_v2) gp = b & 0xf;
        }
        if (!amd_v2) gp = amd_ext ? 6 : 4;
        width = 48;
    }
    puts(intel ? "vendor intel" : "vendor amd");
    puts(" gp=");
    put_dec(gp);
    puts(" fixed=");
    put_dec(fixed);
    puts(" width=");
    put_dec(width);
    puts(intel ? (fw_write ? " fw_write" : "") : (amd_v2 ? " perfmon_v2" : (amd_ext ? " ext_core" : " k7")));
    puts("\n");
}

/* The guest "driver": MSRs of GP counter i. */
u32 ctl_msr(u32 i) { return intel ? INTEL_EVTSEL0 + i : (amd_ext || amd_v2) ? AMD_CTL0 + 2 * i : AMD_K7_CTL0 + i; }
u32 ctr_msr(u32 i) { return intel ? INTEL_PMC0 + i : (amd_ext || amd_v2) ? AMD_CTL0 + 2 * i + 1 : AMD_K7_CTR0 + i; }
u64 ev_instructions(void) { return 0xc0; }
u64 ev_branches(void) { return intel ? 0xc4 : 0xc2; }
u64 ev_cycles(void) { return intel ? 0x3c : 0x76; }
int has_global(void) { return intel || amd_v2; }
u32 global_ctrl_msr(void) { return intel ? INTEL_GLOBAL_CTRL : AMD_GLOBAL_CTL; }
u32 global_status_msr(void) { return intel ? INTEL_GLOBAL_STATUS : AMD_GLOBAL_STATUS; }
u32 ack_msr(void) { return intel ? INTEL_GLOBAL_OVF_CTRL : AMD_GLOBAL_STATUS_CLR; }
u64 mask48(void) { return width >= 64 ? ~0ul : (1ul << width) - 1; }

/*
 * The measured sequence: `wrmsr` (msr <- on) enables counting, then n iterations of
 * `dec; jnz`, then two `mov`s and `wrmsr` (msr <- off). Under the precise source an
 * instruction is counted with the counter state after it retires, so the enabling WRMSR
 * counts and the disabling one does not: instructions = 2n + 3, branches = n.
 */
void measured(u32 msr, u64 on, u64 off, u64 n) {
    u32 lo = (u32)on, hi = (u32)(on >> 32);
    __asm__ volatile(
        "wrmsr\n\t"
        "1: dec %%rbx\n\t"
        "jnz 1b\n\t"
        "mov %%esi, %%eax\n\t"
        "mov %%edi, %%edx\n\t"
        "wrmsr\n\t"
        : "+b"(n), "+a"(lo), "+d"(hi)
        : "c"(msr), "S"((u32)off), "D"((u32)(off >> 32))
        : "memory", "cc");
}

/* Programs GP counter i with `sel` (EN included), runs the measured loop, returns the count. */
u64 count_gp(u32 i, u64 sel, u64 n) {
    wrmsr(ctr_msr(i), 0);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(i), sel);
        measured(global_ctrl_msr(), 1ul << i, 0, n);
    } else {
        measured(ctl_msr(i), sel, sel & ~EN, n);
    }
    wrmsr(ctl_msr(i), 0);
    return rdmsr(ctr_msr(i));
}

int page_rearm_counter0(xenpmu_page *pg, u64 preset, int stop) {
    if (intel) {
        xenpmu_intel_ctxt c;
        xenpmu_counter_pair pair;
        if (xenpmu_intel_ctxt_get(pg, &c) || xenpmu_intel_pair_get(pg, 0, &pair)) return 1;
        c.global_ovf_ctrl |= 1;
        pair.counter = preset;
        if (stop) pair.control = 0;
        return xenpmu_intel_ctxt_set(pg, &c) || xenpmu_intel_pair_set(pg, 0, &pair);
    }
    xenpmu_amd_ctxt c;
    if (xenpmu_amd_ctxt_get(pg, &c)) return 1;
    c.global_status &= ~1ul;
    return xenpmu_amd_ctxt_set(pg, &c) || xenpmu_amd_counter_set(pg, 0, preset) ||
           (stop && xenpmu_amd_ctrl_set(pg, 0, 0));
}
