/* Multi-vCPU and multi-domain conformance cases. */
#include "pmu.h"

/*
 * SMP cases (numbers 100..): every vCPU runs main(case, cpu) on its own VMM thread and pCPU
 * (its own software PMU model). vCPU 0 reports for everybody; the others return 0.
 */
static volatile u32 arrived[2], finished[2];
static volatile u64 smp_count[2], smp_other[2], smp_pmis[2];

static void barrier(volatile u32 *flags, u32 cpu) {
    flags[cpu] = 1;
    while (!(flags[0] && flags[1]))
        ;
}

static void smp_per_vcpu_counting(u32 cpu) {
    u64 n = cpu ? 1500 : 1000;
    barrier(arrived, cpu);
    smp_count[cpu] = count_gp(0, ev_instructions() | OS | EN, n);
    smp_other[cpu] = rdmsr(ctr_msr(1));
    barrier(finished, cpu);
    if (cpu) return;
    report_val("vcpu0 counter 0 = 2*1000+3 while vcpu1 counts too", smp_count[0] == 2003, smp_count[0], 2003);
    report_val("vcpu1 counter 0 = 2*1500+3 while vcpu0 counts too", smp_count[1] == 3003, smp_count[1], 3003);
    report("counter 1 untouched on both vCPUs", smp_other[0] == 0 && smp_other[1] == 0);
}

static void smp_per_vcpu_pmi(u32 cpu) {
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    barrier(arrived, cpu);
    u64 preset = (0 - (cpu ? 300ul : 100ul)) & (intel && !fw_write ? 0xfffffffful : mask48());
    u32 wmsr = intel && fw_write ? INTEL_A_PMC0 : ctr_msr(0);
    u64 sel = ev_instructions() | OS | EN | INT;
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(wmsr, preset);
        wrmsr(ctl_msr(0), sel);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        wrmsr(wmsr, preset);
        measured(ctl_msr(0), sel, 0, N);
    }
    wrmsr(ctl_msr(0), 0);
    smp_pmis[cpu] = pmi_per_cpu[cpu];
    barrier(finished, cpu);
    if (cpu) return;
    report_val("vcpu0 got exactly its own PMI", smp_pmis[0] == 1, smp_pmis[0], 1);
    report_val("vcpu1 got exactly its own PMI", smp_pmis[1] == 1, smp_pmis[1], 1);
}

/* Both vCPUs count across a migration to the other pCPU (the VMM context-switches them). */
static volatile u64 smp_newcpu[2];
static void smp_migration(u32 cpu) {
    u64 n = cpu ? 700 : 400;
    wrmsr(ctr_msr(0), 0);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(0), ev_instructions() | OS | EN);
        measured(global_ctrl_msr(), 1, 0, n);
    } else {
        measured(ctl_msr(0), ev_instructions() | OS | EN, ev_instructions() | OS, n);
    }
    smp_newcpu[cpu] = inl(PORT_MIGRATE);
    if (has_global())
        measured(global_ctrl_msr(), 1, 0, n);
    else
        measured(ctl_msr(0), ev_instructions() | OS | EN, ev_instructions() | OS, n);
    wrmsr(ctl_msr(0), 0);
    smp_count[cpu] = rdmsr(ctr_msr(0));
    barrier(finished, cpu);
    if (cpu) return;
    report("vcpu0 moved to pcpu1 and vcpu1 to pcpu0", smp_newcpu[0] == 1 && smp_newcpu[1] == 0);
    report_val("vcpu0 count survives the migration (2 x (2*400+3))", smp_count[0] == 2 * 803, smp_count[0], 2 * 803);
    report_val("vcpu1 count survives the migration (2 x (2*700+3))", smp_count[1] == 2 * 1403, smp_count[1], 2 * 1403);
}

const struct cpu_case_entry smp_cases[] = {
    {"smp_per_vcpu_counting", smp_per_vcpu_counting},
    {"smp_per_vcpu_pmi", smp_per_vcpu_pmi},
    {"smp_migration", smp_migration},
};
const u32 smp_case_count = sizeof(smp_cases) / sizeof(smp_cases[0]);

/*
 * Domain cases (numbers 300..): one single-vCPU VM per domain (domain 0 privileged, domain 1
 * not), both time-sliced by the VMM on ONE thread = one pCPU, switched every few exits through
 * Vpmu::context_switch. main(case, domain); each domain reports its own checks. Domain d
 * programs only GP counter d, over its own loop length.
 */
static void count_twice_across_a_switch(u32 i, u64 n) {
    /* Counter i counts instructions over two measured loops with a switch between them. */
    u64 sel = ev_instructions() | OS | EN;
    wrmsr(ctr_msr(i), 0);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(i), sel);
        measured(global_ctrl_msr(), 1ul << i, 0, n);
    } else {
        measured(ctl_msr(i), sel, sel & ~EN, n);
    }
    /* Counting off: wait until the other domain has run (scheduled out and back in). */
    u32 s = inl(PORT_SLICES);
    while (inl(PORT_SLICES) == s)
        ;
    if (has_global())
        measured(global_ctrl_msr(), 1ul << i, 0, n);
    else
        measured(ctl_msr(i), sel, sel & ~EN, n);
    wrmsr(ctl_msr(i), 0);
}

static void dom_shared_pcpu(u32 dom) {
    u32 mine = dom, other = 1 - dom;
    u64 n = dom ? 700 : 400;
    u32 before = inl(PORT_SLICES);
    u64 ins = count_gp(mine, ev_instructions() | OS | EN, n);
    u64 br = count_gp(mine, ev_branches() | OS | EN, n);
    u32 slices = inl(PORT_SLICES) - before;
    report_val(dom ? "dom1 gp1 instructions = 2*700+3 (own loop only)" : "dom0 gp0 instructions = 2*400+3 (own loop only)",
               ins == 2 * n + 3, ins, 2 * n + 3);
    report_val(dom ? "dom1 gp1 branches = 700" : "dom0 gp0 branches = 400", br == n, br, n);
    report("switched out and back in during the measurement", slices >= 2);
    u64 o = rdmsr(ctr_msr(other)), oc = rdmsr(ctl_msr(other));
    report("the other domain's counter reads 0 here", o == 0 && oc == 0);
    count_twice_across_a_switch(mine, n);
    u64 two = rdmsr(ctr_msr(mine));
    report_val("count survives a switch while disabled (2 x (2n+3))", two == 2 * (2 * n + 3), two, 2 * (2 * n + 3));
    /* FEATURE_SET (privileged op) with the current features: allowed only for domain 0. */
    struct params p = {1, 0, 0, 0, 0};
    i64 r = hypercall(2 /* feature get */, &p);
    report_val("FEATURE_GET", r == 0, (u64)r, 0);
    struct params q = {1, 0, p.val, 0, 0};
    r = hypercall(3 /* feature set */, &q);
    if (dom == 0)
        report_val("dom0 (privileged) FEATURE_SET allowed", r == 0, (u64)r, 0);
    else
        report_val("dom1 FEATURE_SET -EPERM (unprivileged)", r == -1, (u64)-r, 1);
}

/* Each domain's overflow PMI goes to its own VM's LAPIC, exactly once, although the two
 * domains' counters overflow on the same (shared) pCPU model. */
static void dom_shared_pcpu_pmi(u32 dom) {
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    u64 period = dom ? 300 : 100;
    u64 preset = (0 - period) & (intel && !fw_write ? 0xfffffffful : mask48());
    u32 wmsr = intel && fw_write ? INTEL_A_PMC0 + dom : ctr_msr(dom);
    u64 sel = ev_instructions() | OS | EN | INT;
    u32 before = inl(PORT_SLICES);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(wmsr, preset);
        wrmsr(ctl_msr(dom), sel);
        measured(global_ctrl_msr(), 1ul << dom, 0, N);
    } else {
        wrmsr(wmsr, preset);
        measured(ctl_msr(dom), sel, 0, N);
    }
    wrmsr(ctl_msr(dom), 0);
    u32 slices = inl(PORT_SLICES) - before;
    report_val(dom ? "dom1 got exactly its own PMI" : "dom0 got exactly its own PMI", pmi_count == 1, pmi_count, 1);
    report("switched out and back in while counting", slices >= 2);
    u64 c = rdmsr(ctr_msr(dom)) & mask48();
    /* 2N+3 counted from -period: wrapped, the rest after the wrap, plus the CPL0 PMI
     * handler's own instructions (about 20; the other domain's loop would add hundreds). */
    u64 want = 2 * N + 3 - period;
    report_val("counter wrapped, kept counting own loop (+ PMI handler < 40)", c >= want && c < want + 40, c, want);
    if (has_global()) {
        u64 st = rdmsr(global_status_msr());
        report_val("overflow status: own counter's bit only", st == (1ul << dom), st, 1ul << dom);
    }
}

const struct cpu_case_entry domain_cases[] = {
    {"two_domains_one_pcpu", dom_shared_pcpu},
    {"two_domains_one_pcpu_pmi", dom_shared_pcpu_pmi},
};
const u32 domain_case_count = sizeof(domain_cases) / sizeof(domain_cases[0]);
