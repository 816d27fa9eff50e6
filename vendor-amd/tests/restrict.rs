//! What a save reports, restriction of a saved context after a policy change, and the flush of
//! an unedited page under a policy that now refuses one of its controls.

mod common;

use common::*;
use vpmu::abi::{AmdBanks, VendorArea, XENPMU_REFUSED_FORBIDDEN};
use vpmu::{
    AllowAll, ContextError, CounterSet, EventFilter, GuestPolicy, Overflow, PmuBackend, RawEvent,
};
use vpmu_amd::PmuShape;
use vpmu_models::{HwEvent, SoftwarePmu};

const V2: PmuShape = PmuShape::PerfMonV2 { counters: 6 };

const HOST_COUNTING: GuestPolicy<'static> = GuestPolicy {
    features: 0,
    filter: &AllowAll,
    may_count_host: true,
};

// ---------------------------------------------------------------------------------------------
// Save

#[test]
fn perfmon_v2_save_reports_a_pending_interrupting_overflow_once() {
    let mut vcpu = Vcpu::new(V2);
    vcpu.set(ext_ctr(0), MASK48);
    vcpu.set(ext_ctl(0), EN | OS | INT | INSTRUCTIONS);
    vcpu.set(ext_ctr(1), MASK48);
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    assert!(
        vcpu.hw.pmi_pending(),
        "raised, not handled before the switch"
    );
    assert_eq!(
        vcpu.save_overflow(),
        Overflow {
            counters: CounterSet(0b11),
            interrupt: true
        }
    );
    assert_eq!(vcpu.ctx.global_status(), 0b11);
    assert!(vcpu.nothing_can_count());
    vcpu.load();
    assert_eq!(vcpu.save_overflow(), Overflow::default(), "reported once");

    // Counter 1 alone (no INT): reported, no interrupt due.
    vcpu.load();
    vcpu.set(GLOBAL_STATUS_CLR, 0b10);
    vcpu.set(ext_ctr(1), MASK48);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    assert_eq!(
        vcpu.save_overflow(),
        Overflow {
            counters: CounterSet(0b10),
            interrupt: false
        }
    );
}

#[test]
fn perfmon_v2_save_reports_a_wrap_again_before_the_guest_acknowledged_the_first() {
    let mut vcpu = Vcpu::new(V2);
    vcpu.set(ext_ctr(0), MASK48);
    vcpu.set(ext_ctl(0), EN | OS | INT | INSTRUCTIONS);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    let at_pmi = vcpu
        .backend
        .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
        .unwrap();
    assert_eq!(at_pmi.counters, CounterSet(0b1));
    assert_eq!(
        vcpu.save_overflow(),
        Overflow::default(),
        "handled at the PMI"
    );
    // The guest has not cleared bit 0 when the counter wraps again: the hardware raises a PMI
    // all the same, and the switch-out must keep it.
    vcpu.load();
    vcpu.set(ext_ctr(0), MASK48);
    vcpu.run(HwEvent::Instructions, 1, KERNEL);
    assert!(vcpu.hw.pmi_pending());
    assert_eq!(
        vcpu.save_overflow(),
        Overflow {
            counters: CounterSet(0b1),
            interrupt: true
        }
    );
    assert_eq!(vcpu.ctx.global_status(), 0b1);
    assert!(vcpu.nothing_can_count());
}

/// A wrap while INT was clear raised no PMI; setting INT afterwards (loaded or saved) must not
/// turn it into one, at a save or at another counter's PMI, and the guest still sees it.
#[test]
fn a_wrap_without_int_never_becomes_an_interrupt_once_int_is_set() {
    for shape in [V2, PmuShape::LegacyK7, PmuShape::PerfCtrExtCore] {
        for set_while_loaded in [true, false] {
            let mut vcpu = Vcpu::new(shape);
            vcpu.set(ctr_msr(shape, 0), MASK48);
            vcpu.set(ctl_msr(shape, 0), EN | OS | INSTRUCTIONS);
            vcpu.run(HwEvent::Instructions, 1, KERNEL);
            assert!(!vcpu.hw.pmi_pending(), "{shape:?}");
            if !set_while_loaded {
                vcpu.save_overflow();
            }
            vcpu.set(ctl_msr(shape, 0), EN | OS | INT | INSTRUCTIONS);
            if !set_while_loaded {
                vcpu.load();
            }
            let at_pmi = vcpu
                .backend
                .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
                .unwrap();
            assert!(!at_pmi.interrupt, "{shape:?}, loaded {set_while_loaded}");
            let saved = vcpu.save_overflow();
            assert!(!saved.interrupt, "{shape:?}, loaded {set_while_loaded}");
            if shape == V2 {
                assert_eq!(vcpu.ctx.global_status(), 0b1, "the guest still sees it");
            }
            assert!(vcpu.nothing_can_count(), "{shape:?}");

            // It still interrupts for a wrap after INT was set.
            vcpu.load();
            vcpu.set(ctr_msr(shape, 0), MASK48);
            vcpu.run(HwEvent::Instructions, 1, KERNEL);
            assert!(vcpu.hw.pmi_pending(), "{shape:?}");
            assert_eq!(
                vcpu.save_overflow(),
                Overflow {
                    counters: CounterSet(0b1),
                    interrupt: true
                },
                "{shape:?}, loaded {set_while_loaded}"
            );
        }
    }
}

#[test]
fn legacy_save_reports_a_wrap_from_the_top_bit_once() {
    for shape in [PmuShape::LegacyK7, PmuShape::PerfCtrExtCore] {
        let mut vcpu = Vcpu::new(shape);
        let period = 1000u64;
        vcpu.set(ctr_msr(shape, 0), period.wrapping_neg() & MASK48);
        vcpu.set(ctl_msr(shape, 0), EN | OS | INT | INSTRUCTIONS);
        vcpu.set(ctr_msr(shape, 1), period.wrapping_neg() & MASK48);
        vcpu.set(ctl_msr(shape, 1), EN | OS | INSTRUCTIONS); // no INT: no PMI to keep
        vcpu.set(ctr_msr(shape, 2), (2 * period).wrapping_neg() & MASK48);
        vcpu.set(ctl_msr(shape, 2), EN | OS | INT | INSTRUCTIONS); // does not wrap yet
        vcpu.run(HwEvent::Instructions, period, KERNEL);
        assert!(vcpu.hw.pmi_pending());
        let before = vcpu.hw.access_stats();
        assert_eq!(
            vcpu.save_overflow(),
            Overflow {
                counters: CounterSet(0b1),
                interrupt: true
            },
            "{shape:?}"
        );
        let spent = vcpu.hw.access_stats() - before;
        assert_eq!(spent.reads, 3, "{shape:?}: the counters, read once");
        vcpu.load();
        let at_pmi = vcpu
            .backend
            .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
            .unwrap();
        assert_eq!(at_pmi.counters, CounterSet::EMPTY, "{shape:?}: disarmed");
        assert_eq!(vcpu.save_overflow(), Overflow::default(), "{shape:?}");
    }
}

#[test]
fn an_idle_context_saves_without_overflow() {
    for shape in SHAPES {
        let mut vcpu = Vcpu::new(shape);
        let before = vcpu.hw.access_stats();
        assert_eq!(vcpu.save_overflow(), Overflow::default());
        assert_eq!(vcpu.hw.access_stats(), before, "{shape:?}: no access");
    }
}

// ---------------------------------------------------------------------------------------------
// Restrict

const HOST_CYCLES: u64 = EN | OS | HOST_ONLY | CYCLES;

/// A saved vCPU of a host-counting guest: counter 0 counts cycles in host context only,
/// counter 1 instructions everywhere.
fn saved_host_counter() -> Vcpu {
    let mut vcpu = Vcpu::with_policy(V2, HOST_COUNTING);
    vcpu.set(ext_ctl(0), HOST_CYCLES);
    vcpu.set(ext_ctl(1), EN | OS | INSTRUCTIONS);
    vcpu.save();
    assert_eq!(vcpu.ctx.hardware_control(0), Some(HOST_CYCLES));
    assert_eq!(vcpu.ctx.hardware_control(1), Some(EN | OS | INSTRUCTIONS));
    vcpu
}

#[test]
fn host_counting_withdrawn_stops_host_only_counters() {
    let mut vcpu = saved_host_counter();
    let guest = GuestPolicy::guest_default();
    let refused = Some(ContextError {
        register: "ctrl",
        index: Some(0),
        value: HOST_CYCLES,
        msr: 0xC001_0200,
        reason: XENPMU_REFUSED_FORBIDDEN,
    });
    assert_eq!(vcpu.backend.restrict(&mut vcpu.ctx, &guest), refused);
    assert_eq!(vcpu.ctx.control(0), Some(HOST_CYCLES), "guest value kept");
    assert_eq!(
        vcpu.ctx.hardware_control(0),
        Some(OS | GUEST_ONLY | CYCLES),
        "HostOnly dropped, GuestOnly forced, EN clear"
    );
    assert_eq!(
        vcpu.ctx.hardware_control(1),
        Some(EN | OS | INSTRUCTIONS | GUEST_ONLY),
        "a legal control gets the WRMSR image: GuestOnly forced"
    );
    assert_eq!(vcpu.ctx.in_use(), CounterSet(0b10));
    let once = vcpu.ctx.clone();
    assert_eq!(
        vcpu.backend.restrict(&mut vcpu.ctx, &guest),
        refused,
        "idempotent"
    );
    assert_eq!(vcpu.ctx, once);

    vcpu.policy = guest;
    vcpu.load();
    assert_eq!(vcpu.value(ext_ctl(0)), HOST_CYCLES);
    vcpu.run(HwEvent::CoreCycles, 100, HOST);
    vcpu.run(HwEvent::Instructions, 100, HOST);
    vcpu.run(HwEvent::Instructions, 5, KERNEL);
    assert_eq!(vcpu.value(ext_ctr(0)), 0, "no longer counts the host");
    assert_eq!(vcpu.value(ext_ctr(1)), 5, "guest context only");
    vcpu.save();

    // Host counting granted again: the images are recomputed and count the host again.
    assert_eq!(vcpu.backend.restrict(&mut vcpu.ctx, &HOST_COUNTING), None);
    assert_eq!(vcpu.ctx.hardware_control(0), Some(HOST_CYCLES));
    assert_eq!(vcpu.ctx.in_use(), CounterSet(0b11));
}

#[test]
fn the_filter_is_applied_but_not_reported() {
    struct NoInstructions;
    impl EventFilter for NoInstructions {
        fn allows(&self, event: RawEvent) -> bool {
            event.select != 0xc0
        }
        fn allows_fixed(&self, _index: u32) -> bool {
            true
        }
    }
    let mut vcpu = saved_host_counter();
    let filtered = GuestPolicy {
        filter: &NoInstructions,
        ..HOST_COUNTING
    };
    assert_eq!(vcpu.backend.restrict(&mut vcpu.ctx, &filtered), None);
    assert_eq!(vcpu.ctx.hardware_control(1), Some(OS | INSTRUCTIONS));
    assert_eq!(vcpu.ctx.in_use(), CounterSet(0b1));
    assert!(vcpu.backend.is_active(&vcpu.ctx));
}

// ---------------------------------------------------------------------------------------------
// Flush of an unedited page

fn page(vcpu: &Vcpu) -> VendorArea {
    let mut area = VendorArea::default();
    vcpu.backend.context_to_page(&vcpu.ctx, &mut area);
    area
}

#[test]
fn an_unedited_page_flushes_restricted_after_a_policy_change() {
    let vcpu = saved_host_counter();
    let guest = GuestPolicy::guest_default();
    let flushed = vcpu
        .backend
        .context_from_page(&page(&vcpu), &vcpu.ctx, &guest)
        .expect("an unedited page always flushes");
    let mut expected = vcpu.ctx.clone();
    assert!(vcpu.backend.restrict(&mut expected, &guest).is_some());
    assert_eq!(flushed, expected);
    assert_eq!(flushed.control(0), Some(HOST_CYCLES));
    assert_eq!(flushed.hardware_control(0), Some(OS | GUEST_ONLY | CYCLES));
}

#[test]
fn an_edited_control_is_still_refused() {
    let vcpu = saved_host_counter();
    let guest = GuestPolicy::guest_default();
    let banks = AmdBanks::new(6).unwrap();
    for (index, value) in [(0, EN | USR | HOST_ONLY | CYCLES), (3, HOST_CYCLES)] {
        let mut area = page(&vcpu);
        banks.set_ctrl(&mut area, index, value).unwrap();
        assert_eq!(
            vcpu.backend.context_from_page(&area, &vcpu.ctx, &guest),
            Err(ContextError {
                register: "ctrl",
                index: Some(index as u32),
                value,
                msr: 0xC001_0200 + 2 * index as u32,
                reason: XENPMU_REFUSED_FORBIDDEN,
            })
        );
        assert!(
            vcpu.backend
                .context_from_page(&area, &vcpu.ctx, &HOST_COUNTING)
                .is_ok()
        );
    }
}
