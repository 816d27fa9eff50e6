/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xenpmu-record SECONDS [--doorbell GPA|none]: reads the xenpmu driver's sample rings through
 * /dev/xenpmu and ships them to the VMM of the vpmu project, in user space (native speed where
 * the guest's kernel is emulated).
 *
 * For each CPU with a ring: map it read-only; every ~1 ms acquire the producer's head, walk
 * the unread records [tail, head) with the ABI header's ring reader (xenpmu_ring_next and the
 * record getters), counting samples per sampled domain, lost samples and the sequence
 * numbers; then name those bytes in a `struct ring_batch` (the VMM's ring-shipment format:
 * vmm/profile/src/ring_batch.rs) and ring the doorbell: a 4-byte write of the batch's
 * guest-physical address at GPA + 4 * PORT_BATCH, which the VMM handles as `outl(PORT_BATCH)`
 * and during which it copies the bytes out of guest memory; then hand the bytes back to the
 * driver (XENPMU_IOC_RELEASE). After SECONDS it ends each CPU's sampling (XENPMU_IOC_STOP),
 * reads and ships the rest (one last shipment even if empty: it carries the producer's final
 * counters) and prints VPMU-RESULT lines. `--doorbell none` walks and counts but ships nothing.
 * SIGTERM or SIGINT ends the session early, the same way.
 *
 * When no record has come for 150 ms it asks the driver (XENPMU_IOC_RING_INFO) whether the
 * hypervisor switched the interface off; if so it says so and ends the session at once, the
 * same way (stop, read and ship the rest), its lines saying how much of the session went
 * unsampled and which losses the hypervisor will never report.
 *
 * Exit status: 0; 3 when the session ended early because the hypervisor switched the
 * interface off (everything published before was read and accounted); or 1 with a line on
 * stderr saying what failed (usage, the device, a ring, the doorbell, the batch's address, a
 * record the reader refused, or counts that do not add up to the producer's).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "guest_protocol.h"
#include "xenpmu.h"
#include "xenpmu_uapi.h"

/* struct ring_batch: vmm/guests/profile/profile.h and vmm/profile/src/ring_batch.rs. */
struct ring_batch {
	uint32_t magic; /* RING_BATCH_MAGIC */
	uint32_t data_size; /* info.data_size */
	uint64_t sequence; /* 0, 1, 2, ... per shipping CPU */
	uint64_t data_gpa; /* guest-physical address of the data area */
	uint64_t tail, head; /* the unread bytes */
	uint64_t tsc_khz; /* info.tsc_khz */
	uint64_t records, lost, withheld, wakeups, bad_tail; /* producer's, after the head */
	uint64_t virqs; /* PMU VIRQs taken: none here (the driver polls) */
	uint64_t handler_ticks; /* TSC ticks walking records (cumulative) */
	uint64_t ship_ticks; /* TSC ticks in the doorbell write (cumulative) */
	uint32_t record_max; /* info.record_max */
	uint32_t _pad;
	uint64_t _reserved;
};
_Static_assert(sizeof(struct ring_batch) == RING_BATCH_SIZE, "ring_batch size");
_Static_assert(offsetof(struct ring_batch, record_max) == 112, "ring_batch layout");

#ifndef PORT_START
#error "guest_protocol.h predates port::START: rebuild the VMM (cargo build -p vpmu-guests)"
#endif

#define MAX_CPUS 64
#define MAX_DOMAINS 64
#define PAGE 4096u
#define WALK_INTERVAL_NS 1000000L
/* After this long without a new record on any CPU, ask the driver whether the hypervisor
 * switched the interface off (it asks the mode after 100 ms of a still producer). */
#define OFF_CHECK_NS 150000000ull

struct domain_count {
	uint32_t id;
	uint64_t samples;
	uint64_t user;
};

struct cpu_ring {
	struct xenpmu_ring_desc desc;
	const xenpmu_ring_control *ctl;
	const unsigned char *data;
	uint64_t tail;
	uint64_t seq_seen; /* the highest sequence number read */
	struct xenpmu_release total; /* everything read */
	struct xenpmu_release pending; /* read since the last release */
	uint64_t shipments, bytes, walks, walk_ticks, ship_ticks;
	uint64_t producer_records, producer_lost, withheld, wakeups, bad_tail;
};

static struct cpu_ring rings[MAX_CPUS];
static unsigned int ring_count;
static struct domain_count domains[MAX_DOMAINS];
static unsigned int domain_count;
static uint64_t other_domain_samples; /* beyond MAX_DOMAINS distinct ids */
static int devfd = -1;
static volatile uint32_t *doorbell; /* NULL: --doorbell none */
static struct ring_batch batch_page[PAGE / sizeof(struct ring_batch)] __attribute__((aligned(4096)));
static uint64_t batch_gpa;
static volatile sig_atomic_t stop_signal; /* SIGTERM or SIGINT: end the session now */
static int interface_off; /* the driver says the hypervisor switched the interface off */

static void on_stop_signal(int sig)
{
	stop_signal = sig;
}

static void die(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	/* One write: the console interleaves other programs' output between writes. */
	n = snprintf(line, sizeof(line), "xenpmu-record: ");
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	strcat(line, "\n");
	fputs(line, stderr);
	printf("VPMU-RESULT record=failed\n");
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t tsc(void)
{
	return __builtin_ia32_rdtsc();
}

static void count_domain(uint32_t id, int user)
{
	unsigned int i;

	for (i = 0; i < domain_count && domains[i].id != id; i++)
		;
	if (i == domain_count) {
		if (domain_count == MAX_DOMAINS) {
			other_domain_samples++;
			return;
		}
		domains[domain_count++].id = id;
	}
	domains[i].samples++;
	domains[i].user += user != 0;
}

/* Sequence numbers first..last were accounted for by a record (the driver's own rule). */
static void account(struct cpu_ring *r, uint64_t first, uint64_t last)
{
	struct xenpmu_release *p = &r->pending;

	if (first > r->seq_seen + 1)
		p->seq_gaps += first - r->seq_seen - 1;
	else if (first <= r->seq_seen)
		p->seq_disorder++;
	if (last > r->seq_seen)
		r->seq_seen = last;
	p->seq_last = r->seq_seen;
}

/* Walks [r->tail, head), counting into r->pending. A record the reader refuses is reported
 * and the walk resynchronizes at head (the bytes are still shipped: the VMM judges them). */
static void walk(struct cpu_ring *r, uint64_t head)
{
	const uint32_t size = r->desc.data_size;
	const xenpmu_record_header *rec;
	xenpmu_record_header header;
	xenpmu_ring_sample sample;
	xenpmu_ring_lost lost;
	uint64_t t = r->tail;
	int rc;

	for (;;) {
		rc = xenpmu_ring_next(r->data, size, r->desc.record_max, t, head, &rec);
		if (rc == XENPMU_RING_EMPTY)
			break;
		if (rc) {
			fprintf(stderr, "xenpmu-record: cpu%u: record at position %" PRIu64
				" refused (check %d); resynchronizing at head %" PRIu64 "\n",
				r->desc.cpu, t, rc, head);
			r->pending.corrupt++;
			break;
		}
		memcpy(&header, rec, sizeof(header));
		if (header.kind == XENPMU_RECORD_SAMPLE) {
			if (xenpmu_ring_sample_get(rec, &sample, NULL, 0) < 0) {
				r->pending.corrupt++;
				break;
			}
			r->pending.samples++;
			r->pending.user += (sample.header.misc & XENPMU_RECORD_MISC_USER) != 0;
			r->pending.chain_entries += sample.chain_len;
			count_domain(sample.identity.domain_id,
				     sample.header.misc & XENPMU_RECORD_MISC_USER);
			account(r, sample.sequence, sample.sequence);
			t += sample.header.size;
		} else if (header.kind == XENPMU_RECORD_LOST) {
			if (xenpmu_ring_lost_get(rec, &lost) || lost.lost == 0 ||
			    lost.lost > lost.sequence) {
				fprintf(stderr, "xenpmu-record: cpu%u: lost record at %" PRIu64
					" is impossible (lost %" PRIu64 ", sequence %" PRIu64 ")\n",
					r->desc.cpu, t, lost.lost, lost.sequence);
				r->pending.corrupt++;
				break;
			}
			r->pending.lost += lost.lost;
			r->pending.lost_records++;
			account(r, lost.sequence - lost.lost + 1, lost.sequence);
			t += sizeof(lost);
		} else if (header.kind == XENPMU_RECORD_PAD) {
			r->pending.pads++;
			t += size - (uint32_t)(t & (size - 1));
		} else {
			r->pending.unknown++; /* a later minor's kind: skipped by its checked size */
			t += header.size;
		}
	}
}

/* Adds the pending counts to the total and hands [tail, head) back to the driver. */
static void release(struct cpu_ring *r, uint64_t head)
{
	struct xenpmu_release *p = &r->pending, *t = &r->total;

	p->cpu = r->desc.cpu;
	p->tail = head;
	if (ioctl(devfd, XENPMU_IOC_RELEASE, p) != 0)
		die("cpu%u: XENPMU_IOC_RELEASE to %" PRIu64 " from %" PRIu64 " refused: %s",
		    r->desc.cpu, head, r->tail, strerror(errno));
	t->samples += p->samples;
	t->user += p->user;
	t->lost += p->lost;
	t->lost_records += p->lost_records;
	t->pads += p->pads;
	t->unknown += p->unknown;
	t->chain_entries += p->chain_entries;
	t->seq_gaps += p->seq_gaps;
	t->seq_disorder += p->seq_disorder;
	t->corrupt += p->corrupt;
	if (p->seq_last > t->seq_last)
		t->seq_last = p->seq_last;
	memset(p, 0, sizeof(*p));
	r->tail = head;
}

/* One round for one CPU: walk what arrived, ship it (always: even nothing, for the final
 * counters), release it. Whether anything arrived. */
static int round_one(struct cpu_ring *r, int always)
{
	const volatile xenpmu_ring_producer *prod = &r->ctl->producer;
	struct ring_batch *b = &batch_page[0];
	uint64_t head = xenpmu_ring_head_acquire(r->ctl);
	uint64_t t0;

	r->walks++;
	if (head == r->tail && !always)
		return 0;
	t0 = tsc();
	walk(r, head);
	r->walk_ticks += tsc() - t0;
	/* The producer's counters: single loads after the head's acquire (maybe newer). */
	r->producer_records = prod->records;
	r->producer_lost = prod->lost;
	r->withheld = prod->withheld;
	r->wakeups = prod->wakeups;
	r->bad_tail = prod->bad_tail;
	if (doorbell) {
		memset(b, 0, sizeof(*b));
		b->magic = RING_BATCH_MAGIC;
		b->data_size = r->desc.data_size;
		b->sequence = r->shipments;
		b->data_gpa = r->desc.data_gpa;
		b->tail = r->tail;
		b->head = head;
		b->tsc_khz = r->desc.tsc_khz;
		b->records = r->producer_records;
		b->lost = r->producer_lost;
		b->withheld = r->withheld;
		b->wakeups = r->wakeups;
		b->bad_tail = r->bad_tail;
		b->virqs = 0;
		b->handler_ticks = r->walk_ticks;
		b->ship_ticks = r->ship_ticks;
		b->record_max = r->desc.record_max;
		t0 = tsc();
		/* The batch's stores before the doorbell's (x86 keeps store order; the compiler
		 * must too). The VMM copies [tail, head) during the write. */
		__asm__ __volatile__("" ::: "memory");
		doorbell[PORT_BATCH] = (uint32_t)batch_gpa;
		__asm__ __volatile__("" ::: "memory");
		r->ship_ticks += tsc() - t0;
		r->shipments++;
		r->bytes += head - r->tail;
	}
	release(r, head);
	return 1;
}

/* Whether the driver found any CPU's interface switched off (XENPMU_IOC_RING_INFO). */
static int interface_switched_off(double elapsed, double planned)
{
	struct xenpmu_ring_desc d;
	unsigned int i;

	for (i = 0; i < ring_count; i++) {
		memset(&d, 0, sizeof(d));
		d.cpu = rings[i].desc.cpu;
		if (ioctl(devfd, XENPMU_IOC_RING_INFO, &d) != 0)
			die("cpu%u: XENPMU_IOC_RING_INFO refused: %s", d.cpu, strerror(errno));
		if (d.interface_off) {
			fprintf(stderr, "xenpmu-record: cpu%u: the hypervisor switched the interface off (see the kernel log): ending the session at %.3f s of %.3f s\n",
				d.cpu, elapsed, planned);
			printf("VPMU-RESULT record=interface-off cpu=%u at_s=%.3f planned_s=%.3f\n",
			       d.cpu, elapsed, planned);
			return 1;
		}
	}
	return 0;
}

/* port::START (vmm/protocol): a non-zero value starts the session (the VMM releases the
 * workload domains it holds while this domain boots), 0 ends it (the VMM holds them again). */
static void ring_start_port(uint32_t value)
{
	if (doorbell)
		doorbell[PORT_START] = value;
}

/* The guest-physical address of the (locked) batch page, from /proc/self/pagemap. */
static uint64_t gpa_of(const void *p)
{
	uint64_t entry, vaddr = (uint64_t)(uintptr_t)p;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	if (fd < 0)
		die("opening /proc/self/pagemap failed: %s (the kernel needs CONFIG_PROC_PAGE_MONITOR)",
		    strerror(errno));
	if (pread(fd, &entry, sizeof(entry), (off_t)(vaddr / PAGE * 8)) != sizeof(entry))
		die("reading /proc/self/pagemap failed: %s", strerror(errno));
	close(fd);
	if (!(entry >> 63 & 1))
		die("the batch page is not present in /proc/self/pagemap (entry 0x%" PRIx64 ")",
		    entry);
	entry &= (1ull << 55) - 1;
	if (entry == 0)
		die("/proc/self/pagemap shows no frame numbers (needs CAP_SYS_ADMIN: run as root)");
	return entry * PAGE + (vaddr & (PAGE - 1));
}

static void map_doorbell(const char *arg)
{
	char *end;
	uint64_t gpa;
	void *map;
	int fd;

	errno = 0;
	gpa = strtoull(arg, &end, 0);
	if (errno || *end || gpa % PAGE)
		die("--doorbell %s: expected a page-aligned guest-physical address (e.g. 0xd0000000) or none",
		    arg);
	fd = open("/dev/mem", O_RDWR | O_SYNC);
	if (fd < 0)
		die("opening /dev/mem for the doorbell failed: %s (the kernel needs CONFIG_DEVMEM)",
		    strerror(errno));
	map = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)gpa);
	if (map == MAP_FAILED)
		die("mapping the doorbell page 0x%" PRIx64 " through /dev/mem failed: %s (STRICT_DEVMEM refuses RAM and claimed I/O ranges)",
		    gpa, strerror(errno));
	close(fd);
	doorbell = map;
}

static void open_rings(void)
{
	struct xenpmu_ring_desc d;
	unsigned int cpu;
	void *map;

	devfd = open("/dev/xenpmu", O_RDWR | O_CLOEXEC);
	if (devfd < 0) {
		int err = errno;
		const char *why =
			err == EBUSY   ? "another reader has it open" :
			err == ENODATA ? "no CPU has a sample ring: a page-only hypervisor, or ring_pages=0" :
			err == ENOENT  ? "is xenpmu.ko loaded?" :
					 "see the kernel log";

		die("opening /dev/xenpmu failed: %s (%s)", strerror(err), why);
	}
	for (cpu = 0; cpu < MAX_CPUS; cpu++) {
		memset(&d, 0, sizeof(d));
		d.cpu = cpu;
		if (ioctl(devfd, XENPMU_IOC_RING_INFO, &d) != 0) {
			if (errno == ENXIO)
				continue; /* offline, or no such CPU */
			die("cpu%u: XENPMU_IOC_RING_INFO refused: %s", cpu, strerror(errno));
		}
		if (!d.has_ring) {
			fprintf(stderr, "xenpmu-record: cpu%u has no sample ring (page only): skipped\n",
				cpu);
			continue;
		}
		if (d.stopped)
			die("cpu%u: its sampling was already stopped (XENPMU_IOC_STOP): reload the driver",
			    cpu);
		map = mmap(NULL, d.map_size, PROT_READ, MAP_SHARED, devfd, (off_t)d.map_offset);
		if (map == MAP_FAILED)
			die("cpu%u: mapping its ring (%" PRIu64 " bytes at offset %" PRIu64 ") failed: %s",
			    cpu, d.map_size, d.map_offset, strerror(errno));
		rings[ring_count].desc = d;
		rings[ring_count].ctl = map;
		rings[ring_count].data = xenpmu_ring_data(map);
		rings[ring_count].tail = d.tail;
		if (!rings[ring_count].data || rings[ring_count].ctl->info.data_size != d.data_size)
			die("cpu%u: the mapped ring's info fails its checks (check %d)", cpu,
			    xenpmu_ring_info_check(map));
		ring_count++;
	}
	if (!ring_count)
		die("no CPU has a sample ring (the hypervisor offers none, or ring_pages=0)");
}

static const char *domain_name(uint32_t id, char *buf, size_t n)
{
	if (id == XENPMU_DOMID_SELF)
		return "self";
	if (id == XENPMU_DOMID_HYPERVISOR)
		return "hv";
	snprintf(buf, n, "%" PRIu32, id);
	return buf;
}

static double ticks_us(uint64_t ticks, uint64_t khz)
{
	return khz ? (double)ticks * 1000.0 / (double)khz : 0.0;
}

int main(int argc, char **argv)
{
	const char *bell = "none";
	uint64_t start, stop, samples = 0, lost = 0, shipments = 0, bytes = 0, ship_ticks = 0;
	uint64_t last_record, now, off_at = 0;
	double seconds, elapsed;
	struct timespec nap = { 0, WALK_INTERVAL_NS };
	unsigned int i;
	int bad = 0;
	char *end, name[16];

	if (argc != 2 && !(argc == 4 && !strcmp(argv[2], "--doorbell")))
		die("usage: xenpmu-record SECONDS [--doorbell GPA|none]");
	seconds = strtod(argv[1], &end);
	if (*end || !(seconds > 0) || seconds > 86400)
		die("SECONDS %s: expected a number of seconds above 0", argv[1]);
	if (argc == 4)
		bell = argv[3];
	if (strcmp(bell, "none"))
		map_doorbell(bell);
	if (mlock(batch_page, sizeof(batch_page)) != 0)
		die("mlock of the batch page failed: %s", strerror(errno));
	memset(batch_page, 0, sizeof(batch_page));
	batch_gpa = gpa_of(batch_page);
	if (batch_gpa + sizeof(batch_page) > (1ull << 32))
		die("the batch page is at 0x%" PRIx64 ", above 4 GiB: the doorbell takes 32 bits",
		    batch_gpa);
	open_rings();
	/* The VMM holds the other domains' vCPUs until this domain starts the session (or ships
	 * its first batch); the sampling runs from the open (start=open). */
	ring_start_port(1);
	/* Say so at once (stdout may be a file). */
	printf("VPMU-RESULT record=open cpus=%u data_size=%u doorbell=%s batch_gpa=0x%" PRIx64 "\n",
	       ring_count, rings[0].desc.data_size, bell, batch_gpa);
	fflush(stdout);

	signal(SIGTERM, on_stop_signal);
	signal(SIGINT, on_stop_signal);
	start = now_ns();
	stop = start + (uint64_t)(seconds * 1e9);
	last_record = start;
	while (!stop_signal && (now = now_ns()) < stop) {
		for (i = 0; i < ring_count; i++)
			if (round_one(&rings[i], 0))
				last_record = now;
		if (now - last_record >= OFF_CHECK_NS) {
			last_record = now;
			if (interface_switched_off((double)(now - start) / 1e9, seconds)) {
				interface_off = 1;
				off_at = now;
				break;
			}
		}
		nanosleep(&nap, NULL);
	}
	for (i = 0; i < ring_count; i++) {
		struct xenpmu_stop s = { .cpu = rings[i].desc.cpu };

		if (ioctl(devfd, XENPMU_IOC_STOP, &s) != 0)
			die("cpu%u: XENPMU_IOC_STOP refused: %s", s.cpu, strerror(errno));
		round_one(&rings[i], 1);
	}
	/* The sampled interval is over: the VMM holds the workload domains again (PORT_START
	 * with 0), so that unloading the driver and shutting down do not share the pCPU. */
	ring_start_port(0);
	elapsed = (double)(now_ns() - start) / 1e9;

	for (i = 0; i < ring_count; i++) {
		struct cpu_ring *r = &rings[i];
		struct xenpmu_release *t = &r->total;
		/* RingTotals::accounted of the VMM: every published sample read, every gap a
		 * withheld sample, no more lost in records than the producer counted. */
		int accounted = t->samples == r->producer_records && t->lost <= r->producer_lost &&
				t->seq_gaps <= r->withheld && !t->seq_disorder && !t->corrupt;

		printf("VPMU-RESULT record=cpu cpu=%u samples=%" PRIu64 " user=%" PRIu64
		       " lost=%" PRIu64 " lost_records=%" PRIu64 " pads=%" PRIu64
		       " unknown=%" PRIu64 " corrupt=%" PRIu64 " chain_entries=%" PRIu64
		       " seq_last=%" PRIu64 " seq_gaps=%" PRIu64 " seq_disorder=%" PRIu64
		       " produced=%" PRIu64 " produced_lost=%" PRIu64 " withheld=%" PRIu64
		       " wakeups=%" PRIu64 " bad_tail=%" PRIu64 " shipments=%" PRIu64
		       " bytes=%" PRIu64 " walks=%" PRIu64 " walk_us=%.0f ship_us=%.0f"
		       " ship_us_mean=%.1f interface_off=%d lost_unreported=%" PRIu64
		       " accounted=%d\n",
		       r->desc.cpu, t->samples, t->user, t->lost, t->lost_records, t->pads,
		       t->unknown, t->corrupt, t->chain_entries, t->seq_last, t->seq_gaps,
		       t->seq_disorder, r->producer_records, r->producer_lost, r->withheld,
		       r->wakeups, r->bad_tail, r->shipments, r->bytes, r->walks,
		       ticks_us(r->walk_ticks, r->desc.tsc_khz),
		       ticks_us(r->ship_ticks, r->desc.tsc_khz),
		       r->shipments ? ticks_us(r->ship_ticks, r->desc.tsc_khz) / (double)r->shipments
				    : 0.0,
		       interface_off,
		       /* Switched off, the producer never writes the lost record it owed. */
		       interface_off && r->producer_lost > t->lost ? r->producer_lost - t->lost : 0,
		       accounted);
		if (!accounted) {
			fprintf(stderr, "xenpmu-record: cpu%u: the records read do not add up to the producer's counts (above)\n",
				r->desc.cpu);
			bad = 1;
		}
		samples += t->samples;
		lost += t->lost;
		shipments += r->shipments;
		bytes += r->bytes;
		ship_ticks += r->ship_ticks;
	}
	for (i = 0; i < domain_count; i++)
		printf("VPMU-RESULT record=domain domain=%s samples=%" PRIu64 " user=%" PRIu64 "\n",
		       domain_name(domains[i].id, name, sizeof(name)), domains[i].samples,
		       domains[i].user);
	if (other_domain_samples)
		printf("VPMU-RESULT record=domain domain=other samples=%" PRIu64 "\n",
		       other_domain_samples);
	printf("VPMU-RESULT record=total cpus=%u domains=%u samples=%" PRIu64 " lost=%" PRIu64
	       " shipments=%" PRIu64 " bytes=%" PRIu64 " seconds=%.3f samples_per_s=%.0f"
	       " ship_us_mean=%.1f doorbell=%s batch_gpa=0x%" PRIx64 " unsampled_s=%.3f"
	       " ended_by=%s status=%d\n",
	       ring_count, domain_count, samples, lost, shipments, bytes, elapsed,
	       elapsed > 0 ? (double)samples / elapsed : 0.0,
	       shipments ? ticks_us(ship_ticks, rings[0].desc.tsc_khz) / (double)shipments : 0.0,
	       bell, batch_gpa, interface_off ? (double)(stop - off_at) / 1e9 : 0.0,
	       interface_off ? "interface-off" : stop_signal ? "signal" : "time",
	       bad ? 1 : interface_off ? 3 : 0);
	return bad ? 1 : interface_off ? 3 : 0;
}
