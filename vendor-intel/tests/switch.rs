//! Save/load: round trips preserving every counter and control, the clean-hardware invariant,
//! no leak of another vCPU's stale counters, and the MSR traffic of a switch.

mod common;

use common::*;
use vpmu::abi::XENPMU_FEATURE_INTEL_BTS;
use vpmu::{CounterSet, CountingBus, GuestPolicy, Msr, MsrBus, PmuBackend};
use vpmu_models::{HwEvent, SoftwarePmu};

/// Every guest-visible register of the v5 machine, read through the backend.
fn snapshot(m: &mut Machine, vcpu: &mut Vcpu) -> Vec<(u32, u64)> {
    let mut msrs: Vec<u32> = (0..8)
        .flat_map(|i| [PMC0 + i, A_PMC0 + i, EVTSEL0 + i])
        .collect();
    msrs.extend((0..4).map(|i| FIXED_CTR0 + i));
    msrs.extend([
        FIXED_CTR_CTRL,
        GLOBAL_CTRL,
        GLOBAL_STATUS,
        GLOBAL_OVF_CTRL,
        DS_AREA,
        PEBS_ENABLE,
        PERF_CAPABILITIES,
    ]);
    msrs.into_iter()
        .map(|msr| (msr, m.get(vcpu, msr)))
        .collect()
}

/// Programs every register of a v5 vCPU with distinct values and lets it count.
fn program_everything(m: &mut Machine, vcpu: &mut Vcpu) {
    let bts = GuestPolicy {
        features: XENPMU_FEATURE_INTEL_BTS,
        ..GuestPolicy::guest_default()
    };
    let events = [
        0x003c, 0x00c0, 0x013c, 0x4f2e, 0x412e, 0x00c4, 0x00c5, 0x01b1,
    ];
    for (i, event) in (0..8).zip(events) {
        m.set(
            vcpu,
            A_PMC0 + i,
            0x1000_0000_0000 * u64::from(i + 1) + u64::from(i),
        );
        let flags = if i % 2 == 0 {
            ENABLE_ALL_RINGS
        } else {
            (1 << 22) | (1 << 17) | EVTSEL_INT
        };
        m.set(vcpu, EVTSEL0 + i, flags | event);
    }
    for i in 0..4 {
        m.set(vcpu, FIXED_CTR0 + i, 0x0abc_0000_0000 + u64::from(i));
    }
    m.set(vcpu, FIXED_CTR_CTRL, 0xb3a1);
    m.set(vcpu, GLOBAL_CTRL, 0xf_0000_00bf);
    m.set(vcpu, GLOBAL_STATUS_SET, 1 << 6);
    assert_eq!(
        m.wrmsr_with(vcpu, &bts, DS_AREA, 0xffff_c900_0000_0000),
        vpmu::MsrOutcome::Handled(())
    );
}

/// Another vCPU scribbles over every counter and control, counts, and is saved.
fn other_vcpu_uses_everything(m: &mut Machine) {
    let mut other = m.vcpu();
    m.load(&mut other);
    for i in 0..8 {
        m.set(&mut other, A_PMC0 + i, 0xdead_0000 + u64::from(i));
        m.set(&mut other, EVTSEL0 + i, ENABLE_ALL_RINGS | INSTRUCTIONS);
    }
    for i in 0..4 {
        m.set(&mut other, FIXED_CTR0 + i, 0xbeef_0000 + u64::from(i));
    }
    m.set(&mut other, FIXED_CTR_CTRL, 0x3333);
    m.set(&mut other, GLOBAL_CTRL, 0xf_0000_00ff);
    m.run(HwEvent::Instructions, 1234, KERNEL);
    m.save(&mut other);
    m.assert_nothing_counts();
}

#[test]
fn save_load_round_trip_preserves_every_register() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    program_everything(&mut m, &mut vcpu);
    m.run(HwEvent::Instructions, 777, KERNEL);
    m.run(HwEvent::CoreCycles, 99, USER);
    let live = snapshot(&mut m, &mut vcpu);
    assert_eq!(
        m.get(&mut vcpu, PMC0 + 1),
        0x2000_0000_0001 + 777,
        "counted while loaded"
    );

    m.save(&mut vcpu);
    m.assert_nothing_counts();
    assert_eq!(m.hw.registers().ds_area, 0);
    let saved_ctx = vcpu.ctx.clone();
    assert_eq!(
        snapshot(&mut m, &mut vcpu),
        live,
        "the saved context answers the same"
    );

    other_vcpu_uses_everything(&mut m);

    m.load(&mut vcpu);
    assert_eq!(
        snapshot(&mut m, &mut vcpu),
        live,
        "reloaded over another vCPU's state"
    );
    let r = *m.hw.registers();
    assert_eq!(r.gp_counters[3], 0x4000_0000_0003);
    assert_eq!(r.event_selects[4], ENABLE_ALL_RINGS | 0x412e);
    assert_eq!(r.fixed_ctrl, 0xb3a1);
    assert_eq!(r.global_ctrl, 0xf_0000_00bf);
    m.save(&mut vcpu);
    assert_eq!(vcpu.ctx, saved_ctx, "a second switch changes nothing");
}

#[test]
fn stale_counters_of_another_vcpu_never_leak() {
    let mut m = Machine::v5();
    other_vcpu_uses_everything(&mut m);
    assert_ne!(
        m.hw.registers().gp_counters[3],
        0,
        "the hardware holds stale counts"
    );

    let mut vcpu = m.vcpu();
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.load(&mut vcpu);
    assert_eq!(m.get(&mut vcpu, PMC0 + 3), 0);
    assert_eq!(m.get(&mut vcpu, A_PMC0 + 3), 0);
    assert_eq!(m.get(&mut vcpu, FIXED_CTR0 + 1), 0);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0);

    // Starting an unused counter while loaded first overwrites the stale value.
    m.set(&mut vcpu, EVTSEL0 + 3, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x30);
    m.set(&mut vcpu, GLOBAL_CTRL, 0x2_0000_0009);
    m.run(HwEvent::Instructions, 5, KERNEL);
    m.run(HwEvent::CoreCycles, 6, KERNEL);
    assert_eq!(m.get(&mut vcpu, PMC0 + 3), 5);
    assert_eq!(m.get(&mut vcpu, PMC0), 5);
    assert_eq!(m.get(&mut vcpu, FIXED_CTR0 + 1), 6);
}

#[test]
fn stale_status_of_another_owner_is_not_reported() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.set(
        &mut vcpu,
        EVTSEL0,
        ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS,
    );
    m.set(&mut vcpu, PMC0, 1u64.wrapping_neg());
    m.load(&mut vcpu);
    // Someone else left counter 5's overflow bit on the hardware.
    m.hw.write(Msr(GLOBAL_STATUS_SET), 1 << 5)
        .expect("v5 hardware");
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0);
    m.run(HwEvent::Instructions, 1, KERNEL);
    let overflow = m
        .pmu
        .handle_overflow(&mut vcpu.ctx, &mut m.hw)
        .expect("pmi");
    assert_eq!(overflow.counters, CounterSet::gp(0));
    assert!(overflow.interrupt);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 1);
    assert_eq!(m.hw.registers().global_status, 0, "both acknowledged");
}

#[test]
fn overflow_while_loaded_is_kept_across_a_switch() {
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    m.set(&mut vcpu, EVTSEL0 + 2, ENABLE_ALL_RINGS | BRANCHES);
    m.set(&mut vcpu, PMC0 + 2, 3u64.wrapping_neg());
    m.load(&mut vcpu);
    m.run(HwEvent::Branches, 4, USER);
    assert!(!m.hw.pmi_pending(), "no INT, no PMI");
    m.save(&mut vcpu);
    assert_eq!(m.hw.registers().global_status, 0, "acknowledged at save");
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 1 << 2);
    assert_eq!(m.get(&mut vcpu, PMC0 + 2), 1);
    m.load(&mut vcpu);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 1 << 2);
    m.set(&mut vcpu, GLOBAL_OVF_CTRL, 1 << 2);
    assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0);
    m.save(&mut vcpu);
    assert_eq!(vcpu.ctx.virtual_status(), 0);
}

#[test]
fn activity() {
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    assert!(!m.pmu.is_active(&vcpu.ctx), "reset context");
    m.set(&mut vcpu, PMC0, 5);
    assert!(!m.pmu.is_active(&vcpu.ctx), "a value alone does not count");
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    assert!(m.pmu.is_active(&vcpu.ctx));
    m.set(&mut vcpu, GLOBAL_CTRL, 0b1110);
    assert!(!m.pmu.is_active(&vcpu.ctx), "globally disabled");
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x8);
    m.set(&mut vcpu, GLOBAL_CTRL, 0x1_0000_0000);
    assert!(!m.pmu.is_active(&vcpu.ctx), "PMI bit alone does not count");
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x1);
    assert!(m.pmu.is_active(&vcpu.ctx));
}

#[test]
fn legacy_only_restore_is_exact_for_writable_values() {
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, EVTSEL0 + 1, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, PMC0, 0x7fff_fff0);
    m.set(&mut vcpu, PMC0 + 1, 0x8000_0010);
    m.load(&mut vcpu);
    m.save(&mut vcpu);
    m.load(&mut vcpu);
    assert_eq!(m.get(&mut vcpu, PMC0), 0x7fff_fff0);
    assert_eq!(m.get(&mut vcpu, PMC0 + 1), 0xffff_8000_0010);
    // The documented limitation: a count that crossed bit 31 cannot be written back exactly
    // through the legacy alias.
    m.run(HwEvent::Instructions, 0x20, KERNEL);
    m.save(&mut vcpu);
    assert_eq!(vcpu.ctx.gp_counter(0), Some(0x8000_0010));
    m.load(&mut vcpu);
    // Nothing in between: the hardware still holds the exact count, nothing is written back.
    assert_eq!(m.get(&mut vcpu, PMC0), 0x8000_0010);
    m.save(&mut vcpu);
    // Written back (the record lost, or another context used the counter): sign-extended.
    m.record.forget();
    m.load(&mut vcpu);
    assert_eq!(m.get(&mut vcpu, PMC0), 0xffff_8000_0010);
}

struct Traffic {
    load: vpmu::MsrAccessStats,
    save: vpmu::MsrAccessStats,
}

/// Measures one load and one save of `vcpu` through a `CountingBus`, cross-checked against
/// the model's own counters.
fn measure(m: &mut Machine, vcpu: &mut Vcpu) -> Traffic {
    let model_before = m.stats();
    let mut bus = CountingBus::new(&mut m.hw);
    m.pmu
        .load(&vcpu.ctx, &mut bus, &mut m.record)
        .expect("load");
    let load = bus.stats();
    m.pmu
        .save(&mut vcpu.ctx, &mut bus, &mut m.record)
        .expect("save");
    let save = bus.stats() - load;
    assert_eq!(m.stats() - model_before, bus_total(load, save));
    assert_eq!(load.faults + save.faults, 0);
    Traffic { load, save }
}

fn bus_total(a: vpmu::MsrAccessStats, b: vpmu::MsrAccessStats) -> vpmu::MsrAccessStats {
    vpmu::MsrAccessStats {
        reads: a.reads + b.reads,
        writes: a.writes + b.writes,
        faults: a.faults + b.faults,
    }
}

fn report(label: &str, t: &Traffic) {
    println!(
        "{label:<34} load: {:>2} reads {:>2} writes ({:>2} total) | save: {:>2} reads {:>2} writes ({:>2} total)",
        t.load.reads,
        t.load.writes,
        t.load.total(),
        t.save.reads,
        t.save.writes,
        t.save.total()
    );
}

/// MSR accesses of one switch for "PMU never used", "1 of 8 counters active" and "all
/// active" (8 GP + 4 fixed), on v5 with full-width writes and on v2. Run with --nocapture.
#[test]
fn msr_traffic_of_a_switch() {
    for (name, mut m) in [
        ("v5 8 GP + 4 fixed, FW", Machine::v5()),
        ("v2 4 GP + 3 fixed", Machine::v2()),
    ] {
        let gp = m.pmu.caps().gp_counters();
        let fixed = m.pmu.caps().fixed_counters().count_ones();
        println!("{name}:");

        let mut unused = m.vcpu();
        assert!(!m.pmu.is_active(&unused.ctx));
        let t = measure(&mut m, &mut unused);
        report("  PMU never used", &t);
        assert_eq!((t.load.total(), t.save.total()), (0, 0));

        let mut one = m.vcpu();
        m.set(&mut one, PMC0, 100);
        m.set(&mut one, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
        let t = measure(&mut m, &mut one);
        report(&format!("  1 of {gp} counters active"), &t);
        // Load onto a cleaned CPU: counter, selector, GLOBAL_CTRL (not known since the
        // clean-up). Save: GLOBAL_CTRL <- 0, GLOBAL_STATUS, counter; the selector stays.
        assert_eq!((t.load.reads, t.load.writes), (0, 3));
        assert_eq!((t.save.reads, t.save.writes), (2, 1));
        // Switched back with nothing in between: only GLOBAL_CTRL changes (k + 3 in all).
        let t = measure(&mut m, &mut one);
        assert_eq!((t.load.reads, t.load.writes), (0, 1));
        assert_eq!((t.save.reads, t.save.writes), (2, 1));

        let mut all = m.vcpu();
        for i in 0..gp {
            m.set(&mut all, EVTSEL0 + i, ENABLE_ALL_RINGS | INSTRUCTIONS);
        }
        m.set(&mut all, FIXED_CTR_CTRL, ((1 << (4 * fixed)) - 1) & 0x3333);
        m.set(&mut all, GLOBAL_CTRL, m.pmu.caps().all_counters().0);
        let t = measure(&mut m, &mut all);
        report(&format!("  all active ({gp} GP + {fixed} fixed)"), &t);
        let counters = u64::from(gp + fixed);
        // Load after `one`: every counter, every selector but 0 (`one` left the same value
        // there), FIXED_CTR_CTRL, GLOBAL_CTRL.
        assert_eq!(
            (t.load.reads, t.load.writes),
            (0, counters + u64::from(gp) - 1 + 2)
        );
        // Save: GLOBAL_CTRL <- 0, GLOBAL_STATUS, every counter.
        assert_eq!((t.save.reads, t.save.writes), (1 + counters, 1));
        m.assert_nothing_counts();
        let t = measure(&mut m, &mut all);
        assert_eq!((t.load.reads, t.load.writes), (0, 1));
        assert_eq!((t.save.reads, t.save.writes), (1 + counters, 1));
        // And `one` after `all`: its counter, and every selector `all` left, cleared.
        let t = measure(&mut m, &mut one);
        assert_eq!(
            (t.load.reads, t.load.writes),
            (0, 1 + u64::from(gp) - 1 + 1 + 1)
        );
        m.assert_nothing_counts();
    }
}

/// On a CPU nobody cleaned (power-on sets the GP enables in GLOBAL_CTRL), a context that
/// disabled its counters globally must not count once loaded.
#[test]
fn uncleaned_power_on_state_does_not_count_for_a_disabled_context() {
    let pmu = vpmu_intel::IntelPmu::from_cpuid(v2_shape(), None).expect("v2");
    let mut hw = vpmu_models::intel::IntelPmuModel::new(*pmu.caps());
    assert_eq!(hw.registers().global_ctrl, 0xf, "power-on state");
    let mut ctx = pmu.new_context();
    let policy = GuestPolicy::guest_default();
    for (msr, value) in [(EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS), (GLOBAL_CTRL, 0)] {
        pmu.guest_write(
            &mut ctx,
            None::<&mut vpmu_models::intel::IntelPmuModel>,
            &policy,
            Msr(msr),
            value,
        )
        .expect("no hardware");
    }
    // A CPU nobody cleaned: nothing is known about it.
    let mut record = vpmu::HwRecord::unknown();
    pmu.load(&ctx, &mut hw, &mut record).expect("load");
    hw.count(HwEvent::Instructions, 10, KERNEL);
    assert_eq!(hw.registers().gp_counters[0], 0);
    pmu.save(&mut ctx, &mut hw, &mut record).expect("save");
    assert_eq!(hw.registers().global_ctrl, 0);
}
