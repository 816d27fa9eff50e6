/* The protocol between `vpmu profile` (vmm/profile) and its guests (profiler.c, work.c):
 * a configuration the VMM writes before the run at the symbol `profile_config`, and batches of
 * samples a sampler guest ships with `outl(PORT_BATCH, batch address)`. The VMM is only the
 * transport: every sample is what the guest read from its xenpmu page. The constants
 * (PORT_BATCH, PORT_YIELD, the magics, BATCH_CAPACITY, ROLE_*, the *_SIZE the layouts are
 * asserted against) come from guest_protocol.h, generated from vpmu-guest-protocol; the
 * structs are mirrored in Rust by vmm/profile/src/protocol.rs (sizes checked on both sides). */
#ifndef PROFILE_H
#define PROFILE_H
#include "pmu.h"
#include "xenpmu.h"

struct profile_config {
    u32 magic;    /* PROFILE_CONFIG_MAGIC once the VMM wrote it */
    u32 role;     /* ROLE_* */
    u32 mode;     /* XENPMU_MODE_ALL, _HV or _SELF: what the run measures */
    u32 workload; /* the built-in workload (1..3) of a workload domain (every vCPU runs it) */
    u64 period;   /* mean cycles between samples; 0: do not sample (the baseline run) */
    u64 jitter;   /* the period varies by -jitter/2..+jitter/2 (jitter + 1 a power of two) */
    u64 duration; /* TSC ticks to sample for */
    u32 delivery; /* DELIVERY_PAGE, or DELIVERY_RING (the page if the ring is refused) */
    u32 ring_latency_us; /* ring mode: the ring's max_latency_us (the VIRQ at most this late) */
};
_Static_assert(sizeof(struct profile_config) == PROFILE_CONFIG_SIZE, "profile_config layout");

/* One sample: the page's identity and flags, the full register set and the sample's details
 * (ABI 1.2: TSC and its frequency, the page's sequence number, the overflowed counters, the
 * call chain the hypervisor walked), as read. Only callchain[0..chain_len) is copied: the
 * entries after it are left over from earlier samples and mean nothing. */
struct batch_sample {
    u32 domain_id, vcpu_id, pcpu_id, flags;
    xenpmu_regs regs;
    u64 tsc, tsc_khz, sequence, overflowed;
    u32 chain_len, chain_end;
    u64 callchain[BATCH_CHAIN_MAX];
};
_Static_assert(offsetof(struct batch_sample, tsc) ==
                   BATCH_SAMPLE_IDENTITY_SIZE + sizeof(xenpmu_regs),
               "batch_sample layout");
_Static_assert(offsetof(struct batch_sample, callchain) ==
                   BATCH_SAMPLE_IDENTITY_SIZE + sizeof(xenpmu_regs) + BATCH_SAMPLE_DETAILS_SIZE,
               "batch_sample details");
_Static_assert(BATCH_CHAIN_MAX == XENPMU_CALLCHAIN_MAX, "batch_sample chain");
_Static_assert(sizeof(struct batch_sample) == BATCH_SAMPLE_SIZE, "batch_sample size");

struct sample_batch {
    u32 magic;      /* SAMPLE_BATCH_MAGIC */
    u32 count;      /* samples in this batch */
    u64 sequence;   /* 0, 1, 2, ... per shipping guest */
    u64 dropped;    /* the page's dropped_samples (cumulative, written by the hypervisor) */
    u64 lost;       /* samples the guest read but could not buffer (cumulative) */
    u64 handler_ticks; /* TSC ticks in the VIRQ handler (cumulative, both kinds of batch) */
    u64 ship_ticks;    /* TSC ticks shipping (cumulative) */
    struct batch_sample samples[BATCH_CAPACITY];
};
_Static_assert(offsetof(struct sample_batch, samples) == BATCH_HEADER_SIZE, "sample_batch header");

/* Ring mode: a shipment that names the unread bytes [tail, head) of the vCPU's sample ring
 * (ABI 1.4) instead of carrying samples: the VMM copies them out of guest memory and decodes
 * the records itself, so the guest never copies a record (a copy at emulated CPL0 costs
 * ~0.5 us a word here). After the outl the guest releases tail = head. It shares the
 * sequence numbers of struct sample_batch (one numbering per shipping vCPU). */
struct ring_batch {
    u32 magic;     /* RING_BATCH_MAGIC */
    u32 data_size; /* bytes of the data area (info.data_size) */
    u64 sequence;  /* 0, 1, 2, ... per shipping guest, shared with struct sample_batch */
    u64 data_gpa;  /* guest-physical address of the data area */
    u64 tail, head; /* the unread bytes: the guest's tail and the head it acquired */
    u64 tsc_khz;   /* info.tsc_khz: the records' TSC frequency */
    /* The producer's counters, read after the head (cumulative since RING_INIT). */
    u64 records, lost, withheld, wakeups, bad_tail;
    u64 virqs;     /* PMU VIRQs the guest took (cumulative) */
    u64 handler_ticks; /* TSC ticks in the VIRQ handler (cumulative) */
    u64 ship_ticks;    /* TSC ticks shipping (cumulative) */
    u32 record_max;    /* info.record_max */
    u32 _pad;
    u64 _reserved;
};
_Static_assert(sizeof(struct ring_batch) == RING_BATCH_SIZE, "ring_batch layout");

/* The run's configuration (profiler.c / work.c define it). */
extern volatile struct profile_config profile_config;

/* sampler.c: the sampling half shared by the profiler and self-profiling workloads; each
 * call acts for the calling vCPU (its LAPIC ID indexes the arrays). */
int sampler_start(void);     /* page, LVTPC, counter 0 = cycles (USR+OS+INT); 0 or failures */
void sampler_ship(void);     /* ships the samples buffered so far (CPL0) */
int sampler_ship_due(void);  /* a batch is half full or 40 ms passed since the last ship */
int sampler_stop(void);      /* stops the counter, ships the rest; 0 or failures */
int sampler_ring(void);      /* 1 if this vCPU samples through a ring, 0 through its page */
extern volatile u64 sampler_samples[MAX_CPUS], sampler_lost[MAX_CPUS], sampler_errors[MAX_CPUS];
extern xenpmu_page sampler_pages[MAX_CPUS];

#endif
