//! Shared pieces of the fuzz targets: the machines under test and the invariants the hardware
//! state must keep whatever a guest feeds the backends.

use vpmu::{AllowAll, EventFilter, GuestPolicy, PmuBackend, RawEvent};
use vpmu_amd::{AmdPmu, AmdCaps, AmdPmuModel, PmuShape};
use vpmu_intel::{IntelPmu, IntelPmuModel, SyntheticCpuid};

/// A filter that denies every event with an odd event select, to exercise the filtered path.
pub struct DenyOdd;

impl EventFilter for DenyOdd {
    fn allows(&self, event: RawEvent) -> bool {
        event.select % 2 == 0
    }

    fn allows_fixed(&self, index: u32) -> bool {
        index % 2 == 0
    }
}

/// A guest policy chosen by one input byte.
pub fn policy(selector: u8) -> GuestPolicy<'static> {
    let filter: &'static dyn EventFilter = if selector & 1 != 0 { &DenyOdd } else { &AllowAll };
    GuestPolicy {
        features: u64::from((selector >> 1) & 0x7),
        filter,
        may_count_host: selector & 0x10 != 0,
    }
}

/// An Intel backend and a cleaned model of the same CPU; `shape` picks one of four PMUs.
pub fn intel(shape: u8) -> (IntelPmu, IntelPmuModel) {
    let (cpuid, perf_caps) = match shape % 4 {
        0 => (SyntheticCpuid::v2(4, 3), None),
        1 => (SyntheticCpuid { debug_store: true, ..SyntheticCpuid::v5(8, 4, 0) }, Some(1 << 13)),
        2 => (SyntheticCpuid::v5(6, 0, 0b1011), Some(1 << 13)),
        _ => (SyntheticCpuid::v2(2, 0), None),
    };
    let pmu = IntelPmu::from_cpuid(cpuid, perf_caps).expect("the fuzzed shapes are supported");
    let mut model = IntelPmuModel::new(*pmu.caps());
    pmu.init_hardware(&mut model).expect("a model accepts cleaning");
    (pmu, model)
}

/// An AMD backend and a cleaned model; `shape` picks one of three PMUs.
pub fn amd(shape: u8) -> (AmdPmu, AmdPmuModel) {
    let shape = match shape % 3 {
        0 => PmuShape::LegacyK7,
        1 => PmuShape::PerfCtrExtCore,
        _ => PmuShape::PerfMonV2 { counters: 6 },
    };
    let caps = AmdCaps::from_shape(shape).expect("the fuzzed shapes are supported");
    let mut model = AmdPmuModel::new(caps);
    let pmu = AmdPmu::new(caps).expect("six counters fit the page");
    pmu.init_hardware(&mut model).expect("a model accepts cleaning");
    (pmu, model)
}

/// Bits no Intel guest may ever get onto the hardware: PERFEVTSEL 63:32, AnyThread (21) and
/// Pin Control (19); FIXED_CTR_CTRL AnyThread (bit 2 of each nibble); any PEBS enable.
pub fn assert_intel_clean(model: &IntelPmuModel) {
    let regs = model.registers();
    for (index, select) in regs.event_selects.iter().enumerate() {
        assert_eq!(select & (0xffff_ffff_0000_0000 | 1 << 21 | 1 << 19), 0, "EVTSEL{index} = {select:#x}");
    }
    assert_eq!(regs.fixed_ctrl & 0x4444, 0, "FIXED_CTR_CTRL = {:#x}", regs.fixed_ctrl);
    assert_eq!(regs.pebs_enable, 0, "PEBS_ENABLE = {:#x}", regs.pebs_enable);
}

/// Bits no AMD guest may get onto the hardware: reserved PERF_CTL bits, HostOnly unless host
/// counting is allowed, and a programmed control without GuestOnly unless it is allowed.
pub fn assert_amd_clean(model: &AmdPmuModel, may_count_host: bool) {
    const RESERVED: u64 = 0xffff_fc00_0000_0000 | 0xf << 36 | 1 << 21 | 1 << 19;
    const GUEST_ONLY: u64 = 1 << 40;
    const HOST_ONLY: u64 = 1 << 41;
    for (index, ctl) in model.registers().controls.iter().enumerate() {
        assert_eq!(ctl & RESERVED, 0, "PERF_CTL{index} = {ctl:#x}");
        if !may_count_host {
            assert_eq!(ctl & HOST_ONLY, 0, "PERF_CTL{index} = {ctl:#x}");
            assert!(*ctl == 0 || ctl & GUEST_ONLY != 0, "PERF_CTL{index} = {ctl:#x}");
        }
    }
}
