//! Conformance of the backend (with the software model as hardware) and of the model itself to
//! the APM and to the expectations of kvm-unit-tests `x86/pmu.c` and the KVM selftests.

mod common;

use common::*;
use vpmu::{
    AllowAll, CounterSet, EventFilter, GuestPolicy, Msr, MsrBus, MsrOutcome, PmuBackend, RawEvent,
};
use vpmu_amd::{AmdPmu, PmuShape};
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::{HwEvent, SoftwarePmu};

const GP: MsrOutcome<()> = MsrOutcome::GeneralProtection;
const GP_READ: MsrOutcome<u64> = MsrOutcome::GeneralProtection;

// ---------------------------------------------------------------------------------------------
// MSR presence

#[test]
fn counters_beyond_the_enumerated_count_fault_through_every_alias() {
    for shape in SHAPES {
        let mut vcpu = Vcpu::new(shape);
        let n = pmu(shape).gp_counters();
        for i in 0..8u32 {
            let mut msrs = vec![];
            if i < 4 {
                msrs.extend([K7_CTL + i, K7_CTR + i]);
            }
            if i < 6 {
                msrs.extend([ext_ctl(i), ext_ctr(i)]);
            }
            for msr in msrs {
                let extended = msr >= EXT_CTL;
                let present = i < n && (!extended || shape != PmuShape::LegacyK7);
                let before = vcpu.hw.access_stats();
                let write = vcpu.write(msr, 0);
                let read = vcpu.read(msr);
                if present {
                    assert_eq!(write, MsrOutcome::Handled(()), "{shape:?} {msr:#x}");
                    assert_eq!(read, MsrOutcome::Handled(0), "{shape:?} {msr:#x}");
                } else {
                    assert_eq!((write, read), (GP, GP_READ), "{shape:?} {msr:#x}");
                    assert_eq!(vcpu.hw.access_stats(), before, "a #GP touches no hardware");
                }
                // The model, as hardware, agrees on presence.
                let mut bare = AmdPmuModel::new(pmu(shape));
                assert_eq!(
                    bare.read(Msr(msr)).is_ok(),
                    present,
                    "model {shape:?} {msr:#x}"
                );
            }
        }
    }
}

#[test]
fn global_msrs_exist_only_with_perfmon_v2() {
    for shape in SHAPES {
        let mut vcpu = Vcpu::new(shape);
        let v2 = matches!(shape, PmuShape::PerfMonV2 { .. });
        for msr in [
            GLOBAL_STATUS,
            GLOBAL_CTL,
            GLOBAL_STATUS_CLR,
            GLOBAL_STATUS_SET,
        ] {
            assert_eq!(vcpu.read(msr) != GP_READ, v2, "{shape:?} {msr:#x}");
            let mut bare = AmdPmuModel::new(pmu(shape));
            assert_eq!(bare.read(Msr(msr)).is_ok(), v2, "model {shape:?} {msr:#x}");
        }
    }
}

#[test]
fn msr_ranges_cover_the_whole_architecture_and_nothing_else_is_owned() {
    let backend = AmdPmu::new(pmu(PmuShape::LegacyK7)).unwrap();
    for msr in [
        0xC000_0300,
        0xC000_0303,
        0xC001_0000,
        0xC001_0007,
        0xC001_0200,
        0xC001_020B,
    ] {
        assert!(backend.owns(Msr(msr)), "{msr:#x}");
    }
    for msr in [
        0xC000_02FF,
        0xC000_0304,
        0xC001_0008,
        0xC001_01FF,
        0xC001_020C,
        0xC1,
        0x186,
    ] {
        assert!(!backend.owns(Msr(msr)), "{msr:#x}");
    }
    let mut vcpu = Vcpu::new(PmuShape::LegacyK7);
    assert_eq!(vcpu.read(0x186), MsrOutcome::NotPmu);
    assert_eq!(vcpu.write(0xC001_0008, 1), MsrOutcome::NotPmu);
}

// ---------------------------------------------------------------------------------------------
// Aliases

#[test]
fn k7_and_fam15h_msrs_name_the_same_counters_both_directions() {
    for shape in [
        PmuShape::PerfCtrExtCore,
        PmuShape::PerfMonV2 { counters: 6 },
    ] {
        let mut vcpu = Vcpu::new(shape);
        for i in 0..4u32 {
            let value = 0x1234_0000 + u64::from(i);
            vcpu.set(K7_CTR + i, value);
            assert_eq!(vcpu.value(ext_ctr(i)), value);
            vcpu.set(ext_ctr(i), value << 4);
            assert_eq!(vcpu.value(K7_CTR + i), value << 4);

            let control = OS | USR | INSTRUCTIONS | (u64::from(i) << 8);
            vcpu.set(K7_CTL + i, control);
            assert_eq!(vcpu.value(ext_ctl(i)), control);
            vcpu.set(ext_ctl(i), control | INT);
            assert_eq!(vcpu.value(K7_CTL + i), control | INT);
        }

        // The same on the model, where the alias is the hardware's.
        let mut hw = AmdPmuModel::new(pmu(shape));
        for i in 0..4u32 {
            hw.write(Msr(K7_CTR + i), 0xabc + u64::from(i)).unwrap();
            assert_eq!(hw.read(Msr(ext_ctr(i))), Ok(0xabc + u64::from(i)));
            hw.write(Msr(ext_ctl(i)), EN | u64::from(i)).unwrap();
            assert_eq!(hw.read(Msr(K7_CTL + i)), Ok(EN | u64::from(i)));
        }
    }
}

#[test]
fn a_live_counter_is_aliased_on_the_hardware_too() {
    let mut vcpu = Vcpu::new(PmuShape::PerfCtrExtCore);
    vcpu.set(K7_CTR + 2, 100);
    vcpu.set(K7_CTL + 2, EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 5, KERNEL);
    assert_eq!(vcpu.value(ext_ctr(2)), 105);
    assert_eq!(vcpu.value(K7_CTR + 2), 105);
}

// ---------------------------------------------------------------------------------------------
// Counting, width, overflow

#[test]
fn counter_preset_to_minus_n_overflows_after_exactly_n_events() {
    for shape in SHAPES {
        let v2 = matches!(shape, PmuShape::PerfMonV2 { .. });
        for i in 0..pmu(shape).gp_counters() {
            for n in [1u64, 2, 1000, 1 << 40] {
                let mut vcpu = Vcpu::new(shape);
                vcpu.set(ctr_msr(shape, i), n.wrapping_neg()); // -n as a 64-bit value
                vcpu.set(ctl_msr(shape, i), EN | OS | USR | INT | INSTRUCTIONS);
                vcpu.run(HwEvent::Instructions, n - 1, KERNEL);
                assert_eq!(
                    vcpu.value(ctr_msr(shape, i)),
                    MASK48,
                    "one short of the wrap"
                );
                assert!(!vcpu.hw.pmi_pending());
                if v2 {
                    assert_eq!(vcpu.value(GLOBAL_STATUS), 0);
                }
                vcpu.run(HwEvent::Instructions, 1, USER);
                assert_eq!(vcpu.value(ctr_msr(shape, i)), 0, "wrapped to 0");
                assert!(vcpu.hw.take_pmi(), "{shape:?} counter {i} n {n}");
                if v2 {
                    assert_eq!(vcpu.value(GLOBAL_STATUS), 1 << i);
                }
                vcpu.run(HwEvent::Instructions, 1, KERNEL);
                assert_eq!(vcpu.value(ctr_msr(shape, i)), 1);
                assert!(!vcpu.hw.pmi_pending(), "one overflow, one PMI");
            }
        }
    }
}

/// kvm-unit-tests `check_counter_overflow`: preset `1 - count`, measure `count` events, odd
/// counters with INT. AMD's accepted final count is `0xffffffffffff` or `< 7`; the model gives
/// exactly 1 (see the model's documentation on the wrap).
#[test]
fn kvm_unit_tests_counter_overflow() {
    let count = 10_000_017u64; // LOOP_INSNS
    for shape in SHAPES {
        let v2 = matches!(shape, PmuShape::PerfMonV2 { .. });
        let mut vcpu = Vcpu::new(shape);
        if v2 {
            let status = vcpu.value(GLOBAL_STATUS);
            vcpu.set(GLOBAL_STATUS_CLR, status);
        }
        for i in 0..pmu(shape).gp_counters() {
            let int = if i % 2 == 1 { INT } else { 0 };
            vcpu.set(ctr_msr(shape, i), 1u64.wrapping_sub(count));
            vcpu.set(ctl_msr(shape, i), EN | OS | USR | int | INSTRUCTIONS);
            vcpu.run(HwEvent::Instructions, count, KERNEL);
            vcpu.set(ctl_msr(shape, i), 0);
            let final_count = vcpu.value(ctr_msr(shape, i));
            assert!(final_count == MASK48 || final_count < 7, "{final_count:#x}");
            assert_eq!(final_count, 1);
            if v2 {
                let status = vcpu.value(GLOBAL_STATUS);
                assert_ne!(status & (1 << i), 0, "status bit {i}");
                vcpu.set(GLOBAL_STATUS_CLR, status);
                assert_eq!(vcpu.value(GLOBAL_STATUS) & (1 << i), 0, "cleared");
            }
            assert_eq!(
                vcpu.hw.take_pmi(),
                i % 2 == 1,
                "PMI iff INT ({shape:?} {i})"
            );
        }
    }
}

#[test]
fn counter_writes_keep_the_low_48_bits_like_the_hardware() {
    for shape in SHAPES {
        for i in 0..pmu(shape).gp_counters() {
            let ctr = ctr_msr(shape, i);
            for (written, kept) in [
                (0xff01_2345_6789, 0xff01_2345_6789), // kvm-unit-tests check_rdpmc value
                (0xffff_ff01_2345_6789, 0xff01_2345_6789),
                (1 << 48, 0),
                (u64::MAX, MASK48),
                (1u64.wrapping_sub(10_000), MASK48 - 9_998),
            ] {
                let mut vcpu = Vcpu::new(shape);
                vcpu.set(ctr, written);
                assert_eq!(vcpu.value(ctr), kept, "{shape:?} ctr {i} <- {written:#x}");
                let mut hw = AmdPmuModel::new(pmu(shape));
                hw.write(Msr(ctr), written).unwrap();
                assert_eq!(hw.read(Msr(ctr)), Ok(kept), "the model as the hardware");
            }
        }
    }
}

#[test]
fn a_pmi_is_raised_only_with_the_interrupt_bit() {
    for int in [0, INT] {
        let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
        vcpu.set(ext_ctr(3), MASK48);
        vcpu.set(ext_ctl(3), EN | OS | int | BRANCHES);
        vcpu.run(HwEvent::Branches, 1, KERNEL);
        assert_eq!(
            vcpu.value(GLOBAL_STATUS),
            1 << 3,
            "status regardless of INT"
        );
        assert_eq!(vcpu.hw.pmi_pending(), int != 0);
    }
}

#[test]
fn perfmon_v2_status_clr_clears_and_status_set_sets() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 4 });
    vcpu.set(ext_ctr(1), MASK48);
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    assert_eq!(vcpu.value(GLOBAL_STATUS), 0b10);
    // Linux's PMI handler acknowledges with every bit set.
    vcpu.set(GLOBAL_STATUS_CLR, !0);
    assert_eq!(vcpu.value(GLOBAL_STATUS), 0);
    assert_eq!(
        vcpu.hw.registers().global_status,
        0,
        "cleared on the hardware"
    );
    vcpu.set(GLOBAL_STATUS_SET, 0b1001);
    assert_eq!(vcpu.value(GLOBAL_STATUS), 0b1001);
    assert_eq!(
        vcpu.write(GLOBAL_STATUS_SET, 0b1_0000),
        GP,
        "counter 4 absent"
    );
    assert_eq!(vcpu.write(GLOBAL_STATUS, 0), GP, "read-only");
    assert_eq!(vcpu.value(GLOBAL_STATUS_CLR), 0);
    assert_eq!(vcpu.value(GLOBAL_STATUS_SET), 0);
    vcpu.set(GLOBAL_STATUS_CLR, 0b1000);
    assert_eq!(vcpu.value(GLOBAL_STATUS), 0b0001);
}

#[test]
fn perfmon_v2_global_control_gates_counting() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
    assert_eq!(vcpu.value(GLOBAL_CTL), 0x3f, "reset value GENMASK(5, 0)");
    assert_eq!(vcpu.write(GLOBAL_CTL, 0x40), GP, "counter 6 absent");
    vcpu.set(GLOBAL_CTL, 0);
    for i in 0..2 {
        vcpu.set(ext_ctl(i), EN | OS | USR | INSTRUCTIONS);
    }
    vcpu.run(HwEvent::Instructions, 45, KERNEL);
    assert_eq!((vcpu.value(ext_ctr(0)), vcpu.value(ext_ctr(1))), (0, 0));
    vcpu.set(GLOBAL_CTL, 0b10);
    vcpu.run(HwEvent::Instructions, 45, KERNEL);
    assert_eq!((vcpu.value(ext_ctr(0)), vcpu.value(ext_ctr(1))), (0, 45));
    vcpu.set(GLOBAL_CTL, 0b11);
    vcpu.run(HwEvent::Instructions, 5, USER);
    assert_eq!((vcpu.value(ext_ctr(0)), vcpu.value(ext_ctr(1))), (5, 50));
}

/// KVM selftest `pmu_counters_test`: instructions == 45, branches == 10 for the measured blob,
/// and no counting once disabled.
#[test]
fn exact_counts_and_no_counting_while_disabled() {
    for shape in SHAPES {
        let mut vcpu = Vcpu::new(shape);
        let n = pmu(shape).gp_counters();
        for i in 0..n {
            vcpu.set(
                ctl_msr(shape, i),
                EN | OS | if i % 2 == 0 { INSTRUCTIONS } else { BRANCHES },
            );
        }
        vcpu.run(HwEvent::Instructions, 45, KERNEL);
        vcpu.run(HwEvent::Branches, 10, KERNEL);
        vcpu.run(HwEvent::CoreCycles, 1000, KERNEL);
        for i in 0..n {
            vcpu.set(ctl_msr(shape, i), 0);
        }
        vcpu.run(HwEvent::Instructions, 45, KERNEL);
        vcpu.run(HwEvent::Branches, 10, KERNEL);
        for i in 0..n {
            let expected = if i % 2 == 0 { 45 } else { 10 };
            assert_eq!(vcpu.value(ctr_msr(shape, i)), expected, "{shape:?} {i}");
        }
    }
}

#[test]
fn privilege_gating() {
    let mut vcpu = Vcpu::new(PmuShape::PerfCtrExtCore);
    vcpu.set(ext_ctl(0), EN | OS | CYCLES);
    vcpu.set(ext_ctl(1), EN | USR | CYCLES);
    vcpu.set(ext_ctl(2), EN | OS | USR | CYCLES);
    vcpu.set(ext_ctl(3), EN | CYCLES);
    vcpu.run(HwEvent::CoreCycles, 7, KERNEL);
    vcpu.run(HwEvent::CoreCycles, 11, USER);
    vcpu.run(
        HwEvent::CoreCycles,
        13,
        vpmu_models::ExecMode {
            cpl: 1,
            host: false,
        },
    );
    let counts: Vec<u64> = (0..4).map(|i| vcpu.value(ext_ctr(i))).collect();
    assert_eq!(counts, [7, 24, 31, 0], "OS, USR, both, neither");
}

#[test]
fn unsupported_events_and_qualifiers_count_nothing() {
    let mut vcpu = Vcpu::new(PmuShape::PerfCtrExtCore);
    vcpu.set(ext_ctl(0), EN | OS | INSTRUCTIONS | (2 << 24)); // CMASK=2
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS | (1 << 8)); // another unit mask
    vcpu.set(ext_ctl(2), EN | OS | INSTRUCTIONS | (1 << 32)); // event 0x1C0
    vcpu.set(ext_ctl(3), EN | OS | 0xc3); // branch misses
    for event in [
        HwEvent::Instructions,
        HwEvent::RefCycles,
        HwEvent::LlcReferences,
        HwEvent::LlcMisses,
    ] {
        vcpu.run(event, 100, KERNEL);
    }
    vcpu.run(HwEvent::BranchMisses, 3, KERNEL);
    let counts: Vec<u64> = (0..4).map(|i| vcpu.value(ext_ctr(i))).collect();
    assert_eq!(counts, [0, 0, 0, 3]);
}

// ---------------------------------------------------------------------------------------------
// Host/Guest-only

/// KVM selftest `svm_pmu_host_guest_test`'s table, on the model: PMCs with no bit, GuestOnly,
/// HostOnly, both.
#[test]
fn model_host_guest_gating() {
    let mut hw = AmdPmuModel::new(pmu(PmuShape::PerfCtrExtCore));
    let bits = [0, GUEST_ONLY, HOST_ONLY, GUEST_ONLY | HOST_ONLY];
    for (i, extra) in bits.iter().enumerate() {
        hw.write(Msr(ext_ctl(i as u32)), EN | OS | USR | INSTRUCTIONS | extra)
            .unwrap();
    }
    hw.count(HwEvent::Instructions, 1000, HOST);
    let host: Vec<u64> = (0..4).map(|i| hw.registers().values[i]).collect();
    assert_eq!(host, [1000, 0, 1000, 1000], "none, H, HG count in host");
    hw.count(HwEvent::Instructions, 10, KERNEL);
    let all: Vec<u64> = (0..4).map(|i| hw.registers().values[i]).collect();
    assert_eq!(all, [1010, 10, 1000, 1010], "none, G, HG count in guest");
}

#[test]
fn a_guest_without_host_counting_never_counts_in_host_context() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
    vcpu.set(ext_ctl(0), EN | OS | INSTRUCTIONS);
    assert_eq!(
        vcpu.write(ext_ctl(1), EN | OS | INSTRUCTIONS | HOST_ONLY),
        GP
    );
    assert_eq!(
        vcpu.write(ext_ctl(1), EN | OS | INSTRUCTIONS | HOST_ONLY | GUEST_ONLY),
        GP
    );
    vcpu.set(ext_ctl(2), EN | OS | INSTRUCTIONS | GUEST_ONLY);
    assert_eq!(
        vcpu.value(ext_ctl(0)),
        EN | OS | INSTRUCTIONS,
        "reads back as written"
    );
    assert_eq!(
        vcpu.hw.registers().controls[0],
        EN | OS | INSTRUCTIONS | GUEST_ONLY,
        "GuestOnly forced on the hardware"
    );
    vcpu.run(HwEvent::Instructions, 100, HOST);
    vcpu.run(HwEvent::Instructions, 3, KERNEL);
    assert_eq!(vcpu.value(ext_ctr(0)), 3);
    assert_eq!(vcpu.value(ext_ctr(2)), 3);
}

#[test]
fn a_guest_with_host_counting_programs_what_it_wrote() {
    let policy = GuestPolicy {
        features: 0,
        filter: &AllowAll,
        may_count_host: true,
    };
    let mut vcpu = Vcpu::with_policy(PmuShape::PerfMonV2 { counters: 6 }, policy);
    vcpu.set(ext_ctl(0), EN | OS | INSTRUCTIONS);
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS | HOST_ONLY);
    assert_eq!(vcpu.hw.registers().controls[0], EN | OS | INSTRUCTIONS);
    assert_eq!(
        vcpu.hw.registers().controls[1],
        EN | OS | INSTRUCTIONS | HOST_ONLY
    );
    vcpu.run(HwEvent::Instructions, 100, HOST);
    vcpu.run(HwEvent::Instructions, 3, KERNEL);
    assert_eq!((vcpu.value(ext_ctr(0)), vcpu.value(ext_ctr(1))), (103, 100));
}

// ---------------------------------------------------------------------------------------------
// Reserved bits and the event filter

#[test]
fn reserved_control_bits_fault_and_never_reach_the_hardware() {
    let mut vcpu = Vcpu::new(PmuShape::PerfCtrExtCore);
    vcpu.set(ext_ctl(0), EN | OS | INSTRUCTIONS);
    let writes = vcpu.hw.access_stats().writes;
    for bit in [19, 21, 36, 37, 38, 39, 42, 50, 63] {
        assert_eq!(
            vcpu.write(ext_ctl(0), EN | OS | (1 << bit)),
            GP,
            "bit {bit}"
        );
        assert_eq!(vcpu.write(K7_CTL + 1, 1 << bit), GP, "bit {bit}");
    }
    assert_eq!(vcpu.hw.access_stats().writes, writes);
    assert_eq!(vcpu.value(ext_ctl(0)), EN | OS | INSTRUCTIONS, "unchanged");
    // Bits 35:32 are the high event select, not reserved.
    vcpu.set(ext_ctl(1), EN | OS | (0xf << 32));
}

struct DenyBranches;

impl EventFilter for DenyBranches {
    fn allows(&self, event: RawEvent) -> bool {
        event.select != 0x0c2
    }
    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

/// KVM selftest `pmu_event_filter_test` on AMD: K7 EVNTSEL0 = branches (0xC2), EVNTSEL1 =
/// instructions. Denying 0xC2 stops the branch counter; a deny of 0x1C2 (different 12-bit
/// select) lets it count.
#[test]
fn event_filter_denies_by_twelve_bit_select() {
    static DENY: DenyBranches = DenyBranches;
    let policy = GuestPolicy {
        features: 0,
        filter: &DENY,
        may_count_host: false,
    };
    let mut vcpu = Vcpu::with_policy(PmuShape::PerfCtrExtCore, policy);
    vcpu.set(K7_CTL, EN | OS | USR | BRANCHES);
    vcpu.set(K7_CTL + 1, EN | OS | USR | INSTRUCTIONS);
    vcpu.set(K7_CTL + 2, EN | OS | USR | BRANCHES | (1 << 32));
    vcpu.run(HwEvent::Branches, 42, KERNEL);
    vcpu.run(HwEvent::Instructions, 84, KERNEL);
    assert_eq!(vcpu.value(K7_CTR), 0, "denied: not counting");
    assert_eq!(vcpu.value(K7_CTR + 1), 84);
    assert_eq!(
        vcpu.value(K7_CTL),
        EN | OS | USR | BRANCHES,
        "guest reads back EN"
    );
    assert_eq!(vcpu.hw.registers().controls[0] & EN, 0);
    assert!(
        !vcpu.ctx.in_use().contains(CounterSet::gp(0)),
        "a denied counter never goes to the hardware as counting"
    );
}

// ---------------------------------------------------------------------------------------------
// Running-counter writes, stale values

/// kvm-unit-tests `check_running_counter_wrmsr`.
#[test]
fn writes_to_a_running_counter() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
    vcpu.set(ext_ctl(0), EN | OS | USR | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 5_000_000, KERNEL);
    vcpu.set(ext_ctr(0), 0);
    vcpu.run(HwEvent::Instructions, 5_000_000, KERNEL);
    vcpu.set(ext_ctl(0), 0);
    assert!(vcpu.value(ext_ctr(0)) < 10_000_000);

    let status = vcpu.value(GLOBAL_STATUS);
    vcpu.set(GLOBAL_STATUS_CLR, status);
    vcpu.set(ext_ctl(0), EN | OS | USR | INSTRUCTIONS);
    vcpu.set(ext_ctr(0), u64::MAX); // -1, kept as its low 48 bits
    vcpu.run(HwEvent::Instructions, 10, KERNEL);
    vcpu.set(ext_ctl(0), 0);
    assert_eq!(vcpu.value(GLOBAL_STATUS) & 1, 1);
}

#[test]
fn another_vcpus_stale_counter_values_never_leak() {
    let mut vcpu = Vcpu::new(PmuShape::PerfCtrExtCore);
    for i in 0..6 {
        vcpu.hw.plant_counter(i, 0xdead_0000 + i as u64);
    }
    for i in 0..6 {
        assert_eq!(
            vcpu.value(ext_ctr(i)),
            0,
            "unused counter {i} reads the context"
        );
    }
    vcpu.set(ext_ctr(4), 7);
    vcpu.set(ext_ctl(5), EN | OS | INSTRUCTIONS);
    vcpu.set(ext_ctl(4), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    assert_eq!(vcpu.value(ext_ctr(5)), 1, "started from the context's 0");
    assert_eq!(vcpu.value(ext_ctr(4)), 8, "started from the written 7");
}

// ---------------------------------------------------------------------------------------------
// Overflow handling

#[test]
fn perfmon_v2_overflow_is_folded_and_acknowledged() {
    let mut vcpu = Vcpu::new(PmuShape::PerfMonV2 { counters: 6 });
    vcpu.set(ext_ctr(0), MASK48 - 1);
    vcpu.set(ext_ctl(0), EN | OS | INT | INSTRUCTIONS);
    vcpu.set(ext_ctr(2), MASK48);
    vcpu.set(ext_ctl(2), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 2, KERNEL);
    assert!(vcpu.hw.take_pmi());
    let overflow = vcpu
        .backend
        .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
        .unwrap();
    assert_eq!(overflow.counters, CounterSet(0b101));
    assert!(overflow.interrupt);
    assert_eq!(
        vcpu.hw.registers().global_status,
        0,
        "acknowledged on the hardware"
    );
    assert_eq!(vcpu.ctx.global_status(), 0b101);
    assert_eq!(vcpu.value(GLOBAL_STATUS), 0b101, "the guest still sees it");

    // A second overflow of a counter whose bit is still pending is seen again.
    vcpu.set(ext_ctr(0), MASK48);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    let overflow = vcpu
        .backend
        .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
        .unwrap();
    assert_eq!(overflow.counters, CounterSet(0b1));

    // Only a counter without INT: no interrupt due.
    vcpu.set(GLOBAL_STATUS_CLR, !0);
    vcpu.set(ext_ctr(2), MASK48);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    let overflow = vcpu
        .backend
        .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
        .unwrap();
    assert_eq!(overflow.counters, CounterSet(0b100));
    assert!(!overflow.interrupt);
}

#[test]
fn legacy_overflow_is_recognised_from_the_top_bit() {
    for shape in [PmuShape::LegacyK7, PmuShape::PerfCtrExtCore] {
        let mut vcpu = Vcpu::new(shape);
        let period = 1000u64;
        for i in 0..3 {
            vcpu.set(ctr_msr(shape, i), period.wrapping_neg() & MASK48);
        }
        vcpu.set(ctl_msr(shape, 0), EN | OS | INT | INSTRUCTIONS);
        vcpu.set(ctl_msr(shape, 1), EN | OS | INSTRUCTIONS); // no INT
        vcpu.set(ctl_msr(shape, 2), EN | OS | INT | BRANCHES); // does not wrap
        vcpu.run(HwEvent::Instructions, period, KERNEL);
        assert!(vcpu.hw.take_pmi());
        let overflow = vcpu
            .backend
            .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
            .unwrap();
        assert_eq!(overflow.counters, CounterSet(0b1), "{shape:?}");
        assert!(overflow.interrupt);
        // Disarmed until the guest re-arms it: the same PMI is not reported twice.
        let again = vcpu
            .backend
            .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
            .unwrap();
        assert_eq!(again.counters, CounterSet::EMPTY);
        vcpu.set(ctr_msr(shape, 0), period.wrapping_neg() & MASK48);
        vcpu.run(HwEvent::Instructions, period, KERNEL);
        let rearmed = vcpu
            .backend
            .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
            .unwrap();
        assert_eq!(rearmed.counters, CounterSet(0b1));
    }
}

#[test]
fn amd_does_not_mask_the_lvtpc() {
    let backend = AmdPmu::new(pmu(PmuShape::PerfCtrExtCore)).unwrap();
    assert!(!backend.masks_lvtpc_on_pmi());
    let caps = backend.capabilities();
    assert_eq!(
        (caps.vendor, caps.gp_counters, caps.gp_width),
        (vpmu::Vendor::Amd, 6, 48)
    );
}
