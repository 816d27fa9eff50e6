// SPDX-License-Identifier: GPL-2.0
/*
 * xenpmu.ko: the counter it programs, reading samples from the ring or the page, counting
 * them and their losses, and a CPU's tear-down (FINISH).
 *
 * Copyright the vpmu project authors. Licensed under the GNU General Public License, version 2.
 */
#define pr_fmt(fmt) "xenpmu: " fmt

#include <linux/bits.h>
#include <linux/kernel.h>
#include <linux/printk.h>
#include <linux/string.h>
#include <asm/msr.h>
#include <asm/perf_event.h>
#include <asm/processor.h>

#include "xenpmu_drv.h"
#include "xenpmu_uapi.h"

/* Event-select bits common to Intel PERFEVTSELx and AMD PERF_CTLx. */
#define EVTSEL_USR BIT_ULL(16)
#define EVTSEL_OS BIT_ULL(17)
#define EVTSEL_INT BIT_ULL(20)
#define EVTSEL_EN BIT_ULL(22)

/* How often FINISH is retried while the hypervisor answers -EAGAIN. */
#define FINISH_RETRIES 1000

const char *xenpmu_errname(int rc)
{
	switch (-rc) {
	case XENPMU_EPERM: return "EPERM";
	case XENPMU_ENOENT: return "ENOENT";
	case XENPMU_EIO: return "EIO";
	case XENPMU_EAGAIN: return "EAGAIN";
	case XENPMU_ENOMEM: return "ENOMEM";
	case XENPMU_EFAULT: return "EFAULT";
	case XENPMU_EBUSY: return "EBUSY";
	case XENPMU_EEXIST: return "EEXIST";
	case XENPMU_EINVAL: return "EINVAL";
	case XENPMU_ENOSPC: return "ENOSPC";
	case XENPMU_ENOSYS: return "ENOSYS";
	case XENPMU_EPROTONOSUPPORT: return "EPROTONOSUPPORT";
	case XENPMU_EOPNOTSUPP: return "EOPNOTSUPP";
	case XENPMU_EADDRINUSE: return "EADDRINUSE";
	case XENPMU_ENOBUFS: return "ENOBUFS";
	default: return "unknown error";
	}
}

/* The ABI's error numbers are Linux's on x86; anything else becomes -EIO. */
int xenpmu_errno(int rc)
{
	return strcmp(xenpmu_errname(rc), "unknown error") ? rc : -EIO;
}

const char *xenpmu_mode_name(u32 mode)
{
	switch (mode) {
	case XENPMU_MODE_OFF: return "off";
	case XENPMU_MODE_SELF: return "self";
	case XENPMU_MODE_HV: return "hv";
	case XENPMU_MODE_ALL: return "all";
	default: return "unknown";
	}
}

/* ---- the counter: general-purpose counter 0 counting core cycles ---- */

int xenpmu_counter_detect(struct xenpmu_counter *k)
{
	u32 eax, ebx, ecx, edx;

	memset(k, 0, sizeof(*k));
	if (boot_cpu_data.x86_vendor == X86_VENDOR_INTEL) {
		cpuid(0xa, &eax, &ebx, &ecx, &edx);
		if ((eax & 0xff) == 0 || ((eax >> 8) & 0xff) == 0) {
			pr_err("no architectural PMU (CPUID.0AH:EAX 0x%x)\n", eax);
			return -ENODEV;
		}
		k->name = "Intel";
		k->vendor = XENPMU_VENDOR_INTEL;
		k->ctl = MSR_ARCH_PERFMON_EVENTSEL0;
		k->ctr = MSR_ARCH_PERFMON_PERFCTR0;
		k->global_ctrl = (eax & 0xff) >= 2 ? MSR_CORE_PERF_GLOBAL_CTRL : 0;
		k->event = 0x3c; /* unhalted core cycles */
		k->width = (eax >> 16) & 0xff;
		return 0;
	}
	if (boot_cpu_data.x86_vendor == X86_VENDOR_AMD) {
		k->name = "AMD";
		k->vendor = XENPMU_VENDOR_AMD;
		if (cpuid_ecx(0x80000001) & BIT(23)) { /* PerfCtrExtCore: the F15h MSRs */
			k->ctl = MSR_F15H_PERF_CTL;
			k->ctr = MSR_F15H_PERF_CTR;
		} else {
			k->ctl = MSR_K7_EVNTSEL0;
			k->ctr = MSR_K7_PERFCTR0;
		}
		if (cpuid_eax(0x80000000) >= 0x80000022 && (cpuid_eax(0x80000022) & BIT(0)))
			k->global_ctrl = MSR_AMD64_PERF_CNTR_GLOBAL_CTL; /* PerfMonV2 */
		k->event = 0x76; /* cycles not in halt */
		k->width = 48;
		return 0;
	}
	pr_err("no Intel or AMD PMU (vendor %u)\n", boot_cpu_data.x86_vendor);
	return -ENODEV;
}

static u64 counter_rearm_value(const struct xenpmu_counter *k, unsigned long period)
{
	return (0 - (u64)period) & GENMASK_ULL(k->width - 1, 0);
}

int xenpmu_counter_start(const struct xenpmu_counter *k, unsigned long period)
{
	u64 global;

	if (wrmsrl_safe(k->ctl, 0) || wrmsrl_safe(k->ctr, counter_rearm_value(k, period)) ||
	    wrmsrl_safe(k->ctl, k->event | EVTSEL_USR | EVTSEL_OS | EVTSEL_INT | EVTSEL_EN))
		return -EIO;
	if (k->global_ctrl) {
		if (rdmsrl_safe(k->global_ctrl, &global) ||
		    wrmsrl_safe(k->global_ctrl, global | BIT_ULL(0)))
			return -EIO;
	}
	return 0;
}

/* Stops counter 0. Fails (#GP) while a sample is cached in the page. */
static int counter_stop(const struct xenpmu_counter *k)
{
	u64 global;

	if (wrmsrl_safe(k->ctl, 0))
		return -EIO;
	if (k->global_ctrl) {
		if (rdmsrl_safe(k->global_ctrl, &global) ||
		    wrmsrl_safe(k->global_ctrl, global & ~BIT_ULL(0)))
			return -EIO;
	}
	return 0;
}

/* ---- counting ---- */

/* Sequence numbers first..last were accounted for by a sample or a lost record. */
static void account(struct xenpmu_stats *s, u64 first, u64 last)
{
	if (first > s->seq_last + 1)
		s->seq_gaps += first - s->seq_last - 1;
	else if (first <= s->seq_last)
		s->seq_disorder++;
	if (last > s->seq_last)
		s->seq_last = last;
}

static void ring_read(struct xenpmu_cpu *c)
{
	struct xenpmu_stats *s = &c->stats;
	const xenpmu_record_header *rec;
	xenpmu_record_header header;
	xenpmu_ring_lost lost;
	u64 head = xenpmu_ring_head_acquire(c->ring);
	u64 tail = c->tail;
	int rc, n;

	for (;;) {
		rc = xenpmu_ring_next(c->data, c->data_size, c->record_max, tail, head, &rec);
		if (rc == XENPMU_RING_EMPTY)
			break;
		if (rc) {
			/* A corrupt ring: resynchronize at head, as docs/abi.md says. */
			s->corrupt++;
			s->last_check = rc;
			tail = head;
			break;
		}
		memcpy(&header, rec, sizeof(header));
		if (header.kind == XENPMU_RECORD_SAMPLE) {
			n = xenpmu_ring_sample_get(rec, &c->sample, NULL, 0);
			if (n < 0) {
				s->corrupt++;
				tail = head;
				break;
			}
			s->samples++;
			if (c->sample.header.misc & XENPMU_RECORD_MISC_USER)
				s->user++;
			else
				s->kernel++;
			s->chain_entries += c->sample.chain_len;
			account(s, c->sample.sequence, c->sample.sequence);
			tail += c->sample.header.size;
		} else if (header.kind == XENPMU_RECORD_LOST) {
			if (xenpmu_ring_lost_get(rec, &lost) || lost.lost == 0 ||
			    lost.lost > lost.sequence) {
				s->corrupt++;
				tail = head;
				break;
			}
			s->lost += lost.lost;
			s->lost_records++;
			account(s, lost.sequence - lost.lost + 1, lost.sequence);
			tail += sizeof(lost);
		} else if (header.kind == XENPMU_RECORD_PAD) {
			s->pads++;
			tail += c->data_size - (u32)(tail & (c->data_size - 1));
		} else {
			/* A later minor's kind: skip it by its (checked) size. */
			s->unknown++;
			tail += header.size;
		}
	}
	c->tail = tail;
	xenpmu_ring_tail_release(c->ring, tail);
}

/* The page's cached sample: count it, re-arm counter 0 and acknowledge its overflow in the
 * vendor area, FLUSH. */
static void page_read(struct xenpmu_cpu *c, const struct xenpmu_counter *k, unsigned long period)
{
	struct xenpmu_stats *s = &c->stats;
	const xenpmu_sample_info *info;
	xenpmu_counter_pair pair;
	xenpmu_intel_ctxt intel;
	xenpmu_amd_ctxt amd;
	u64 flags = xenpmu_flags_acquire(c->page);
	u64 sequence = 0, overflowed = BIT_ULL(0);
	int rc;

	if (flags & XENPMU_FLAG_CACHED) {
		info = xenpmu_sample_info_get(c->page);
		if (info) {
			sequence = READ_ONCE(info->sequence);
			overflowed = READ_ONCE(info->overflowed);
		}
		s->samples++;
		if (flags & XENPMU_FLAG_SAMPLE_USER)
			s->user++;
		else
			s->kernel++;
		if (sequence)
			account(s, sequence, sequence);
		if (overflowed & BIT_ULL(0)) {
			if (k->vendor == XENPMU_VENDOR_INTEL &&
			    !xenpmu_intel_pair_get(c->page, 0, &pair)) {
				pair.counter = counter_rearm_value(k, period);
				xenpmu_intel_pair_set(c->page, 0, &pair);
				if (!xenpmu_intel_ctxt_get(c->page, &intel)) {
					intel.global_status &= ~BIT_ULL(0);
					xenpmu_intel_ctxt_set(c->page, &intel);
				}
			} else if (k->vendor == XENPMU_VENDOR_AMD) {
				xenpmu_amd_counter_set(c->page, 0, counter_rearm_value(k, period));
				if (!xenpmu_amd_ctxt_get(c->page, &amd)) {
					amd.global_status &= ~BIT_ULL(0);
					xenpmu_amd_ctxt_set(c->page, &amd);
				}
			}
		}
		rc = xenpmu_op(c, XENPMU_OP_FLUSH, 0, 0);
		s->flushes++;
		if (rc) {
			s->flush_errors++;
			s->last_flush_error = rc;
		}
	}
	s->dropped = xenpmu_dropped_samples_read(c->page);
}

/* Reads what arrived since the last call. On this CPU, with interrupts off (the hrtimer, or
 * the /proc reader's cross call), or after the timer is cancelled. */
void xenpmu_poll(struct xenpmu_cpu *c, const struct xenpmu_counter *k, unsigned long period)
{
	if (c->ring) {
		if (c->kernel_reads)
			ring_read(c);
	} else {
		page_read(c, k, period);
	}
}

static void stats_fill(struct xenpmu_cpu *c, struct xenpmu_stats *out)
{
	*out = c->stats;
	out->cpu = c->cpu;
	out->ring = c->ring != NULL;
	if (c->ring) {
		out->produced = READ_ONCE(c->ring->producer.records);
		out->produced_lost = READ_ONCE(c->ring->producer.lost);
		out->withheld = READ_ONCE(c->ring->producer.withheld);
		out->wakeups = READ_ONCE(c->ring->producer.wakeups);
		out->bad_tail = READ_ONCE(c->ring->producer.bad_tail);
	}
	out->off = c->off;
	/* Once off, the producer never writes the lost record it still owed. */
	out->lost_unreported = c->off && out->produced_lost > out->lost ?
				       out->produced_lost - out->lost : 0;
}

/* Reads what arrived and copies the counts out. The hypervisor keeps publishing meanwhile
 * (its producer needs nothing from this CPU), so the producer's record count is read before
 * and after: it bumps `records` after storing `head`, so every record counted before the read
 * lies below the head the read loads. On this CPU with interrupts off. */
void xenpmu_snapshot(struct xenpmu_cpu *c, const struct xenpmu_counter *k, unsigned long period,
		     struct xenpmu_stats *out)
{
	u64 before = c->ring ? READ_ONCE(c->ring->producer.records) : 0;

	xenpmu_poll(c, k, period);
	stats_fill(c, out);
	out->produced_before = before;
}

/* Every sequence number up to the last one seen is a sample, a lost sample or (a gap) a
 * withheld (ring) or dropped (page) sample; nothing out of order, nothing corrupt; and with a
 * ring, every record the hypervisor published was read. */
bool xenpmu_stats_accounted(const struct xenpmu_stats *s)
{
	if (s->samples + s->lost + s->seq_gaps != s->seq_last || s->seq_disorder || s->corrupt)
		return false;
	if (s->ring)
		return s->seq_gaps <= s->withheld && s->produced_before <= s->samples &&
		       s->samples <= s->produced;
	return s->seq_gaps <= s->dropped;
}

void xenpmu_stats_format(char *buf, size_t size, const struct xenpmu_stats *s)
{
	snprintf(buf, size,
		 "cpu=%u path=%s reader=%s released=%llu releases=%llu samples=%llu user=%llu kernel=%llu lost=%llu lost_records=%llu seq_last=%llu seq_gaps=%llu seq_disorder=%llu pads=%llu unknown=%llu corrupt=%llu last_check=%d chain_entries=%llu produced_before=%llu produced=%llu produced_lost=%llu withheld=%llu wakeups=%llu bad_tail=%llu flushes=%llu flush_errors=%llu last_flush_error=%d dropped=%llu off=%d lost_unreported=%llu accounted=%d",
		 s->cpu, s->ring ? "ring" : "page", s->user_reader ? "user" : "kernel", s->released,
		 s->releases, s->samples, s->user, s->kernel, s->lost,
		 s->lost_records, s->seq_last, s->seq_gaps, s->seq_disorder, s->pads, s->unknown,
		 s->corrupt, s->last_check, s->chain_entries, s->produced_before, s->produced, s->produced_lost,
		 s->withheld, s->wakeups, s->bad_tail, s->flushes, s->flush_errors,
		 s->last_flush_error, s->dropped, s->off, s->lost_unreported,
		 xenpmu_stats_accounted(s));
}

/* Ends CPU c's sampling (on that CPU, interrupts on): mask the LVTPC, read what is left of a
 * page (a cached sample must be flushed before the WRMSR can stop counter 0), stop counter 0,
 * RING_FINISH. The ring's records stay readable, its producer counters final. */
void xenpmu_stop(struct xenpmu_cpu *c, const struct xenpmu_counter *k, unsigned long period)
{
	int rc;

	if (c->stopped)
		return;
	c->stopped = true;
	c->page->lapic_lvtpc = XENPMU_LVTPC_MASKED | transport.vector;
	rc = xenpmu_op(c, XENPMU_OP_LVTPC_SET, 0, 0);
	if (rc)
		pr_err("cpu%u: masking (LVTPC_SET) refused: %s (%d)\n", c->cpu,
		       xenpmu_errname(rc), rc);
	local_irq_disable();
	if (!c->ring)
		page_read(c, k, period);
	/* Switched off, the PMU is gone: its MSRs fault, and nothing counts any more. */
	rc = c->off ? 0 : counter_stop(k);
	if (rc && !c->ring) {
		page_read(c, k, period);
		rc = counter_stop(k);
	}
	local_irq_enable();
	if (rc && !xenpmu_off_probe(c, "stopping counter 0 refused (WRMSR #GP)"))
		pr_err("cpu%u: stopping counter 0 failed (WRMSR #GP); FINISH stops it\n", c->cpu);
	if (c->ring) {
		rc = xenpmu_op(c, XENPMU_OP_RING_FINISH, 0, c->cpu);
		if (rc)
			pr_err("cpu%u: RING_FINISH refused: %s (%d)\n", c->cpu, xenpmu_errname(rc),
			       rc);
	}
}

/* What /dev/xenpmu's opener says it read from [c->tail, r->tail): its counts join the CPU's
 * (the sequence numbers continue the driver's own account of them). */
void xenpmu_account_release(struct xenpmu_cpu *c, const struct xenpmu_release *r)
{
	struct xenpmu_stats *s = &c->stats;

	s->user_reader = true;
	s->released += r->tail - c->tail;
	s->releases++;
	s->samples += r->samples;
	s->user += r->user;
	s->kernel += r->samples - r->user;
	s->lost += r->lost;
	s->lost_records += r->lost_records;
	s->pads += r->pads;
	s->unknown += r->unknown;
	s->chain_entries += r->chain_entries;
	s->seq_gaps += r->seq_gaps;
	s->seq_disorder += r->seq_disorder;
	s->corrupt += r->corrupt;
	if (r->seq_last > s->seq_last)
		s->seq_last = r->seq_last;
}

/* Tears down CPU c (on that CPU, its timer cancelled, /dev/xenpmu closed): stop it (above),
 * read the records published before RING_FINISH that nobody read, FINISH, and say what was
 * counted. */
void xenpmu_finish(struct xenpmu_cpu *c, const struct xenpmu_counter *k, unsigned long period)
{
	int rc, tries;

	xenpmu_stop(c, k, period);
	/* Whoever read the ring before, what is left is the driver's to read now. */
	local_irq_disable();
	c->kernel_reads = true;
	xenpmu_snapshot(c, k, period, &c->snapshot);
	local_irq_enable();
	for (tries = 0; tries < FINISH_RETRIES; tries++) {
		rc = xenpmu_op(c, XENPMU_OP_FINISH, 0, c->cpu);
		if (rc != -XENPMU_EAGAIN)
			break;
		cpu_relax();
	}
	if (rc)
		pr_err("cpu%u: FINISH refused: %s (%d)\n", c->cpu, xenpmu_errname(rc), rc);
	xenpmu_stats_format(c->line, sizeof(c->line), &c->snapshot);
	pr_info("cpu%u: finished: %s\n", c->cpu, c->line);
}
