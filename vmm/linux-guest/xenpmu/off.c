// SPDX-License-Identifier: GPL-2.0
/*
 * xenpmu.ko: noticing that the hypervisor switched the interface off while the driver uses it.
 *
 * Copyright the vpmu project authors. Licensed under the GNU General Public License, version 2.
 *
 * An administrator may set the hypervisor's vPMU mode to off at any time (Xen: XENPMU_mode_set
 * from dom0; the vpmu project's VMM: `vpmu boot --xenpmu-off-after`), and nobody tells the
 * driver: its page and ring stay registered and readable, the operations keep working, but the
 * PMU is gone (its MSRs fault) and no sample comes any more. The driver asks the mode
 * (MODE_GET) when a CPU's samples have stopped for a while, and when a WRMSR of its counter is
 * refused; a refused MODE_GET counts as off too (a hypervisor that withdrew the transport).
 * It then says so once per CPU, stops touching the PMU, and keeps the rest working: the
 * records published before are read, STOP and the unload unregister as usual, and the counts
 * say what was lost (the samples the producer counted lost but never reported in a record).
 */
#define pr_fmt(fmt) "xenpmu: " fmt

#include <linux/kernel.h>
#include <linux/printk.h>

#include "xenpmu_drv.h"

/* How long a sampling CPU's producer may stay still before the timer asks the mode: long
 * enough that a busy CPU never asks (one sample per period), short enough for a recorder to
 * end its session soon after the switch. An idle CPU asks once per interval: one call. */
#define XENPMU_OFF_QUIET_MS 100

/* The interface is off (how: what showed it): say so once, with the producer's final counts. */
void xenpmu_interface_off(struct xenpmu_cpu *c, const char *how)
{
	const xenpmu_ring_control *r = c->ring;

	if (c->off)
		return;
	c->off = true;
	if (r)
		pr_warn("cpu%u: the hypervisor switched the interface off (%s): no more samples; its ring stopped at %llu records published, %llu samples lost to a full ring, %llu withheld; the published records stay readable, the page and ring registered until the unload\n",
			c->cpu, how, READ_ONCE(r->producer.records), READ_ONCE(r->producer.lost),
			READ_ONCE(r->producer.withheld));
	else
		pr_warn("cpu%u: the hypervisor switched the interface off (%s): no more samples; %llu read through the page, %llu dropped by the hypervisor; the page stays registered until the unload\n",
			c->cpu, how, c->stats.samples, c->stats.dropped);
}

/* Asks the mode because `what` happened: true (after saying so) if the interface is off. */
bool xenpmu_off_probe(struct xenpmu_cpu *c, const char *what)
{
	char how[128];
	int rc;

	if (c->off)
		return true;
	rc = xenpmu_op(c, XENPMU_OP_MODE_GET, 0, 0);
	if (rc)
		snprintf(how, sizeof(how), "%s; MODE_GET refused: %s (%d)", what,
			 xenpmu_errname(rc), rc);
	else if (c->params.val == XENPMU_MODE_OFF)
		snprintf(how, sizeof(how), "%s; MODE_GET: mode off", what);
	else
		return false;
	xenpmu_interface_off(c, how);
	return true;
}

/* From the CPU's timer (interrupts off): once a sampling CPU's producer has been still for
 * XENPMU_OFF_QUIET_MS, ask the mode. */
void xenpmu_off_check(struct xenpmu_cpu *c, unsigned int poll_ms)
{
	u64 progress;

	if (!c->started || c->stopped || c->off)
		return;
	if (c->ring)
		progress = READ_ONCE(c->ring->producer.records) +
			   READ_ONCE(c->ring->producer.lost) +
			   READ_ONCE(c->ring->producer.withheld);
	else
		progress = c->stats.samples + c->stats.dropped;
	if (progress != c->progress) {
		c->progress = progress;
		c->quiet_ms = 0;
		return;
	}
	c->quiet_ms += poll_ms;
	if (c->quiet_ms < XENPMU_OFF_QUIET_MS)
		return;
	c->quiet_ms = 0;
	xenpmu_off_probe(c, "its samples stopped");
}
