//! Shared pieces of the fuzz targets: the machines under test and the invariants the hardware
//! state must keep whatever a guest feeds the backends.

use vpmu::{AllowAll, EventFilter, GuestPolicy, PmuBackend, RawEvent};
use vpmu_amd::{AmdPmu, PmuShape};
use vpmu_intel::{IntelPmu, PERF_CAP_FW_WRITES};
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::shapes::{ALL_EVENTS, AmdShape, IntelShape, VendorShape};

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

/// An Intel backend and a cleaned model of the same CPU; `shape` picks one of four PMUs: the
/// `intel-v2` and `intel-v5` test shapes (the latter with the debug store), and two exotic ones.
pub fn intel(shape: u8) -> (IntelPmu, IntelPmuModel) {
    let shape = match shape % 4 {
        0 => IntelShape::v2(ALL_EVENTS),
        1 => {
            let v5 = IntelShape::v5(ALL_EVENTS);
            IntelShape { cpuid: SyntheticCpuid { debug_store: true, ..v5.cpuid }, ..v5 }
        }
        2 => IntelShape { cpuid: SyntheticCpuid::v5(6, 0, 0b1011), perf_capabilities: Some(PERF_CAP_FW_WRITES) },
        _ => IntelShape { cpuid: SyntheticCpuid::v2(2, 0), perf_capabilities: None },
    };
    cleaned(shape)
}

/// An AMD backend and a cleaned model; `shape` picks one of three PMUs: the `amd-k7` and
/// `amd-perfmonv2` test shapes and PerfCtrExtCore.
pub fn amd(shape: u8) -> (AmdPmu, AmdPmuModel) {
    let shape = match shape % 3 {
        0 => AmdShape::k7(),
        1 => AmdShape { pmu: PmuShape::PerfCtrExtCore },
        _ => AmdShape::perfmon_v2(),
    };
    cleaned(shape)
}

/// The backend of `shape` and its model, cleaned as a hypervisor cleans each CPU's PMU before
/// its first load.
fn cleaned<S: VendorShape>(shape: S) -> (S::Backend, S::Model) {
    let (pmu, mut model) = (shape.backend(), shape.model());
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
