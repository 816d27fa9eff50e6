/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * /dev/xenpmu, the xenpmu driver's character device: what user space (xenpmu-record) passes
 * to its ioctls. Included by the driver (dev.c) and by user space alike.
 *
 * The device is root only and opened by one process at a time (EBUSY otherwise). While it is
 * open the driver does not read the rings: the opener reads them through a read-only mmap of
 * each CPU's ring area (control page + data pages) and hands the bytes it consumed back with
 * XENPMU_IOC_RELEASE. README.md in this directory describes the protocol.
 */
#ifndef XENPMU_UAPI_H
#define XENPMU_UAPI_H

#ifdef __KERNEL__
#include <linux/ioctl.h>
#include <linux/types.h>
#else
#include <stdint.h>
#include <sys/ioctl.h>
typedef uint32_t __u32;
typedef uint64_t __u64;
#endif

/* XENPMU_IOC_RING_INFO: in `cpu`; out the rest. A CPU the driver has no state for (offline,
 * or beyond the last one) is ENXIO; a CPU whose samples come through the page (no ring: the
 * hypervisor has no rings, or ring_pages=0) has `has_ring` = 0 and nothing else filled. */
struct xenpmu_ring_desc {
	__u32 cpu;
	__u32 has_ring; /* 1: the ring below; 0: page only */
	__u32 data_size; /* bytes of the data area (info.data_size, a power of two) */
	__u32 record_max; /* info.record_max */
	__u64 control_gpa; /* guest-physical address of the control page */
	__u64 data_gpa; /* of the data area (control_gpa + 4096; contiguous) */
	__u64 tsc_khz; /* info.tsc_khz */
	__u64 map_offset; /* the mmap offset of this CPU's area (control page first) */
	__u64 map_size; /* its bytes: 4096 + data_size */
	__u64 tail; /* the consumer's position: where the opener starts reading */
	__u32 stopped; /* 1: XENPMU_IOC_STOP ended this CPU's sampling */
	__u32 interface_off; /* 1: the hypervisor switched the interface off (the driver found
			      * mode off after the samples stopped, or a refused call): no more
			      * records will come; those published stay readable */
};

/* XENPMU_IOC_RELEASE: the opener consumed the ring of `cpu` up to `tail` (8-aligned, between
 * the current tail and the producer's head: EINVAL otherwise). The driver stores it, with
 * release semantics, as the ring's consumer tail. The counts are the opener's account of the
 * records in [previous tail, tail) - added to /proc/xenpmu's, which then shows every sample
 * read by whoever read it (the producer's own counts are there too, to compare with). */
struct xenpmu_release {
	__u32 cpu;
	__u32 _pad;
	__u64 tail;
	__u64 samples; /* sample records */
	__u64 user; /* of them, XENPMU_RECORD_MISC_USER */
	__u64 lost; /* samples the lost records report */
	__u64 lost_records;
	__u64 pads;
	__u64 unknown; /* records of kinds the reader does not know */
	__u64 chain_entries;
	__u64 seq_gaps; /* sequence numbers no record carries */
	__u64 seq_disorder; /* records whose number is not above the previous */
	__u64 seq_last; /* the last sequence number read */
	__u64 corrupt; /* records the reader refused (it then released up to head) */
};

/* XENPMU_IOC_STOP: in `cpu`. Ends that CPU's sampling as unloading would, without reading:
 * masks the LVTPC, stops counter 0 and unregisters the ring (RING_FINISH). The records
 * published before stay readable and the producer's counters are final: the opener reads
 * and releases the rest and then accounts for every record exactly. */
struct xenpmu_stop {
	__u32 cpu;
	__u32 _pad;
};

#define XENPMU_IOC_MAGIC 0xb6
#define XENPMU_IOC_RING_INFO _IOWR(XENPMU_IOC_MAGIC, 1, struct xenpmu_ring_desc)
#define XENPMU_IOC_RELEASE _IOW(XENPMU_IOC_MAGIC, 2, struct xenpmu_release)
#define XENPMU_IOC_STOP _IOW(XENPMU_IOC_MAGIC, 3, struct xenpmu_stop)

#endif
