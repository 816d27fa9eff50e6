/* The hostile domain where it has a vPMU (self and hv mode; docs/abi.md "The page" and "The
 * sample ring"): each round registers its page and rings, attacks both (registrations twice,
 * bad configurations, a ring over its page or its code, a period-1 ring), floods a ring with
 * PMIs while its LVTPC is masked, plays a hostile consumer (tails past head, odd, more than
 * the area behind, moved back) and checks every record below head, and tears it all down. */
#include "hostile.h"

#define RING_PAGES 4
#define RING_BYTES (RING_PAGES * 4096u)
#define POISON 0xa5a5a5a5a5a5a5a5ul
/* The consumer's ring period: ~0.4 ms at this host's 2.3 GHz (the flood's FLOOD_PARTS CPL3
 * parts take a few). */
#define RING_PERIOD 1000000

struct hostile_ring {
    xenpmu_ring_control ctl;
    u8 data[RING_BYTES];
};
static struct hostile_ring rings[MAX_CPUS] __attribute__((aligned(4096)));
static u8 pages[MAX_CPUS][4096] __attribute__((aligned(4096)));
static int code_checked[MAX_CPUS];
static u64 last_sequence[MAX_CPUS];
extern char _start[];

u64 hostile_page_frame(u32 cpu) { return (u64)pages[cpu] >> 12; }
static u64 ring_frame(u32 cpu) { return (u64)&rings[cpu].ctl >> 12; }

static void config(xenpmu_ring_config *c, u64 period) {
    memset(c, 0, sizeof(*c));
    c->data_pages = RING_PAGES;
    c->max_latency_us = 1000;
    c->period_gp[0] = period;
}

/* The bad configurations: each must be refused with -EINVAL. */
static const char *const bad_names[] = {
    "data_pages 3",          "data_pages 0",           "data_pages 512",
    "wakeup_bytes > size",   "flags 1",                "reserved0",
    "reserved1",             "period 2^(w-1)",         "period 2^64-1",
    "an absent counter's period", "a fixed period the PMU lacks",
};
#define BAD_CONFIGS (sizeof(bad_names) / sizeof(bad_names[0]))

static void make_bad(xenpmu_ring_config *c, u32 i) {
    struct pmu_shape *s = &hostile_pmu;
    switch (i) {
    case 0: c->data_pages = 3; break;
    case 1: c->data_pages = 0; break;
    case 2: c->data_pages = 2 * XENPMU_RING_MAX_DATA_PAGES; break;
    case 3: c->wakeup_bytes = RING_BYTES + 8; break;
    case 4: c->flags = 1; break;
    case 5: c->_reserved0[3] = 1; break;
    case 6: c->_reserved1[11] = 1; break;
    case 7: c->period_gp[0] = 1ul << (s->width - 1); break;
    case 8: c->period_gp[0] = ~0ul; break;
    case 9: c->period_gp[s->gp < XENPMU_RING_GP_PERIODS ? s->gp : 0] =
                s->gp < XENPMU_RING_GP_PERIODS ? 1000 : ~0ul;
        break;
    default:
        /* AMD has no fixed counters: any fixed period is refused; Intel lacks those past its
         * count (or, with all four, the period is out of range). */
        if (!s->intel)
            c->period_fixed[0] = 1000;
        else if (s->fixed < XENPMU_RING_FIXED_PERIODS)
            c->period_fixed[s->fixed] = 1000;
        else
            c->period_fixed[0] = ~0ul;
        break;
    }
}

/* Fills what a successful RING_INIT writes (info, producer, consumer) with a pattern, to see
 * that a refused one wrote nothing. */
static void poison(xenpmu_ring_control *ctl) {
    memset(&ctl->info, 0xa5, sizeof(ctl->info) + sizeof(ctl->producer) + sizeof(ctl->consumer));
}

static void check_poison(u32 cpu, const xenpmu_ring_control *ctl, const char *what) {
    const u64 *w = (const u64 *)&ctl->info;
    for (u32 i = 0; i < (sizeof(ctl->info) + sizeof(ctl->producer) + sizeof(ctl->consumer)) / 8;
         i++)
        if (w[i] != POISON) violation(cpu, what, w[i], POISON);
}

static u64 page_sum(const void *p) {
    const u64 *w = p;
    u64 sum = 0;
    for (u32 i = 0; i < 512; i++) sum = sum * 31 + w[i];
    return sum;
}

/* Reads every record in [tail, head) and checks it as a consumer must (xenpmu_ring_next), and
 * that sample sequence numbers only grow; then releases the tail. Returns the new tail. */
static u64 walk(u32 cpu, struct hostile_ring *r, u64 tail) {
    struct hostile_stats *h = &hostile_stats[cpu];
    u64 head = xenpmu_ring_head_acquire(&r->ctl);
    if (head % 8) violation(cpu, "head not a multiple of 8", head, tail);
    if (head - tail > RING_BYTES)
        violation(cpu, "head more than the area ahead of tail", head, tail);
    while (tail != head) {
        const xenpmu_record_header *rec;
        int rc = xenpmu_ring_next(r->data, RING_BYTES, r->ctl.info.record_max, tail, head, &rec);
        if (rc != 0) violation(cpu, "a malformed record below head", (u64)rc, tail);
        if (rec->kind == XENPMU_RECORD_SAMPLE) {
            const xenpmu_ring_sample *s = (const xenpmu_ring_sample *)rec;
            if (s->sequence <= last_sequence[cpu])
                violation(cpu, "a sample's sequence went back", s->sequence, last_sequence[cpu]);
            last_sequence[cpu] = s->sequence;
            h->records++;
        } else if (rec->kind == XENPMU_RECORD_LOST) {
            const xenpmu_ring_lost *l = (const xenpmu_ring_lost *)rec;
            if (l->lost == 0 || l->sequence <= last_sequence[cpu])
                violation(cpu, "a lost record's count or sequence", l->sequence, l->lost);
            last_sequence[cpu] = l->sequence;
            h->lost += l->lost;
        }
        tail += rec->size;
    }
    xenpmu_ring_tail_release(&r->ctl, tail);
    return tail;
}

/* FLOOD_PARTS CPL3 parts with counter 0 counting user cycles from -1 (the first PMI at
 * once, then one per ring period). */
#define FLOOD_PARTS 8
#define FLOOD_PERIOD 300000
static void flood(u32 cpu) {
    struct pmu_shape *s = &hostile_pmu;
    u64 sel = (s->intel ? 0x3c : 0x76) | USR | INT | EN;
    by_mode(cpu, "counter 0 = -1", 1, pmu_ctr(0), s->intel ? 0xfffffffful : (1ul << s->width) - 1);
    by_mode(cpu, "counter 0's event select", 1, pmu_ctl(0), sel);
    for (u32 i = 0; i < FLOOD_PARTS; i++) user_part(cpu);
    by_mode(cpu, "counter 0 off", 1, pmu_ctl(0), 0);
}

static void set_lvtpc(u32 cpu, u32 masked) {
    ((xenpmu_page *)pages[cpu])->lapic_lvtpc = masked;
    EXPECT(cpu, "LVTPC_SET", op(XENPMU_OP_LVTPC_SET, 0, 0, 1, 0), XENPMU_OK);
}

static void ring_init(u32 cpu, u64 period) {
    struct hostile_ring *r = &rings[cpu];
    config(&r->ctl.config, period);
    EXPECT(cpu, "RING_INIT", op(XENPMU_OP_RING_INIT, ring_frame(cpu), cpu, 1, 0), XENPMU_OK);
    if (xenpmu_ring_info_check(&r->ctl) != 0 || r->ctl.info.data_size != RING_BYTES)
        violation(cpu, "the ring's info", r->ctl.info.data_size, RING_BYTES);
    hostile_stats[cpu].rings++;
}

/* The shortest period the ABI allows (1) is accepted, but never run here: on this host's
 * timed event source (cycles = the vCPU thread's time inside KVM_RUN, KVM's entry included)
 * any period below ~10^5 cycles leaves the guest almost no instruction per entry: measured
 * with the LVTPC masked (no wakeups at all), period 20000: 93,584 PMIs in 15 s, every one at
 * the same CPL3 instruction, and the VMM thread busy 9.2 s of them. The vCPU stops itself,
 * nothing else; but this program must end its rounds. So the flood runs at FLOOD_PERIOD, with
 * the page's LVTPC masked: every PMI withheld (counted, nothing written, no wakeup). */
static void masked_flood(u32 cpu) {
    struct hostile_ring *r = &rings[cpu];
    xenpmu_ring_producer *p = &r->ctl.producer;
    ring_init(cpu, 1);
    EXPECT(cpu, "RING_FINISH", op(XENPMU_OP_RING_FINISH, 0, cpu, 1, 0), XENPMU_OK);
    ring_init(cpu, FLOOD_PERIOD);
    set_lvtpc(cpu, XENPMU_LVTPC_MASKED);
    u64 head = xenpmu_ring_head_acquire(&r->ctl), records = p->records, lost = p->lost;
    flood(cpu);
    if (xenpmu_ring_head_acquire(&r->ctl) != head || p->records != records || p->lost != lost)
        violation(cpu, "a record written while the LVTPC was masked", p->records, records);
    hostile_stats[cpu].withheld += p->withheld;
    EXPECT(cpu, "RING_FINISH", op(XENPMU_OP_RING_FINISH, 0, cpu, 1, 0), XENPMU_OK);
    EXPECT(cpu, "RING_FINISH twice", op(XENPMU_OP_RING_FINISH, 0, cpu, 1, 0), XENPMU_ENOENT);
}

/* Impossible tails: ahead of head, not a multiple of 8, more than the area behind. While one
 * stands the ring is full: nothing may be written (head stays), every sample is lost and
 * counted in bad_tail. */
static u64 attack_tail(u32 cpu, struct hostile_ring *r) {
    struct hostile_stats *h = &hostile_stats[cpu];
    xenpmu_ring_producer *p = &r->ctl.producer;
    u64 head = xenpmu_ring_head_acquire(&r->ctl);
    for (u32 k = 0; k < 3; k++) {
        u64 bad = k == 0 ? head + 8 : k == 1 ? head - 3 : head - RING_BYTES - 8;
        u64 records = p->records, lost = p->lost, bad_tail = p->bad_tail;
        xenpmu_ring_tail_release(&r->ctl, bad);
        flood(cpu);
        u64 now = xenpmu_ring_head_acquire(&r->ctl);
        if (now != head)
            violation(cpu, "a record written while the tail was impossible", now, head);
        if (p->records != records)
            violation(cpu, "records published while the tail was impossible", p->records, records);
        if (p->lost != lost && p->bad_tail == bad_tail)
            violation(cpu, "a loss to an impossible tail not counted in bad_tail", p->lost, lost);
        h->tail_attacks++;
        h->bad_tail += p->bad_tail - bad_tail;
    }
    /* Repaired: tail = head, as the specification says a consumer does. */
    xenpmu_ring_tail_release(&r->ctl, head);
    return head;
}

void attack_ring(u32 cpu) {
    struct hostile_ring *r = &rings[cpu];
    struct hostile_stats *h = &hostile_stats[cpu];
    u64 page = hostile_page_frame(cpu), ring = ring_frame(cpu);
    config(&r->ctl.config, 1000);
    EXPECT(cpu, "RING_INIT without INIT", op(XENPMU_OP_RING_INIT, ring, cpu, 1, 0), XENPMU_ENOENT);
    EXPECT(cpu, "INIT", op(XENPMU_OP_INIT, page, cpu, 1, 0), XENPMU_OK);
    EXPECT(cpu, "INIT twice", op(XENPMU_OP_INIT, page, cpu, 1, 0), XENPMU_EEXIST);
    EXPECT(cpu, "INIT another frame", op(XENPMU_OP_INIT, ring, cpu, 1, 0), XENPMU_EEXIST);
    last_sequence[cpu] = 0;
    for (u32 i = 0; i < BAD_CONFIGS; i++) {
        config(&r->ctl.config, 1000);
        make_bad(&r->ctl.config, i);
        poison(&r->ctl);
        EXPECT(cpu, bad_names[i], op(XENPMU_OP_RING_INIT, ring, cpu, 1, 0), XENPMU_EINVAL);
        check_poison(cpu, &r->ctl, "a refused RING_INIT wrote the control page");
        h->ring_refused++;
    }
    /* The ring's control page on the vCPU's own page: its header is no valid configuration,
     * and the area overlaps a page; the page stays as it was. */
    u64 before = page_sum(pages[cpu]);
    EXPECT(cpu, "RING_INIT over the page", op(XENPMU_OP_RING_INIT, page, cpu, 1, 0), XENPMU_EINVAL,
           XENPMU_EADDRINUSE);
    if (page_sum(pages[cpu]) != before) violation(cpu, "a refused RING_INIT wrote the page", 0, 0);
    h->ring_refused++;
    /* Over its own code (its first page: the code's bytes are no valid configuration, so the
     * call must change nothing; this vCPU runs on only if the code survived). */
    if (!code_checked[cpu]) {
        u64 code = page_sum(_start);
        u64 frame = (u64)_start >> 12;
        EXPECT(cpu, "RING_INIT over the code", op(XENPMU_OP_RING_INIT, frame, cpu, 1, 0),
               XENPMU_EINVAL);
        if (page_sum(_start) != code) violation(cpu, "a refused RING_INIT wrote the code", 0, 0);
        code_checked[cpu] = 1;
        h->ring_refused++;
    }
    struct pmu_shape *s = &hostile_pmu;
    if (s->global)
        by_mode(cpu, "global ctrl counter 0", 1, s->intel ? INTEL_GLOBAL_CTRL : AMD_GLOBAL_CTL, 1);
    masked_flood(cpu);
    /* The consumer's ring: a sample every RING_PERIOD cycles, unmasked. */
    ring_init(cpu, RING_PERIOD);
    EXPECT(cpu, "RING_INIT twice", op(XENPMU_OP_RING_INIT, ring, cpu, 1, 0), XENPMU_EEXIST);
    EXPECT(cpu, "INIT with a ring", op(XENPMU_OP_INIT, page, cpu, 1, 0), XENPMU_EEXIST);
    set_lvtpc(cpu, 0);
    flood(cpu);
    u64 tail = walk(cpu, r, 0);
    tail = attack_tail(cpu, r);
    flood(cpu); /* the losses are reported in the stream first */
    tail = walk(cpu, r, tail);
    /* A tail moved back into consumed bytes is possible (the hypervisor cannot know record
     * boundaries): it only shrinks the free space. Nothing may exceed the area. */
    if (tail >= 8) {
        xenpmu_ring_tail_release(&r->ctl, tail - 8);
        flood(cpu);
        u64 head = xenpmu_ring_head_acquire(&r->ctl);
        if (head - (tail - 8) > RING_BYTES)
            violation(cpu, "head more than the area ahead of a moved-back tail", head, tail - 8);
    }
    EXPECT(cpu, "FINISH", op(XENPMU_OP_FINISH, 0, cpu, 1, 0), XENPMU_OK);
    EXPECT(cpu, "FINISH twice", op(XENPMU_OP_FINISH, 0, cpu, 1, 0), XENPMU_ENOENT);
    EXPECT(cpu, "RING_FINISH after FINISH", op(XENPMU_OP_RING_FINISH, 0, cpu, 1, 0), XENPMU_ENOENT);
}
