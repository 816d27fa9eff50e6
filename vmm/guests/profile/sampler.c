/* The sampling half of the profile guests: register the xenpmu page, program counter 0 to count
 * cycles (USR + OS, interrupt on overflow, a jittered period), and for each PMU VIRQ read the
 * sample from the page (identity, flags, every register), acknowledge and re-arm the counter
 * through the page's vendor area, flush. Samples wait in one of two batch buffers; the
 * non-interrupt side ships the full one (`outl` needs CPL0, so a CPL3 workload ships between
 * its chunks). In all mode the page carries the pCPU's system-wide context and samples of every
 * domain; in self and hv mode the vCPU's own context (and, for the privileged profiler in hv
 * mode, samples of the hypervisor). Every vCPU has its own page, buffers and state (indexed by
 * its LAPIC ID): a sample's VIRQ arrives on the vCPU whose page holds it. */
#include "profile.h"

xenpmu_page sampler_pages[MAX_CPUS] __attribute__((aligned(4096)));
static struct sample_batch batches[MAX_CPUS][2];
static volatile u32 filling[MAX_CPUS]; /* the batch the VIRQ hook appends to */
static volatile int stopping[MAX_CPUS];
u64 shipped_sequence[MAX_CPUS]; /* shared with ring.c's shipments */
static u64 last_ship_tsc[MAX_CPUS];
static u32 counter_msr;
static u64 rng[MAX_CPUS];
volatile u64 sampler_samples[MAX_CPUS], sampler_lost[MAX_CPUS], sampler_errors[MAX_CPUS];

/* The fewest TSC ticks a sample's handling took on each vCPU, up to its re-arm: its own cost,
 * without the host's preemptions (which the counted cycles leave out too). */
static u64 handler_ticks[MAX_CPUS];
/* Cumulative TSC ticks in the VIRQ handler and in shipping (reported in every batch). */
static u64 handler_total[MAX_CPUS], ship_total[MAX_CPUS];

/* ring.c: the ring half (ABI 1.4). */
int ring_start(u32 cpu, u64 period);
int ring_active(u32 cpu);
void ring_virq(u32 cpu);
int ring_ship(u32 cpu, u64 sequence, int always);
int ring_ship_due(u32 cpu);
int ring_finish(u32 cpu);

/* The ring's period: the configured one, at least 1000 cycles (as the page path's), and below
 * 2^31 (legacy Intel counters take 32 bits sign-extended; the ABI refuses more there). */
static u64 ring_period(void) {
    u64 period = profile_config.period;
    if (period < 1000) period = 1000;
    /* A guest sampling itself (USR + OS) below ~87 us of its own time per sample (~11.5 kHz
     * at this host's 2.3 GHz TSC) never finished on this host: with its kernel code emulated,
     * the timed source's kicks (at least 50 us apart) caught the vCPU in a loop that made no
     * progress (the page path's throttle prevents the same). Unresolved: the floor keeps
     * self-sampling rings out of it. */
    if (profile_config.role == ROLE_WORKLOAD && period < 200000) period = 200000;
    if (period > 0x7fffffffu) period = 0x7fffffffu;
    return period;
}

static u64 next_preset(u32 cpu) {
    u64 *r = &rng[cpu];
    if (*r == 0) *r = 0x2545f4914f6cdd1dul ^ ((u64)cpu << 32); /* distinct streams per vCPU */
    *r ^= *r << 13;
    *r ^= *r >> 7;
    *r ^= *r << 17;
    u64 j = profile_config.jitter;
    u64 period = profile_config.period - j / 2 + (*r & j);
    if (period < 1000) period = 1000; /* a PMI costs far more than this */
    /* Throttle (as perf does): a period shorter than a few times this handler's own cost
     * (counted too: USR + OS) would sample the handler back to back and never let the
     * sampled code, or the shipping, run. */
    u64 floor = 4 * handler_ticks[cpu];
    if (floor > (1ul << 29)) floor = 1ul << 29;
    if (period < floor) period = floor + (*r & j); /* still jittered */
    /* Legacy Intel counters take 32 bits sign-extended: periods stay below 2^31. */
    return (0 - period) & (intel && !fw_write ? 0xfffffffful : mask48());
}

static void take_sample(void) {
    u64 entered = rdtsc();
    u32 cpu = cpu_id();
    xenpmu_page *pg = &sampler_pages[cpu];
    __asm__ volatile("" ::: "memory"); /* the hypervisor wrote the page */
    if (xenpmu_page_check(pg) != 0) {
        sampler_errors[cpu]++;
        return;
    }
    if (!(pg->pmu_flags & XENPMU_FLAG_CACHED)) return; /* already taken (the stop path) */
    struct sample_batch *b = &batches[cpu][filling[cpu]];
    if (b->count < BATCH_CAPACITY) {
        struct batch_sample *s = &b->samples[b->count++];
        s->domain_id = pg->identity.domain_id;
        s->vcpu_id = pg->identity.vcpu_id;
        s->pcpu_id = pg->identity.pcpu_id;
        s->flags = pg->pmu_flags;
        s->regs = pg->regs;
        /* The 1.2 details: the fixed part, then only the valid part of the chain (a copy at
         * emulated CPL0 costs ~0.5 us per word here; most chains are a few entries). */
        const volatile xenpmu_sample_info *info = &pg->sample;
        s->tsc = info->tsc;
        s->tsc_khz = info->tsc_khz;
        s->sequence = info->sequence;
        s->overflowed = info->overflowed;
        u32 len = info->chain_len;
        if (len > BATCH_CHAIN_MAX) len = BATCH_CHAIN_MAX;
        s->chain_len = len;
        s->chain_end = info->chain_end;
        for (u32 i = 0; i < len; i++) s->callchain[i] = info->callchain[i];
        sampler_samples[cpu]++;
    } else {
        sampler_lost[cpu]++;
    }
    u64 took = rdtsc() - entered;
    if (handler_ticks[cpu] == 0 || took < handler_ticks[cpu]) handler_ticks[cpu] = took;
    int bad = page_rearm_counter0(pg, next_preset(cpu), stopping[cpu]);
    struct params p = {1, 0, 0, 0, 0};
    if (bad || hypercall(XENPMU_OP_FLUSH, &p) != 0) sampler_errors[cpu]++;
    handler_total[cpu] += rdtsc() - entered;
}

/* The PMU VIRQ: a sample in the page, or (ring mode) records ready in the ring. In ring mode
 * the hypervisor re-arms counter 0 with one fixed period, which aliases with the workloads'
 * periodic rounds (the page path jitters every period); one WRMSR per wakeup restarts the
 * period with the page path's jitter, so that each batch's samples start at a random phase. */
static void on_virq(void) {
    u32 cpu = cpu_id();
    if (ring_active(cpu)) {
        ring_virq(cpu);
        if (!stopping[cpu] && wrmsr_safe(counter_msr, next_preset(cpu))) sampler_errors[cpu]++;
    } else {
        take_sample();
    }
}

int sampler_start(void) {
    u32 cpu = cpu_id();
    int failed = 0;
    struct params ip = {1, 0, (u64)&sampler_pages[cpu] >> 12, cpu, 0};
    failed += hypercall(XENPMU_OP_INIT, &ip) != 0;
    failed += xenpmu_page_check(&sampler_pages[cpu]) != 0;
    sampler_pages[cpu].lapic_lvtpc = PMI_VECTOR;
    struct params lp = {1, 0, 0, 0, 0};
    failed += hypercall(XENPMU_OP_LVTPC_SET, &lp) != 0;
    /* Ring mode: the ring after the page (RING_INIT needs the page); the page alone if the
     * hypervisor has no ring (-EOPNOTSUPP). */
    if (profile_config.delivery == DELIVERY_RING) {
        int rc = ring_start(cpu, ring_period());
        failed += rc < 0;
    }
    virq_hook = on_virq;
    counter_msr = intel && fw_write ? INTEL_A_PMC0 : ctr_msr(0);
    if (has_global()) failed += wrmsr_safe(global_ctrl_msr(), 0);
    failed += wrmsr_safe(counter_msr, next_preset(cpu));
    failed += wrmsr_safe(ctl_msr(0), ev_cycles() | USR | OS | INT | EN);
    if (has_global()) failed += wrmsr_safe(global_ctrl_msr(), 1);
    last_ship_tsc[cpu] = rdtsc();
    return failed;
}

void sampler_ship(void) {
    u32 cpu = cpu_id();
    if (ring_active(cpu)) {
        /* Interrupts off: the VIRQ handler may ship too (a ring a quarter full). */
        __asm__ volatile("cli" ::: "memory");
        if (ring_ship(cpu, shipped_sequence[cpu], 0)) shipped_sequence[cpu]++;
        __asm__ volatile("sti" ::: "memory");
        last_ship_tsc[cpu] = rdtsc();
        return;
    }
    u64 t0 = rdtsc();
    __asm__ volatile("cli" ::: "memory");
    u32 full = filling[cpu];
    filling[cpu] = full ^ 1;
    __asm__ volatile("sti" ::: "memory");
    struct sample_batch *b = &batches[cpu][full];
    last_ship_tsc[cpu] = rdtsc();
    if (b->count == 0) return;
    b->magic = SAMPLE_BATCH_MAGIC;
    b->sequence = shipped_sequence[cpu]++;
    b->dropped = sampler_pages[cpu].dropped_samples;
    b->lost = sampler_lost[cpu];
    b->handler_ticks = handler_total[cpu];
    b->ship_ticks = ship_total[cpu];
    outl(PORT_BATCH, (u32)(u64)b);
    b->count = 0;
    ship_total[cpu] += rdtsc() - t0;
}

int sampler_ship_due(void) {
    u32 cpu = cpu_id();
    if (ring_active(cpu)) return ring_ship_due(cpu);
    return batches[cpu][filling[cpu]].count >= BATCH_CAPACITY / 2 ||
           rdtsc() - last_ship_tsc[cpu] > 100000000ul;
}

int sampler_stop(void) {
    u32 cpu = cpu_id();
    stopping[cpu] = 1;
    if (ring_active(cpu)) {
        /* Ring mode: no cached window, so the counters stop by WRMSR at once; RING_FINISH
         * then completes any sample in flight, and the last records and the producer's final
         * counters are shipped (the ring stays readable after it). */
        __asm__ volatile("cli" ::: "memory");
        int failed = wrmsr_safe(ctl_msr(0), 0);
        if (has_global()) failed += wrmsr_safe(global_ctrl_msr(), 0);
        failed += ring_finish(cpu);
        __asm__ volatile("sti" ::: "memory");
        if (ring_ship(cpu, shipped_sequence[cpu], 1)) shipped_sequence[cpu]++;
        return failed;
    }
    int failed = 1;
    __asm__ volatile("cli" ::: "memory");
    /* A sample cached in the page: take it, which also stops the counter through the page. A
     * PMU MSR write in the cached window faults, and a sample can arrive at any exit (even
     * with interrupts off: the hypervisor writes the page, the VIRQ waits), so a faulting
     * stop is retried after taking that sample. */
    for (int tries = 0; tries < 4 && failed; tries++) {
        take_sample();
        failed = wrmsr_safe(ctl_msr(0), 0);
        if (!failed && has_global()) failed = wrmsr_safe(global_ctrl_msr(), 0);
    }
    __asm__ volatile("sti" ::: "memory");
    sampler_ship();
    sampler_ship();
    return failed;
}
