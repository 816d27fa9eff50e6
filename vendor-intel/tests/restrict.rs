//! What a save reports, restriction of a saved context after a policy change, and the flush of
//! an unedited page under a policy that now refuses one of its controls.

mod common;

use common::*;
use vpmu::abi::{
    CounterPair, IntelBanks, VendorArea, VendorLayout, XENPMU_FEATURE_INTEL_BTS,
    XENPMU_FEATURE_IPC_ONLY, XENPMU_REFUSED_EVENT, XENPMU_REFUSED_FORBIDDEN,
};
use vpmu::{ContextError, CounterSet, EventFilter, GuestPolicy, Overflow, PmuBackend, RawEvent};
use vpmu_intel::IntelContext;
use vpmu_models::{HwEvent, SoftwarePmu};

const DS_ADDRESS: u64 = 0xffff_c900_0000_0000;
/// PERFEVTSELx.EN.
const EN: u64 = 1 << 22;

fn with_features(features: u64) -> GuestPolicy<'static> {
    GuestPolicy {
        features,
        ..GuestPolicy::guest_default()
    }
}

/// A restriction (or refusal) of `register` for `reason` (`XENPMU_REFUSED_*`), naming the MSR a
/// WRMSR of it would name (the SDM's numbers).
fn error(register: &'static str, index: Option<u32>, value: u64, reason: u32) -> ContextError {
    let msr = match (register, index) {
        ("fixed_ctrl", None) => 0x38d,
        ("ds_area", None) => 0x600,
        ("evtsel", Some(i)) => 0x186 + i,
        other => panic!("no MSR for {other:?}"),
    };
    ContextError {
        register,
        index,
        value,
        msr,
        reason,
    }
}

fn restricted(
    register: &'static str,
    index: Option<u32>,
    value: u64,
    reason: u32,
) -> Option<ContextError> {
    Some(error(register, index, value, reason))
}

// ---------------------------------------------------------------------------------------------
// Save

#[test]
fn save_reports_a_pending_interrupting_overflow_once() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, A_PMC0, 1u64.wrapping_neg() & ((1 << 48) - 1));
    m.set(
        &mut vcpu,
        EVTSEL0,
        ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS,
    );
    m.set(&mut vcpu, A_PMC0 + 1, (1 << 48) - 1);
    m.set(&mut vcpu, EVTSEL0 + 1, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.run(HwEvent::Instructions, 1, KERNEL);
    assert!(m.hw.pmi_pending(), "raised, not handled before the switch");
    assert_eq!(
        m.save(&mut vcpu),
        Overflow {
            counters: CounterSet::gp(0).union(CounterSet::gp(1)),
            interrupt: true,
        }
    );
    assert_eq!(vcpu.ctx.virtual_status(), 0b11);
    m.load(&mut vcpu);
    assert_eq!(m.save(&mut vcpu), Overflow::default(), "reported once");
    assert_eq!(vcpu.ctx.virtual_status(), 0b11, "still recorded");
}

#[test]
fn save_reports_fixed_counters_and_interrupt_only_with_the_pmi_bit() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, FIXED_CTR0 + 1, (1 << 48) - 1);
    m.set(&mut vcpu, FIXED_CTR0 + 2, (1 << 48) - 1);
    // Fixed 1: OS without PMI; fixed 2: OS with PMI.
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0x910);
    m.set(&mut vcpu, GLOBAL_CTRL, 0x6_0000_0000);
    m.run(HwEvent::CoreCycles, 1, KERNEL);
    assert_eq!(
        m.save(&mut vcpu),
        Overflow {
            counters: CounterSet::fixed(1),
            interrupt: false,
        }
    );
    m.load(&mut vcpu);
    m.run(HwEvent::RefCycles, 1, KERNEL);
    assert_eq!(
        m.save(&mut vcpu),
        Overflow {
            counters: CounterSet::fixed(2),
            interrupt: true,
        }
    );
}

#[test]
fn save_reports_a_wrap_again_before_the_guest_acknowledged_the_first() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, A_PMC0, (1 << 48) - 1);
    m.set(
        &mut vcpu,
        EVTSEL0,
        ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS,
    );
    m.run(HwEvent::Instructions, 1, KERNEL);
    let at_pmi = m
        .pmu
        .handle_overflow(&mut vcpu.ctx, &mut m.hw)
        .expect("pmi");
    assert_eq!(at_pmi.counters, CounterSet::gp(0));
    assert_eq!(m.save(&mut vcpu), Overflow::default(), "handled at the PMI");

    // The guest has not cleared bit 0 when the counter wraps again: the hardware raises a PMI
    // all the same, and the switch-out must keep it.
    m.load(&mut vcpu);
    m.set(&mut vcpu, A_PMC0, (1 << 48) - 1);
    m.run(HwEvent::Instructions, 1, KERNEL);
    assert!(m.hw.pmi_pending());
    assert_eq!(
        m.save(&mut vcpu),
        Overflow {
            counters: CounterSet::gp(0),
            interrupt: true,
        }
    );
    assert_eq!(vcpu.ctx.virtual_status(), 1);
}

/// A wrap while the interrupt was disabled raised no PMI; enabling the interrupt afterwards
/// (loaded or saved, GP or fixed) must not turn it into one, at a save or at another counter's
/// PMI, and the guest still sees its status bit.
#[test]
fn a_wrap_without_interrupt_never_becomes_one_once_it_is_enabled() {
    let fixed1 = FIXED_CTR0 + 1;
    for enable_while_loaded in [true, false] {
        let mut m = Machine::v5();
        let mut vcpu = m.vcpu();
        m.load(&mut vcpu);
        m.set(&mut vcpu, A_PMC0, (1 << 48) - 1);
        m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
        m.set(&mut vcpu, fixed1, (1 << 48) - 1);
        m.set(&mut vcpu, FIXED_CTR_CTRL, 0x30);
        m.set(&mut vcpu, GLOBAL_CTRL, 0x2_0000_0001);
        m.run(HwEvent::Instructions, 1, KERNEL);
        m.run(HwEvent::CoreCycles, 1, KERNEL);
        assert!(!m.hw.pmi_pending());
        if !enable_while_loaded {
            m.save(&mut vcpu);
        }
        m.set(
            &mut vcpu,
            EVTSEL0,
            ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS,
        );
        m.set(&mut vcpu, FIXED_CTR_CTRL, 0xb0);
        if !enable_while_loaded {
            m.load(&mut vcpu);
        }
        let at_pmi = m
            .pmu
            .handle_overflow(&mut vcpu.ctx, &mut m.hw)
            .expect("pmi");
        assert!(!at_pmi.interrupt, "loaded {enable_while_loaded}");
        let saved = m.save(&mut vcpu);
        assert!(!saved.interrupt, "loaded {enable_while_loaded}");
        assert_eq!(
            vcpu.ctx.virtual_status(),
            0x2_0000_0001,
            "the guest still sees them"
        );

        // They still interrupt for a wrap after the interrupt was enabled.
        m.load(&mut vcpu);
        m.set(&mut vcpu, A_PMC0, (1 << 48) - 1);
        m.set(&mut vcpu, fixed1, (1 << 48) - 1);
        m.run(HwEvent::Instructions, 1, KERNEL);
        m.run(HwEvent::CoreCycles, 1, KERNEL);
        assert!(m.hw.pmi_pending());
        assert_eq!(
            m.save(&mut vcpu),
            Overflow {
                counters: CounterSet(0x2_0000_0001),
                interrupt: true,
            },
            "loaded {enable_while_loaded}"
        );
    }
}

#[test]
fn an_unused_context_saves_without_overflow() {
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    let before = m.stats();
    assert_eq!(m.save(&mut vcpu), Overflow::default());
    assert_eq!(m.stats(), before, "no access");
}

// ---------------------------------------------------------------------------------------------
// Restrict

/// A saved v5 vCPU counting branches on GP0 and instructions on GP1 (INT), fixed 0, 1, 3 (PMI
/// on 3), everything globally enabled.
fn saved_busy_vcpu(m: &mut Machine) -> Vcpu {
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | BRANCHES);
    m.set(
        &mut vcpu,
        EVTSEL0 + 1,
        ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS,
    );
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0xb033);
    m.set(&mut vcpu, GLOBAL_CTRL, 0xf_0000_00ff);
    m.run(HwEvent::Branches, 10, KERNEL);
    m.save(&mut vcpu);
    vcpu
}

#[test]
fn ipc_only_clears_enables_in_the_hardware_images_only() {
    let mut m = Machine::v5();
    let mut vcpu = saved_busy_vcpu(&mut m);
    let guest_view = (
        m.get(&mut vcpu, EVTSEL0),
        m.get(&mut vcpu, EVTSEL0 + 1),
        m.get(&mut vcpu, FIXED_CTR_CTRL),
    );
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    // FIXED_CTR_CTRL (topdown slots on fixed 3) comes first, then GP0's branches.
    assert_eq!(
        m.pmu.restrict(&mut vcpu.ctx, &ipc),
        restricted("fixed_ctrl", None, 0xb033, XENPMU_REFUSED_EVENT)
    );
    let once = vcpu.ctx.clone();
    assert_eq!(
        m.pmu.restrict(&mut vcpu.ctx, &ipc),
        restricted("fixed_ctrl", None, 0xb033, XENPMU_REFUSED_EVENT),
        "idempotent"
    );
    assert_eq!(vcpu.ctx, once);
    assert_eq!(
        (
            m.get(&mut vcpu, EVTSEL0),
            m.get(&mut vcpu, EVTSEL0 + 1),
            m.get(&mut vcpu, FIXED_CTR_CTRL),
        ),
        guest_view,
        "the guest reads back what it wrote"
    );

    m.load(&mut vcpu);
    let r = *m.hw.registers();
    assert_eq!(r.event_selects[0], (ENABLE_ALL_RINGS | BRANCHES) & !EN);
    assert_eq!(
        r.event_selects[1],
        ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS
    );
    assert_eq!(r.fixed_ctrl, 0x0033, "only the refused nibble is cleared");
    m.run(HwEvent::Branches, 5, KERNEL);
    m.run(HwEvent::Instructions, 7, KERNEL);
    assert_eq!(m.get(&mut vcpu, PMC0), 10, "GP0 no longer counts");
    assert_eq!(m.get(&mut vcpu, PMC0 + 1), 7);
    assert_eq!(m.get(&mut vcpu, FIXED_CTR0), 7, "fixed 0 still counts");
    m.save(&mut vcpu);

    // The policy relaxes again: the images are recomputed and count again.
    let default = GuestPolicy::guest_default();
    assert_eq!(m.pmu.restrict(&mut vcpu.ctx, &default), None);
    m.load(&mut vcpu);
    assert_eq!(
        m.hw.registers().event_selects[0],
        ENABLE_ALL_RINGS | BRANCHES
    );
    assert_eq!(m.hw.registers().fixed_ctrl, 0xb033);
}

#[test]
fn restriction_names_the_first_event_select() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.set(&mut vcpu, EVTSEL0 + 3, ENABLE_ALL_RINGS | BRANCHES);
    m.set(&mut vcpu, EVTSEL0 + 5, ENABLE_ALL_RINGS | 0x412e);
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    assert_eq!(
        m.pmu.restrict(&mut vcpu.ctx, &ipc),
        restricted(
            "evtsel",
            Some(3),
            ENABLE_ALL_RINGS | BRANCHES,
            XENPMU_REFUSED_EVENT
        )
    );
    assert!(!m.pmu.is_active(&vcpu.ctx), "nothing left that counts");
    assert_eq!(
        vcpu.ctx.in_use(),
        CounterSet::gp(3).union(CounterSet::gp(5))
    );
}

#[test]
fn the_filter_is_applied_but_not_reported() {
    struct NoInstructions;
    impl EventFilter for NoInstructions {
        fn allows(&self, event: RawEvent) -> bool {
            event.select != 0xc0
        }
        fn allows_fixed(&self, index: u32) -> bool {
            index != 0
        }
    }
    let mut m = Machine::v5();
    let mut vcpu = saved_busy_vcpu(&mut m);
    let filtered = GuestPolicy {
        features: 0,
        filter: &NoInstructions,
        may_count_host: false,
    };
    assert_eq!(m.pmu.restrict(&mut vcpu.ctx, &filtered), None);
    m.load(&mut vcpu);
    let r = *m.hw.registers();
    assert_eq!(
        r.event_selects[1],
        (ENABLE_ALL_RINGS | EVTSEL_INT | INSTRUCTIONS) & !EN
    );
    assert_eq!(r.fixed_ctrl, 0xb030);
}

#[test]
fn bts_withdrawn_unloads_the_ds_area() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    let bts = with_features(XENPMU_FEATURE_INTEL_BTS);
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &bts, DS_AREA, DS_ADDRESS),
        vpmu::MsrOutcome::Handled(())
    );
    assert!(m.pmu.is_active(&vcpu.ctx));
    assert_eq!(m.pmu.restrict(&mut vcpu.ctx, &bts), None);
    assert_eq!(m.get(&mut vcpu, DS_AREA), DS_ADDRESS);

    let default = GuestPolicy::guest_default();
    assert_eq!(
        m.pmu.restrict(&mut vcpu.ctx, &default),
        restricted("ds_area", None, DS_ADDRESS, XENPMU_REFUSED_FORBIDDEN)
    );
    assert_eq!(m.get(&mut vcpu, DS_AREA), 0);
    assert!(!m.pmu.is_active(&vcpu.ctx));
    assert_eq!(
        m.pmu.restrict(&mut vcpu.ctx, &default),
        None,
        "nothing left"
    );
    m.load(&mut vcpu);
    assert_eq!(m.hw.registers().ds_area, 0);
}

// ---------------------------------------------------------------------------------------------
// Flush of an unedited page

fn banks(m: &Machine) -> IntelBanks {
    match m.pmu.page_layout() {
        VendorLayout::Intel(banks) => banks,
        other => panic!("Intel backend with {other:?}"),
    }
}

fn area_of(m: &Machine, ctx: &IntelContext) -> VendorArea {
    let mut area = VendorArea::default();
    m.pmu.context_to_page(ctx, &mut area);
    area
}

#[test]
fn an_unedited_page_flushes_restricted_after_a_policy_change() {
    let mut m = Machine::v5();
    let vcpu = saved_busy_vcpu(&mut m);
    let area = area_of(&m, &vcpu.ctx);
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    let flushed = m
        .pmu
        .context_from_page(&area, &vcpu.ctx, &ipc)
        .expect("an unedited page always flushes");
    let mut expected = vcpu.ctx.clone();
    assert!(m.pmu.restrict(&mut expected, &ipc).is_some());
    assert_eq!(flushed, expected);
    assert_eq!(flushed.event_select(0), Some(ENABLE_ALL_RINGS | BRANCHES));

    let mut loaded = Vcpu {
        ctx: flushed,
        loaded: false,
    };
    m.load(&mut loaded);
    assert_eq!(
        m.hw.registers().event_selects[0],
        (ENABLE_ALL_RINGS | BRANCHES) & !EN
    );
    assert_eq!(m.hw.registers().fixed_ctrl, 0x0033);
}

#[test]
fn an_edited_control_is_still_refused() {
    let mut m = Machine::v5();
    let vcpu = saved_busy_vcpu(&mut m);
    let b = banks(&m);
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    let clean = area_of(&m, &vcpu.ctx);

    // GP1 edited to an event IPC_ONLY refuses; the unedited GP0 would be restricted.
    let mut area = clean.clone();
    let pair = b.pair(&area, 1).expect("in bank");
    let control = ENABLE_ALL_RINGS | BRANCHES | EVTSEL_INT;
    b.set_pair(&mut area, 1, CounterPair { control, ..pair })
        .expect("in bank");
    // FIXED_CTR_CTRL is unedited, so GP1 is the first refusal.
    assert_eq!(
        m.pmu.context_from_page(&area, &vcpu.ctx, &ipc),
        Err(error("evtsel", Some(1), control, XENPMU_REFUSED_EVENT))
    );

    // FIXED_CTR_CTRL edited to another value with topdown slots enabled.
    let mut area = clean.clone();
    let mut ctxt = area.intel_ctxt();
    ctxt.fixed_ctrl = 0x3033;
    area.set_intel_ctxt(&ctxt);
    assert_eq!(
        m.pmu.context_from_page(&area, &vcpu.ctx, &ipc),
        Err(error("fixed_ctrl", None, 0x3033, XENPMU_REFUSED_EVENT))
    );
}

#[test]
fn an_unedited_ds_area_is_unloaded_and_an_edited_one_refused() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    let bts = with_features(XENPMU_FEATURE_INTEL_BTS);
    assert_eq!(
        m.wrmsr_with(&mut vcpu, &bts, DS_AREA, DS_ADDRESS),
        vpmu::MsrOutcome::Handled(())
    );
    let default = GuestPolicy::guest_default();
    let clean = area_of(&m, &vcpu.ctx);
    let flushed = m
        .pmu
        .context_from_page(&clean, &vcpu.ctx, &default)
        .expect("unedited");
    let mut expected = vcpu.ctx.clone();
    m.pmu.restrict(&mut expected, &default);
    assert_eq!(flushed, expected);
    assert!(!m.pmu.is_active(&flushed), "no DS area loaded");

    let mut area = clean;
    let mut ctxt = area.intel_ctxt();
    ctxt.ds_area = DS_ADDRESS + 0x1000;
    area.set_intel_ctxt(&ctxt);
    assert_eq!(
        m.pmu.context_from_page(&area, &vcpu.ctx, &default),
        Err(error(
            "ds_area",
            None,
            DS_ADDRESS + 0x1000,
            XENPMU_REFUSED_FORBIDDEN
        ))
    );
    assert!(m.pmu.context_from_page(&area, &vcpu.ctx, &bts).is_ok());
}
