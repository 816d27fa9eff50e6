//! The software PMU model on its own: hardware semantics, independent of the backend's policy.

mod common;

use common::*;
use vpmu::{CountingBus, Msr, MsrBus, MsrFault};
use vpmu_intel::{IntelCaps, PERF_CAP_FW_WRITES};
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::{HwEvent, SoftwarePmu};

fn model(shape: SyntheticCpuid, perf_capabilities: Option<u64>) -> IntelPmuModel {
    IntelPmuModel::new(IntelCaps::from_cpuid(shape, perf_capabilities).expect("shape"))
}

fn fault(msr: u32) -> Result<(), MsrFault> {
    Err(MsrFault { msr: Msr(msr) })
}

#[test]
fn reserved_bits_fault_but_anythread_and_pin_control_are_accepted() {
    let mut hw = model(v5_shape(), Some(RICH_PERF_CAPABILITIES));
    let sel = ENABLE_ALL_RINGS | INSTRUCTIONS | 1 << 21 | 1 << 19;
    assert_eq!(hw.write(Msr(EVTSEL0), sel), Ok(()));
    assert_eq!(hw.write(Msr(EVTSEL0), 1 << 32), fault(EVTSEL0));
    assert_eq!(
        hw.registers().event_selects[0],
        sel,
        "a faulting write changes nothing"
    );
    assert_eq!(
        hw.write(Msr(FIXED_CTR_CTRL), 0xffff),
        Ok(()),
        "AnyThread in every nibble"
    );
    assert_eq!(
        hw.write(Msr(FIXED_CTR_CTRL), 0x1_0000),
        fault(FIXED_CTR_CTRL)
    );
    assert_eq!(hw.write(Msr(GLOBAL_CTRL), 1 << 36), fault(GLOBAL_CTRL));
    assert_eq!(
        hw.write(Msr(PEBS_ENABLE), 0xff),
        Ok(()),
        "PEBS bits of the GP counters"
    );
    assert_eq!(hw.write(Msr(PEBS_ENABLE), 0x100), fault(PEBS_ENABLE));
    assert_eq!(
        hw.write(Msr(DS_AREA), 0x0000_8000_0000_0000),
        fault(DS_AREA)
    );
    assert_eq!(hw.read(Msr(PERF_CAPABILITIES)), Ok(RICH_PERF_CAPABILITIES));
    assert_eq!(
        hw.write(Msr(PERF_CAPABILITIES), 0),
        fault(PERF_CAPABILITIES)
    );
    assert_eq!(hw.read(Msr(0x1d9)), Err(MsrFault { msr: Msr(0x1d9) }));
}

#[test]
fn counter_aliases() {
    let mut legacy_only = model(v2_shape(), None);
    assert_eq!(legacy_only.write(Msr(PMC0), 0xff01_2345_6789), Ok(()));
    assert_eq!(legacy_only.read(Msr(PMC0)), Ok(0x2345_6789));
    assert_eq!(legacy_only.write(Msr(PMC0), 0x9000_0000), Ok(()));
    assert_eq!(legacy_only.read(Msr(PMC0)), Ok(0xffff_9000_0000));
    assert_eq!(legacy_only.write(Msr(A_PMC0), 1), fault(A_PMC0));
    assert_eq!(legacy_only.write(Msr(PMC0 + 4), 1), fault(PMC0 + 4));

    let mut full = model(SyntheticCpuid::v5(8, 4, 0), Some(PERF_CAP_FW_WRITES));
    assert_eq!(full.write(Msr(A_PMC0 + 7), 0xff01_2345_6789), Ok(()));
    assert_eq!(full.read(Msr(PMC0 + 7)), Ok(0xff01_2345_6789));
    assert_eq!(
        full.write(Msr(A_PMC0 + 7), 0xffff_ff01_2345_6789),
        fault(A_PMC0 + 7)
    );
    assert_eq!(
        full.write(Msr(FIXED_CTR0 + 3), 1 << 48),
        fault(FIXED_CTR0 + 3)
    );
}

#[test]
fn status_registers() {
    let mut v2 = model(v2_shape(), None);
    assert_eq!(v2.write(Msr(GLOBAL_STATUS), 0), fault(GLOBAL_STATUS));
    assert_eq!(
        v2.write(Msr(GLOBAL_STATUS_SET), 1),
        fault(GLOBAL_STATUS_SET)
    );
    assert_eq!(
        v2.write(Msr(GLOBAL_OVF_CTRL), 1 << 61),
        fault(GLOBAL_OVF_CTRL),
        "v3+"
    );

    let mut v5 = model(v5_shape(), None);
    assert_eq!(v5.write(Msr(GLOBAL_STATUS_SET), 0b11 | 1 << 35), Ok(()));
    assert_eq!(v5.read(Msr(GLOBAL_STATUS)), Ok(0b11 | 1 << 35));
    assert_eq!(v5.read(Msr(GLOBAL_STATUS_SET)), Ok(0));
    assert_eq!(v5.write(Msr(GLOBAL_OVF_CTRL), 0b01 | 1 << 61), Ok(()));
    assert_eq!(v5.read(Msr(GLOBAL_STATUS)), Ok(0b10 | 1 << 35));
    assert_eq!(v5.read(Msr(GLOBAL_OVF_CTRL)), Ok(0));
}

#[test]
fn gating_by_enable_global_ctrl_privilege_and_event() {
    let mut hw = model(v2_shape(), None);
    // 0: user-only instructions; 1: kernel-only instructions; 2: instructions, disabled;
    // 3: branches both rings but globally disabled.
    hw.write(Msr(EVTSEL0), (1 << 22) | (1 << 16) | INSTRUCTIONS)
        .unwrap();
    hw.write(Msr(EVTSEL0 + 1), (1 << 22) | (1 << 17) | INSTRUCTIONS)
        .unwrap();
    hw.write(Msr(EVTSEL0 + 2), (1 << 17) | (1 << 16) | INSTRUCTIONS)
        .unwrap();
    hw.write(Msr(EVTSEL0 + 3), ENABLE_ALL_RINGS | BRANCHES)
        .unwrap();
    hw.write(Msr(GLOBAL_CTRL), 0b0111).unwrap();
    hw.count(HwEvent::Instructions, 10, KERNEL);
    hw.count(HwEvent::Instructions, 3, USER);
    hw.count(
        HwEvent::Instructions,
        5,
        vpmu_models::ExecMode { cpl: 1, host: true },
    );
    hw.count(HwEvent::Branches, 7, KERNEL);
    assert_eq!(hw.registers().gp_counters[..4], [8, 10, 0, 0]);
    hw.write(Msr(GLOBAL_CTRL), 0b1000).unwrap();
    hw.count(HwEvent::Branches, 7, USER);
    assert_eq!(hw.registers().gp_counters[3], 7);
}

#[test]
fn edge_inv_and_cmask_selectors_do_not_count() {
    let mut hw = model(v2_shape(), None);
    for (i, extra) in [(0, 1 << 18), (1, 1 << 23), (2, 2 << 24), (3, 0)] {
        hw.write(Msr(EVTSEL0 + i), ENABLE_ALL_RINGS | INSTRUCTIONS | extra)
            .unwrap();
    }
    hw.count(HwEvent::Instructions, 9, KERNEL);
    assert_eq!(hw.registers().gp_counters[..4], [0, 0, 0, 9]);
}

#[test]
fn wrap_sets_status_and_pmi_only_with_int() {
    let mut hw = model(v2_shape(), None);
    hw.write(Msr(PMC0), 10u64.wrapping_neg()).unwrap();
    hw.write(Msr(PMC0 + 1), 10u64.wrapping_neg()).unwrap();
    hw.write(Msr(EVTSEL0), ENABLE_ALL_RINGS | INSTRUCTIONS)
        .unwrap();
    hw.write(Msr(EVTSEL0 + 1), ENABLE_ALL_RINGS | EVTSEL_INT | BRANCHES)
        .unwrap();
    hw.count(HwEvent::Instructions, 25, KERNEL);
    assert_eq!(hw.registers().gp_counters[0], 15, "ends at (c + n) mod 2^w");
    assert_eq!(hw.registers().global_status, 1);
    assert!(!hw.pmi_pending());
    hw.count(HwEvent::Branches, 9, KERNEL);
    assert!(!hw.pmi_pending(), "one short of the wrap");
    hw.count(HwEvent::Branches, 1, KERNEL);
    assert_eq!(hw.registers().global_status, 0b11);
    assert!(hw.take_pmi());
    assert!(!hw.take_pmi(), "taken");
}

#[test]
fn fixed_counters_behave_as_on_hardware() {
    let mut hw = model(SyntheticCpuid::v5(2, 4, 0), None);
    hw.write(Msr(FIXED_CTR0 + 1), ((1u64 << 48) - 2) & ((1 << 48) - 1))
        .unwrap();
    hw.write(Msr(FIXED_CTR_CTRL), 0x3bb3).unwrap();
    hw.write(Msr(GLOBAL_CTRL), 0xf_0000_0000).unwrap();
    hw.count(HwEvent::CoreCycles, 3, USER);
    hw.count(HwEvent::Instructions, 4, KERNEL);
    hw.count(HwEvent::RefCycles, 5, KERNEL);
    let r = hw.registers();
    assert_eq!(r.fixed_counters, [4, 1, 5, 0]);
    assert_eq!(r.global_status, 1 << 33);
    assert!(hw.pmi_pending(), "fixed counter 1 has its PMI bit");
}

#[test]
fn access_statistics_match_a_counting_bus() {
    let mut hw = model(v2_shape(), None);
    let mut bus = CountingBus::new(&mut hw);
    bus.write(Msr(PMC0), 1).unwrap();
    bus.read(Msr(PMC0)).unwrap();
    bus.read(Msr(PMC0 + 5)).unwrap_err();
    bus.write(Msr(GLOBAL_STATUS), 0).unwrap_err();
    let seen = bus.stats();
    assert_eq!((seen.reads, seen.writes, seen.faults), (2, 2, 2));
    assert_eq!(hw.access_stats(), seen);
}
