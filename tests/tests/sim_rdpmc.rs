//! RDPMC through the core on all four PMU shapes: it returns what RDMSR of the same counter
//! returns (live while the context is loaded, the saved value otherwise, never another vCPU's),
//! and raises #GP exactly where the processor does: a selector naming no counter of the
//! enumerated PMU, CPL > 0 without CR4.PCE, no vPMU for the domain.

use vpmu::abi::{XENPMU_MODE_OFF, XENPMU_MODE_SELF};
use vpmu::{MsrOutcome, VcpuId};
use vpmu_sim::helpers::counting;
use vpmu_sim::{Driver, Machine, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 2, vcpu: 0 };
const GP: MsrOutcome<u64> = MsrOutcome::GeneralProtection;
/// The sim driver's numbering of the first Intel fixed counter.
const FIXED0: u32 = 32;
/// Intel's RDPMC type for the fixed counters (ECX bit 30).
const INTEL_FIXED: u32 = 1 << 30;

/// The RDPMC selector of the driver's counter `ctr`.
fn selector(driver: &Driver, ctr: u32) -> u32 {
    if driver.is_intel() && ctr >= FIXED0 {
        INTEL_FIXED | (ctr - FIXED0)
    } else {
        ctr
    }
}

fn machine<V: SimVendor>(vendor: V, mode: u64) -> Machine<V> {
    let mut m = Machine::new(vendor, 1, &[1, 1, 1], mode);
    m.schedule(0, Some(A));
    m
}

/// Every counter, started at a distinct value and run: RDPMC = RDMSR, at CPL 0 and at CPL 3
/// with CR4.PCE; and after B ran in between, A still reads its own values, B its own.
fn reads_match_rdmsr<V: SimVendor>(vendor: V) {
    let driver = vendor.driver();
    let mut m = machine(vendor, XENPMU_MODE_SELF);
    let counters = driver.counters();
    let setups: Vec<_> = counters
        .iter()
        .map(|&c| counting(c, 0x1000 * u64::from(c + 1)))
        .collect();
    m.program(A, &setups);
    m.run(0, 25);
    for &c in &counters {
        let rdmsr = m.read(A, driver.read_counter(c));
        let sel = selector(&driver, c);
        assert_eq!(
            m.rdpmc(A, sel, 0, false),
            MsrOutcome::Handled(rdmsr),
            "ctr {c}"
        );
        assert_eq!(
            m.rdpmc(A, sel, 3, true),
            MsrOutcome::Handled(rdmsr),
            "ctr {c}"
        );
        assert!(
            rdmsr > 0x1000 * u64::from(c + 1),
            "ctr {c} counted: {rdmsr:#x}"
        );
    }
    let before: Vec<_> = counters
        .iter()
        .map(|&c| m.rdpmc(A, selector(&driver, c), 0, false))
        .collect();
    m.schedule(0, Some(B));
    for &c in &counters {
        assert_eq!(
            m.rdpmc(B, selector(&driver, c), 0, false),
            MsrOutcome::Handled(0),
            "B never wrote ctr {c}: it reads 0, not A's value"
        );
    }
    m.schedule(0, Some(A));
    let after: Vec<_> = counters
        .iter()
        .map(|&c| m.rdpmc(A, selector(&driver, c), 0, false))
        .collect();
    assert_eq!(before, after, "A's counters did not move while B ran");
}

/// RDPMC at CPL 3 without CR4.PCE, and selectors past the enumerated counters, #GP.
fn faults<V: SimVendor>(vendor: V, invalid: &[u32]) {
    let mut m = machine(vendor, XENPMU_MODE_SELF);
    m.program(A, &[counting(0, 5)]);
    assert_eq!(m.rdpmc(A, 0, 3, false), GP, "CPL 3 without CR4.PCE");
    assert_eq!(m.rdpmc(A, 0, 1, false), GP, "CPL 1 without CR4.PCE");
    for &sel in invalid {
        assert_eq!(m.rdpmc(A, sel, 0, false), GP, "selector {sel:#x}");
    }
    let faults = m.vcpu(A).stats().gp_faults;
    assert_eq!(faults, 2 + invalid.len() as u64, "each #GP counted");
}

/// With the vPMU off nothing is readable.
fn off<V: SimVendor>(vendor: V) {
    let mut m = machine(vendor, XENPMU_MODE_OFF);
    assert_eq!(m.rdpmc(A, 0, 0, false), GP);
}

#[test]
fn intel_v5_rdpmc() {
    reads_match_rdmsr(intel_v5());
    // GP 8 and fixed 4 are past the banks; bit 31 (fast read) and bit 29 (metrics) are
    // types this PMU does not have.
    faults(
        intel_v5(),
        &[
            8,
            0xffff,
            INTEL_FIXED | 4,
            1 << 31,
            (1 << 31) | 1,
            1 << 29,
            1 << 16,
        ],
    );
    off(intel_v5());
}

#[test]
fn intel_v2_rdpmc() {
    reads_match_rdmsr(intel_v2());
    // v2 has 4 GP and 3 fixed counters.
    faults(intel_v2(), &[4, 7, INTEL_FIXED | 3, 1 << 31]);
    off(intel_v2());
}

#[test]
fn amd_perfmon_v2_rdpmc() {
    reads_match_rdmsr(amd_v2());
    // 6 core counters; 6..9 would be the (absent) northbridge counters.
    faults(amd_v2(), &[6, 9, 15, 1 << 30, 1 << 31]);
    off(amd_v2());
}

#[test]
fn amd_k7_rdpmc() {
    reads_match_rdmsr(amd_legacy());
    faults(amd_legacy(), &[4, 5, 1 << 31]);
    off(amd_legacy());
}
