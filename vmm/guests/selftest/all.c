/* all_mode_profiles_other_domains (timed source; cases 400..): three one-vCPU domains on one
 * pCPU. Domain 0 (privileged) is the profiler: it sets mode ALL, registers its page, programs a
 * cycles counter (its WRMSRs program the pCPU's system-wide context), and for each PMU VIRQ
 * reads the sample (identity, RIP, CPL, flags) through the xenpmu.h structs, re-arms the counter
 * in the page's vendor area and flushes. Domains 1 and 2 run distinct CPL3 workloads
 * (all_work.S) and never touch the PMU, except to check that a PMU MSR faults in all mode. The
 * profiler prints every sample (`SAMPLE dom vcpu rip cpl user`) for the VMM, which compares
 * them with its own record of what ran at each PMI (src/attribution.rs). */
#include "pmu.h"
#include "xenpmu.h"

extern char dom1_loop[], dom1_loop_end[], dom1_hot[], dom1_hot_end[];
extern char dom2_loop[], dom2_loop_end[], dom2_hot[], dom2_hot_end[];
u64 dom1_loop_fn(u64 deadline) __asm__("dom1_loop");
u64 dom2_loop_fn(u64 deadline) __asm__("dom2_loop");

#define ALL_PERIOD 1000000ul    /* + 0..4.2 M ticks of jitter: 0.4-2.1 ms, over 1 ms slices */
#define ALL_JITTER 0x3ffffful
#define PROFILE_TICKS 400000000ul /* the profiler samples at least ~0.16 s of TSC */
/* ... and on until each workload domain gave MIN_USER user samples (how long that takes is
 * host scheduling: a loaded host runs the workload domains' threads less often), within a
 * cap far beyond any load seen. */
#define MIN_USER 4
#define PROFILE_TICKS_CAP (40 * PROFILE_TICKS)
#define GUEST_TICKS 600000000ul   /* the workloads outlast it */
#define MAX_ALL 1024

static xenpmu_page prof_page __attribute__((aligned(4096)));
static u8 all_stack[16384] __attribute__((aligned(16)));
static volatile u32 s_dom[MAX_ALL], s_vcpu[MAX_ALL];
static volatile u64 s_rip[MAX_ALL];
static volatile u8 s_cpl[MAX_ALL], s_user[MAX_ALL];
static volatile u64 n_samples, bad_pages, rearm_errors, flush_errors, stopping;
static u64 arng = 0x2545f4914f6cdd1dul;

static u64 all_preset(void) {
    arng ^= arng << 13;
    arng ^= arng >> 7;
    arng ^= arng << 17;
    return (0 - (ALL_PERIOD + (arng & ALL_JITTER))) & mask48();
}

/* The VIRQ hook: one sample is cached in the page. */
static void take_sample(void) {
    xenpmu_page *pg = &prof_page;
    __asm__ volatile("" ::: "memory"); /* the hypervisor wrote the page */
    if (xenpmu_page_check(pg) != 0) {
        bad_pages++;
        return;
    }
    if (!(pg->pmu_flags & XENPMU_FLAG_CACHED)) return; /* already taken (stop path) */
    u64 i = n_samples++;
    if (i < MAX_ALL) {
        s_dom[i] = pg->identity.domain_id;
        s_vcpu[i] = pg->identity.vcpu_id;
        s_rip[i] = pg->regs.rip;
        s_cpl[i] = pg->regs.cpl;
        s_user[i] = (pg->pmu_flags & XENPMU_FLAG_SAMPLE_USER) != 0;
    }
    /* Acknowledge counter 0's overflow and re-arm it (or stop it) in the vendor area. */
    int bad = page_rearm_counter0(pg, all_preset(), stopping);
    if (bad) rearm_errors++;
    struct params p = {1, 0, 0, 0, 0};
    if (hypercall(XENPMU_OP_FLUSH, &p) != 0) flush_errors++;
}

static int in(const char *lo, const char *hi, u64 ip) { return ip >= (u64)lo && ip < (u64)hi; }


/* User (CPL3) samples of `dom` recorded so far. */
static u64 user_samples(u32 dom) {
    u64 n = n_samples < MAX_ALL ? n_samples : MAX_ALL, k = 0;
    for (u64 i = 0; i < n; i++)
        if (s_dom[i] == dom && s_cpl[i] == 3) k++;
    return k;
}

static void profiler(void) {
    struct params m = {1, 0, XENPMU_MODE_ALL, 0, 0};
    i64 mode = hypercall(XENPMU_OP_MODE_SET, &m); /* before anybody touches the PMU */
    puts("CASE all_mode_profiles_other_domains\n");
    begin_records("all_mode_profiles_other_domains");
    detect();
    report_val("MODE_SET all from the privileged domain", mode == 0, (u64)mode, 0);
    struct params ip = {1, 0, (u64)&prof_page >> 12, 0, 0};
    report("INIT the profiler's page", hypercall(XENPMU_OP_INIT, &ip) == 0);
    report("page header valid", xenpmu_page_check(&prof_page) == 0);
    prof_page.lapic_lvtpc = PMI_VECTOR;
    struct params lp = {1, 0, 0, 0, 0};
    report("LVTPC_SET (unmask)", hypercall(XENPMU_OP_LVTPC_SET, &lp) == 0);
    virq_hook = take_sample;
    u32 counter = intel && fw_write ? INTEL_A_PMC0 : ctr_msr(0);
    if (has_global()) wrmsr(global_ctrl_msr(), 0);
    wrmsr(counter, all_preset());
    wrmsr(ctl_msr(0), ev_cycles() | USR | OS | INT | EN);
    if (has_global()) wrmsr(global_ctrl_msr(), 1);
    u64 t0 = rdtsc();
    /* Idle: each port read is an exit, so the profiler gives the pCPU up after a few. */
    for (;;) {
        u64 t = rdtsc() - t0;
        /* Never more samples than the buffer keeps: every one is printed and checked. */
        if (t >= PROFILE_TICKS_CAP || n_samples >= MAX_ALL - 16) break;
        if (t >= PROFILE_TICKS && user_samples(1) >= MIN_USER && user_samples(2) >= MIN_USER)
            break;
        (void)inl(PORT_SLICES);
    }
    stopping = 1;
    __asm__ volatile("cli" ::: "memory");
    /* A sample still cached: take it, and stop the counter through the page. One may also be
     * published between that and the stopping WRMSR, which the cached window then refuses
     * (#GP): take that one too and stop again. Once the control is 0 nothing overflows. */
    int stop_gp = 1;
    for (int tries = 0; tries < 16 && stop_gp; tries++) {
        take_sample();
        stop_gp = wrmsr_safe(ctl_msr(0), 0);
        if (!stop_gp && has_global()) stop_gp = wrmsr_safe(global_ctrl_msr(), 0);
    }
    __asm__ volatile("sti" ::: "memory");

    u64 n = n_samples < MAX_ALL ? n_samples : MAX_ALL;
    u64 d1 = 0, d2 = 0, self = 0, other = 0, u1 = 0, u2 = 0, outside = 0, flag_bad = 0;
    u64 self_user = 0, bad_vcpu = 0;
    for (u64 i = 0; i < n; i++) {
        puts("SAMPLE ");
        put_dec(s_dom[i]);
        puts(" ");
        put_dec(s_vcpu[i]);
        puts(" ");
        put_hex(s_rip[i]);
        puts(" ");
        put_dec(s_cpl[i]);
        puts(" ");
        put_dec(s_user[i]);
        puts("\n");
        u64 rip = s_rip[i];
        int user = s_cpl[i] == 3;
        if (s_user[i] != user) flag_bad++;
        if (s_vcpu[i] != 0) bad_vcpu++;
        if (s_dom[i] == 1) {
            d1++;
            if (user) {
                u1++;
                if (!in(dom1_loop, dom1_loop_end, rip) && !in(dom1_hot, dom1_hot_end, rip)) outside++;
            }
        } else if (s_dom[i] == 2) {
            d2++;
            if (user) {
                u2++;
                if (!in(dom2_loop, dom2_loop_end, rip) && !in(dom2_hot, dom2_hot_end, rip)) outside++;
            }
        } else if (s_dom[i] == XENPMU_DOMID_SELF) {
            self++;
            if (user) self_user++;
        } else {
            other++;
        }
    }
    puts("PROFILE samples ");
    put_dec(n_samples);
    puts(": dom1 ");
    put_dec(d1);
    puts(" (user ");
    put_dec(u1);
    puts("), dom2 ");
    put_dec(d2);
    puts(" (user ");
    put_dec(u2);
    puts("), self ");
    put_dec(self);
    puts(", other ");
    put_dec(other);
    puts("; dropped ");
    put_dec(prof_page.dropped_samples);
    puts("; VIRQs ");
    put_dec(virq_count);
    puts("\n");
    report_val("samples of domain 1", d1 > 0, d1, 1);
    report_val("samples of domain 2", d2 > 0, d2, 1);
    report_val("user samples of domains 1 and 2 (CPL3 workloads)", u1 > 0 && u2 > 0, u1 + u2, 1);
    report_val("every user sample's RIP is in its own domain's workload", outside == 0, outside, 0);
    report_val("no sample of another domain id", other == 0, other, 0);
    report_val("no user sample of the profiler itself", self_user == 0, self_user, 0);
    report_val("SAMPLE_USER flag = (CPL == 3)", flag_bad == 0, flag_bad, 0);
    report_val("every sample's vcpu_id is 0", bad_vcpu == 0, bad_vcpu, 0);
    report_val("page checks and vendor-area edits succeeded", bad_pages + rearm_errors == 0,
               bad_pages + rearm_errors, 0);
    report_val("every FLUSH succeeded", flush_errors == 0, flush_errors, 0);
    report("counter stopped by WRMSR after the last flush", stop_gp == 0);
    report_val("at most MAX_ALL samples (all printed)", n_samples <= MAX_ALL, n_samples, MAX_ALL);
}

static void workload(u32 dom) {
    u64 t0 = rdtsc();
    u64 rounds = user_call(dom == 1 ? dom1_loop_fn : dom2_loop_fn, t0 + GUEST_TICKS,
                           all_stack + sizeof(all_stack));
    puts("rounds ");
    put_dec(rounds);
    puts("\n");
    report("the CPL3 workload ran and returned", rounds > 0);
    /* All mode: an unprivileged domain has no vPMU; its PMU MSRs fault. */
    u32 a, b, c, d;
    cpuid(0, 0, &a, &b, &c, &d);
    u32 msr = b == 0x756e6547 ? INTEL_PMC0 : 0xC0010004u;
    u64 v = 0;
    report("an unprivileged domain's PMU MSR read #GPs in all mode", rdmsr_safe(msr, &v) == 1);
}

static void all_mode_profiles_other_domains(u32 dom) {
    if (dom == 0)
        profiler();
    else
        workload(dom);
}

const struct cpu_case_entry all_cases[] = {
    {"all_mode_profiles_other_domains", all_mode_profiles_other_domains},
};
const u32 all_case_count = sizeof(all_cases) / sizeof(all_cases[0]);
