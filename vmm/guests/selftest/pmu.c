/*
 * PMU conformance cases, modeled on kvm-unit-tests x86/pmu.c, for both vendor personalities.
 * The VMM runs one case per VM: main(case) runs case `case`, prints one PASS/FAIL line per
 * check and returns the number of failures (NO_CASE_STATUS: no such case; the numbers are vpmu-guest-protocol's).
 *
 * Counting is the VMM's precise mode: it single-steps CPL0 code while a counter is enabled,
 * so a measured loop of known instructions counts exactly.
 */
#include "pmu.h"

static void case_gp_counts_exactly(void) {
    for (u32 i = 0; i < gp; i++) {
        u64 ins = count_gp(i, ev_instructions() | OS | USR | EN, N);
        u64 br = count_gp(i, ev_branches() | OS | USR | EN, N);
        int ok = ins == 2 * N + 3 && br == N;
        if (!ok || i == 0 || i == gp - 1) {
            report_val(i == 0 ? "gp0 instructions = 2N+3" : "gpN instructions = 2N+3", ins == 2 * N + 3, ins, 2 * N + 3);
            report_val(i == 0 ? "gp0 branches = N" : "gpN branches = N", br == N, br, N);
        }
    }
    u64 a = count_gp(0, ev_instructions() | OS | EN, 500);
    u64 b = count_gp(0, ev_instructions() | OS | EN, 1500);
    report_val("instructions linear in N (delta 1000 iterations)", b - a == 2000, b - a, 2000);
}

static void case_disabled_does_not_count(void) {
    /* Selector without EN. */
    wrmsr(ctr_msr(0), 0);
    if (has_global()) {
        wrmsr(ctl_msr(0), ev_instructions() | OS | USR);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        measured(ctl_msr(0), ev_instructions() | OS | USR, 0, N);
    }
    report_val("selector EN=0 does not count", rdmsr(ctr_msr(0)) == 0, rdmsr(ctr_msr(0)), 0);
    if (has_global()) {
        /* Selector enabled, global enable of another counter only. */
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctr_msr(0), 0);
        wrmsr(ctl_msr(0), ev_instructions() | OS | USR | EN);
        measured(global_ctrl_msr(), 2, 0, N);
        wrmsr(ctl_msr(0), 0);
        report_val("global ctrl bit clear does not count", rdmsr(ctr_msr(0)) == 0, rdmsr(ctr_msr(0)), 0);
    }
    /* Unselected event: a counter selecting branches, no other counting. */
    u64 br = count_gp(1, ev_branches() | OS | EN, N);
    report_val("branch counter counts branches only", br == N, br, N);
}

static void case_os_usr(void) {
    u64 os = count_gp(0, ev_instructions() | OS | EN, N);
    u64 usr = count_gp(0, ev_instructions() | USR | EN, N);
    u64 none = count_gp(0, ev_instructions() | EN, N);
    report_val("OS-only counts CPL0 loop", os == 2 * N + 3, os, 2 * N + 3);
    report_val("USR-only does not count CPL0 loop", usr == 0, usr, 0);
    report_val("neither OS nor USR counts nothing", none == 0, none, 0);
}

static void case_absent_counter_gp(void) {
    u64 v;
    if (intel) {
        report("rdmsr PMC[gp] #GP", rdmsr_safe(INTEL_PMC0 + gp, &v) == 1 || gp == 8);
        report("wrmsr EVTSEL[gp] #GP", gp == 8 || wrmsr_safe(INTEL_EVTSEL0 + gp, ev_instructions() | EN) == 1);
        report("wrmsr GLOBAL_CTRL absent bit #GP", wrmsr_safe(INTEL_GLOBAL_CTRL, 1ul << 31) == 1);
        report("rdmsr FIXED_CTR[fixed] #GP", rdmsr_safe(INTEL_FIXED_CTR0 + fixed, &v) == 1 || fixed >= 4);
        report("rdmsr A_PMC0 #GP iff no FW_WRITE", rdmsr_safe(INTEL_A_PMC0, &v) == !fw_write);
    } else {
        if (gp < 6) report("rdmsr CTR[gp] #GP", rdmsr_safe(ctr_msr(gp), &v) == 1);
        report("rdmsr PerfMonV2 GLOBAL_CTL #GP iff no PerfMonV2", rdmsr_safe(AMD_GLOBAL_CTL, &v) == !amd_v2);
        if (amd_v2 && gp < 6) report("wrmsr GLOBAL_CTL absent bit #GP", wrmsr_safe(AMD_GLOBAL_CTL, 1ul << gp) == 1);
    }
    /* The other vendor's PMU MSRs are not this CPU's: #GP (never KVM's silent answer). */
    u32 other = intel ? AMD_K7_CTR0 : INTEL_PMC0;
    report("other vendor's counter MSR #GP", rdmsr_safe(other, &v) == 1);
    report("#GP handler saw the faulting RIP", last_gp_rip != 0);
    /* Not modelled by the backends; filtered so that KVM does not answer them: #GP. */
    report("PERF_GLOBAL_INUSE (0x392) #GP, never KVM's answer", rdmsr_safe(0x392, &v) == 1);
    report("PERF_METRICS (0x329) #GP, never KVM's answer", rdmsr_safe(0x329, &v) == 1);
}

static void case_reserved_bits_gp(void) {
    report("evtsel bit 32 #GP", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 63)) == 1 || !intel);
    if (intel) {
        report("evtsel AnyThread #GP", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 21)) == 1);
        report("evtsel PinControl #GP", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 19)) == 1);
        report("FIXED_CTR_CTRL AnyThread #GP", wrmsr_safe(INTEL_FIXED_CTR_CTRL, 0x4) == 1);
        report("OVF_CTRL uncore bit #GP", wrmsr_safe(INTEL_GLOBAL_OVF_CTRL, 1ul << 61) == 1);
    } else {
        report("ctl reserved bit 21 #GP", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 21)) == 1);
        report("ctl reserved bit 42 #GP", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 42)) == 1);
        report("ctl HostOnly #GP for a guest", wrmsr_safe(ctl_msr(0), ev_instructions() | (1ul << 41)) == 1);
    }
    u64 v = 0;
    rdmsr_safe(ctl_msr(0), &v);
    report_val("refused write left the selector unchanged", v == 0, v, 0);
}

static void case_global_status_ro(void) {
    if (!has_global()) {
        report_skip("no global status on this shape");
        return;
    }
    report("GLOBAL_STATUS write #GP", wrmsr_safe(global_status_msr(), 1) == 1);
    u64 v = 1;
    rdmsr_safe(global_status_msr(), &v);
    report_val("GLOBAL_STATUS still 0", v == 0, v, 0);
}

/* Preset to -n, count n+? instructions with or without INT; status bit, PMI iff INT. */
static void overflow_case(int with_int) {
    u64 n = 100;
    u64 before = pmi_count;
    lvtpc_in_handler = 0;
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    u64 preset = (0 - n) & (intel && !fw_write ? 0xfffffffful : mask48());
    u32 wmsr = intel && fw_write ? INTEL_A_PMC0 : ctr_msr(0);
    u64 sel = ev_instructions() | OS | EN | (with_int ? INT : 0);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(wmsr, preset);
        wrmsr(ctl_msr(0), sel);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        wrmsr(wmsr, preset);
        measured(ctl_msr(0), sel, 0, N);
    }
    u64 ctr = rdmsr(ctr_msr(0));
    u64 want = 2 * N + 3 - n;
    if (with_int) {
        /* The PMI handler runs at CPL0 with the counter still enabled (no freeze on PMI): its
         * instructions count too, so only a small excess is allowed. */
        report_val("INT: counter wrapped, kept counting (+ PMI handler)", ctr >= want && ctr <= want + 64, ctr, want);
    } else {
        report_val("no INT: counter wrapped and kept counting", ctr == want, ctr, want);
    }
    if (has_global()) {
        u64 st = rdmsr(global_status_msr());
        report_val(with_int ? "INT: overflow status bit 0 set" : "no INT: overflow status bit 0 set", st & 1, st, 1);
        wrmsr(ack_msr(), 1);
        st = rdmsr(global_status_msr());
        report_val("status cleared by ack", st == 0, st, 0);
    }
    u64 got = pmi_count - before;
    report_val(with_int ? "INT: exactly one PMI" : "no INT: no PMI", got == (u64)with_int, got, with_int);
    if (with_int) {
        u32 want_lvt = PMI_VECTOR | (intel ? LVT_MASKED : 0);
        report_val(intel ? "LVTPC masked on PMI (Intel)" : "LVTPC not masked on PMI (AMD)", lvtpc_in_handler == want_lvt, lvtpc_in_handler, want_lvt);
    }
    wrmsr(ctl_msr(0), 0);
}

static void case_overflow_pmi(void) {
    overflow_case(1);
    overflow_case(0);
    /* Masked LVTPC: overflow, status, but no PMI. */
    u64 before = pmi_count;
    apic_write(LAPIC_LVTPC, PMI_VECTOR | LVT_MASKED);
    wrmsr(ctr_msr(0), (0 - 10ul) & (intel ? 0xfffffffful : mask48()));
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(0), ev_instructions() | OS | EN | INT);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        measured(ctl_msr(0), ev_instructions() | OS | EN | INT, 0, N);
    }
    report_val("masked LVTPC: no PMI", pmi_count == before, pmi_count - before, 0);
    wrmsr(ctl_msr(0), 0);
    /* NMI delivery mode. */
    before = nmi_count;
    apic_write(LAPIC_LVTPC, LVT_NMI);
    wrmsr(ctr_msr(0), (0 - 10ul) & (intel ? 0xfffffffful : mask48()));
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(0), ev_instructions() | OS | EN | INT);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        measured(ctl_msr(0), ev_instructions() | OS | EN | INT, 0, N);
    }
    report_val("LVTPC NMI mode: one NMI", nmi_count - before == 1, nmi_count - before, 1);
    wrmsr(ctl_msr(0), 0);
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
}

static void case_write_widths(void) {
    u64 v;
    if (intel) {
        wrmsr(INTEL_PMC0, 0x80000000ul);
        v = rdmsr(INTEL_PMC0);
        u64 want = 0xffff80000000ul & mask48();
        report_val("legacy PMC write sign-extends bit 31", v == want, v, want);
        wrmsr(INTEL_PMC0, 0x123456789ul);
        v = rdmsr(INTEL_PMC0);
        report_val("legacy PMC write keeps bits 31:0 only", v == 0x23456789ul, v, 0x23456789ul);
        if (fw_write) {
            report("A_PMC write of width bits ok", wrmsr_safe(INTEL_A_PMC0, 0x123456789ul) == 0);
            v = rdmsr(INTEL_PMC0);
            report_val("A_PMC full-width value read back", v == 0x123456789ul, v, 0x123456789ul);
            report("A_PMC write above width #GP", wrmsr_safe(INTEL_A_PMC0, 1ul << width) == 1);
        } else {
            report("A_PMC #GP without FW_WRITE", wrmsr_safe(INTEL_A_PMC0, 1) == 1);
        }
    } else {
        report("counter write of 48 bits ok", wrmsr_safe(ctr_msr(0), 0xffffffffffful) == 0);
        v = rdmsr(ctr_msr(0));
        report_val("48-bit value read back", v == 0xffffffffffful, v, 0xffffffffffful);
        report("64-bit counter write ok", wrmsr_safe(ctr_msr(0), 0xffffff0123456789ul) == 0);
        v = rdmsr(ctr_msr(0));
        report_val("only its low 48 bits kept", v == 0xff0123456789ul, v, 0xff0123456789ul);
    }
}

static void case_amd_aliases(void) {
    if (intel) {
        report_skip("AMD aliases: not an AMD shape");
        return;
    }
    u64 v;
    wrmsr(AMD_K7_CTR0 + 2, 0x1234);
    v = rdmsr(ctr_msr(2));
    report_val("K7 PERF_CTR2 aliases counter 2", v == 0x1234, v, 0x1234);
    wrmsr(ctr_msr(3), 0x5678);
    v = rdmsr(AMD_K7_CTR0 + 3);
    report_val("counter 3 visible through K7 PERF_CTR3", v == 0x5678, v, 0x5678);
    wrmsr(AMD_K7_CTL0 + 1, ev_instructions() | OS);
    v = rdmsr(ctl_msr(1));
    report_val("K7 PERF_CTL1 aliases control 1", v == (ev_instructions() | OS), v, ev_instructions() | OS);
    wrmsr(AMD_K7_CTL0 + 1, 0);
    if (amd_ext || amd_v2) {
        report("counter 4 has no K7 alias (0xc0010008 not PMU)", 1);
        u64 n = count_gp(4, ev_instructions() | OS | EN, N);
        report_val("counter 4 (Fam15h MSR only) counts", n == 2 * N + 3, n, 2 * N + 3);
    }
    /* Counting through a K7 alias. */
    wrmsr(AMD_K7_CTR0, 0);
    if (amd_v2) {
        wrmsr(AMD_GLOBAL_CTL, 0);
        wrmsr(AMD_K7_CTL0, ev_instructions() | OS | EN);
        measured(AMD_GLOBAL_CTL, 1, 0, N);
    } else {
        measured(AMD_K7_CTL0, ev_instructions() | OS | EN, ev_instructions() | OS, N);
    }
    wrmsr(AMD_K7_CTL0, 0);
    v = rdmsr(AMD_K7_CTR0);
    report_val("counting programmed through K7 aliases", v == 2 * N + 3, v, 2 * N + 3);
}

static void case_fixed_counter(void) {
    if (!intel || fixed == 0) {
        report_skip("fixed counters: none on this shape");
        return;
    }
    wrmsr(INTEL_GLOBAL_CTRL, 0);
    wrmsr(INTEL_FIXED_CTR0, 0);
    wrmsr(INTEL_FIXED_CTR_CTRL, 0x1); /* OS */
    measured(INTEL_GLOBAL_CTRL, 1ul << 32, 0, N);
    wrmsr(INTEL_FIXED_CTR_CTRL, 0);
    u64 v = rdmsr(INTEL_FIXED_CTR0);
    report_val("fixed counter 0 counts instructions = 2N+3", v == 2 * N + 3, v, 2 * N + 3);
}

/* Control operations through the hypercall transport (docs/abi.md). */
static u8 shared_page[4096] __attribute__((aligned(4096)));

static void case_control_ops(void) {
    struct params p = {1, 0, 0, 0, 0};
    i64 r = hypercall(0 /* mode get */, &p);
    report_val("MODE_GET returns 0", r == 0, (u64)r, 0);
    report_val("mode is self", p.val == 1, p.val, 1);
    p.val = (u64)shared_page >> 12;
    r = hypercall(4 /* init */, &p);
    report_val("INIT with the page's frame number", r == 0, (u64)r, 0);
    u32 ver = *(volatile u32 *)shared_page;
    report("page header written by the hypervisor", ver != 0);
    p.val = (u64)shared_page >> 12;
    r = hypercall(4, &p);
    report_val("second INIT -EEXIST", r == -17, (u64)-r, 17);
    p.val = 0;
    r = hypercall(5 /* finish */, &p);
    report_val("FINISH", r == 0, (u64)r, 0);
    r = hypercall(99, &p);
    report("unknown op fails", r < 0);
}

static void case_unavailable_events(void) {
    /* The precise source's cycle model: one core cycle per retired instruction. */
    u64 ins = count_gp(0, 0xc0 | OS | EN, N);
    u64 cyc = count_gp(0, (intel ? 0x3c : 0x76) | OS | EN, N);
    report_val("core cycles count one per retired instruction under the precise source",
               cyc == ins && ins > 0, cyc, ins);
    if (!intel)
        return;
    u32 a, b, c, d;
    cpuid(0xa, 0, &a, &b, &c, &d);
    report("leaf 0xA: core cycles, instructions and branches available",
           (b & ((1u << 0) | (1u << 1) | (1u << 5))) == 0);
    report("leaf 0xA: ref cycles, LLC, branch misses unavailable", (b & 0x5c) == 0x5c);
    u64 ref = count_gp(0, 0x013c | OS | EN, N);
    report_val("unavailable reference cycles event counts nothing", ref == 0, ref, 0);
    report_val("fixed counters 0 (instructions) and 1 (core cycles) enumerated", fixed == 2,
               fixed, 2);
}

static void case_all_counters_together(void) {
    /* Every GP counter at once, alternating instructions and branches. */
    u64 all = 0;
    if (has_global()) wrmsr(global_ctrl_msr(), 0);
    for (u32 i = 0; i < gp; i++) {
        wrmsr(ctr_msr(i), 0);
        wrmsr(ctl_msr(i), (i & 1 ? ev_branches() : ev_instructions()) | OS | (has_global() ? EN : 0));
        all |= 1ul << i;
    }
    if (has_global()) {
        measured(global_ctrl_msr(), all, 0, N);
    } else {
        /* Without global control, enable counter 0 last through the measured WRMSR. */
        for (u32 i = 1; i < gp; i++) wrmsr(ctl_msr(i), (i & 1 ? ev_branches() : ev_instructions()) | OS | EN);
        wrmsr(ctr_msr(1), 0), wrmsr(ctr_msr(2), 0), wrmsr(ctr_msr(3), 0);
        measured(ctl_msr(0), ev_instructions() | OS | EN, ev_instructions() | OS, N);
        for (u32 i = 1; i < gp; i++) wrmsr(ctl_msr(i), 0);
    }
    int ok = 1;
    for (u32 i = 0; i < gp; i++) {
        u64 v = rdmsr(ctr_msr(i));
        wrmsr(ctl_msr(i), 0);
        if (!has_global() && i > 0) continue; /* they also counted the set-up instructions */
        u64 want = i & 1 ? N : 2 * N + 3;
        if (v != want) {
            report_val("counter of the set", 0, v, want);
            ok = 0;
        }
    }
    report("all GP counters count the same loop at once", ok);
    if (!has_global()) {
        u64 v1 = rdmsr(ctr_msr(1)), v2 = rdmsr(ctr_msr(2));
        report("without global control the others counted at least the loop", v1 >= N && v2 >= 2 * N);
    }
}

static void case_intel_mask_stays(void) {
    if (!intel) {
        report("LVTPC is not masked by a PMI on AMD (see overflow_pmi)", 1);
        return;
    }
    /* Two overflows without unmasking: Intel's PMI masks the LVTPC, the second is not delivered. */
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    u64 before = pmi_count;
    for (int k = 0; k < 2; k++) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctr_msr(0), 0xffffff00ul & 0xfffffffful);
        wrmsr(ctl_msr(0), ev_instructions() | OS | EN | INT);
        measured(global_ctrl_msr(), 1, 0, N);
        wrmsr(ack_msr(), 1);
    }
    report_val("second overflow while LVTPC masked: one PMI in total", pmi_count - before == 1, pmi_count - before, 1);
    report("LVTPC reads masked after the PMI", (apic_read(LAPIC_LVTPC) & LVT_MASKED) != 0);
    apic_write(LAPIC_LVTPC, PMI_VECTOR);
    wrmsr(global_ctrl_msr(), 0);
    wrmsr(ctr_msr(0), 0xffffff00ul);
    measured(global_ctrl_msr(), 1, 0, N);
    report_val("after unmasking, the next overflow is delivered", pmi_count - before == 2, pmi_count - before, 2);
    wrmsr(ctl_msr(0), 0);
}

/* Sample mode: PMIs go to the registered page, the VIRQ handler acknowledges and flushes. */
static volatile u64 seen_flags, seen_rip, flush_result = 1;
static volatile u32 seen_domain;

static void sample_handler(void) {
    volatile u8 *pg = shared_page;
    seen_flags = *(volatile u64 *)(pg + 32);
    seen_rip = *(volatile u64 *)(pg + 176);
    seen_domain = *(volatile u32 *)(pg + 16);
    if (intel)
        *(volatile u64 *)(pg + 256 + 32) |= 1; /* global_ovf_ctrl: acknowledge counter 0 */
    else
        *(volatile u64 *)(pg + 256 + 24) &= ~1ul; /* global_status: acknowledge counter 0 */
    struct params p = {1, 0, 0, 0, 0};
    flush_result = (u64)hypercall(7 /* flush */, &p);
}

static void case_sample_mode(void) {
    struct params p = {1, 0, (u64)shared_page >> 12, 0, 0};
    report("INIT", hypercall(4, &p) == 0);
    report("page LVTPC starts masked", (*(volatile u32 *)(shared_page + 40) & LVT_MASKED) != 0);
    *(volatile u32 *)(shared_page + 40) = PMI_VECTOR;
    struct params q = {1, 0, 0, 0, 0};
    report("LVTPC_SET (unmask)", hypercall(6, &q) == 0);
    virq_hook = sample_handler;
    u64 pmis = pmi_count;
    u64 preset = (0 - 100ul) & (intel ? 0xfffffffful : mask48());
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctr_msr(0), preset);
        wrmsr(ctl_msr(0), ev_instructions() | OS | EN | INT);
        measured(global_ctrl_msr(), 1, 0, N);
    } else {
        wrmsr(ctr_msr(0), preset);
        measured(ctl_msr(0), ev_instructions() | OS | EN | INT, 0, N);
    }
    wrmsr(ctl_msr(0), 0);
    report_val("one VIRQ (sample in the page)", virq_count == 1, virq_count, 1);
    report_val("no LVTPC PMI while a page is registered", pmi_count == pmis, pmi_count - pmis, 0);
    report("sample had XENPMU_FLAG_CACHED", seen_flags & 1);
    report("sample identity is DOMID_SELF", seen_domain == 0x7ff0);
    report("sample RIP is guest code", seen_rip >= 0x100000 && seen_rip < 0x200000);
    report_val("FLUSH succeeded", flush_result == 0, flush_result, 0);
    report("CACHED clear after flush", (*(volatile u64 *)(shared_page + 32) & 1) == 0);
    if (has_global()) {
        u64 st = rdmsr(global_status_msr());
        report_val("overflow acknowledged through the page", st == 0, st, 0);
    }
    struct params f = {1, 0, 0, 0, 0};
    report("FINISH", hypercall(5, &f) == 0);
    virq_hook = 0;
}

static void case_reset_state(void) {
    /* A fresh VM: counters and selectors 0, status 0, global enables at their RESET value. */
    int zero = 1;
    for (u32 i = 0; i < gp; i++) zero &= rdmsr(ctr_msr(i)) == 0 && rdmsr(ctl_msr(i)) == 0;
    report("counters and selectors are 0 after RESET", zero);
    if (has_global()) {
        u64 g = rdmsr(global_ctrl_msr()), want = (1ul << gp) - 1;
        report_val("GLOBAL_CTRL enables every GP counter after RESET", g == want, g, want);
        u64 st = rdmsr(global_status_msr());
        report_val("GLOBAL_STATUS 0 after RESET", st == 0, st, 0);
    }
    if (intel) {
        u64 f = rdmsr(INTEL_FIXED_CTR_CTRL);
        report_val("FIXED_CTR_CTRL 0 after RESET", f == 0, f, 0);
    }
}

static void case_status_set(void) {
    if (intel) {
        u32 a, b, c, d;
        cpuid(0xa, 0, &a, &b, &c, &d);
        int v4 = (a & 0xff) >= 4;
        int faulted = wrmsr_safe(0x391 /* GLOBAL_STATUS_SET */, 1);
        report(v4 ? "GLOBAL_STATUS_SET accepted (v4+)" : "GLOBAL_STATUS_SET #GP before v4", faulted == !v4);
        if (v4) {
            u64 st = rdmsr(INTEL_GLOBAL_STATUS);
            report_val("status set through GLOBAL_STATUS_SET", st == 1, st, 1);
            wrmsr(INTEL_GLOBAL_OVF_CTRL, 1);
            st = rdmsr(INTEL_GLOBAL_STATUS);
            report_val("OVF_CTRL clears it", st == 0, st, 0);
        }
    } else if (amd_v2) {
        report("PerfCntrGlobalStatusSet accepted", wrmsr_safe(0xc0000303u, 2) == 0);
        u64 st = rdmsr(AMD_GLOBAL_STATUS);
        report_val("status set through StatusSet", st == 2, st, 2);
        wrmsr(AMD_GLOBAL_STATUS_CLR, 2);
        st = rdmsr(AMD_GLOBAL_STATUS);
        report_val("StatusClr clears it", st == 0, st, 0);
    } else {
        report_skip("no global status on K7");
    }
}

static u64 rdpmc_ecx(u32 ecx) {
    u32 lo, hi;
    __asm__ volatile("rdpmc" : "=a"(lo), "=d"(hi) : "c"(ecx) : "memory");
    return (u64)hi << 32 | lo;
}

static void case_rdpmc(void) {
    /* With KVM's PMU off, KVM raises #GP for RDPMC; the VMM completes it through the vpmu (at the
     * #GP handler's breakpoint here, no counter being enabled): it reads what RDMSR of the
     * counter reads, and an absent counter still #GPs (the handler skips 2 bytes). */
    wrmsr(ctr_msr(0), 0x12345);
    u64 before = gp_faults;
    u64 v = rdpmc_ecx(0);
    report_val("RDPMC(0) reads the value written to counter 0", v == 0x12345, v, 0x12345);
    report_val("RDPMC(0) raises no #GP", gp_faults == before, gp_faults - before, 0);
    (void)rdpmc_ecx(64);
    report_val("RDPMC(64), no such counter, raises #GP", gp_faults == before + 1, gp_faults - before, 1);
}


/*
 * Instructions completed on the guest's behalf count once, as retired (as KVM's
 * kvm_pmu_instruction_retired does): inside a counted window, an RDMSR of a PMU MSR (a
 * user-space exit, answered by the vpmu), an RDPMC (performed by the VMM at its step) and a
 * CPUID (answered inside KVM). The window: the enabling WRMSR (counted, it retires with the
 * counter on), mov, rdmsr, mov, xor, rdpmc, mov, cpuid, mov, mov, xor, and the stopping WRMSR
 * (not counted): 11. RDMSR and RDPMC read the counter before they retire: 2 and 5.
 */
static void case_completed_instructions(void) {
    u64 sel = ev_instructions() | OS | USR | EN;
    wrmsr(ctr_msr(0), 0);
    u32 on_msr, off_lo;
    u64 on;
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(0), sel);
        on_msr = global_ctrl_msr();
        on = 1;
        off_lo = 0;
    } else {
        on_msr = ctl_msr(0);
        on = sel;
        off_lo = (u32)(sel & ~EN);
    }
    register u64 ctr __asm__("r8") = ctr_msr(0);
    register u64 stop_msr __asm__("r9") = on_msr;
    register u64 stop_lo __asm__("r10") = off_lo;
    u32 read_by_rdmsr, read_by_rdpmc;
    u32 lo = (u32)on, hi = (u32)(on >> 32), msr = on_msr;
    __asm__ volatile(
        "wrmsr\n\t"
        "mov %%r8d, %%ecx\n\t"
        "rdmsr\n\t"
        "mov %%eax, %[by_rdmsr]\n\t"
        "xor %%ecx, %%ecx\n\t"
        "rdpmc\n\t"
        "mov %%eax, %[by_rdpmc]\n\t"
        "cpuid\n\t"
        "mov %%r9d, %%ecx\n\t"
        "mov %%r10d, %%eax\n\t"
        "xor %%edx, %%edx\n\t"
        "wrmsr\n\t"
        : "+a"(lo), "+d"(hi), "+c"(msr), [by_rdpmc] "=&r"(read_by_rdpmc),
          [by_rdmsr] "=&r"(read_by_rdmsr)
        : "r"(ctr), "r"(stop_msr), "r"(stop_lo)
        : "rbx", "memory", "cc");
    wrmsr(ctl_msr(0), 0);
    u64 count = rdmsr(ctr_msr(0));
    report_val("window with RDMSR, RDPMC and CPUID counts 11", count == 11, count, 11);
    report_val("RDMSR inside the window reads 2 (before it retires)", read_by_rdmsr == 2,
               read_by_rdmsr, 2);
    report_val("RDPMC inside the window reads 5 (before it retires)", read_by_rdpmc == 5,
               read_by_rdpmc, 5);
    /* While counting the VMM performs RDPMC at its step; an absent counter still #GPs there. */
    u64 before = gp_faults;
    wrmsr(ctl_msr(0), sel);
    if (has_global()) wrmsr(global_ctrl_msr(), 1);
    (void)rdpmc_ecx(64);
    if (has_global()) wrmsr(global_ctrl_msr(), 0);
    wrmsr(ctl_msr(0), 0);
    u64 counted = rdmsr(ctr_msr(0));
    report_val("RDPMC(64) while counting raises #GP", gp_faults == before + 1, gp_faults - before, 1);
    report_val("and the counter kept counting", counted > count, counted, count + 1);
}

/*
 * Writing a running counter (kvm-unit-tests check_running_counter_wrmsr): the counter keeps
 * counting from the value written. The sequence is `wrmsr` (counter <- value) while it runs,
 * n iterations of `dec; jnz`, three `mov`s and the stopping `wrmsr`: under the precise source the
 * writing WRMSR is counted after it retires and the stopping one is not, so the counter ends at
 * value + 2n + 4.
 */
static void write_running_then_loop(u32 ctr, u64 value, u32 stop_msr, u64 stop, u64 n) {
    u32 lo = (u32)value, hi = (u32)(value >> 32);
    register u64 stop_reg __asm__("r8") = stop_msr;
    __asm__ volatile(
        "wrmsr\n\t"
        "1: dec %%rbx\n\t"
        "jnz 1b\n\t"
        "mov %%esi, %%eax\n\t"
        "mov %%edi, %%edx\n\t"
        "mov %%r8d, %%ecx\n\t"
        "wrmsr\n\t"
        : "+b"(n), "+a"(lo), "+d"(hi), "+c"(ctr)
        : "S"((u32)stop), "D"((u32)(stop >> 32)), "r"(stop_reg)
        : "memory", "cc");
}

static void run_and_write(u64 value, u64 n) {
    u64 sel = ev_instructions() | OS | USR | EN;
    wrmsr(ctr_msr(0), 0);
    if (has_global()) {
        wrmsr(global_ctrl_msr(), 0);
        wrmsr(ctl_msr(0), sel);
        wrmsr(global_ctrl_msr(), 1);
    } else {
        wrmsr(ctl_msr(0), sel);
    }
    /* Let it count something first, so that the write visibly replaces a running value. */
    for (volatile int k = 0; k < 50; k++) {
    }
    u32 stop_msr = has_global() ? global_ctrl_msr() : ctl_msr(0);
    write_running_then_loop(ctr_msr(0), value, stop_msr, has_global() ? 0 : sel & ~EN, n);
    wrmsr(ctl_msr(0), 0);
}

static void case_running_counter_write(void) {
    u64 n = N;
    if (has_global()) {
        wrmsr(ack_msr(), 1);
    }
    run_and_write(0, n);
    u64 v = rdmsr(ctr_msr(0));
    report_val("write 0 to a running counter: it counts on from 0 (2N+4)", v == 2 * n + 4, v, 2 * n + 4);

    /* Written to -1 while running: the writing WRMSR itself wraps it, the status bit is set. */
    run_and_write(mask48(), n);
    v = rdmsr(ctr_msr(0));
    report_val("write -1 to a running counter: wraps and counts on (2N+3)", v == 2 * n + 3, v, 2 * n + 3);
    if (has_global()) {
        u64 status = rdmsr(global_status_msr());
        report_val("write -1 to a running counter: overflow status bit 0", (status & 1) == 1, status, 1);
        wrmsr(ack_msr(), 1);
        status = rdmsr(global_status_msr());
        report_val("status bit cleared by the acknowledge", (status & 1) == 0, status, 0);
    }
}

void case_transport(void);

static const struct case_entry cases[] = {
    {"gp_counts_exactly", case_gp_counts_exactly},
    {"disabled_does_not_count", case_disabled_does_not_count},
    {"os_usr_filtering", case_os_usr},
    {"absent_counter_gp", case_absent_counter_gp},
    {"reserved_bits_gp", case_reserved_bits_gp},
    {"global_status_ro", case_global_status_ro},
    {"overflow_pmi", case_overflow_pmi},
    {"write_widths", case_write_widths},
    {"amd_aliases", case_amd_aliases},
    {"fixed_counter", case_fixed_counter},
    {"control_ops", case_control_ops},
    {"unavailable_events", case_unavailable_events},
    {"all_counters_together", case_all_counters_together},
    {"intel_lvtpc_mask_on_pmi", case_intel_mask_stays},
    {"sample_mode", case_sample_mode},
    {"reset_state", case_reset_state},
    {"global_status_set", case_status_set},
    {"rdpmc", case_rdpmc},
    {"running_counter_write", case_running_counter_write},
    {"completed_instructions_count_once", case_completed_instructions},
    {"transport", case_transport}, /* transport.c; the last: vpmu-cli's test runs it by index */
};

/* Starts a case: runtime set-up, the CASE line the VMM parses, vendor detection. */
static void begin_case(const char *name) {
    rt_init();
    puts("CASE ");
    puts(name);
    puts("\n");
    begin_records(name);
    detect();
}

int main(u64 which, u64 cpu) {
    rt_case = (u32)which;
    if (which == WATCHDOG_CASE) /* the VMM's watchdog test: spin at CPL0 without exits */
        for (;;)
            __asm__ volatile("" ::: "memory");
    if (which >= ALL_BASE) {
        /* All-mode cases: `cpu` is the domain; each case prints its own CASE line (domain 0
         * sets the mode first, before anybody touches the PMU). */
        which -= ALL_BASE;
        if (which >= all_case_count) {
            if (cpu == 0) puts("NOCASE\n");
            return NO_CASE_STATUS;
        }
        rt_init();
        all_cases[which].fn((u32)cpu);
    } else if (which >= DOMAIN_BASE) {
        /* Domain cases: `cpu` is the domain (each a one-vCPU VM, all on one pCPU). */
        which -= DOMAIN_BASE;
        if (which >= domain_case_count) {
            if (cpu == 0) puts("NOCASE\n");
            return NO_CASE_STATUS;
        }
        begin_case(domain_cases[which].name);
        domain_cases[which].fn((u32)cpu);
    } else if (which >= TIMED_BASE) {
        which -= TIMED_BASE;
        if (which >= timed_case_count) {
            puts("NOCASE\n");
            return NO_CASE_STATUS;
        }
        begin_case(timed_cases[which].name);
        timed_cases[which].fn();
    } else if (which >= SMP_BASE) {
        which -= SMP_BASE;
        if (which >= smp_case_count) {
            if (cpu == 0) puts("NOCASE\n");
            return NO_CASE_STATUS;
        }
        rt_init();
        if (cpu == 0) {
            puts("CASE ");
            puts(smp_cases[which].name);
            puts("\n");
            begin_records(smp_cases[which].name);
            detect();
        } else {
            /* Same enumeration, silently (the globals get the same values). */
            u32 a, b, c, d;
            cpuid(0, 0, &a, &b, &c, &d);
        }
        while (cpu == 1 && gp == 0)
            ; /* wait for vcpu0's detect() */
        smp_cases[which].fn((u32)cpu);
        if (cpu) return 0;
    } else {
        if (which >= sizeof(cases) / sizeof(cases[0])) {
            puts("NOCASE\n");
            return NO_CASE_STATUS;
        }
        begin_case(cases[which].name);
        cases[which].fn();
    }
    puts("END ");
    put_dec((u64)passes);
    puts(" passed, ");
    put_dec((u64)failures);
    puts(" failed\n");
    end_records();
    return failures;
}

