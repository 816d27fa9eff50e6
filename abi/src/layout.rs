//! A machine-readable table of every ABI struct and field, with sizes and offsets taken from the
//! compiler (`size_of`, `offset_of!`).
//!
//! The header generator turns it into `_Static_assert`s, the cross-language tests compare it
//! with what gcc computes at -m32 and -m64, and the layout example prints it. Its own unit test
//! proves that each struct's fields tile the struct exactly, which (with sizes that are
//! multiples of 8) makes the layout independent of the consumer's `uint64_t` alignment.

use core::mem::{offset_of, size_of};

use crate::ops::{CoverageParams, Params, Version};
use crate::page::{FlushRefusal, Header, Identity, Page, Regs, SampleInfo};
use crate::ring::{
    RecordHeader, RingConfig, RingConsumer, RingControl, RingInfo, RingLost, RingProducer,
    RingSample,
};
use crate::vendor::{AmdCtxt, CounterPair, IntelCtxt, VendorArea};

/// One field of an ABI struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// Field name (the same in Rust and C).
    pub name: &'static str,
    /// Byte offset within the struct.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// One ABI struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructLayout {
    /// The Rust type name.
    pub rust_name: &'static str,
    /// The C type name in the generated header.
    pub c_name: &'static str,
    /// Size in bytes.
    pub size: usize,
    /// Fields in declaration order.
    pub fields: &'static [FieldLayout],
}

/// Size of the type a field accessor returns; lets `offset_of!`-style tables record field sizes
/// in const context.
const fn field_size<S, F>(_accessor: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! struct_layout {
    ($ty:ident, $c_name:literal, [$($field:ident),* $(,)?]) => {
        StructLayout {
            rust_name: stringify!($ty),
            c_name: $c_name,
            size: size_of::<$ty>(),
            fields: &[$(FieldLayout {
                name: stringify!($field),
                offset: offset_of!($ty, $field),
                size: field_size(|s: &$ty| &s.$field),
            }),*],
        }
    };
}

/// Every struct of the ABI, in the order the header declares them.
pub const STRUCTS: &[StructLayout] = &[
    struct_layout!(
        Header,
        "xenpmu_header",
        [magic, version_major, version_minor, defined_size, vendor]
    ),
    struct_layout!(
        Identity,
        "xenpmu_identity",
        [domain_id, vcpu_id, pcpu_id, _pad0]
    ),
    struct_layout!(
        Regs,
        "xenpmu_regs",
        [
            rax, rbx, rcx, rdx, rsi, rdi, rbp, rsp, r8, r9, r10, r11, r12, r13, r14, r15, rip,
            rflags, cs, ss, ds, es, fs, gs, cpl, _pad0, mode, _pad1
        ]
    ),
    struct_layout!(VendorArea, "xenpmu_vendor_area", [words]),
    struct_layout!(
        SampleInfo,
        "xenpmu_sample_info",
        [
            tsc, tsc_khz, sequence, overflowed, chain_len, chain_end, callchain, _reserved0
        ]
    ),
    struct_layout!(FlushRefusal, "xenpmu_flush_refusal", [msr, reason, value]),
    struct_layout!(CounterPair, "xenpmu_counter_pair", [counter, control]),
    struct_layout!(
        IntelCtxt,
        "xenpmu_intel_ctxt",
        [
            fixed_counters,
            arch_counters,
            fixed_count,
            arch_count,
            global_ctrl,
            global_status,
            global_ovf_ctrl,
            fixed_ctrl,
            ds_area,
            pebs_enable
        ]
    ),
    struct_layout!(
        AmdCtxt,
        "xenpmu_amd_ctxt",
        [
            counters,
            ctrls,
            counter_count,
            _pad0,
            global_ctrl,
            global_status,
            _reserved0
        ]
    ),
    struct_layout!(
        Page,
        "xenpmu_page",
        [
            header,
            identity,
            pmu_flags,
            lapic_lvtpc,
            _pad0,
            regs,
            dropped_samples,
            flush_refusal,
            _reserved0,
            vendor,
            sample,
            _reserved1
        ]
    ),
    struct_layout!(Version, "xenpmu_version", [major, minor]),
    struct_layout!(Params, "xenpmu_params", [version, val, vcpu, _pad0]),
    struct_layout!(
        CoverageParams,
        "xenpmu_coverage_params",
        [version, buffer, size, subop]
    ),
    struct_layout!(RecordHeader, "xenpmu_record_header", [kind, size, misc]),
    struct_layout!(
        RingSample,
        "xenpmu_ring_sample",
        [
            header, sequence, tsc, identity, overflowed, chain_len, chain_end, regs
        ]
    ),
    struct_layout!(RingLost, "xenpmu_ring_lost", [header, lost, sequence, tsc]),
    struct_layout!(
        RingConfig,
        "xenpmu_ring_config",
        [
            data_pages,
            wakeup_bytes,
            max_latency_us,
            flags,
            _reserved0,
            period_gp,
            period_fixed,
            _reserved1
        ]
    ),
    struct_layout!(
        RingInfo,
        "xenpmu_ring_info",
        [
            magic,
            version_major,
            version_minor,
            data_offset,
            data_size,
            record_max,
            wakeup_bytes,
            tsc_khz,
            _reserved0
        ]
    ),
    struct_layout!(
        RingProducer,
        "xenpmu_ring_producer",
        [head, records, lost, withheld, wakeups, bad_tail, _reserved0]
    ),
    struct_layout!(RingConsumer, "xenpmu_ring_consumer", [tail, _reserved0]),
    struct_layout!(
        RingControl,
        "xenpmu_ring_control",
        [config, info, producer, consumer, _reserved]
    ),
];

/// The layout of the struct with this Rust name.
pub fn find(rust_name: &str) -> Option<&'static StructLayout> {
    STRUCTS.iter().find(|s| s.rust_name == rust_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_every_struct_exactly() {
        for layout in STRUCTS {
            let mut next = 0;
            for field in layout.fields {
                assert_eq!(
                    field.offset, next,
                    "{}.{} starts at {} but the previous field ends at {next}: implicit padding or a field missing from the table",
                    layout.rust_name, field.name, field.offset
                );
                next = field.offset + field.size;
            }
            assert_eq!(
                next, layout.size,
                "{}: fields do not reach the end of the struct",
                layout.rust_name
            );
            assert_eq!(
                layout.size % 8,
                0,
                "{}: size not a multiple of 8",
                layout.rust_name
            );
        }
    }

    #[test]
    fn eight_byte_fields_are_eight_aligned() {
        // With `uint64_t` aligned to 4 (i386) a misplaced u64 would silently move; none is.
        for layout in STRUCTS {
            for field in layout.fields {
                if field.size % 8 == 0 && !field.name.starts_with('_') {
                    assert_eq!(field.offset % 8, 0, "{}.{}", layout.rust_name, field.name);
                }
            }
        }
    }

    #[test]
    fn c_names_are_unique() {
        for (i, a) in STRUCTS.iter().enumerate() {
            for b in &STRUCTS[i + 1..] {
                assert_ne!(a.c_name, b.c_name);
                assert_ne!(a.rust_name, b.rust_name);
            }
        }
    }
}
