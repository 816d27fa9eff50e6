/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenpmu.ko's own declarations: the transport it found, the counter it programs, and each
 * CPU's state (core.c sets it up and tears it down, read.c reads samples and counts them).
 */
#ifndef XENPMU_DRV_H
#define XENPMU_DRV_H

#include <linux/hrtimer.h>
#include <linux/mutex.h>
#include <linux/types.h>

#include "xenpmu.h"

/* The ring's latency bound: long, because a wakeup is a VIRQ this driver cannot handle (the
 * timer reads the ring); the hypervisor wakes at the latest after this many µs. */
#define XENPMU_DRV_RING_LATENCY_US 10000000u

/* What CPUID says about the interface (docs/abi.md "Transport"). */
struct xenpmu_transport {
	u32 base;
	u32 major;
	u32 minor;
	u32 op_count;
	u16 port;
	bool has_virq;
	u8 vector;
};

/* The general-purpose counter 0 of this CPU's vendor: its MSRs, event and width. */
struct xenpmu_counter {
	const char *name;
	u32 vendor; /* XENPMU_VENDOR_INTEL or XENPMU_VENDOR_AMD, as the page's header says */
	u32 ctl;
	u32 ctr;
	u32 global_ctrl; /* 0 when the PMU has no global enable */
	u64 event; /* event select of core cycles, without the enable bits */
	u32 width;
};

/* The counts /proc/xenpmu and the finish line show, as one consistent snapshot. */
struct xenpmu_stats {
	u32 cpu;
	bool ring;
	u64 samples;
	u64 user;
	u64 kernel;
	u64 lost;
	u64 lost_records;
	u64 seq_last;
	u64 seq_gaps;
	u64 seq_disorder;
	u64 pads;
	u64 unknown;
	u64 corrupt;
	int last_check;
	u64 chain_entries;
	u64 flushes;
	u64 flush_errors;
	int last_flush_error;
	u64 dropped;
	u64 produced_before; /* producer.records before the last read, */
	u64 produced; /* and after it: the samples read lie between the two */
	u64 produced_lost;
	u64 withheld;
	u64 wakeups;
	u64 bad_tail;
	bool user_reader; /* someone other than the driver read part of the ring (/dev/xenpmu) */
	u64 released; /* bytes /dev/xenpmu's opener released */
	u64 releases;
	bool off; /* the hypervisor switched the interface off (off.c) */
	u64 lost_unreported; /* then: samples the producer counted lost, in no lost record read */
};

/* One CPU's state, in one page of its own (so the parameter block never crosses a page). */
struct xenpmu_cpu {
	/* The block every call of this CPU passes: first, 32-byte aligned, inside this page. */
	xenpmu_params params __aligned(32);
	unsigned int cpu;
	xenpmu_page *page;
	xenpmu_ring_control *ring; /* NULL: samples come through the page */
	size_t ring_bytes;
	const void *data;
	u32 data_size;
	u32 record_max;
	u64 tail;
	/* false while /dev/xenpmu's opener owns the ring's tail (or with reader=user): the timer
	 * and /proc/xenpmu then leave the ring alone. Changed only on this CPU, interrupts off. */
	bool kernel_reads;
	bool started; /* LVTPC unmasked and counter 0 programmed (xenpmu_cpu_start) */
	bool stopped; /* XENPMU_IOC_STOP ran: counter stopped, LVTPC masked, ring finished */
	bool off; /* the hypervisor switched the interface off (off.c): said once, no PMU left */
	u64 progress; /* off.c: the samples produced when the timer last looked */
	unsigned int quiet_ms; /* off.c: how long they have not changed */
	struct hrtimer timer;
	struct xenpmu_stats stats; /* updated by the reader, with interrupts off on this CPU */
	struct xenpmu_stats snapshot;
	xenpmu_ring_sample sample; /* the reader's copy of a record */
	char line[768];
};

/* read.c */
const char *xenpmu_errname(int rc);
int xenpmu_errno(int rc);
const char *xenpmu_mode_name(u32 mode);
int xenpmu_counter_detect(struct xenpmu_counter *counter);
int xenpmu_counter_start(const struct xenpmu_counter *counter, unsigned long period);
void xenpmu_poll(struct xenpmu_cpu *c, const struct xenpmu_counter *counter, unsigned long period);
void xenpmu_snapshot(struct xenpmu_cpu *c, const struct xenpmu_counter *counter,
		     unsigned long period, struct xenpmu_stats *out);
bool xenpmu_stats_accounted(const struct xenpmu_stats *s);
void xenpmu_stats_format(char *buf, size_t size, const struct xenpmu_stats *s);
void xenpmu_finish(struct xenpmu_cpu *c, const struct xenpmu_counter *counter,
		   unsigned long period);
void xenpmu_stop(struct xenpmu_cpu *c, const struct xenpmu_counter *counter,
		 unsigned long period);
struct xenpmu_release;
void xenpmu_account_release(struct xenpmu_cpu *c, const struct xenpmu_release *r);

/* off.c */
void xenpmu_interface_off(struct xenpmu_cpu *c, const char *how);
bool xenpmu_off_probe(struct xenpmu_cpu *c, const char *what);
void xenpmu_off_check(struct xenpmu_cpu *c, unsigned int poll_ms);

/* core.c */
int xenpmu_op(struct xenpmu_cpu *c, u64 op, u64 val, u32 vcpu);
int xenpmu_features_apply(const char *param);
extern struct xenpmu_transport transport;
extern struct xenpmu_counter xenpmu_counter;
extern struct mutex xenpmu_lock;
struct xenpmu_cpu *xenpmu_cpu_state(unsigned int cpu);
bool xenpmu_reader_user(void);
unsigned long xenpmu_period(void);
size_t xenpmu_ring_span(void);
int xenpmu_cpu_start(struct xenpmu_cpu *c);

/* dev.c */
int xenpmu_dev_register(void);
void xenpmu_dev_unregister(void);

#endif
