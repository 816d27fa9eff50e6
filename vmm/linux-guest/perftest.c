/*
 * perftest: the Linux guest's static perf_event_open test tool.
 *
 *   perftest calibrate SECONDS          iterations for about SECONDS of work, and the TSC rate
 *   perftest count SECONDS              cycles:u, cycles:k, instructions:u, branches:u,
 *                                       ref-cycles:u over the workload
 *   perftest sample SECONDS PERIOD [EV] samples of cycles:u (or EV = cpu-clock, PERIOD in ns,
 *                                       for hosts without a PMU) classified into hot_a/hot_b
 *   perftest work ITERATIONS            the workload alone, for Debian perf to measure
 *
 * PERIOD may be "auto": one millisecond's worth of TSC ticks (the measured TSC rate in kHz).
 *
 * Output: every result line starts with "VPMU-RESULT " and continues with key=value pairs
 * separated by single spaces (no spaces inside values; the first pair is cmd=<subcommand>).
 * Anything else on stdout or stderr is commentary. Exit status: 0 when the subcommand ran (an
 * event of `count` that cannot be opened is a result, open_errno=, not a failure); 2 when it
 * could not (the sampling event cannot be opened or mapped); 64 for bad usage.
 *
 * The workload: two functions with the same loop body, one LCG step per iteration whose
 * state is stored to memory each time, written in assembly so that their address ranges are
 * known exactly (hot_a..hot_a_end, hot_b..hot_b_end) and the compiler cannot change them.
 * hot_a runs 3 parts and hot_b 1 part, counted in ITERATIONS (never in time: a slow PMI
 * handler inside a time-boxed window would end the window early and skew the shares). The
 * iterations are run in chunks of CHUNK_ITERS (3/4 in hot_a, then 1/4 in hot_b), each timed
 * with rdtsc, so that the shares are right over any stretch of the run and the fastest chunk
 * gives the work's own cost per iteration.
 *
 * Built static (gcc -O2 -static) and NOT stripped: `perf report --sort symbol` names hot_a
 * and hot_b from the symbol table.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <linux/perf_event.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the workload ---------- */

/*
 * uint64_t hot_X(uint64_t iterations, uint64_t *state): runs `iterations` LCG steps
 * (Knuth's MMIX constants) on *state, storing it each step, and returns the last value.
 * Both loops are 64-byte aligned at the same offset so that they cost the same per iteration.
 * The *_end labels are NOTYPE symbols: perf ignores them, the sizes come from .size.
 */
#define HOT_FUNCTION(name)                                   \
	".p2align 6\n"                                       \
	".globl " #name "\n"                                 \
	".type " #name ", @function\n"                       \
	#name ":\n"                                          \
	"	movabs $6364136223846793005, %rcx\n"         \
	"	movabs $1442695040888963407, %rdx\n"         \
	"	mov (%rsi), %rax\n"                          \
	"	test %rdi, %rdi\n"                           \
	"	jz 2f\n"                                     \
	"	.p2align 5\n"                                \
	"1:	imul %rcx, %rax\n"                           \
	"	add %rdx, %rax\n"                            \
	"	mov %rax, (%rsi)\n"                          \
	"	dec %rdi\n"                                  \
	"	jnz 1b\n"                                    \
	"2:	ret\n"                                       \
	".size " #name ", .-" #name "\n"                     \
	".globl " #name "_end\n"                             \
	#name "_end:\n"

__asm__(".text\n" HOT_FUNCTION(hot_a) HOT_FUNCTION(hot_b) ".p2align 6\n");

uint64_t hot_a(uint64_t iterations, uint64_t *state);
uint64_t hot_b(uint64_t iterations, uint64_t *state);
extern const char hot_a_end[], hot_b_end[];

/* Divisible by 4 (3/4 to hot_a, 1/4 to hot_b); about 1.6 ms at 4 cycles an iteration and
 * 2.6 GHz, well under the guest's 10 ms timer tick, so most chunks run uninterrupted. */
#define CHUNK_ITERS (1u << 20)

static uint64_t lcg_state = 1;

static inline uint64_t rdtsc_ordered(void)
{
	uint32_t lo, hi;
	__asm__ volatile("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi) : : "memory");
	return ((uint64_t)hi << 32) | lo;
}

struct work_stats {
	uint64_t iterations, iters_a, iters_b;
	uint64_t tsc;              /* rdtsc around the whole run */
	double min_tsc_per_iter;   /* fastest chunk, ticks per iteration */
	double median_tsc_per_iter;
	uint64_t chunks;
};

typedef void (*chunk_hook)(void *);

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Rounds up to a multiple of 4 so that the 3:1 split is exact. */
static uint64_t round_iterations(uint64_t n)
{
	if (n < 4)
		n = 4;
	return (n + 3) & ~(uint64_t)3;
}

/* Runs `n` iterations (a multiple of 4) in chunks; `hook`, if any, runs between chunks. */
static void run_work(uint64_t n, struct work_stats *st, chunk_hook hook, void *hook_arg)
{
	uint64_t nchunks = (n + CHUNK_ITERS - 1) / CHUNK_ITERS;
	double *per_iter = calloc(nchunks ? nchunks : 1, sizeof(double));
	uint64_t done = 0, k = 0, t_start, t_end;
	double min_full = INFINITY;

	if (!per_iter) {
		perror("perftest: calloc");
		exit(2);
	}
	memset(st, 0, sizeof(*st));
	t_start = rdtsc_ordered();
	while (done < n) {
		uint64_t c = n - done < CHUNK_ITERS ? n - done : CHUNK_ITERS;
		uint64_t a = c / 4 * 3, b = c / 4;
		uint64_t t0 = rdtsc_ordered();
		hot_a(a, &lcg_state);
		hot_b(b, &lcg_state);
		uint64_t t1 = rdtsc_ordered();
		per_iter[k] = (double)(t1 - t0) / (double)c;
		if (c == CHUNK_ITERS && per_iter[k] < min_full)
			min_full = per_iter[k];
		k++;
		done += c;
		st->iters_a += a;
		st->iters_b += b;
		if (hook)
			hook(hook_arg);
	}
	t_end = rdtsc_ordered();
	st->iterations = n;
	st->tsc = t_end - t_start;
	st->chunks = k;
	/* A partial last chunk is used only when there is no full one (its fixed costs weigh
	 * more per iteration). */
	st->min_tsc_per_iter = min_full;
	if (!isfinite(min_full)) {
		st->min_tsc_per_iter = per_iter[0];
		for (uint64_t i = 1; i < k; i++)
			if (per_iter[i] < st->min_tsc_per_iter)
				st->min_tsc_per_iter = per_iter[i];
	}
	qsort(per_iter, k, sizeof(double), cmp_double);
	st->median_tsc_per_iter = per_iter[k / 2];
	free(per_iter);
}

/* ---------------------------------------------------------------- the TSC rate --------- */

static uint64_t monotonic_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A (TSC, CLOCK_MONOTONIC) pair read as close together as possible: the best of 5 brackets
 * (in a guest clock_gettime may be a system call, which can take a long time emulated). */
static void tsc_clock_pair(double *tsc, uint64_t *ns)
{
	uint64_t best = UINT64_MAX;
	for (int i = 0; i < 5; i++) {
		uint64_t t0 = rdtsc_ordered();
		uint64_t c = monotonic_ns();
		uint64_t t1 = rdtsc_ordered();
		if (t1 - t0 < best) {
			best = t1 - t0;
			*tsc = (double)t0 + (double)(t1 - t0) / 2;
			*ns = c;
		}
	}
}

/* TSC kHz measured against CLOCK_MONOTONIC over about 100 ms. */
static uint64_t measure_tsc_khz(void)
{
	double tsc0, tsc1;
	uint64_t ns0, ns1;
	struct timespec nap = {0, 100 * 1000 * 1000};

	tsc_clock_pair(&tsc0, &ns0);
	while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
	}
	tsc_clock_pair(&tsc1, &ns1);
	if (ns1 <= ns0)
		return 0;
	return (uint64_t)llround((tsc1 - tsc0) * 1e6 / (double)(ns1 - ns0));
}

/* "cpu MHz" of /proc/cpuinfo in kHz (a KVM guest shows its TSC rate there), 0 if absent. */
static uint64_t cpuinfo_khz(void)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	uint64_t khz = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		double mhz;
		if (sscanf(line, "cpu MHz : %lf", &mhz) == 1) { /* blanks match tabs too */
			khz = (uint64_t)llround(mhz * 1000);
			break;
		}
	}
	fclose(f);
	return khz;
}

struct calibration {
	double seconds;
	uint64_t tsc_khz, cpuinfo_khz, iterations;
	double tsc_per_iter;
};

/* Iterations for about `seconds` of work at the fastest chunk's speed (32 chunks, about
 * 50 ms, measured natively: user space runs natively even in the emulated guest). */
static void calibrate(double seconds, struct calibration *cal)
{
	struct work_stats st;
	double n;

	cal->seconds = seconds;
	cal->tsc_khz = measure_tsc_khz();
	cal->cpuinfo_khz = cpuinfo_khz();
	run_work(32 * (uint64_t)CHUNK_ITERS, &st, NULL, NULL);
	cal->tsc_per_iter = st.min_tsc_per_iter;
	n = seconds * (double)cal->tsc_khz * 1000.0 / cal->tsc_per_iter;
	cal->iterations = round_iterations(n > 4 ? (uint64_t)n : 4);
}

static void print_calibration(const char *cmd, const struct calibration *cal)
{
	printf("VPMU-RESULT cmd=%s seconds=%.3f tsc_khz=%" PRIu64 " cpuinfo_khz=%" PRIu64
	       " iterations=%" PRIu64 " tsc_per_iter=%.4f chunk_iters=%u\n",
	       cmd, cal->seconds, cal->tsc_khz, cal->cpuinfo_khz, cal->iterations,
	       cal->tsc_per_iter, CHUNK_ITERS);
	fflush(stdout);
}

/* ---------------------------------------------------------------- perf_event_open ------ */

static int perf_event_open(struct perf_event_attr *attr, pid_t pid, int cpu, int group_fd,
			   unsigned long flags)
{
	return (int)syscall(SYS_perf_event_open, attr, pid, cpu, group_fd, flags);
}

static const char *errno_name(int e)
{
	switch (e) {
	case ENOENT: return "ENOENT";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EINVAL: return "EINVAL";
	case EACCES: return "EACCES";
	case EPERM: return "EPERM";
	case ENODEV: return "ENODEV";
	case EBUSY: return "EBUSY";
	case ENOSPC: return "ENOSPC";
	case E2BIG: return "E2BIG";
	case ENOSYS: return "ENOSYS";
	case EMFILE: return "EMFILE";
	case ENOMEM: return "ENOMEM";
	case EFAULT: return "EFAULT";
	default: return "other";
	}
}

struct event {
	const char *name;
	uint32_t type;
	uint64_t config;
	int user, kernel; /* which privilege levels to count */
	int fd, open_errno;
	uint64_t value, enabled, running;
	int read_ok;
};

static void event_attr(const struct event *ev, struct perf_event_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	attr->size = sizeof(*attr);
	attr->type = ev->type;
	attr->config = ev->config;
	attr->disabled = 1;
	attr->exclude_user = !ev->user;
	attr->exclude_kernel = !ev->kernel;
	attr->exclude_hv = 1;
	attr->read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
}

static int open_event(struct event *ev, struct perf_event_attr *attr)
{
	ev->fd = perf_event_open(attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
	ev->open_errno = ev->fd < 0 ? errno : 0;
	return ev->fd;
}

static void read_event(struct event *ev)
{
	uint64_t buf[3];
	ev->read_ok = ev->fd >= 0 && read(ev->fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf);
	if (ev->read_ok) {
		ev->value = buf[0];
		ev->enabled = buf[1];
		ev->running = buf[2];
	}
}

static void print_event(const char *cmd, const struct event *ev)
{
	if (ev->fd < 0)
		printf("VPMU-RESULT cmd=%s event=%s open_errno=%d open_error=%s\n", cmd, ev->name,
		       ev->open_errno, errno_name(ev->open_errno));
	else if (!ev->read_ok)
		printf("VPMU-RESULT cmd=%s event=%s read_failed=1\n", cmd, ev->name);
	else
		printf("VPMU-RESULT cmd=%s event=%s value=%" PRIu64 " time_enabled=%" PRIu64
		       " time_running=%" PRIu64 "\n",
		       cmd, ev->name, ev->value, ev->enabled, ev->running);
}

/* ---------------------------------------------------------------- count ---------------- */

/*
 * Which TSC reference cycles:u should be compared with:
 *
 * work_tsc (rdtsc around the counted workload, read at CPL3) includes every tick the kernel
 * and the hypervisor spent interrupting the workload: timer interrupts, the periodic kicks
 * of the VMM's timed source, VM exits. A correct cycles:u excludes all of that, so it should
 * come out BELOW work_tsc by exactly that time; comparing with work_tsc hides an inflation of
 * cycles:u by interrupt time.
 *
 * calibrated_tsc is the work's own time: the same iteration count run uncounted just before,
 * chunk by chunk, costed at the FASTEST chunk's ticks per iteration (a chunk of about 1.6 ms
 * usually runs without any interrupt, so the minimum is the interrupt-free cost). That is
 * the right reference: cycles:u / calibrated_tsc is then the core clock over the TSC clock,
 * about 1 for a virtual PMU whose cycles follow the TSC (and whatever turbo makes it on bare
 * metal, where ref-cycles:u / calibrated_tsc is about 1 instead), and anything above that is
 * kernel or hypervisor time charged to user mode. calibrated_tsc_median (the median chunk)
 * shows how noisy the host was.
 */
static int cmd_count(double seconds)
{
	struct event evs[] = {
		{"cycles:u", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 1, 0, -1, 0, 0, 0, 0, 0},
		{"cycles:k", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 0, 1, -1, 0, 0, 0, 0, 0},
		{"instructions:u", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, 1, 0, -1, 0, 0, 0, 0, 0},
		{"branches:u", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_INSTRUCTIONS, 1, 0, -1, 0, 0, 0, 0, 0},
		{"ref-cycles:u", PERF_TYPE_HARDWARE, PERF_COUNT_HW_REF_CPU_CYCLES, 1, 0, -1, 0, 0, 0, 0, 0},
	};
	const size_t nev = sizeof(evs) / sizeof(evs[0]);
	struct calibration cal;
	struct work_stats uncounted, counted;
	uint64_t wall0, wall1;
	size_t i;

	calibrate(seconds, &cal);
	print_calibration("count", &cal);

	/* The same iteration count, uncounted: the reference (see above). */
	run_work(cal.iterations, &uncounted, NULL, NULL);

	for (i = 0; i < nev; i++) {
		struct perf_event_attr attr;
		event_attr(&evs[i], &attr);
		open_event(&evs[i], &attr);
	}

	wall0 = rdtsc_ordered();
	for (i = 0; i < nev; i++)
		if (evs[i].fd >= 0)
			ioctl(evs[i].fd, PERF_EVENT_IOC_ENABLE, 0);
	run_work(cal.iterations, &counted, NULL, NULL);
	for (i = 0; i < nev; i++)
		if (evs[i].fd >= 0)
			ioctl(evs[i].fd, PERF_EVENT_IOC_DISABLE, 0);
	wall1 = rdtsc_ordered();

	for (i = 0; i < nev; i++) {
		read_event(&evs[i]);
		print_event("count", &evs[i]);
	}

	double calibrated = uncounted.min_tsc_per_iter * (double)cal.iterations;
	double calibrated_median = uncounted.median_tsc_per_iter * (double)cal.iterations;
	printf("VPMU-RESULT cmd=count iterations=%" PRIu64 " iters_a=%" PRIu64 " iters_b=%" PRIu64
	       " work_tsc=%" PRIu64 " wall_tsc=%" PRIu64 " calibrated_tsc=%.0f"
	       " calibrated_tsc_median=%.0f uncounted_tsc=%" PRIu64 " tsc_khz=%" PRIu64,
	       counted.iterations, counted.iters_a, counted.iters_b, counted.tsc, wall1 - wall0,
	       calibrated, calibrated_median, uncounted.tsc, cal.tsc_khz);
	/* Ratios only for counters that were read. */
	if (evs[0].read_ok) {
		printf(" ratio_cycles_u_work_tsc=%.4f ratio_cycles_u_calibrated_tsc=%.4f",
		       (double)evs[0].value / (double)counted.tsc,
		       (double)evs[0].value / calibrated);
	}
	if (evs[1].read_ok)
		printf(" ratio_cycles_k_wall_tsc=%.4f",
		       (double)evs[1].value / (double)(wall1 - wall0));
	if (evs[4].read_ok)
		printf(" ratio_ref_cycles_u_calibrated_tsc=%.4f",
		       (double)evs[4].value / calibrated);
	printf("\n");
	fflush(stdout);
	for (i = 0; i < nev; i++)
		if (evs[i].fd >= 0)
			close(evs[i].fd);
	return 0;
}

/* ---------------------------------------------------------------- sample --------------- */

#define RING_DATA_PAGES 64

struct sampler {
	struct perf_event_mmap_page *meta;
	unsigned char *data;
	uint64_t size; /* data area, a power of two */
	uint64_t samples, hot_a, hot_b, other, other_kernel;
	uint64_t lost, lost_records, throttled, unthrottled, other_records, bad_records;
};

/* Copies `len` bytes at ring offset `pos` (wrapping around the end). */
static void ring_copy(const struct sampler *s, uint64_t pos, void *dst, size_t len)
{
	uint64_t off = pos & (s->size - 1);
	size_t first = len;
	if (off + len > s->size)
		first = (size_t)(s->size - off);
	memcpy(dst, s->data + off, first);
	if (first < len)
		memcpy((unsigned char *)dst + first, s->data, len - first);
}

static void ring_drain(struct sampler *s)
{
	uint64_t head = __atomic_load_n(&s->meta->data_head, __ATOMIC_ACQUIRE);
	uint64_t tail = s->meta->data_tail;
	const uintptr_t a0 = (uintptr_t)hot_a, a1 = (uintptr_t)hot_a_end;
	const uintptr_t b0 = (uintptr_t)hot_b, b1 = (uintptr_t)hot_b_end;

	while (tail < head) {
		struct perf_event_header hdr;
		uint64_t rec[8]; /* the largest record read here is 32 bytes after the header */

		if (head - tail < sizeof(hdr))
			break;
		ring_copy(s, tail, &hdr, sizeof(hdr));
		if (hdr.size < sizeof(hdr) || hdr.size > head - tail) {
			s->bad_records++;
			tail = head; /* cannot resynchronise: drop the rest */
			break;
		}
		size_t body = hdr.size - sizeof(hdr);
		if (body > sizeof(rec))
			body = sizeof(rec);
		memset(rec, 0, sizeof(rec));
		ring_copy(s, tail + sizeof(hdr), rec, body);

		switch (hdr.type) {
		case PERF_RECORD_SAMPLE: {
			/* sample_type IP | TID: u64 ip; u32 pid, tid */
			uintptr_t ip = (uintptr_t)rec[0];
			s->samples++;
			if (ip >= a0 && ip < a1)
				s->hot_a++;
			else if (ip >= b0 && ip < b1)
				s->hot_b++;
			else {
				s->other++;
				if ((hdr.misc & PERF_RECORD_MISC_CPUMODE_MASK) ==
				    PERF_RECORD_MISC_KERNEL)
					s->other_kernel++;
			}
			break;
		}
		case PERF_RECORD_LOST: /* u64 id; u64 lost */
			s->lost_records++;
			s->lost += rec[1];
			break;
		case PERF_RECORD_THROTTLE: /* u64 time, id, stream_id */
			s->throttled++;
			break;
		case PERF_RECORD_UNTHROTTLE:
			s->unthrottled++;
			break;
		default:
			s->other_records++;
			break;
		}
		tail += hdr.size;
	}
	__atomic_store_n(&s->meta->data_tail, tail, __ATOMIC_RELEASE);
}

/* Between chunks: drain only when the ring is half full (so the hook costs almost nothing). */
static void ring_hook(void *arg)
{
	struct sampler *s = arg;
	uint64_t head = __atomic_load_n(&s->meta->data_head, __ATOMIC_ACQUIRE);
	if (head - s->meta->data_tail > s->size / 2)
		ring_drain(s);
}

static double percent(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static int cmd_sample(double seconds, const char *period_arg, const char *event_arg)
{
	struct event ev = {"cycles:u", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 1, 0,
			   -1, 0, 0, 0, 0, 0};
	struct perf_event_attr attr;
	struct calibration cal;
	struct work_stats st;
	struct sampler s;
	uint64_t period, wall0, wall1;
	long page = sysconf(_SC_PAGESIZE);
	size_t map_len = (size_t)(1 + RING_DATA_PAGES) * (size_t)page;
	void *base;

	if (event_arg && strcmp(event_arg, "cpu-clock") == 0) {
		ev.name = "cpu-clock:u";
		ev.type = PERF_TYPE_SOFTWARE;
		ev.config = PERF_COUNT_SW_CPU_CLOCK;
	} else if (event_arg && strcmp(event_arg, "cycles") != 0) {
		fprintf(stderr, "perftest: sample event must be cycles or cpu-clock\n");
		return 64;
	}

	calibrate(seconds, &cal);
	print_calibration("sample", &cal);
	if (strcmp(period_arg, "auto") == 0)
		period = ev.type == PERF_TYPE_SOFTWARE ? 1000000 : cal.tsc_khz;
	else
		period = strtoull(period_arg, NULL, 10);
	if (period == 0) {
		fprintf(stderr, "perftest: bad period %s\n", period_arg);
		return 64;
	}

	event_attr(&ev, &attr);
	attr.sample_period = period;
	attr.sample_type = PERF_SAMPLE_IP | PERF_SAMPLE_TID;
	attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
	if (open_event(&ev, &attr) < 0) {
		printf("VPMU-RESULT cmd=sample event=%s period=%" PRIu64 " open_errno=%d"
		       " open_error=%s\n",
		       ev.name, period, ev.open_errno, errno_name(ev.open_errno));
		return 2;
	}
	base = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, ev.fd, 0);
	if (base == MAP_FAILED) {
		int e = errno;
		printf("VPMU-RESULT cmd=sample event=%s period=%" PRIu64 " mmap_errno=%d"
		       " mmap_error=%s\n",
		       ev.name, period, e, errno_name(e));
		return 2;
	}
	memset(&s, 0, sizeof(s));
	s.meta = base;
	s.data = (unsigned char *)base + page;
	s.size = (uint64_t)RING_DATA_PAGES * (uint64_t)page;
	if (s.meta->data_offset && s.meta->data_size) { /* Linux 4.1 and later say where */
		s.data = (unsigned char *)base + s.meta->data_offset;
		s.size = s.meta->data_size;
	}

	wall0 = rdtsc_ordered();
	ioctl(ev.fd, PERF_EVENT_IOC_ENABLE, 0);
	run_work(cal.iterations, &st, ring_hook, &s);
	ioctl(ev.fd, PERF_EVENT_IOC_DISABLE, 0);
	wall1 = rdtsc_ordered();
	ring_drain(&s);
	read_event(&ev);

	printf("VPMU-RESULT cmd=sample event=%s period=%" PRIu64 " iterations=%" PRIu64
	       " samples=%" PRIu64 " hot_a=%" PRIu64 " hot_b=%" PRIu64 " other=%" PRIu64
	       " other_kernel=%" PRIu64 " lost=%" PRIu64 " lost_records=%" PRIu64
	       " throttled=%" PRIu64 " unthrottled=%" PRIu64 " bad_records=%" PRIu64
	       " share_a=%.2f share_b=%.2f share_other=%.2f value=%" PRIu64
	       " expected_samples=%.1f work_tsc=%" PRIu64 " wall_tsc=%" PRIu64 "\n",
	       ev.name, period, st.iterations, s.samples, s.hot_a, s.hot_b, s.other,
	       s.other_kernel, s.lost, s.lost_records, s.throttled, s.unthrottled,
	       s.bad_records, percent(s.hot_a, s.samples), percent(s.hot_b, s.samples),
	       percent(s.other, s.samples), ev.read_ok ? ev.value : 0,
	       ev.read_ok ? (double)ev.value / (double)period : 0.0, st.tsc, wall1 - wall0);
	fflush(stdout);
	munmap(base, map_len);
	close(ev.fd);
	return 0;
}

/* ---------------------------------------------------------------- main ----------------- */

static int usage(void)
{
	fprintf(stderr,
		"usage: perftest calibrate SECONDS\n"
		"       perftest count SECONDS\n"
		"       perftest sample SECONDS PERIOD|auto [cycles|cpu-clock]\n"
		"       perftest work ITERATIONS\n");
	return 64;
}

static int parse_seconds(const char *arg, double *out)
{
	char *end;
	double v = strtod(arg, &end);
	if (end == arg || *end != '\0' || !isfinite(v) || v <= 0 || v > 3600) {
		fprintf(stderr, "perftest: bad SECONDS %s (0 < SECONDS <= 3600)\n", arg);
		return -1;
	}
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	double seconds;

	if (argc < 2)
		return usage();
	if (strcmp(argv[1], "calibrate") == 0 && argc == 3) {
		struct calibration cal;
		if (parse_seconds(argv[2], &seconds))
			return 64;
		calibrate(seconds, &cal);
		print_calibration("calibrate", &cal);
		return 0;
	}
	if (strcmp(argv[1], "count") == 0 && argc == 3) {
		if (parse_seconds(argv[2], &seconds))
			return 64;
		return cmd_count(seconds);
	}
	if (strcmp(argv[1], "sample") == 0 && (argc == 4 || argc == 5)) {
		if (parse_seconds(argv[2], &seconds))
			return 64;
		return cmd_sample(seconds, argv[3], argc == 5 ? argv[4] : NULL);
	}
	if (strcmp(argv[1], "work") == 0 && argc == 3) {
		char *end;
		unsigned long long n = strtoull(argv[2], &end, 10);
		struct work_stats st;
		if (end == argv[2] || *end != '\0' || n == 0) {
			fprintf(stderr, "perftest: bad ITERATIONS %s\n", argv[2]);
			return 64;
		}
		run_work(round_iterations(n), &st, NULL, NULL);
		printf("VPMU-RESULT cmd=work iterations=%" PRIu64 " iters_a=%" PRIu64
		       " iters_b=%" PRIu64 " work_tsc=%" PRIu64 " tsc_per_iter=%.4f\n",
		       st.iterations, st.iters_a, st.iters_b, st.tsc, st.min_tsc_per_iter);
		return 0;
	}
	return usage();
}
