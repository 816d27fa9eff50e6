// SPDX-License-Identifier: GPL-2.0
/*
 * xenpmu.ko: a Linux driver for the xenpmu interface (docs/abi.md of the vpmu project).
 *
 * Copyright the vpmu project authors. Licensed under the GNU General Public License, version 2
 * (this directory only; see README.md).
 *
 * It finds the interface by CPUID, checks its version, and on every online CPU registers a
 * page (INIT) and, from ABI 1.4, a sample ring (RING_INIT); it programs general-purpose
 * counter 0 to count core cycles with a period, reads the samples (ring records, or the
 * page's cached sample and FLUSH), counts them and their losses, and tears everything down
 * (FINISH) on CPU offline and on unload. /proc/xenpmu shows the counts.
 *
 * The PMU VIRQ is not handled: Linux 6.1 gives a module no way to install a handler on a
 * given IDT vector (the x86 vector domain, exported, allocates interrupts but picks their
 * vector itself in irq_matrix_alloc; the IDT's alloc_intr_gate is __init), so each CPU polls
 * its ring or page from a pinned hrtimer instead. A VIRQ the
 * hypervisor raises all the same reaches Linux's common_interrupt, which acknowledges it and
 * logs "No irq handler for vector" (rate-limited); the ring's watermark is set to the whole
 * ring so that this is rare.
 */
#define pr_fmt(fmt) "xenpmu: " fmt

#include <linux/cpu.h>
#include <linux/cpuhotplug.h>
#include <linux/gfp.h>
#include <linux/hrtimer.h>
#include <linux/io.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/percpu.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/smp.h>
#include <asm/msr.h>
#include <asm/nmi.h>
#include <asm/processor.h>

#include "xenpmu.h"
#include "xenpmu_drv.h"

static unsigned long period = 1000000;
module_param(period, ulong, 0444);
MODULE_PARM_DESC(period, "sampling period of the cycles counter, in cycles (1 to 2^31-1)");

static unsigned int ring_pages = 256;
module_param(ring_pages, uint, 0444);
MODULE_PARM_DESC(ring_pages,
		 "data pages of each CPU's sample ring (a power of two up to 256); 0 = use the page only");

static unsigned int poll_ms = 10;
module_param(poll_ms, uint, 0444);
MODULE_PARM_DESC(poll_ms, "how often each CPU reads its ring or page, in ms (1 to 1000)");

static char *mode_param = "self";
module_param_named(mode, mode_param, charp, 0444);
MODULE_PARM_DESC(mode,
		 "the hypervisor's mode to set before the CPUs register: self, hv or all (privileged domain only unless it is the mode in force)");

static char *reader_param = "kernel";
module_param_named(reader, reader_param, charp, 0444);
MODULE_PARM_DESC(reader,
		 "who reads the rings: kernel (the driver, except while /dev/xenpmu is open) or user (only /dev/xenpmu's opener; records wait for it from RING_INIT on)");

static bool reader_is_user;

static char *features_param = "keep";
module_param_named(features, features_param, charp, 0444);
MODULE_PARM_DESC(features,
		 "the hypervisor's vPMU features to set before the CPUs register: keep (report them only), none, or a comma-separated list of bts, ipc-only, arch-only (privileged domain only)");

static char *start_param = "load";
module_param_named(start, start_param, charp, 0444);
MODULE_PARM_DESC(start,
		 "when the CPUs start sampling: load (at once) or open (at the first open of /dev/xenpmu, so that a recorder's ring starts with its session)");

static bool start_on_open;

struct xenpmu_transport transport;
struct xenpmu_counter xenpmu_counter;
static DEFINE_PER_CPU(struct xenpmu_cpu *, xenpmu_state);
/* Serializes CPU set-up and tear-down with /proc/xenpmu readers. */
DEFINE_MUTEX(xenpmu_lock);
static enum cpuhp_state xenpmu_hp_state;
static struct proc_dir_entry *xenpmu_proc;

/* One call through the transport: RAX = 40, RDI = op, RSI = the block's physical address.
 * The block is inside the caller's state page (physically contiguous, never crosses a page);
 * interrupts are off so that the polling timer cannot reuse it meanwhile. */
static int xenpmu_call(struct xenpmu_cpu *c, u64 op)
{
	unsigned long rax = XENPMU_HYPERCALL_NR;
	unsigned long flags;

	local_irq_save(flags);
	asm volatile("inl %%dx, %%eax"
		     : "+a"(rax)
		     : "d"(transport.port), "D"(op), "S"((u64)virt_to_phys(&c->params))
		     : "memory");
	local_irq_restore(flags);
	return (int)(s32)(u32)rax;
}

/* Fills the block and calls with interrupts off throughout: the timer's own call (MODE_GET,
 * off.c) must not rewrite the block between a process-context caller's fill and its IN. */
int xenpmu_op(struct xenpmu_cpu *c, u64 op, u64 val, u32 vcpu)
{
	unsigned long flags;
	int rc;

	local_irq_save(flags);
	memset(&c->params, 0, sizeof(c->params));
	c->params.version.major = XENPMU_VERSION_MAJOR;
	c->params.version.minor = XENPMU_VERSION_MINOR;
	c->params.val = val;
	c->params.vcpu = vcpu;
	rc = xenpmu_call(c, op);
	local_irq_restore(flags);
	return rc;
}

/* ---- discovery ---- */

static int __init xenpmu_discover(void)
{
	u32 base, eax, ebx, ecx, edx;

	if (!(cpuid_ecx(1) & BIT(31))) {
		pr_err("no xenpmu interface: CPUID.1:ECX.hypervisor is clear (not a guest)\n");
		return -ENODEV;
	}
	for (base = XENPMU_CPUID_FIRST; base < XENPMU_CPUID_END; base += XENPMU_CPUID_STRIDE) {
		cpuid(base, &eax, &ebx, &ecx, &edx);
		if (ebx == XENPMU_CPUID_SIGNATURE && ecx == XENPMU_CPUID_SIGNATURE &&
		    edx == XENPMU_CPUID_SIGNATURE && eax >= base + XENPMU_CPUID_LEAVES)
			break;
	}
	if (base >= XENPMU_CPUID_END) {
		pr_err("no xenpmu interface: no \"XPMUXPMUXPMU\" signature in CPUID 0x%x-0x%x\n",
		       XENPMU_CPUID_FIRST, XENPMU_CPUID_END - XENPMU_CPUID_STRIDE);
		return -ENODEV;
	}
	transport.base = base;
	cpuid(base + XENPMU_CPUID_LEAF_VERSION, &eax, &ebx, &ecx, &edx);
	transport.major = eax >> 16;
	transport.minor = eax & 0xffff;
	transport.op_count = ebx;
	cpuid(base + XENPMU_CPUID_LEAF_TRANSPORT, &eax, &ebx, &ecx, &edx);
	if (transport.major != XENPMU_VERSION_MAJOR) {
		pr_err("xenpmu interface at CPUID 0x%x has ABI %u.%u; this driver speaks major %u\n",
		       base, transport.major, transport.minor, XENPMU_VERSION_MAJOR);
		return -ENODEV;
	}
	if (!(eax & XENPMU_TRANSPORT_IO_PORT)) {
		pr_err("xenpmu interface at CPUID 0x%x offers no I/O-port call (transport flags 0x%x)\n",
		       base, eax);
		return -ENODEV;
	}
	transport.port = ebx & 0xffff;
	transport.has_virq = eax & XENPMU_TRANSPORT_VIRQ_VECTOR;
	transport.vector = ecx & 0xff;
	return 0;
}

/* The mode, through mode_get on the boot CPU's block (before any CPU is set up). */
static int __init xenpmu_mode_get(u32 *mode)
{
	struct xenpmu_cpu *c = (struct xenpmu_cpu *)get_zeroed_page(GFP_KERNEL);
	int rc;

	if (!c)
		return -ENOMEM;
	rc = xenpmu_op(c, XENPMU_OP_MODE_GET, 0, 0);
	if (rc == 0) {
		*mode = (u32)c->params.val;
		if (c->params.version.major != transport.major ||
		    c->params.version.minor != transport.minor)
			pr_warn("mode_get says ABI %u.%u, CPUID says %u.%u; using mode_get's\n",
				c->params.version.major, c->params.version.minor,
				transport.major, transport.minor);
		transport.minor = c->params.version.minor;
	}
	free_page((unsigned long)c);
	return rc;
}

/* The mode, through mode_set, retried while the hypervisor applies a change (EAGAIN). */
static int __init xenpmu_mode_set(u32 mode)
{
	struct xenpmu_cpu *c = (struct xenpmu_cpu *)get_zeroed_page(GFP_KERNEL);
	int rc, tries;

	if (!c)
		return -ENOMEM;
	for (tries = 0; tries < 1000; tries++) {
		rc = xenpmu_op(c, XENPMU_OP_MODE_SET, mode, 0);
		if (rc != -XENPMU_EAGAIN)
			break;
		cpu_relax();
	}
	free_page((unsigned long)c);
	return rc;
}

static int __init xenpmu_mode_parse(const char *name, u32 *out)
{
	static const u32 modes[] = { XENPMU_MODE_SELF, XENPMU_MODE_HV, XENPMU_MODE_ALL };
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(modes); i++) {
		if (!strcmp(name, xenpmu_mode_name(modes[i]))) {
			*out = modes[i];
			return 0;
		}
	}
	pr_err("mode=%s: must be self, hv or all\n", name);
	return -EINVAL;
}

/* For dev.c: CPU `cpu`'s state, or NULL (offline, or no such CPU). Under xenpmu_lock. */
struct xenpmu_cpu *xenpmu_cpu_state(unsigned int cpu)
{
	lockdep_assert_held(&xenpmu_lock);
	if (cpu >= nr_cpu_ids || !cpu_online(cpu))
		return NULL;
	return per_cpu(xenpmu_state, cpu);
}

bool xenpmu_reader_user(void)
{
	return reader_is_user;
}

/* Bytes of every CPU's ring area (control page + data pages); 0 with ring_pages=0. */
size_t xenpmu_ring_span(void)
{
	return ring_pages ? (size_t)(1 + ring_pages) * PAGE_SIZE : 0;
}

unsigned long xenpmu_period(void)
{
	return period;
}

/* Unmasks the LVTPC (samples are published from then on; the vector is the transport's) and
 * starts counter 0. On the CPU, in process context, once per CPU. */
int xenpmu_cpu_start(struct xenpmu_cpu *c)
{
	int rc;

	if (c->started)
		return 0;
	c->page->lapic_lvtpc = transport.vector;
	rc = xenpmu_op(c, XENPMU_OP_LVTPC_SET, 0, 0);
	if (rc) {
		pr_err("cpu%u: LVTPC_SET refused: %s (%d)\n", c->cpu, xenpmu_errname(rc), rc);
		return xenpmu_errno(rc);
	}
	rc = xenpmu_counter_start(&xenpmu_counter, period);
	if (rc && xenpmu_off_probe(c, "programming counter 0 refused (WRMSR #GP)"))
		return -ENODEV;
	if (rc) {
		pr_err("cpu%u: programming %s counter 0 failed (WRMSR #GP)\n", c->cpu,
		       xenpmu_counter.name);
		return rc;
	}
	c->started = true;
	return 0;
}

/* ---- per-CPU set-up and tear-down (cpuhp callbacks: they run on the CPU itself) ---- */

static void xenpmu_cpu_free(struct xenpmu_cpu *c)
{
	if (c->ring)
		free_pages_exact(c->ring, c->ring_bytes);
	if (c->page)
		free_page((unsigned long)c->page);
	free_page((unsigned long)c);
}

/* Registers the ring: 1 control page + ring_pages data pages, physically contiguous. */
static int xenpmu_ring_setup(struct xenpmu_cpu *c, unsigned int cpu)
{
	int rc, verdict;

	c->ring_bytes = (size_t)(1 + ring_pages) * PAGE_SIZE;
	c->ring = alloc_pages_exact(c->ring_bytes, GFP_KERNEL | __GFP_ZERO);
	if (!c->ring)
		return -ENOMEM;
	c->ring->config.data_pages = ring_pages;
	/* The whole ring: a wakeup (VIRQ) per ring's worth of records; the timer reads them. */
	c->ring->config.wakeup_bytes = ring_pages * XENPMU_RING_PAGE_SIZE;
	c->ring->config.max_latency_us = XENPMU_DRV_RING_LATENCY_US;
	c->ring->config.period_gp[0] = period;
	rc = xenpmu_op(c, XENPMU_OP_RING_INIT, virt_to_phys(c->ring) >> PAGE_SHIFT, cpu);
	if (rc) {
		free_pages_exact(c->ring, c->ring_bytes);
		c->ring = NULL;
		return rc;
	}
	verdict = xenpmu_ring_info_check(c->ring);
	if (verdict) {
		pr_err("cpu%u: the ring's info fails check %d; finishing it\n", cpu, verdict);
		xenpmu_op(c, XENPMU_OP_RING_FINISH, 0, cpu);
		free_pages_exact(c->ring, c->ring_bytes);
		c->ring = NULL;
		return -EPROTO;
	}
	c->data = xenpmu_ring_data(c->ring);
	c->data_size = c->ring->info.data_size;
	c->record_max = c->ring->info.record_max;
	return 0;
}

static enum hrtimer_restart xenpmu_timer_fn(struct hrtimer *timer)
{
	struct xenpmu_cpu *c = container_of(timer, struct xenpmu_cpu, timer);

	xenpmu_poll(c, &xenpmu_counter, period);
	xenpmu_off_check(c, poll_ms);
	hrtimer_forward_now(timer, ms_to_ktime(poll_ms));
	return HRTIMER_RESTART;
}

static int xenpmu_cpu_online(unsigned int cpu)
{
	struct xenpmu_cpu *c;
	int rc, verdict;

	BUILD_BUG_ON(sizeof(struct xenpmu_cpu) > PAGE_SIZE);
	c = (struct xenpmu_cpu *)get_zeroed_page(GFP_KERNEL);
	if (!c)
		return -ENOMEM;
	c->cpu = cpu;
	c->kernel_reads = !reader_is_user;
	c->page = (xenpmu_page *)get_zeroed_page(GFP_KERNEL);
	if (!c->page) {
		xenpmu_cpu_free(c);
		return -ENOMEM;
	}
	rc = xenpmu_op(c, XENPMU_OP_INIT, virt_to_phys(c->page) >> PAGE_SHIFT, cpu);
	if (rc) {
		pr_err("cpu%u: INIT refused: %s (%d)\n", cpu, xenpmu_errname(rc), rc);
		free_page((unsigned long)c->page);
		c->page = NULL;
		xenpmu_cpu_free(c);
		return xenpmu_errno(rc);
	}
	verdict = xenpmu_page_verdict(c->page);
	if (verdict) {
		pr_err("cpu%u: the page fails check %d after INIT\n", cpu, verdict);
		rc = -EPROTO;
		goto finish;
	}
	if (c->page->header.vendor != xenpmu_counter.vendor) {
		pr_err("cpu%u: the page's vendor is %u, CPUID's %s\n", cpu, c->page->header.vendor,
		       xenpmu_counter.name);
		rc = -EPROTO;
		goto finish;
	}
	if (ring_pages && transport.minor >= 4) {
		rc = xenpmu_ring_setup(c, cpu);
		if (rc == -XENPMU_EOPNOTSUPP) {
			pr_info("cpu%u: no sample ring (RING_INIT: EOPNOTSUPP): using the page\n", cpu);
		} else if (rc) {
			pr_err("cpu%u: RING_INIT refused: %s (%d)\n", cpu, xenpmu_errname(rc), rc);
			rc = xenpmu_errno(rc);
			goto finish;
		}
	}
	if (!start_on_open) {
		rc = xenpmu_cpu_start(c);
		if (rc)
			goto finish;
	}
	mutex_lock(&xenpmu_lock);
	per_cpu(xenpmu_state, cpu) = c;
	mutex_unlock(&xenpmu_lock);
	hrtimer_init(&c->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL_PINNED);
	c->timer.function = xenpmu_timer_fn;
	hrtimer_start(&c->timer, ms_to_ktime(poll_ms), HRTIMER_MODE_REL_PINNED);
	pr_info("cpu%u: page at 0x%llx, %s, %s counter 0 counts cycles with period %lu%s\n", cpu,
		(u64)virt_to_phys(c->page),
		c->ring ? "ring registered" : "page only (no ring)", xenpmu_counter.name, period,
		start_on_open ? " from the first open of /dev/xenpmu" : "");
	return 0;

finish:
	xenpmu_finish(c, &xenpmu_counter, period);
	xenpmu_cpu_free(c);
	return rc;
}

static int xenpmu_cpu_offline(unsigned int cpu)
{
	struct xenpmu_cpu *c;

	mutex_lock(&xenpmu_lock);
	c = per_cpu(xenpmu_state, cpu);
	per_cpu(xenpmu_state, cpu) = NULL;
	mutex_unlock(&xenpmu_lock);
	if (!c)
		return 0;
	hrtimer_cancel(&c->timer);
	xenpmu_finish(c, &xenpmu_counter, period);
	xenpmu_cpu_free(c);
	return 0;
}

/* ---- /proc/xenpmu ---- */

static void xenpmu_snapshot_fn(void *info)
{
	struct xenpmu_cpu *c = info;

	/* Interrupts are off here and the timer runs on this CPU: no concurrent reader. */
	xenpmu_snapshot(c, &xenpmu_counter, period, &c->snapshot);
}

static int xenpmu_proc_show(struct seq_file *m, void *v)
{
	unsigned int cpu;

	mutex_lock(&xenpmu_lock);
	for_each_online_cpu(cpu) {
		struct xenpmu_cpu *c = per_cpu(xenpmu_state, cpu);

		if (!c) {
			seq_printf(m, "cpu=%u registered=0\n", cpu);
			continue;
		}
		smp_call_function_single(cpu, xenpmu_snapshot_fn, c, 1);
		xenpmu_stats_format(c->line, sizeof(c->line), &c->snapshot);
		seq_printf(m, "%s\n", c->line);
	}
	mutex_unlock(&xenpmu_lock);
	return 0;
}

/* ---- module ---- */

static int __init xenpmu_init(void)
{
	u32 mode = 0, wanted = 0, was;
	int rc;

	if (!period || period > 0x7fffffffUL) {
		pr_err("period=%lu: must be 1 to 2^31-1\n", period);
		return -EINVAL;
	}
	if (ring_pages > XENPMU_RING_MAX_DATA_PAGES || (ring_pages & (ring_pages - 1))) {
		pr_err("ring_pages=%u: must be 0 or a power of two up to %u\n", ring_pages,
		       XENPMU_RING_MAX_DATA_PAGES);
		return -EINVAL;
	}
	if (!poll_ms || poll_ms > 1000) {
		pr_err("poll_ms=%u: must be 1 to 1000\n", poll_ms);
		return -EINVAL;
	}
	rc = xenpmu_mode_parse(mode_param ? mode_param : "", &wanted);
	if (rc)
		return rc;
	if (!reader_param || (strcmp(reader_param, "kernel") && strcmp(reader_param, "user"))) {
		pr_err("reader=%s: must be kernel or user\n", reader_param ? reader_param : "");
		return -EINVAL;
	}
	reader_is_user = !strcmp(reader_param, "user");
	if (!start_param || (strcmp(start_param, "load") && strcmp(start_param, "open"))) {
		pr_err("start=%s: must be load or open\n", start_param ? start_param : "");
		return -EINVAL;
	}
	start_on_open = !strcmp(start_param, "open");
	rc = xenpmu_discover();
	if (rc)
		return rc;
	rc = xenpmu_mode_get(&mode);
	if (rc) {
		pr_err("mode_get refused: %s (%d)\n", xenpmu_errname(rc), rc);
		return rc == -XENPMU_EOPNOTSUPP ? -ENODEV : xenpmu_errno(rc);
	}
	if (mode == XENPMU_MODE_OFF) {
		pr_err("the hypervisor's vPMU is off (mode_get: mode 0)\n");
		return -ENODEV;
	}
	was = mode;
	if (mode != wanted) {
		rc = xenpmu_mode_set(wanted);
		if (rc) {
			pr_err("mode=%s: MODE_SET refused: %s (%d)%s; the mode stays %s\n",
			       xenpmu_mode_name(wanted), xenpmu_errname(rc), rc,
			       rc == -XENPMU_EPERM ? " (only the privileged domain may change it)" : "",
			       xenpmu_mode_name(mode));
			return xenpmu_errno(rc);
		}
		mode = wanted;
	}
	rc = xenpmu_features_apply(features_param);
	if (rc)
		return rc;
	rc = xenpmu_counter_detect(&xenpmu_counter);
	if (rc)
		return rc;
	pr_info("interface at CPUID 0x%x: ABI %u.%u, %u operations, I/O port 0x%x, mode %s%s%s%s; PMU VIRQ vector 0x%x not handled (a module cannot take a fixed vector): polled every %u ms; rings read by %s\n",
		transport.base, transport.major, transport.minor, transport.op_count,
		transport.port, xenpmu_mode_name(mode), was != mode ? " (set, was " : "",
		was != mode ? xenpmu_mode_name(was) : "", was != mode ? ")" : "", transport.vector, poll_ms,
		reader_is_user ? "/dev/xenpmu only" : "the driver (/dev/xenpmu while open)");
	/* Linux's perf then refuses to create hardware events (EBUSY) while we hold counter 0. */
	if (!reserve_perfctr_nmi(xenpmu_counter.ctr)) {
		pr_err("%s counter 0 is in use by another driver\n", xenpmu_counter.name);
		return -EBUSY;
	}
	if (!reserve_evntsel_nmi(xenpmu_counter.ctl)) {
		release_perfctr_nmi(xenpmu_counter.ctr);
		pr_err("%s event select 0 is in use by another driver\n", xenpmu_counter.name);
		return -EBUSY;
	}
	xenpmu_proc = proc_create_single("xenpmu", 0444, NULL, xenpmu_proc_show);
	if (!xenpmu_proc) {
		rc = -ENOMEM;
		goto release;
	}
	rc = cpuhp_setup_state(CPUHP_AP_ONLINE_DYN, "xenpmu:online", xenpmu_cpu_online,
			       xenpmu_cpu_offline);
	if (rc < 0) {
		pr_err("setting up the CPUs failed (%d)\n", rc);
		goto remove;
	}
	xenpmu_hp_state = rc;
	rc = xenpmu_dev_register();
	if (rc) {
		cpuhp_remove_state(xenpmu_hp_state);
		goto remove;
	}
	pr_info("loaded: %u CPU(s), read /proc/xenpmu\n", num_online_cpus());
	return 0;

remove:
	proc_remove(xenpmu_proc);
release:
	release_evntsel_nmi(xenpmu_counter.ctl);
	release_perfctr_nmi(xenpmu_counter.ctr);
	return rc;
}

static void __exit xenpmu_exit(void)
{
	/* The device and /proc first: no ioctl or reader may run into a CPU being torn down. (No
	 * open file remains: an open or mapped /dev/xenpmu holds the module.) */
	xenpmu_dev_unregister();
	proc_remove(xenpmu_proc);
	cpuhp_remove_state(xenpmu_hp_state);
	release_evntsel_nmi(xenpmu_counter.ctl);
	release_perfctr_nmi(xenpmu_counter.ctr);
	pr_info("unloaded\n");
}

module_init(xenpmu_init);
module_exit(xenpmu_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("xenpmu interface driver: per-CPU page and sample ring, cycles sampling");
