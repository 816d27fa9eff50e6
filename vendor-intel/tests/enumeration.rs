//! Enumeration of several CPUID shapes through raw-cpuid's custom reader. The leaves are
//! written out as raw register values (not built by `SyntheticCpuid`), so the encoder of the
//! synthetic CPUID is not what these tests check against.

use raw_cpuid::{CpuIdReader, CpuIdResult};
use vpmu::{GuestPolicy, Msr, MsrOutcome, PmuBackend, Vendor};
use vpmu_intel::{EnumerationError, IntelCaps, IntelPmu, PERF_CAP_FW_WRITES};
use vpmu_models::HwEvent;
use vpmu_models::intel::IntelPmuModel;
use vpmu_models::intel::arch_event;

const NONE: CpuIdResult = CpuIdResult {
    eax: 0,
    ebx: 0,
    ecx: 0,
    edx: 0,
};

/// "GenuineIntel" with max basic leaf `max_leaf`.
const fn intel_leaf0(max_leaf: u32) -> CpuIdResult {
    CpuIdResult {
        eax: max_leaf,
        ebx: 0x756e_6547,
        ecx: 0x6c65_746e,
        edx: 0x4965_6e69,
    }
}

/// "AuthenticAMD".
const AMD_LEAF0: CpuIdResult = CpuIdResult {
    eax: 0x10,
    ebx: 0x6874_7541,
    ecx: 0x444d_4163,
    edx: 0x6974_6e65,
};

/// Leaf 1 of a family-6 part; `ecx` and `edx` carry PDCM (ECX 15), DTES64 (ECX 2), DS (EDX 21).
const fn leaf1(ecx: u32, edx: u32) -> CpuIdResult {
    CpuIdResult {
        eax: 0x0009_06ea,
        ebx: 0x0010_0800,
        ecx,
        edx,
    }
}

/// A CPUID answered from a table of (leaf, result), every subleaf alike.
fn table(entries: Vec<(u32, CpuIdResult)>) -> impl CpuIdReader {
    move |leaf: u32, _subleaf: u32| {
        entries
            .iter()
            .find(|(l, _)| *l == leaf)
            .map_or(NONE, |(_, r)| *r)
    }
}

fn intel(leaf_a: CpuIdResult, leaf1_ecx: u32) -> impl CpuIdReader {
    table(vec![
        (0, intel_leaf0(0xa)),
        (1, leaf1(leaf1_ecx, 0)),
        (0xa, leaf_a),
    ])
}

const PDCM: u32 = 1 << 15;

/// v2: 4 GP counters of 48 bits, event vector of 7, 3 fixed counters of 48 bits.
const V2_4GP_3FIXED: CpuIdResult = CpuIdResult {
    eax: 0x0730_0402,
    ebx: 0,
    ecx: 0,
    edx: 0x0000_0603,
};

/// v5: 8 GP counters of 48 bits, event vector of 8, 4 fixed counters of 48 bits, AnyThread
/// deprecated (EDX 15).
const V5_8GP_4FIXED: CpuIdResult = CpuIdResult {
    eax: 0x0830_0805,
    ebx: 0,
    ecx: 0,
    edx: 0x0000_8604,
};

/// v5: 8 GP counters, EDX says 2 contiguous fixed counters, ECX adds fixed counter 3: the
/// present set is {0, 1, 3}.
const V5_SPARSE: CpuIdResult = CpuIdResult {
    eax: 0x0830_0805,
    ebx: 0,
    ecx: 0b1000,
    edx: 0x0000_8602,
};

fn write(pmu: &IntelPmu, msr: u32, value: u64) -> MsrOutcome<()> {
    let mut ctx = pmu.new_context();
    pmu.guest_write(
        &mut ctx,
        None::<&mut IntelPmuModel>,
        &GuestPolicy::guest_default(),
        Msr(msr),
        value,
    )
    .expect("no hardware involved")
}

fn read(pmu: &IntelPmu, msr: u32) -> MsrOutcome<u64> {
    let mut ctx = pmu.new_context();
    pmu.guest_read(&mut ctx, None::<&mut IntelPmuModel>, Msr(msr))
        .expect("no hardware involved")
}

const GP: MsrOutcome<()> = MsrOutcome::GeneralProtection;
const OK: MsrOutcome<()> = MsrOutcome::Handled(());

#[test]
fn v2_four_gp_three_fixed() {
    let caps = IntelCaps::from_cpuid(intel(V2_4GP_3FIXED, 0), Some(PERF_CAP_FW_WRITES))
        .expect("v2 is supported");
    assert_eq!(caps.version(), 2);
    assert_eq!(caps.gp_counters(), 4);
    assert_eq!(caps.gp_width(), 48);
    assert_eq!(caps.fixed_counters(), 0b111);
    assert_eq!(caps.fixed_width(), 48);
    assert!(
        !caps.has_perf_capabilities(),
        "no PDCM: PERF_CAPABILITIES not consulted"
    );
    assert!(!caps.full_width_writes());
    assert!(!caps.anythread_deprecated());

    let pmu = IntelPmu::new(caps).expect("fits the page");
    let summary = pmu.capabilities();
    assert_eq!(summary.vendor, Vendor::Intel);
    assert_eq!(
        (summary.version, summary.gp_counters, summary.gp_width),
        (2, 4, 48)
    );
    assert_eq!((summary.fixed_counters, summary.fixed_width), (0b111, 48));
    assert!(summary.global_ctrl && !summary.full_width_writes);

    assert_eq!(write(&pmu, 0xc4, 1), OK, "IA32_PMC3");
    assert_eq!(write(&pmu, 0xc5, 1), GP, "IA32_PMC4 does not exist");
    assert_eq!(write(&pmu, 0x189, 0), OK, "PERFEVTSEL3");
    assert_eq!(write(&pmu, 0x18a, 0), GP, "PERFEVTSEL4 does not exist");
    assert_eq!(
        write(&pmu, 0x4c1, 1),
        GP,
        "no full-width alias without FW_WRITE"
    );
    assert_eq!(write(&pmu, 0x30b, 1), OK, "FIXED_CTR2");
    assert_eq!(write(&pmu, 0x30c, 1), GP, "FIXED_CTR3 does not exist");
    assert_eq!(write(&pmu, 0x391, 1), GP, "GLOBAL_STATUS_SET is v4+");
    assert_eq!(read(&pmu, 0x391), MsrOutcome::GeneralProtection);
    assert_eq!(read(&pmu, 0x345), MsrOutcome::GeneralProtection, "no PDCM");
    assert_eq!(
        read(&pmu, 0x38f),
        MsrOutcome::Handled(0xf),
        "reset GLOBAL_CTRL"
    );
}

#[test]
fn v5_eight_gp_four_fixed_with_full_width_writes() {
    let caps = IntelCaps::from_cpuid(intel(V5_8GP_4FIXED, PDCM), Some(PERF_CAP_FW_WRITES | 0x3))
        .expect("v5 is supported");
    assert_eq!(caps.version(), 5);
    assert_eq!(caps.gp_counters(), 8);
    assert_eq!(caps.fixed_counters(), 0b1111);
    assert!(caps.anythread_deprecated());
    assert!(caps.full_width_writes());

    let pmu = IntelPmu::new(caps).expect("fits the page");
    assert_eq!(write(&pmu, 0xc8, 1), OK, "IA32_PMC7");
    assert_eq!(write(&pmu, 0x4c8, 1), OK, "IA32_A_PMC7");
    assert_eq!(write(&pmu, 0x30c, 1), OK, "FIXED_CTR3 (topdown slots)");
    assert_eq!(write(&pmu, 0x391, 1), OK, "GLOBAL_STATUS_SET");
    assert_eq!(
        read(&pmu, 0x345),
        MsrOutcome::Handled(PERF_CAP_FW_WRITES),
        "only FW_WRITE is shown, not the LBR format"
    );
    assert_eq!(read(&pmu, 0x38f), MsrOutcome::Handled(0xff));
    assert_eq!(write(&pmu, 0x38f, 0xf_0000_00ff), OK);
}

#[test]
fn v5_sparse_fixed_bitmap() {
    let caps = IntelCaps::from_cpuid(intel(V5_SPARSE, PDCM), Some(0)).expect("v5 is supported");
    assert_eq!(caps.fixed_counters(), 0b1011);
    assert_eq!(caps.fixed_bank_len(), 4);
    assert!(!caps.full_width_writes());

    let pmu = IntelPmu::new(caps).expect("fits the page");
    assert_eq!(write(&pmu, 0x309, 1), OK);
    assert_eq!(write(&pmu, 0x30a, 1), OK);
    assert_eq!(
        write(&pmu, 0x30b, 1),
        GP,
        "fixed counter 2 is not in the bitmap"
    );
    assert_eq!(write(&pmu, 0x30c, 1), OK, "fixed counter 3 is, through ECX");
    assert_eq!(
        write(&pmu, 0x38d, 0x0b00),
        GP,
        "FIXED_CTR_CTRL nibble of counter 2"
    );
    assert_eq!(write(&pmu, 0x38d, 0xb0bb), OK);
    assert_eq!(
        write(&pmu, 0x38f, 1 << 34),
        GP,
        "GLOBAL_CTRL bit of counter 2"
    );
    assert_eq!(write(&pmu, 0x38f, 1 << 35), OK);
    assert_eq!(read(&pmu, 0x345), MsrOutcome::Handled(0));
}

#[test]
fn ecx_bitmap_is_ignored_before_v5() {
    let v4 = CpuIdResult {
        eax: 0x0730_0404,
        ecx: 0b1000,
        ..V2_4GP_3FIXED
    };
    let caps = IntelCaps::from_cpuid(intel(v4, 0), None).expect("v4 is supported");
    assert_eq!(caps.fixed_counters(), 0b111);
}

#[test]
fn v1_is_refused_and_later_versions_are_driven_as_v5() {
    let v1 = CpuIdResult {
        eax: 0x0728_0201,
        ..NONE
    };
    assert_eq!(
        IntelCaps::from_cpuid(intel(v1, 0), None),
        Err(EnumerationError::UnsupportedVersion(1))
    );
    let v6 = CpuIdResult {
        eax: 0x0830_0806,
        ..V5_SPARSE
    };
    let caps = IntelCaps::from_cpuid(intel(v6, 0), None).expect("v6 is driven as v5");
    assert_eq!((caps.version(), caps.reported_version()), (5, 6));
    assert_eq!(caps.fixed_counters(), 0b1011, "the v5 bitmap is still read");
}

#[test]
fn gp_counters_are_clipped_to_the_map() {
    let twelve = CpuIdResult {
        eax: 0x0730_0c03,
        ..V2_4GP_3FIXED
    };
    let caps = IntelCaps::from_cpuid(intel(twelve, 0), None).expect("v3");
    assert_eq!(caps.gp_counters(), 8);
}

#[test]
fn no_architectural_pmu() {
    let amd = table(vec![(0, AMD_LEAF0), (0xa, V2_4GP_3FIXED)]);
    assert_eq!(
        IntelCaps::from_cpuid(amd, None),
        Err(EnumerationError::NoArchitecturalPmu),
        "leaf 0xA is reserved on AMD"
    );
    let old = table(vec![(0, intel_leaf0(0x6)), (0xa, V2_4GP_3FIXED)]);
    assert_eq!(
        IntelCaps::from_cpuid(old, None),
        Err(EnumerationError::NoArchitecturalPmu),
        "max basic leaf below 0xA"
    );
}

#[test]
fn event_availability_bits() {
    // Vector length 7; EBX says LLC misses (bit 4) and branch misses (bit 6) unavailable.
    let leaf = CpuIdResult {
        ebx: 0b101_0000,
        ..V2_4GP_3FIXED
    };
    let caps = IntelCaps::from_cpuid(intel(leaf, 0), None).expect("v2");
    let available: Vec<_> = [
        HwEvent::CoreCycles,
        HwEvent::Instructions,
        HwEvent::RefCycles,
        HwEvent::LlcReferences,
        HwEvent::LlcMisses,
        HwEvent::Branches,
        HwEvent::BranchMisses,
    ]
    .into_iter()
    .map(|e| caps.event_available(arch_event(e)))
    .collect();
    assert_eq!(available, [true, true, true, true, false, true, false]);
}

#[test]
fn debug_store_needs_ds_and_dtes64() {
    let ds_only = table(vec![
        (0, intel_leaf0(0xa)),
        (1, leaf1(0, 1 << 21)),
        (0xa, V2_4GP_3FIXED),
    ]);
    let both = table(vec![
        (0, intel_leaf0(0xa)),
        (1, leaf1(1 << 2, 1 << 21)),
        (0xa, V2_4GP_3FIXED),
    ]);
    assert!(
        !IntelCaps::from_cpuid(ds_only, None)
            .expect("v2")
            .debug_store()
    );
    assert!(IntelCaps::from_cpuid(both, None).expect("v2").debug_store());
}

#[test]
fn msr_ranges_cover_the_whole_architectural_map() {
    let pmu = IntelPmu::from_cpuid(intel(V2_4GP_3FIXED, 0), None).expect("v2");
    for msr in [
        0xc1, 0xc8, 0x186, 0x18d, 0x309, 0x30c, 0x329, 0x345, 0x38d, 0x38e, 0x38f, 0x390, 0x391,
        0x392, 0x3f1, 0x4c1, 0x4c8, 0x600,
    ] {
        assert!(pmu.owns(Msr(msr)), "{msr:#x}");
    }
    for msr in [
        0xc0, 0xc9, 0x185, 0x18e, 0x1d9, 0x308, 0x30d, 0x328, 0x32a, 0x393, 0x4c0, 0x4c9, 0x601,
    ] {
        assert!(!pmu.owns(Msr(msr)), "{msr:#x}");
        assert_eq!(write(&pmu, msr, 0), MsrOutcome::NotPmu);
        assert_eq!(read(&pmu, msr), MsrOutcome::NotPmu);
    }
}
