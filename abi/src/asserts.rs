//! Compile-time proof of the layout `docs/abi.md` specifies: every struct's size and every
//! field's offset, as literal numbers. Changing the layout without changing the specification
//! (and the major version) fails the build.

use core::mem::{align_of, offset_of, size_of};

use static_assertions::{const_assert, const_assert_eq};

use crate::ops::{CoverageParams, Params, Version};
use crate::page::{FlushRefusal, Header, Identity, Page, Regs, SampleInfo};
use crate::ring::{
    RecordHeader, RingConfig, RingConsumer, RingControl, RingInfo, RingLost, RingProducer,
    RingSample,
};
use crate::vendor::{AmdCtxt, CounterPair, IntelCtxt, VendorArea};

const_assert_eq!(size_of::<Page>(), crate::XENPMU_PAGE_SIZE);
const_assert_eq!(size_of::<Header>(), 16);
const_assert_eq!(size_of::<Identity>(), 16);
const_assert_eq!(size_of::<Regs>(), 168);
const_assert_eq!(size_of::<VendorArea>(), crate::XENPMU_VENDOR_AREA_SIZE);
const_assert_eq!(size_of::<CounterPair>(), 16);
const_assert_eq!(size_of::<IntelCtxt>(), crate::XENPMU_VENDOR_CTXT_SIZE);
const_assert_eq!(size_of::<AmdCtxt>(), crate::XENPMU_VENDOR_CTXT_SIZE);
const_assert_eq!(size_of::<Version>(), 8);
const_assert_eq!(size_of::<Params>(), 24);

// No struct needs more than 8-byte alignment, so a page at any 8-aligned address is usable.
const_assert_eq!(align_of::<Page>(), 8);
const_assert_eq!(align_of::<Params>(), 8);

const_assert_eq!(offset_of!(Header, magic), 0);
const_assert_eq!(offset_of!(Header, version_major), 4);
const_assert_eq!(offset_of!(Header, version_minor), 6);
const_assert_eq!(offset_of!(Header, defined_size), 8);
const_assert_eq!(offset_of!(Header, vendor), 12);

const_assert_eq!(offset_of!(Identity, domain_id), 0);
const_assert_eq!(offset_of!(Identity, vcpu_id), 4);
const_assert_eq!(offset_of!(Identity, pcpu_id), 8);
const_assert_eq!(offset_of!(Identity, _pad0), 12);

const_assert_eq!(offset_of!(Regs, rax), 0);
const_assert_eq!(offset_of!(Regs, rbx), 8);
const_assert_eq!(offset_of!(Regs, rcx), 16);
const_assert_eq!(offset_of!(Regs, rdx), 24);
const_assert_eq!(offset_of!(Regs, rsi), 32);
const_assert_eq!(offset_of!(Regs, rdi), 40);
const_assert_eq!(offset_of!(Regs, rbp), 48);
const_assert_eq!(offset_of!(Regs, rsp), 56);
const_assert_eq!(offset_of!(Regs, r8), 64);
const_assert_eq!(offset_of!(Regs, r9), 72);
const_assert_eq!(offset_of!(Regs, r10), 80);
const_assert_eq!(offset_of!(Regs, r11), 88);
const_assert_eq!(offset_of!(Regs, r12), 96);
const_assert_eq!(offset_of!(Regs, r13), 104);
const_assert_eq!(offset_of!(Regs, r14), 112);
const_assert_eq!(offset_of!(Regs, r15), 120);
const_assert_eq!(offset_of!(Regs, rip), 128);
const_assert_eq!(offset_of!(Regs, rflags), 136);
const_assert_eq!(offset_of!(Regs, cs), 144);
const_assert_eq!(offset_of!(Regs, ss), 146);
const_assert_eq!(offset_of!(Regs, ds), 148);
const_assert_eq!(offset_of!(Regs, es), 150);
const_assert_eq!(offset_of!(Regs, fs), 152);
const_assert_eq!(offset_of!(Regs, gs), 154);
const_assert_eq!(offset_of!(Regs, cpl), 156);
const_assert_eq!(offset_of!(Regs, _pad0), 157);
const_assert_eq!(offset_of!(Regs, mode), 160);
const_assert_eq!(offset_of!(Regs, _pad1), 164);

const_assert_eq!(offset_of!(VendorArea, words), 0);

const_assert_eq!(offset_of!(CounterPair, counter), 0);
const_assert_eq!(offset_of!(CounterPair, control), 8);

const_assert_eq!(offset_of!(IntelCtxt, fixed_counters), 0);
const_assert_eq!(offset_of!(IntelCtxt, arch_counters), 4);
const_assert_eq!(offset_of!(IntelCtxt, fixed_count), 8);
const_assert_eq!(offset_of!(IntelCtxt, arch_count), 12);
const_assert_eq!(offset_of!(IntelCtxt, global_ctrl), 16);
const_assert_eq!(offset_of!(IntelCtxt, global_status), 24);
const_assert_eq!(offset_of!(IntelCtxt, global_ovf_ctrl), 32);
const_assert_eq!(offset_of!(IntelCtxt, fixed_ctrl), 40);
const_assert_eq!(offset_of!(IntelCtxt, ds_area), 48);
const_assert_eq!(offset_of!(IntelCtxt, pebs_enable), 56);

const_assert_eq!(offset_of!(AmdCtxt, counters), 0);
const_assert_eq!(offset_of!(AmdCtxt, ctrls), 4);
const_assert_eq!(offset_of!(AmdCtxt, counter_count), 8);
const_assert_eq!(offset_of!(AmdCtxt, _pad0), 12);
const_assert_eq!(offset_of!(AmdCtxt, global_ctrl), 16);
const_assert_eq!(offset_of!(AmdCtxt, global_status), 24);
const_assert_eq!(offset_of!(AmdCtxt, _reserved0), 32);

const_assert_eq!(offset_of!(Page, header), 0);
const_assert_eq!(offset_of!(Page, identity), 16);
const_assert_eq!(offset_of!(Page, pmu_flags), 32);
const_assert_eq!(offset_of!(Page, lapic_lvtpc), 40);
const_assert_eq!(offset_of!(Page, _pad0), 44);
const_assert_eq!(offset_of!(Page, regs), 48);
const_assert_eq!(offset_of!(Page, dropped_samples), 216);
const_assert_eq!(offset_of!(Page, flush_refusal), 224);
const_assert_eq!(offset_of!(Page, _reserved0), 240);
const_assert_eq!(offset_of!(Page, vendor), 256);
const_assert_eq!(offset_of!(Page, sample), 1280);
const_assert_eq!(offset_of!(Page, _reserved1), 1864);

const_assert_eq!(size_of::<FlushRefusal>(), 16);
const_assert_eq!(offset_of!(FlushRefusal, msr), 0);
const_assert_eq!(offset_of!(FlushRefusal, reason), 4);
const_assert_eq!(offset_of!(FlushRefusal, value), 8);

const_assert_eq!(size_of::<SampleInfo>(), 584);
const_assert_eq!(offset_of!(SampleInfo, tsc), 0);
const_assert_eq!(offset_of!(SampleInfo, tsc_khz), 8);
const_assert_eq!(offset_of!(SampleInfo, sequence), 16);
const_assert_eq!(offset_of!(SampleInfo, overflowed), 24);
const_assert_eq!(offset_of!(SampleInfo, chain_len), 32);
const_assert_eq!(offset_of!(SampleInfo, chain_end), 36);
const_assert_eq!(offset_of!(SampleInfo, callchain), 40);
const_assert_eq!(offset_of!(SampleInfo, _reserved0), 552);
const_assert_eq!(align_of::<SampleInfo>(), 8);

const_assert_eq!(offset_of!(Version, major), 0);
const_assert_eq!(offset_of!(Version, minor), 4);

const_assert_eq!(offset_of!(Params, version), 0);
const_assert_eq!(offset_of!(Params, val), 8);
const_assert_eq!(offset_of!(Params, vcpu), 16);
const_assert_eq!(offset_of!(Params, _pad0), 20);

// The coverage block is the same 24 bytes read differently: one copy-in serves every op.
const_assert_eq!(size_of::<CoverageParams>(), size_of::<Params>());
const_assert_eq!(
    offset_of!(CoverageParams, version),
    offset_of!(Params, version)
);
const_assert_eq!(offset_of!(CoverageParams, buffer), offset_of!(Params, val));
const_assert_eq!(offset_of!(CoverageParams, size), offset_of!(Params, vcpu));
const_assert_eq!(offset_of!(CoverageParams, subop), offset_of!(Params, _pad0));

// The defined part of version 1.2 ends where the sample details end.
const_assert_eq!(
    crate::XENPMU_DEFINED_SIZE_1_2 as usize,
    offset_of!(Page, sample) + size_of::<SampleInfo>()
);
// The defined part of version 1.0 ends where the vendor area ends.
const_assert_eq!(
    crate::XENPMU_DEFINED_SIZE_1_0 as usize,
    offset_of!(Page, vendor) + size_of::<VendorArea>()
);
// Room for at least 8 GP + 4 fixed (Intel) and 6 core counters (AMD); the banks must fit.
const_assert!(
    crate::XENPMU_VENDOR_CTXT_SIZE + 4 * 8 + 8 * size_of::<CounterPair>()
        <= crate::XENPMU_VENDOR_AREA_SIZE
);
const_assert!(crate::XENPMU_VENDOR_CTXT_SIZE + 2 * 6 * 8 <= crate::XENPMU_VENDOR_AREA_SIZE);

// The sample ring (1.4).
const_assert_eq!(size_of::<RecordHeader>(), 8);
const_assert_eq!(offset_of!(RecordHeader, kind), 0);
const_assert_eq!(offset_of!(RecordHeader, size), 2);
const_assert_eq!(offset_of!(RecordHeader, misc), 4);
const_assert_eq!(size_of::<RingSample>(), crate::XENPMU_RING_SAMPLE_SIZE);
const_assert_eq!(offset_of!(RingSample, header), 0);
const_assert_eq!(offset_of!(RingSample, sequence), 8);
const_assert_eq!(offset_of!(RingSample, tsc), 16);
const_assert_eq!(offset_of!(RingSample, identity), 24);
const_assert_eq!(offset_of!(RingSample, overflowed), 40);
const_assert_eq!(offset_of!(RingSample, chain_len), 48);
const_assert_eq!(offset_of!(RingSample, chain_end), 52);
const_assert_eq!(offset_of!(RingSample, regs), 56);
const_assert_eq!(crate::XENPMU_RECORD_MAX, 736);
const_assert!(crate::XENPMU_RECORD_MAX <= u16::MAX as usize);
const_assert_eq!(size_of::<RingLost>(), 32);
const_assert_eq!(offset_of!(RingLost, lost), 8);
const_assert_eq!(offset_of!(RingLost, sequence), 16);
const_assert_eq!(offset_of!(RingLost, tsc), 24);
const_assert_eq!(size_of::<RingConfig>(), 256);
const_assert_eq!(offset_of!(RingConfig, data_pages), 0);
const_assert_eq!(offset_of!(RingConfig, wakeup_bytes), 4);
const_assert_eq!(offset_of!(RingConfig, max_latency_us), 8);
const_assert_eq!(offset_of!(RingConfig, flags), 12);
const_assert_eq!(offset_of!(RingConfig, _reserved0), 16);
const_assert_eq!(offset_of!(RingConfig, period_gp), 64);
const_assert_eq!(offset_of!(RingConfig, period_fixed), 128);
const_assert_eq!(offset_of!(RingConfig, _reserved1), 160);
const_assert_eq!(size_of::<RingInfo>(), 64);
const_assert_eq!(offset_of!(RingInfo, magic), 0);
const_assert_eq!(offset_of!(RingInfo, version_major), 4);
const_assert_eq!(offset_of!(RingInfo, version_minor), 6);
const_assert_eq!(offset_of!(RingInfo, data_offset), 8);
const_assert_eq!(offset_of!(RingInfo, data_size), 12);
const_assert_eq!(offset_of!(RingInfo, record_max), 16);
const_assert_eq!(offset_of!(RingInfo, wakeup_bytes), 20);
const_assert_eq!(offset_of!(RingInfo, tsc_khz), 24);
const_assert_eq!(size_of::<RingProducer>(), 64);
const_assert_eq!(offset_of!(RingProducer, head), 0);
const_assert_eq!(offset_of!(RingProducer, records), 8);
const_assert_eq!(offset_of!(RingProducer, lost), 16);
const_assert_eq!(offset_of!(RingProducer, withheld), 24);
const_assert_eq!(offset_of!(RingProducer, wakeups), 32);
const_assert_eq!(offset_of!(RingProducer, bad_tail), 40);
const_assert_eq!(size_of::<RingConsumer>(), 64);
const_assert_eq!(size_of::<RingControl>(), crate::XENPMU_RING_CONTROL_SIZE);
const_assert_eq!(offset_of!(RingControl, config), 0);
const_assert_eq!(
    offset_of!(RingControl, info),
    crate::XENPMU_RING_INFO_OFFSET
);
const_assert_eq!(
    offset_of!(RingControl, producer),
    crate::XENPMU_RING_PRODUCER_OFFSET
);
const_assert_eq!(
    offset_of!(RingControl, consumer),
    crate::XENPMU_RING_CONSUMER_OFFSET
);
// Producer and consumer lines never share a cache line with each other or with anything else.
const_assert_eq!(crate::XENPMU_RING_PRODUCER_OFFSET % 64, 0);
const_assert_eq!(crate::XENPMU_RING_CONSUMER_OFFSET % 64, 0);
const_assert_eq!(align_of::<RingControl>(), 8);
