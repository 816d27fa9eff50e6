/* The ring half of the profile guests' sampler (ABI 1.4, docs/abi.md "The sample ring"): the
 * hypervisor writes each sample as a record into a per-vCPU ring and re-arms counter 0 itself
 * from the period given at RING_INIT; the PMU VIRQ comes once per batch (watermark or latency)
 * and its handler only notes that records are ready. The shipping side (the profiler's idle
 * loop, a workload between its chunks) acquires the head and ships a struct ring_batch that
 * names the unread bytes [tail, head) of the data area; the VMM copies and decodes them, and the
 * guest then releases tail = head. The guest never copies a record: at emulated CPL0 (this host)
 * each copied word costs ~0.5 us, which bounded the page path at ~620 samples/s per pCPU. */
#include "profile.h"

/* One vCPU's ring area: the control page, then the data pages (physically contiguous: the
 * guest's RAM is identity-mapped, and a static array is one run of frames). */
struct ring_area {
    xenpmu_ring_control ctl;
    u8 data[RING_DATA_PAGES * 4096];
};
_Static_assert(sizeof(xenpmu_ring_control) == 4096, "control page");
static struct ring_area rings[MAX_CPUS] __attribute__((aligned(4096)));
static struct ring_batch ring_batches[MAX_CPUS];
static int ring_on[MAX_CPUS];
static u64 ring_tail[MAX_CPUS];
static volatile u32 ring_ready[MAX_CPUS];
static volatile u64 ring_virqs[MAX_CPUS], ring_handler_ticks[MAX_CPUS];
static u64 ring_ship_ticks[MAX_CPUS], ring_last_ship[MAX_CPUS];

int sampler_ring(void) { return ring_on[cpu_id()]; }
int ring_active(u32 cpu) { return ring_on[cpu]; }

int ring_ship(u32 cpu, u64 sequence, int always);
extern u64 shipped_sequence[MAX_CPUS];

/* The VIRQ in ring mode: records are ready, noted for the shipping side (emulated CPL0 is
 * slow: the handler does little). Only a ring at least a quarter full (the watermark's
 * wakeup) is shipped from here: a workload ships between its 20 ms chunks, and a ring left
 * full until then would lose samples, each loss raising the VIRQ again. */
void ring_virq(u32 cpu) {
    u64 t = rdtsc();
    ring_virqs[cpu]++;
    u64 unread = xenpmu_ring_head_acquire(&rings[cpu].ctl) - ring_tail[cpu];
    if (unread >= RING_DATA_PAGES * 4096 / 4) {
        if (ring_ship(cpu, shipped_sequence[cpu], 0)) shipped_sequence[cpu]++;
    } else {
        ring_ready[cpu] = 1;
    }
    ring_handler_ticks[cpu] += rdtsc() - t;
}

/* Registers this vCPU's ring with counter 0 re-armed every `period` cycles by the hypervisor.
 * 0: the ring is on; 1: the hypervisor has no ring (-EOPNOTSUPP: the caller uses the page);
 * -1: it refused the ring otherwise (a failure). The page must be registered first. */
int ring_start(u32 cpu, u64 period) {
    struct ring_area *r = &rings[cpu];
    memset(r, 0, sizeof(xenpmu_ring_control));
    r->ctl.config.data_pages = RING_DATA_PAGES;
    /* The watermark: a quarter of the area (~60 short-chain records), so that a burst between
     * two shipments of a workload (one per 20 ms chunk) never fills the ring; the latency
     * bound brings the profiler's batches sooner at low rates. */
    r->ctl.config.wakeup_bytes = RING_DATA_PAGES * 4096 / 4;
    r->ctl.config.max_latency_us = profile_config.ring_latency_us;
    r->ctl.config.period_gp[0] = period;
    __asm__ volatile("" ::: "memory"); /* the config before the call (the IN orders it too) */
    struct params p = {1, 4, (u64)&r->ctl >> 12, cpu, 0};
    i64 rc = hypercall(XENPMU_OP_RING_INIT, &p);
    if (rc == -XENPMU_EOPNOTSUPP) return 1;
    if (rc != 0) {
        puts("sampler: RING_INIT failed: -");
        put_dec((u64)-rc);
        puts("\n");
        return -1;
    }
    if (xenpmu_ring_info_check(&r->ctl) != 0 ||
        r->ctl.info.data_size != RING_DATA_PAGES * 4096) {
        puts("sampler: the ring's info is not what was asked for\n");
        return -1;
    }
    ring_tail[cpu] = 0;
    ring_on[cpu] = 1;
    ring_last_ship[cpu] = rdtsc();
    return 0;
}

/* Ships the unread records as batch `sequence` (`always`: even none, for the final producer
 * counters); 1 if it shipped, 0 if there was nothing to ship. */
int ring_ship(u32 cpu, u64 sequence, int always) {
    u64 t0 = rdtsc();
    struct ring_area *r = &rings[cpu];
    ring_ready[cpu] = 0;
    u64 head = xenpmu_ring_head_acquire(&r->ctl);
    u64 tail = ring_tail[cpu];
    ring_last_ship[cpu] = t0;
    if (head == tail && !always) return 0;
    struct ring_batch *b = &ring_batches[cpu];
    b->magic = RING_BATCH_MAGIC;
    b->data_size = r->ctl.info.data_size;
    b->record_max = r->ctl.info.record_max;
    b->sequence = sequence;
    b->data_gpa = (u64)r->data;
    b->tail = tail;
    b->head = head;
    b->tsc_khz = r->ctl.info.tsc_khz;
    /* Statistics: single loads after the head's acquire (they may be newer than it). */
    b->records = r->ctl.producer.records;
    b->lost = r->ctl.producer.lost;
    b->withheld = r->ctl.producer.withheld;
    b->wakeups = r->ctl.producer.wakeups;
    b->bad_tail = r->ctl.producer.bad_tail;
    b->virqs = ring_virqs[cpu];
    b->handler_ticks = ring_handler_ticks[cpu];
    b->ship_ticks = ring_ship_ticks[cpu];
    outl(PORT_BATCH, (u32)(u64)b); /* the VMM copies [tail, head) out during the outl */
    ring_tail[cpu] = head;
    xenpmu_ring_tail_release(&r->ctl, head);
    ring_ship_ticks[cpu] += rdtsc() - t0;
    return 1;
}

/* Whether this vCPU's ring wants shipping: a wakeup came, or 40 ms passed. */
int ring_ship_due(u32 cpu) { return ring_ready[cpu] || rdtsc() - ring_last_ship[cpu] > 100000000ul; }

/* Unregisters the ring (the counters must be stopped already: nothing is in flight after it).
 * 0 or 1 on failure. */
int ring_finish(u32 cpu) {
    struct params p = {1, 4, 0, cpu, 0};
    int failed = hypercall(XENPMU_OP_RING_FINISH, &p) != 0;
    ring_on[cpu] = 0;
    return failed;
}
