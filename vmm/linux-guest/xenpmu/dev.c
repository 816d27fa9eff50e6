// SPDX-License-Identifier: GPL-2.0
/*
 * xenpmu.ko: /dev/xenpmu, the character device through which user space reads the sample
 * rings (xenpmu_uapi.h says what each ioctl passes; README.md describes the protocol).
 *
 * Copyright the vpmu project authors. Licensed under the GNU General Public License, version 2.
 *
 * The records are walked in user space: the guest's kernel may run far slower than its user
 * code (under KVM on some hosts CPL0 is emulated), so the driver only hands over the memory
 * (a read-only mmap of each CPU's ring area), checks and stores the consumer's tail, and ends a
 * CPU's sampling on request. While the device is open the driver's timer and /proc/xenpmu
 * leave the rings alone; the tail is the opener's.
 */
#define pr_fmt(fmt) "xenpmu: " fmt

#include <linux/atomic.h>
#include <linux/cpu.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/smp.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "xenpmu_drv.h"
#include "xenpmu_uapi.h"

/* One opener at a time: two consumers of one tail would each see half the records. */
static atomic_t xenpmu_dev_open = ATOMIC_INIT(0);


/* Runs on the CPU (interrupts off): the timer and /proc/xenpmu's cross call read the ring
 * only on that CPU with interrupts off, so after this returns neither is in the ring. */
static void xenpmu_dev_claim_fn(void *info)
{
	struct xenpmu_cpu *c = info;

	c->kernel_reads = false;
}

static void xenpmu_dev_return_fn(void *info)
{
	struct xenpmu_cpu *c = info;

	c->kernel_reads = !xenpmu_reader_user();
}

/* Runs fn on every CPU with a ring; how many there are. */
static unsigned int xenpmu_dev_for_each_ring(smp_call_func_t fn)
{
	unsigned int cpu, rings = 0;

	mutex_lock(&xenpmu_lock);
	for_each_online_cpu(cpu) {
		struct xenpmu_cpu *c = xenpmu_cpu_state(cpu);

		if (c && c->ring) {
			smp_call_function_single(cpu, fn, c, 1);
			rings++;
		}
	}
	mutex_unlock(&xenpmu_lock);
	return rings;
}

static long xenpmu_dev_start_fn(void *info)
{
	return xenpmu_cpu_start(info);
}

/* With start=open: every CPU not sampling yet starts now (on the CPU itself). */
static int xenpmu_dev_start_all(void)
{
	unsigned int cpu;
	long rc = 0;

	mutex_lock(&xenpmu_lock);
	for_each_online_cpu(cpu) {
		struct xenpmu_cpu *c = xenpmu_cpu_state(cpu);

		if (c && !c->started && !c->stopped) {
			rc = work_on_cpu(cpu, xenpmu_dev_start_fn, c);
			if (rc)
				break;
		}
	}
	mutex_unlock(&xenpmu_lock);
	return rc;
}

static int xenpmu_dev_open_fn(struct inode *inode, struct file *file)
{
	int rc;

	if (atomic_cmpxchg(&xenpmu_dev_open, 0, 1) != 0)
		return -EBUSY;
	if (!xenpmu_dev_for_each_ring(xenpmu_dev_claim_fn)) {
		/* The device reads rings only: page samples stay the driver's. */
		pr_info("/dev/xenpmu: no CPU has a sample ring (the hypervisor offers none, or ring_pages=0): open refused (ENODATA)\n");
		atomic_set(&xenpmu_dev_open, 0);
		return -ENODATA;
	}
	rc = xenpmu_dev_start_all();
	if (rc) {
		xenpmu_dev_for_each_ring(xenpmu_dev_return_fn);
		atomic_set(&xenpmu_dev_open, 0);
	}
	return rc;
}

static int xenpmu_dev_release_fn(struct inode *inode, struct file *file)
{
	xenpmu_dev_for_each_ring(xenpmu_dev_return_fn);
	atomic_set(&xenpmu_dev_open, 0);
	return 0;
}

/* The CPU `cpu` names, with a ring: its state, or NULL and *err set. Under xenpmu_lock. */
static struct xenpmu_cpu *xenpmu_dev_ring(u32 cpu, int *err)
{
	struct xenpmu_cpu *c = xenpmu_cpu_state(cpu);

	if (!c) {
		*err = -ENXIO;
		return NULL;
	}
	if (!c->ring) {
		pr_info_ratelimited("/dev/xenpmu: cpu%u has no sample ring (the hypervisor offers none, or ring_pages=0): its samples come through the page\n",
				    cpu);
		*err = -ENODATA;
		return NULL;
	}
	return c;
}

static long xenpmu_dev_ring_info(void __user *arg)
{
	struct xenpmu_ring_desc d;
	struct xenpmu_cpu *c;
	int err = 0;

	if (copy_from_user(&d, arg, sizeof(d)))
		return -EFAULT;
	mutex_lock(&xenpmu_lock);
	c = xenpmu_cpu_state(d.cpu);
	if (!c) {
		mutex_unlock(&xenpmu_lock);
		return -ENXIO;
	}
	memset(&d.has_ring, 0, sizeof(d) - offsetof(struct xenpmu_ring_desc, has_ring));
	if (c->ring) {
		d.has_ring = 1;
		d.data_size = c->data_size;
		d.record_max = c->record_max;
		d.control_gpa = virt_to_phys(c->ring);
		d.data_gpa = d.control_gpa + XENPMU_RING_CONTROL_SIZE;
		d.tsc_khz = c->ring->info.tsc_khz;
		d.map_offset = (u64)d.cpu * xenpmu_ring_span();
		d.map_size = xenpmu_ring_span();
		d.tail = c->tail;
		d.stopped = c->stopped;
		d.interface_off = c->off;
	}
	mutex_unlock(&xenpmu_lock);
	if (copy_to_user(arg, &d, sizeof(d)))
		err = -EFAULT;
	return err;
}

static long xenpmu_dev_release_ioctl(void __user *arg)
{
	struct xenpmu_release r;
	struct xenpmu_cpu *c;
	u64 head;
	int err = 0;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	mutex_lock(&xenpmu_lock);
	c = xenpmu_dev_ring(r.cpu, &err);
	if (c) {
		head = xenpmu_ring_head_acquire(c->ring);
		/* 0 <= new - old <= head - old, 8-aligned: never ahead of what was published. */
		if (r.tail % XENPMU_RECORD_ALIGN || r.tail - c->tail > head - c->tail ||
		    r.samples < r.user) {
			err = -EINVAL;
		} else {
			xenpmu_account_release(c, &r);
			c->tail = r.tail;
			xenpmu_ring_tail_release(c->ring, r.tail);
		}
	}
	mutex_unlock(&xenpmu_lock);
	return err;
}

static long xenpmu_dev_stop_fn(void *info)
{
	xenpmu_stop(info, &xenpmu_counter, xenpmu_period());
	return 0;
}

static long xenpmu_dev_stop(void __user *arg)
{
	struct xenpmu_stop s;
	struct xenpmu_cpu *c;
	int err = 0;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	mutex_lock(&xenpmu_lock);
	c = xenpmu_dev_ring(s.cpu, &err);
	/* On the CPU itself (its MSRs and its vCPU's calls), in process context. */
	if (c)
		work_on_cpu(s.cpu, xenpmu_dev_stop_fn, c);
	mutex_unlock(&xenpmu_lock);
	return err;
}

static long xenpmu_dev_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	switch (cmd) {
	case XENPMU_IOC_RING_INFO:
		return xenpmu_dev_ring_info((void __user *)arg);
	case XENPMU_IOC_RELEASE:
		return xenpmu_dev_release_ioctl((void __user *)arg);
	case XENPMU_IOC_STOP:
		return xenpmu_dev_stop((void __user *)arg);
	default:
		return -ENOTTY;
	}
}

/* A CPU's ring area, read-only: vm_insert_page takes a reference on each page, so the pages
 * outlive a CPU going offline (the driver frees its reference) until the mapping goes. */
static int xenpmu_dev_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long pages = vma_pages(vma), i;
	struct xenpmu_cpu *c;
	u64 cpu;
	int err = 0;

	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	mutex_lock(&xenpmu_lock);
	if (!xenpmu_ring_span()) {
		err = -ENODATA; /* ring_pages=0 */
		goto out;
	}
	cpu = ((u64)vma->vm_pgoff << PAGE_SHIFT) / xenpmu_ring_span();
	if (((u64)vma->vm_pgoff << PAGE_SHIFT) % xenpmu_ring_span() ||
	    pages << PAGE_SHIFT != xenpmu_ring_span() || cpu >= nr_cpu_ids) {
		err = -EINVAL;
		goto out;
	}
	c = xenpmu_dev_ring(cpu, &err);
	if (!c)
		goto out;
	vma->vm_flags &= ~VM_MAYWRITE;
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	for (i = 0; i < pages && !err; i++)
		err = vm_insert_page(vma, vma->vm_start + i * PAGE_SIZE,
				     virt_to_page((char *)c->ring + i * PAGE_SIZE));
out:
	mutex_unlock(&xenpmu_lock);
	return err;
}

static const struct file_operations xenpmu_dev_fops = {
	.owner = THIS_MODULE,
	.open = xenpmu_dev_open_fn,
	.release = xenpmu_dev_release_fn,
	.unlocked_ioctl = xenpmu_dev_ioctl,
	.mmap = xenpmu_dev_mmap,
	.llseek = noop_llseek,
};

static struct miscdevice xenpmu_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "xenpmu",
	.fops = &xenpmu_dev_fops,
	.mode = 0600,
};

int xenpmu_dev_register(void)
{
	int rc = misc_register(&xenpmu_dev);

	if (rc)
		pr_err("registering /dev/xenpmu failed (%d)\n", rc);
	return rc;
}

void xenpmu_dev_unregister(void)
{
	misc_deregister(&xenpmu_dev);
}
