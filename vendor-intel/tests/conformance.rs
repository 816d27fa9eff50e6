//! Conformance of the emulated MSRs to the SDM and to what kvm-unit-tests x86/pmu.c and the KVM
//! selftests (pmu_counters_test, pmu_event_filter_test) expect, with the software model as the
//! hardware under a loaded context.

mod common;

use common::*;
use vpmu::abi::{XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY};
use vpmu::{CounterSet, EventFilter, GuestPolicy, MsrOutcome, PmuBackend, RawEvent};
use vpmu_intel::PERF_CAP_FW_WRITES;
use vpmu_models::{HwEvent, SoftwarePmu};

const GP: MsrOutcome<()> = MsrOutcome::GeneralProtection;
const WIDTH_48: u64 = (1 << 48) - 1;

fn loaded(machine: &mut Machine) -> Vcpu {
    let mut vcpu = machine.vcpu();
    machine.load(&mut vcpu);
    vcpu
}

/// kvm-unit-tests check_rdpmc: 0xff0123456789 through the legacy alias reads back the
/// sign-extended low 32 bits, through the full-width alias the width-masked value.
#[test]
fn rdpmc_values_through_both_aliases() {
    for is_loaded in [false, true] {
        let mut m = Machine::v5();
        let mut vcpu = m.vcpu();
        if is_loaded {
            m.load(&mut vcpu);
        }
        let val = 0xff01_2345_6789;
        for i in 0..8 {
            m.set(&mut vcpu, PMC0 + i, val);
            assert_eq!(m.get(&mut vcpu, PMC0 + i), 0x2345_6789, "legacy {i}");
            assert_eq!(
                m.get(&mut vcpu, A_PMC0 + i),
                0x2345_6789,
                "legacy via A_PMC {i}"
            );
            m.set(&mut vcpu, A_PMC0 + i, val);
            assert_eq!(
                m.get(&mut vcpu, A_PMC0 + i),
                val & WIDTH_48,
                "full width {i}"
            );
            assert_eq!(m.get(&mut vcpu, PMC0 + i), val & WIDTH_48);
        }
        for i in 0..4 {
            m.set(&mut vcpu, FIXED_CTR0 + i, val & WIDTH_48);
            assert_eq!(
                m.get(&mut vcpu, FIXED_CTR0 + i),
                val & WIDTH_48,
                "fixed {i}"
            );
        }
        if is_loaded {
            assert_eq!(m.hw.registers().gp_counters[7], val & WIDTH_48);
        }
    }
}

/// kvm-unit-tests check_gp_counters_write_width.
#[test]
fn gp_counter_write_width() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    let val64: u64 = 0xffff_ff01_2345_6789;
    let val32: u64 = val64 & 0xffff_ffff;
    let val_max = val64 & WIDTH_48;
    for i in 0..8 {
        for written in [val32, val_max, val64] {
            m.set(&mut vcpu, PMC0 + i, written);
            assert_eq!(m.get(&mut vcpu, PMC0 + i), 0x2345_6789);
            assert_eq!(m.get(&mut vcpu, A_PMC0 + i), 0x2345_6789);
        }
        m.set(&mut vcpu, A_PMC0 + i, val32);
        assert_eq!(m.get(&mut vcpu, PMC0 + i), val32);
        m.set(&mut vcpu, A_PMC0 + i, val_max);
        assert_eq!(m.get(&mut vcpu, A_PMC0 + i), val_max);
        assert_eq!(m.wrmsr(&mut vcpu, A_PMC0 + i, val64), GP);
        assert_eq!(
            m.get(&mut vcpu, A_PMC0 + i),
            val_max,
            "a refused write changes nothing"
        );
    }
    // Sign extension of bit 31 through the legacy alias.
    m.set(&mut vcpu, PMC0, 0x8000_0000);
    assert_eq!(m.get(&mut vcpu, A_PMC0), 0xffff_8000_0000);
    assert_eq!(m.stats().faults, 0);
}

/// pmu_counters_test test_gp_counters / test_fixed_counters: counters beyond the enumerated
/// ones #GP on every alias; GLOBAL_CTRL and FIXED_CTR_CTRL bits for them #GP.
#[test]
fn absent_counters_fault() {
    for is_loaded in [false, true] {
        let mut m = Machine::v2();
        let mut vcpu = m.vcpu();
        if is_loaded {
            m.load(&mut vcpu);
        }
        for i in 0..8 {
            let present = i < 4;
            let expected = if present { MsrOutcome::Handled(()) } else { GP };
            assert_eq!(m.wrmsr(&mut vcpu, PMC0 + i, 0xffff), expected, "PMC{i}");
            assert_eq!(m.wrmsr(&mut vcpu, EVTSEL0 + i, 0), expected, "EVTSEL{i}");
            if present {
                assert_eq!(m.get(&mut vcpu, PMC0 + i), 0xffff);
            } else {
                assert_eq!(m.rdmsr(&mut vcpu, PMC0 + i), MsrOutcome::GeneralProtection);
            }
            assert_eq!(m.wrmsr(&mut vcpu, A_PMC0 + i, 0), GP, "no FW_WRITE");
            assert_eq!(
                m.wrmsr(&mut vcpu, GLOBAL_CTRL, 1 << i),
                expected,
                "GLOBAL_CTRL bit {i}"
            );
        }
        for i in 0..4 {
            let expected = if i < 3 { MsrOutcome::Handled(()) } else { GP };
            assert_eq!(m.wrmsr(&mut vcpu, FIXED_CTR0 + i, 1), expected);
            assert_eq!(m.wrmsr(&mut vcpu, FIXED_CTR_CTRL, 0x3 << (4 * i)), expected);
            assert_eq!(m.wrmsr(&mut vcpu, GLOBAL_CTRL, 1 << (32 + i)), expected);
        }
        assert_eq!(m.wrmsr(&mut vcpu, GLOBAL_CTRL, 1 << 31), GP);
        assert_eq!(m.wrmsr(&mut vcpu, GLOBAL_CTRL, 1 << 63), GP);
        assert_eq!(m.stats().faults, 0);
    }
}

/// pmu_counters_test: GLOBAL_CTRL at reset has every GP enable bit set.
#[test]
fn global_ctrl_reset_value() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    assert_eq!(m.get(&mut vcpu, GLOBAL_CTRL), 0xff);
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    assert_eq!(m.get(&mut vcpu, GLOBAL_CTRL), 0xf);
}

/// A counter preset to -N overflows after exactly N events, sets its status bit, raises a PMI
/// only with INT, and OVF_CTRL clears the status. Odd counters get INT, as in kvm-unit-tests
/// check_counter_overflow.
#[test]
fn preset_counter_overflows_after_exactly_n_events() {
    const N: u64 = 1000;
    for shape in [Machine::v2 as fn() -> Machine, Machine::v5] {
        let mut m = shape();
        let gp = m.pmu.caps().gp_counters();
        for i in 0..gp {
            let mut vcpu = loaded(&mut m);
            let int = if i % 2 == 1 { EVTSEL_INT } else { 0 };
            m.set(&mut vcpu, PMC0 + i, N.wrapping_neg());
            m.set(
                &mut vcpu,
                EVTSEL0 + i,
                ENABLE_ALL_RINGS | int | INSTRUCTIONS,
            );
            m.set(&mut vcpu, GLOBAL_CTRL, 1 << i);

            m.run(HwEvent::Instructions, N - 1, KERNEL);
            assert_eq!(m.get(&mut vcpu, PMC0 + i), WIDTH_48, "-1 after N - 1");
            assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0, "no overflow before N");
            assert!(!m.hw.pmi_pending());

            m.run(HwEvent::Instructions, 1, USER);
            assert_eq!(m.get(&mut vcpu, PMC0 + i), 0);
            assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 1 << i, "status bit {i}");
            let pmi = m.hw.take_pmi();
            assert_eq!(pmi, int != 0, "PMI iff INT, counter {i}");

            // The integrator collects overflows on a PMI only; without one the status stays
            // live on the hardware until the guest clears it.
            if pmi {
                let overflow = m
                    .pmu
                    .handle_overflow(&mut vcpu.ctx, &mut m.hw)
                    .expect("overflow");
                assert_eq!(overflow.counters, CounterSet::gp(i));
                assert!(overflow.interrupt);
                assert_eq!(
                    m.hw.registers().global_status,
                    0,
                    "acknowledged on hardware"
                );
                assert_eq!(
                    m.get(&mut vcpu, GLOBAL_STATUS),
                    1 << i,
                    "kept in the virtual status"
                );
            } else {
                assert_eq!(
                    m.hw.registers().global_status,
                    1 << i,
                    "live on the hardware"
                );
            }

            m.set(&mut vcpu, GLOBAL_OVF_CTRL, 1 << i);
            assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0, "OVF_CTRL clears it");
            assert_eq!(m.hw.registers().global_status, 0, "on the hardware too");
            assert_eq!(m.get(&mut vcpu, GLOBAL_OVF_CTRL), 0, "OVF_CTRL reads 0");
            m.set(&mut vcpu, EVTSEL0 + i, 0);
            m.save(&mut vcpu);
        }
    }
}

/// kvm-unit-tests check_counter_overflow on fixed counter 0: preset 1 - count, final count 1.
#[test]
fn fixed_counter_overflow_with_and_without_pmi() {
    const COUNT: u64 = 10_000_017;
    for pmi in [false, true] {
        let mut m = Machine::v5();
        let mut vcpu = loaded(&mut m);
        m.set(&mut vcpu, FIXED_CTR0, 1u64.wrapping_sub(COUNT) & WIDTH_48);
        let nibble = if pmi { 0xb } else { 0x3 };
        m.set(&mut vcpu, FIXED_CTR_CTRL, nibble);
        m.set(&mut vcpu, GLOBAL_CTRL, 1 << 32);
        m.run(HwEvent::Instructions, COUNT, KERNEL);
        assert_eq!(m.get(&mut vcpu, FIXED_CTR0), 1);
        assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 1 << 32);
        assert_eq!(m.hw.take_pmi(), pmi);
        let overflow = m
            .pmu
            .handle_overflow(&mut vcpu.ctx, &mut m.hw)
            .expect("pmi");
        assert_eq!(overflow.counters, CounterSet::fixed(0));
        assert_eq!(overflow.interrupt, pmi);
    }
}

/// kvm-unit-tests check_emulated_instr: branches preset -5 on GP0, instructions -22 on GP1,
/// then 22 instructions of which 5 branches: both overflow.
#[test]
fn emulated_instruction_presets_both_overflow() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    m.set(&mut vcpu, GLOBAL_CTRL, 0);
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | BRANCHES);
    m.set(&mut vcpu, EVTSEL0 + 1, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, A_PMC0, 5u64.wrapping_neg() & WIDTH_48);
    m.set(&mut vcpu, A_PMC0 + 1, 22u64.wrapping_neg() & WIDTH_48);
    m.set(&mut vcpu, GLOBAL_CTRL, 0b11);
    for _ in 0..5 {
        m.run(HwEvent::Branches, 1, KERNEL);
    }
    m.run(HwEvent::Instructions, 22, KERNEL);
    m.set(&mut vcpu, GLOBAL_CTRL, 0);
    assert_eq!(m.get(&mut vcpu, PMC0), 0);
    assert_eq!(m.get(&mut vcpu, PMC0 + 1), 0);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS) & 0b11, 0b11);
}

/// pmu_counters_test: exact counts (45 instructions, 10 branches), nothing counted once
/// disabled, and a 0xdead write reads back.
#[test]
fn exact_counts_and_no_counting_while_disabled() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    m.set(&mut vcpu, EVTSEL0, (1 << 22) | (1 << 17) | INSTRUCTIONS);
    m.set(&mut vcpu, EVTSEL0 + 1, (1 << 22) | (1 << 17) | BRANCHES);
    m.set(&mut vcpu, GLOBAL_CTRL, 0b11);
    for _ in 0..10 {
        m.run(HwEvent::Instructions, 4, KERNEL);
        m.run(HwEvent::Branches, 1, KERNEL);
    }
    m.run(HwEvent::Instructions, 5, KERNEL);
    m.run(HwEvent::Instructions, 100, USER);
    m.set(&mut vcpu, GLOBAL_CTRL, 0);
    m.run(HwEvent::Instructions, 45, KERNEL);
    assert_eq!(m.get(&mut vcpu, PMC0), 45, "OS-only counter ignores CPL 3");
    assert_eq!(m.get(&mut vcpu, PMC0 + 1), 10);
    m.set(&mut vcpu, PMC0, 0xdead);
    assert_eq!(m.get(&mut vcpu, PMC0), 0xdead);
}

/// kvm-unit-tests check_running_counter_wrmsr.
#[test]
fn writing_a_running_counter() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, GLOBAL_CTRL, 1);
    m.run(HwEvent::Instructions, 5_000_000, KERNEL);
    m.set(&mut vcpu, PMC0, 0);
    m.run(HwEvent::Instructions, 17, KERNEL);
    assert_eq!(m.get(&mut vcpu, PMC0), 17);
    m.set(&mut vcpu, A_PMC0, WIDTH_48);
    m.run(HwEvent::Instructions, 1, KERNEL);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS) & 1, 1);
}

/// Fixed counters count their events with OS/USR gating and GLOBAL_CTRL.
#[test]
fn fixed_counters_count_their_events() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    // Counter 0 user only, 1 kernel only, 2 both, 3 both (topdown slots: nothing to count).
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x3312);
    m.set(&mut vcpu, GLOBAL_CTRL, 0xf << 32);
    m.run(HwEvent::Instructions, 7, KERNEL);
    m.run(HwEvent::Instructions, 11, USER);
    m.run(HwEvent::CoreCycles, 13, KERNEL);
    m.run(HwEvent::CoreCycles, 17, USER);
    m.run(HwEvent::RefCycles, 19, USER);
    let counts: Vec<u64> = (0..4).map(|i| m.get(&mut vcpu, FIXED_CTR0 + i)).collect();
    assert_eq!(counts, [11, 13, 19, 0]);
}

#[test]
fn read_only_and_write_only_registers() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    assert_eq!(
        m.wrmsr(&mut vcpu, GLOBAL_STATUS, 0),
        GP,
        "GLOBAL_STATUS is read-only"
    );
    assert_eq!(m.wrmsr(&mut vcpu, PERF_CAPABILITIES, 0), GP);
    assert_eq!(m.get(&mut vcpu, PERF_CAPABILITIES), PERF_CAP_FW_WRITES);
    assert_eq!(m.hw.registers().global_status, 0);

    m.set(&mut vcpu, GLOBAL_STATUS_SET, 0b101 | 1 << 33);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0b101 | 1 << 33);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS_SET), 0);
    assert_eq!(
        m.wrmsr(&mut vcpu, GLOBAL_STATUS_SET, 1 << 8),
        GP,
        "no counter 8"
    );
    m.set(&mut vcpu, GLOBAL_OVF_CTRL, 0b001);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0b100 | 1 << 33);
    assert_eq!(
        m.wrmsr(&mut vcpu, GLOBAL_OVF_CTRL, 1 << 61),
        GP,
        "uncore bit"
    );
    m.set(
        &mut vcpu,
        GLOBAL_OVF_CTRL,
        1 << 63 | 1 << 62 | 0xff | 0xf << 32,
    );
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0);
}

#[test]
fn anythread_and_pin_control_never_reach_the_hardware() {
    let mut m = Machine::v2();
    let mut vcpu = loaded(&mut m);
    let sel = ENABLE_ALL_RINGS | INSTRUCTIONS;
    assert_eq!(m.wrmsr(&mut vcpu, EVTSEL0, sel | 1 << 21), GP, "AnyThread");
    assert_eq!(
        m.wrmsr(&mut vcpu, EVTSEL0, sel | 1 << 19),
        GP,
        "Pin Control"
    );
    assert_eq!(m.wrmsr(&mut vcpu, EVTSEL0, sel | 1 << 32), GP, "IN_TX");
    assert_eq!(
        m.wrmsr(&mut vcpu, FIXED_CTR_CTRL, 0x7),
        GP,
        "fixed AnyThread"
    );
    assert_eq!(m.wrmsr(&mut vcpu, FIXED_CTR_CTRL, 0x3 | 0x4 << 8), GP);
    assert_eq!(m.hw.registers().event_selects[0], 0);
    assert_eq!(m.hw.registers().fixed_ctrl, 0);
    // The model itself would have taken them, as pre-v5 hardware does.
    use vpmu::{Msr, MsrBus};
    m.hw.write(Msr(EVTSEL0), sel | 1 << 21 | 1 << 19)
        .expect("hardware accepts");
    m.hw.write(Msr(FIXED_CTR_CTRL), 0x7)
        .expect("hardware accepts");
}

#[test]
fn pebs_and_ds_area() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    assert_eq!(m.wrmsr(&mut vcpu, PEBS_ENABLE, 1), GP);
    m.set(&mut vcpu, PEBS_ENABLE, 0);
    assert_eq!(m.get(&mut vcpu, PEBS_ENABLE), 0);

    let address = 0xffff_8880_0000_1000;
    assert_eq!(m.wrmsr(&mut vcpu, DS_AREA, address), GP, "BTS feature off");
    m.set(&mut vcpu, DS_AREA, 0);
    let bts = GuestPolicy {
        features: XENPMU_FEATURE_INTEL_BTS,
        ..GuestPolicy::guest_default()
    };
    let non_canonical = 0x0000_8880_0000_1000;
    assert_eq!(m.wrmsr_with(&mut vcpu, &bts, DS_AREA, non_canonical), GP);
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &bts, DS_AREA, address),
        MsrOutcome::Handled(())
    );
    assert_eq!(m.get(&mut vcpu, DS_AREA), address);
    assert_eq!(m.hw.registers().ds_area, address);
    assert!(m.pmu.is_active(&vcpu.ctx));
    m.save(&mut vcpu);
    assert_eq!(
        m.hw.registers().ds_area,
        0,
        "a saved DS area leaves the hardware"
    );
    m.load(&mut vcpu);
    assert_eq!(m.hw.registers().ds_area, address);
    let bts_ipc = GuestPolicy {
        features: XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_IPC_ONLY,
        ..GuestPolicy::guest_default()
    };
    assert_eq!(m.wrmsr_with(&mut vcpu, &bts_ipc, DS_AREA, address), GP);
    assert_eq!(m.wrmsr_with(&mut vcpu, &bts_ipc, PEBS_ENABLE, 1), GP);
    assert_eq!(m.hw.registers().pebs_enable, 0);
}

#[test]
fn feature_whitelists() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    let ipc = GuestPolicy {
        features: XENPMU_FEATURE_IPC_ONLY,
        ..GuestPolicy::guest_default()
    };
    let arch = GuestPolicy {
        features: XENPMU_FEATURE_ARCH_ONLY,
        ..GuestPolicy::guest_default()
    };
    let branches = ENABLE_ALL_RINGS | BRANCHES;
    let uops = ENABLE_ALL_RINGS | 0x01b1;
    assert_eq!(m.wrmsr_with(&mut vcpu, &ipc, EVTSEL0, branches), GP);
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &arch, EVTSEL0, branches),
        MsrOutcome::Handled(())
    );
    assert_eq!(m.wrmsr_with(&mut vcpu, &arch, EVTSEL0, uops), GP);
    for allowed in [0x003c, 0x013c, 0x00c0] {
        let sel = ENABLE_ALL_RINGS | allowed;
        assert_eq!(
            m.wrmsr_with(&mut vcpu, &ipc, EVTSEL0, sel),
            MsrOutcome::Handled(())
        );
    }
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &ipc, EVTSEL0, 0),
        MsrOutcome::Handled(())
    );
    assert_eq!(m.wrmsr_with(&mut vcpu, &ipc, FIXED_CTR_CTRL, 0x3000), GP);
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &ipc, FIXED_CTR_CTRL, 0x0333),
        MsrOutcome::Handled(())
    );
}

struct DenyInstructions;

impl EventFilter for DenyInstructions {
    fn allows(&self, event: RawEvent) -> bool {
        !(event.select == 0xc0 && event.umask == 0)
    }

    fn allows_fixed(&self, index: u32) -> bool {
        index != 0
    }
}

/// pmu_event_filter_test: a denied event reads back as written but does not count.
#[test]
fn event_filter_denies_counting_not_programming() {
    let mut m = Machine::v5();
    let mut vcpu = loaded(&mut m);
    let policy = GuestPolicy {
        features: 0,
        filter: &DenyInstructions,
        may_count_host: false,
    };
    let instructions = ENABLE_ALL_RINGS | INSTRUCTIONS;
    let branches = ENABLE_ALL_RINGS | BRANCHES;
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &policy, EVTSEL0 + 1, instructions),
        MsrOutcome::Handled(())
    );
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &policy, EVTSEL0, branches),
        MsrOutcome::Handled(())
    );
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &policy, FIXED_CTR_CTRL, 0x33),
        MsrOutcome::Handled(())
    );
    m.set(&mut vcpu, GLOBAL_CTRL, 0x3_0000_0003);
    assert_eq!(m.get(&mut vcpu, EVTSEL0 + 1), instructions);
    assert_eq!(m.get(&mut vcpu, FIXED_CTR_CTRL), 0x33);
    assert_eq!(m.hw.registers().event_selects[1] & (1 << 22), 0);
    m.run(HwEvent::Instructions, 42, KERNEL);
    m.run(HwEvent::Branches, 42, KERNEL);
    m.run(HwEvent::CoreCycles, 42, KERNEL);
    assert_eq!(m.get(&mut vcpu, PMC0 + 1), 0, "instructions filtered");
    assert_eq!(m.get(&mut vcpu, PMC0), 42, "branches allowed");
    assert_eq!(m.get(&mut vcpu, FIXED_CTR0), 0, "fixed 0 filtered");
    assert_eq!(m.get(&mut vcpu, FIXED_CTR0 + 1), 42, "fixed 1 allowed");
}

#[test]
fn intel_masks_lvtpc_on_pmi() {
    let m = Machine::v2();
    assert!(m.pmu.masks_lvtpc_on_pmi());
}

/// No register write to a saved context reaches the hardware.
#[test]
fn saved_context_writes_touch_no_hardware() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    let before = m.stats();
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, PMC0, 5);
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x3);
    m.set(&mut vcpu, GLOBAL_CTRL, 0x1_0000_0001);
    assert_eq!(m.get(&mut vcpu, PMC0), 5);
    assert_eq!(m.stats(), before);
    assert!(m.pmu.is_active(&vcpu.ctx));
}

/// Software written for v1 never touches GLOBAL_CTRL and relies on its reset value: a selector
/// programmed while the context is loaded must count straight away.
#[test]
fn reset_global_ctrl_lets_v1_style_software_count() {
    for is_loaded in [true, false] {
        let mut m = Machine::v2();
        let mut vcpu = m.vcpu();
        if is_loaded {
            m.load(&mut vcpu);
        }
        m.set(&mut vcpu, EVTSEL0 + 1, ENABLE_ALL_RINGS | CORE_CYCLES);
        if !is_loaded {
            m.load(&mut vcpu);
        }
        m.run(HwEvent::CoreCycles, 321, KERNEL);
        assert_eq!(m.get(&mut vcpu, PMC0 + 1), 321, "loaded first: {is_loaded}");
    }
}

/// IA32_PERF_METRICS and IA32_PERF_GLOBAL_INUSE are architectural PMU registers the backend
/// does not model: it owns them (so an integrator routes them here instead of letting its own
/// MSR code answer) and they fault, on every shape.
#[test]
fn unmodelled_architectural_registers_are_owned_and_fault() {
    for mut m in [Machine::v2(), Machine::v5()] {
        let mut vcpu = m.vcpu();
        for msr in [0x329, 0x392] {
            assert!(m.pmu.owns(vpmu::Msr(msr)), "{msr:#x} owned");
            assert_eq!(
                m.rdmsr(&mut vcpu, msr),
                MsrOutcome::GeneralProtection,
                "rdmsr {msr:#x}"
            );
            assert_eq!(
                m.wrmsr(&mut vcpu, msr, 0),
                MsrOutcome::GeneralProtection,
                "wrmsr {msr:#x}"
            );
        }
    }
}
