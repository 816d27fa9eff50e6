//! `VendorPmu::from_cpuid`: the vendor string picks the backend, the backend is the one the
//! vendor crate enumerates from the same CPUID, and every refusal names its reason.

use std::cell::Cell;

use raw_cpuid::{CpuIdReader, CpuIdResult};
use vpmu::{PmuBackend, Vendor};
use vpmu_amd::{AmdCaps, AmdPmu, PmuShape};
use vpmu_intel::{IntelPmu, PERF_CAP_FW_WRITES};
use vpmu_models::intel::SyntheticCpuid;
use vpmu_vendor_any::{SelectError, VendorId, VendorPmu};

const ZERO: CpuIdResult = CpuIdResult {
    eax: 0,
    ebx: 0,
    ecx: 0,
    edx: 0,
};

/// Leaf 0: the highest basic leaf and a vendor string (EBX, EDX, ECX).
fn leaf_0(max_basic_leaf: u32, vendor: &[u8; 12]) -> CpuIdResult {
    let word =
        |i: usize| u32::from_le_bytes([vendor[i], vendor[i + 1], vendor[i + 2], vendor[i + 3]]);
    CpuIdResult {
        eax: max_basic_leaf,
        ebx: word(0),
        edx: word(4),
        ecx: word(8),
    }
}

/// A CPUID table: leaves not listed read as zero.
#[derive(Clone)]
struct Table(Vec<(u32, CpuIdResult)>);

impl CpuIdReader for Table {
    fn cpuid2(&self, leaf: u32, _subleaf: u32) -> CpuIdResult {
        self.0
            .iter()
            .find(|(l, _)| *l == leaf)
            .map_or(ZERO, |(_, result)| *result)
    }
}

/// An AMD (or Hygon) CPU's CPUID describing `shape`, from the backend's own guest leaves.
fn amd_cpuid(vendor: &[u8; 12], shape: PmuShape) -> Table {
    let leaves = AmdCaps::from_shape(shape).unwrap().guest_leaves();
    Table(vec![
        (0, leaf_0(0x10, vendor)),
        (
            0x8000_0000,
            CpuIdResult {
                eax: leaves.max_extended_leaf,
                ..ZERO
            },
        ),
        (
            0x8000_0001,
            CpuIdResult {
                ecx: leaves.ext_features,
                ..ZERO
            },
        ),
        (
            0x8000_0022,
            CpuIdResult {
                eax: leaves.perfmon[0],
                ebx: leaves.perfmon[1],
                ecx: leaves.perfmon[2],
                edx: leaves.perfmon[3],
            },
        ),
    ])
}

/// The synthetic Intel CPUID with leaf `leaf` replaced.
fn intel_with(shape: SyntheticCpuid, leaf: u32, result: CpuIdResult) -> impl CpuIdReader {
    move |l: u32, sub: u32| {
        if l == leaf {
            result
        } else {
            shape.leaf(l, sub)
        }
    }
}

#[test]
fn intel_cpus_get_the_intel_backend_of_the_same_enumeration() {
    for shape in [SyntheticCpuid::v5(8, 4, 0), SyntheticCpuid::v2(4, 3)] {
        let asked = Cell::new(0);
        let pmu = VendorPmu::from_cpuid(shape, || {
            asked.set(asked.get() + 1);
            Some(PERF_CAP_FW_WRITES)
        })
        .expect("a supported Intel PMU");
        assert_eq!(pmu.vendor(), Vendor::Intel);
        // IA32_PERF_CAPABILITIES is read exactly when CPUID.1:ECX.PDCM says it exists.
        let pdcm = shape.pdcm;
        assert_eq!(asked.get(), u32::from(pdcm), "{shape:?}");
        let direct = IntelPmu::from_cpuid(shape, pdcm.then_some(PERF_CAP_FW_WRITES)).unwrap();
        assert_eq!(pmu.as_intel().unwrap().caps(), direct.caps());
        assert_eq!(pmu.capabilities(), direct.capabilities());
        assert_eq!(pmu.capabilities().full_width_writes, pdcm);
        assert!(pmu.as_amd().is_none());
    }
}

#[test]
fn amd_and_hygon_cpus_get_the_amd_backend_of_every_shape() {
    for vendor in [b"AuthenticAMD", b"HygonGenuine"] {
        for shape in [
            PmuShape::LegacyK7,
            PmuShape::PerfCtrExtCore,
            PmuShape::PerfMonV2 { counters: 6 },
            PmuShape::PerfMonV2 { counters: 3 },
        ] {
            let pmu = VendorPmu::from_cpuid(amd_cpuid(vendor, shape), || {
                panic!("IA32_PERF_CAPABILITIES read on an AMD CPU")
            })
            .expect("an AMD PMU");
            assert_eq!(pmu.vendor(), Vendor::Amd);
            assert_eq!(pmu.as_amd().unwrap().caps().shape(), shape);
            let direct = AmdPmu::new(AmdCaps::from_shape(shape).unwrap()).unwrap();
            assert_eq!(pmu.capabilities(), direct.capabilities());
            assert!(pmu.as_intel().is_none());
        }
    }
}

#[test]
fn an_unknown_vendor_is_refused_with_its_string() {
    let centaur = Table(vec![(0, leaf_0(0xa, b"CentaurHauls"))]);
    let refused = VendorPmu::from_cpuid(centaur, || panic!("MSR read")).unwrap_err();
    assert_eq!(
        refused,
        SelectError::UnknownVendor(VendorId(*b"CentaurHauls"))
    );
    assert_eq!(
        refused.to_string(),
        "CPU vendor \"CentaurHauls\" has no vPMU backend (GenuineIntel, AuthenticAMD and \
         HygonGenuine have)"
    );
    // An Intel architectural PMU behind another vendor string is not taken for Intel's.
    let shape = SyntheticCpuid::v5(8, 4, 0);
    let disguised = intel_with(shape, 0, leaf_0(0xa, b"  Shanghai  "));
    assert!(matches!(
        VendorPmu::from_cpuid(disguised, || None),
        Err(SelectError::UnknownVendor(id)) if id.as_str() == Some("  Shanghai  ")
    ));
    // Bytes that are not printable are shown escaped.
    let odd = VendorId(*b"Genuine\0ntel");
    assert_eq!(odd.to_string(), "\"Genuine\\x00ntel\"");
    assert_eq!(odd.vendor(), None);
}

#[test]
fn an_intel_cpu_without_a_pmu_is_refused_as_such() {
    let shape = SyntheticCpuid::v5(8, 4, 0);
    // The highest basic leaf below 0xA: no leaf 0xA at all.
    let short = intel_with(shape, 0, leaf_0(7, b"GenuineIntel"));
    // Leaf 0xA of version 0: a VM whose hypervisor hides the PMU.
    let hidden = intel_with(shape, 0xa, ZERO);
    for refused in [
        VendorPmu::from_cpuid(short, || panic!("MSR read")),
        VendorPmu::from_cpuid(hidden, || panic!("MSR read")),
    ] {
        let error = refused.unwrap_err();
        assert_eq!(
            error,
            SelectError::NoPmu {
                vendor: Vendor::Intel
            }
        );
        assert_eq!(
            error.to_string(),
            "the Intel CPU advertises no PMU (CPUID leaf 0xA)"
        );
    }
}

#[test]
fn a_pmu_the_vendor_backend_refuses_carries_the_backends_reason() {
    let v1 = SyntheticCpuid {
        version: 1,
        ..SyntheticCpuid::v2(4, 0)
    };
    let error = VendorPmu::from_cpuid(v1, || None).unwrap_err();
    assert_eq!(
        error,
        SelectError::Intel(vpmu::BackendError::Enumeration(
            vpmu_intel::EnumerationError::UnsupportedVersion(1)
        ))
    );
    assert_eq!(
        error.to_string(),
        "Intel backend: unsupported PMU: architectural PMU version 1 has no global control \
         registers"
    );
    assert!(core::error::Error::source(&error).is_some());

    let mut no_counters = amd_cpuid(b"AuthenticAMD", PmuShape::PerfMonV2 { counters: 6 });
    no_counters.0[3].1.ebx = 0;
    let error = VendorPmu::from_cpuid(no_counters, || None).unwrap_err();
    assert_eq!(
        error,
        SelectError::Amd(vpmu::BackendError::Enumeration(
            vpmu_amd::EnumerationError::NoCounters
        ))
    );
    assert_eq!(
        error.to_string(),
        "AMD backend: unsupported PMU: PerfMonV2 with no core counters"
    );
}
