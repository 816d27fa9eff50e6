// SPDX-License-Identifier: GPL-2.0
/*
 * A Linux kernel module that consumes the xenpmu page through abi/include/xenpmu.h, built by
 * tests/tests/header_builds.rs with Kbuild (-nostdinc, the kernel's own types and warnings,
 * -Werror) to prove the header builds where guest kernels build. It is never loaded: what
 * matters is that every helper (the 1.4 ring's included) and every version 1.2 field compiles
 * in a kernel build.
 */
#include <linux/module.h>
#include <linux/init.h>
#include <linux/build_bug.h>
#include <linux/printk.h>

#include <xenpmu.h>
#include <xenpmu.h> /* a second include must be harmless */

static xenpmu_page xenpmu_kmod_page __aligned(4096);

/* The 1.2 sample details, as a PMU interrupt handler would log them. */
static void xenpmu_kmod_sample(const xenpmu_page *page)
{
	const xenpmu_sample_info *info = xenpmu_sample_info_get(page);
	uint32_t i, len;

	if (!info) {
		pr_info("xenpmu: pre-1.2 page, rip %llx\n", (unsigned long long)page->regs.rip);
		return;
	}
	len = xenpmu_sample_chain_len(info);
	pr_info("xenpmu: seq %llu tsc %llu (%llu kHz) overflowed %llx dropped %llu\n",
		(unsigned long long)info->sequence, (unsigned long long)info->tsc,
		(unsigned long long)info->tsc_khz, (unsigned long long)info->overflowed,
		(unsigned long long)page->dropped_samples);
	pr_info("xenpmu: leaf %llx, %u callers%s\n", (unsigned long long)page->regs.rip, len,
		info->chain_end == XENPMU_CHAIN_TRUNCATED ? " (truncated)" :
		info->chain_end == XENPMU_CHAIN_BAD_FRAME ? " (bad frame)" :
		info->chain_end == XENPMU_CHAIN_UNREADABLE ? " (unreadable)" :
		info->chain_end == XENPMU_CHAIN_NONE ? " (no chain)" : "");
	for (i = 0; i < len; i++)
		pr_info("xenpmu:   caller %llx\n", (unsigned long long)info->callchain[i]);
}

/* What the interrupt handler does in the cached window: read, re-arm, acknowledge. */
static int xenpmu_kmod_rearm(xenpmu_page *page)
{
	int ret = xenpmu_page_check(page);
	uint32_t i;

	if (ret)
		return ret;
	if (!(page->pmu_flags & XENPMU_FLAG_CACHED))
		return -XENPMU_ENOENT;
	xenpmu_kmod_sample(page);
	if (page->header.vendor == XENPMU_VENDOR_INTEL) {
		xenpmu_intel_ctxt ctxt;
		xenpmu_counter_pair pair;
		uint64_t value;

		ret = xenpmu_intel_ctxt_get(page, &ctxt);
		if (ret)
			return ret;
		for (i = 0; i < ctxt.fixed_count; i++)
			if (!xenpmu_intel_fixed_get(page, i, &value) && (value >> 47))
				xenpmu_intel_fixed_set(page, i, (uint64_t)-100000 & 0xFFFFFFFFFFFFull);
		for (i = 0; i < ctxt.arch_count; i++) {
			if (xenpmu_intel_pair_get(page, i, &pair))
				return -XENPMU_EINVAL;
			pair.counter = (uint64_t)-100000 & 0xFFFFFFFFFFFFull;
			xenpmu_intel_pair_set(page, i, &pair);
		}
		ctxt.global_ovf_ctrl = ctxt.global_status;
		return xenpmu_intel_ctxt_set(page, &ctxt);
	}
	if (page->header.vendor == XENPMU_VENDOR_AMD) {
		xenpmu_amd_ctxt ctxt;
		uint64_t value;

		ret = xenpmu_amd_ctxt_get(page, &ctxt);
		if (ret)
			return ret;
		for (i = 0; i < ctxt.counter_count; i++) {
			if (xenpmu_amd_ctrl_get(page, i, &value) || xenpmu_amd_counter_get(page, i, &value))
				return -XENPMU_EINVAL;
			if (!(value >> 47))
				xenpmu_amd_counter_set(page, i, (uint64_t)-100000 & 0xFFFFFFFFFFFFull);
			xenpmu_amd_ctrl_set(page, i, 0);
		}
		ctxt.global_status = 0;
		return xenpmu_amd_ctxt_set(page, &ctxt);
	}
	return xenpmu_bank_check(XENPMU_VENDOR_CTXT_SIZE, 0, 8);
}

/* The sample ring (1.4), as a VIRQ handler drains it: every ring helper, including the
 * 64-bit head acquire and tail release. */
static struct {
	xenpmu_ring_control control;
	unsigned char data[XENPMU_RING_PAGE_SIZE];
} xenpmu_kmod_ring_area __aligned(4096);

static int xenpmu_kmod_ring(xenpmu_ring_control *ctl)
{
	const unsigned char *data = xenpmu_ring_data(ctl);
	const xenpmu_record_header *rec;
	xenpmu_ring_sample sample;
	xenpmu_ring_lost lost;
	uint64_t chain[XENPMU_CALLCHAIN_MAX];
	uint64_t head, tail;
	int ret = xenpmu_ring_info_check(ctl);

	if (ret)
		return xenpmu_verdict_errno(ret);
	head = xenpmu_ring_head_acquire(ctl);
	tail = ctl->consumer.tail;
	while (!(ret = xenpmu_ring_next(data, ctl->info.data_size, ctl->info.record_max, tail, head,
					&rec))) {
		if (rec->kind == XENPMU_RECORD_SAMPLE && xenpmu_ring_sample_get(rec, &sample, chain,
									   XENPMU_CALLCHAIN_MAX) >= 0)
			pr_info("xenpmu: ring sample %llu rip %llx\n",
				(unsigned long long)sample.sequence, (unsigned long long)sample.regs.rip);
		else if (rec->kind == XENPMU_RECORD_LOST && !xenpmu_ring_lost_get(rec, &lost))
			pr_info("xenpmu: %llu samples lost\n", (unsigned long long)lost.lost);
		tail += rec->size;
	}
	if (ret != XENPMU_RING_EMPTY)
		tail = head; /* corrupt: resynchronize */
	xenpmu_ring_tail_release(ctl, tail);
	return ret == XENPMU_RING_EMPTY ? 0 : xenpmu_verdict_errno(ret);
}

static int __init xenpmu_kmod_init(void)
{
	BUILD_BUG_ON(sizeof(xenpmu_page) != XENPMU_PAGE_SIZE);
	BUILD_BUG_ON(offsetof(xenpmu_page, sample) != XENPMU_DEFINED_SIZE_1_0);
	BUILD_BUG_ON(offsetof(xenpmu_page, sample) + sizeof(xenpmu_sample_info) !=
		     XENPMU_DEFINED_SIZE_1_2);
	BUILD_BUG_ON(ARRAY_SIZE(xenpmu_kmod_page.sample.callchain) != XENPMU_CALLCHAIN_MAX);
	BUILD_BUG_ON(sizeof(xenpmu_ring_control) != XENPMU_RING_CONTROL_SIZE);
	/* A zeroed page or ring has no magic: the checks refuse them. */
	if (xenpmu_kmod_ring(&xenpmu_kmod_ring_area.control) != -XENPMU_EPROTONOSUPPORT)
		return -EINVAL;
	return xenpmu_kmod_rearm(&xenpmu_kmod_page) == -XENPMU_EPROTONOSUPPORT ? 0 : -EINVAL;
}

static void __exit xenpmu_kmod_exit(void)
{
}

module_init(xenpmu_kmod_init);
module_exit(xenpmu_kmod_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Build test of the xenpmu C binding in a kernel module (never loaded)");
