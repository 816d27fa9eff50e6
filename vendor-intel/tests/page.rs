//! The context in the shared page's vendor area: round trips, the backend's own geometry, and
//! flush verification with the WRMSR validators.

mod common;

use common::*;
use vpmu::abi::{
    CounterPair, IntelBanks, VendorArea, VendorLayout, XENPMU_FEATURE_INTEL_BTS,
    XENPMU_FEATURE_IPC_ONLY, XENPMU_REFUSED_ABSENT as ABSENT, XENPMU_REFUSED_EVENT as EVENT,
    XENPMU_REFUSED_FORBIDDEN as FORBIDDEN, XENPMU_REFUSED_RESERVED as RESERVED,
    XENPMU_REFUSED_STATUS as STATUS, XENPMU_REFUSED_WIDTH as WIDTH,
};
use vpmu::{ContextError, EventFilter, GuestPolicy, PmuBackend, RawEvent};
use vpmu_intel::IntelContext;
use vpmu_models::HwEvent;
use vpmu_models::intel::SyntheticCpuid;

fn busy_context(m: &mut Machine) -> IntelContext {
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    for i in 0..8 {
        m.set(&mut vcpu, A_PMC0 + i, 0x100 * u64::from(i + 1));
        m.set(
            &mut vcpu,
            EVTSEL0 + i,
            ENABLE_ALL_RINGS | EVTSEL_INT | BRANCHES,
        );
    }
    m.set(&mut vcpu, PMC0 + 7, 1u64.wrapping_neg());
    m.set(&mut vcpu, FIXED_CTR0 + 3, 0x42);
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0xb00b);
    m.set(&mut vcpu, GLOBAL_CTRL, 0x9_0000_00ff);
    m.run(HwEvent::Branches, 1, KERNEL);
    m.save(&mut vcpu);
    assert_eq!(vcpu.ctx.virtual_status(), 1 << 7, "counter 7 overflowed");
    vcpu.ctx
}

fn area_of(m: &Machine, ctx: &IntelContext) -> VendorArea {
    let mut area = VendorArea::default();
    m.pmu.context_to_page(ctx, &mut area);
    area
}

fn banks(m: &Machine) -> IntelBanks {
    match m.pmu.page_layout() {
        VendorLayout::Intel(banks) => banks,
        other => panic!("Intel backend with {other:?}"),
    }
}

fn flush(
    m: &Machine,
    area: &VendorArea,
    saved: &IntelContext,
) -> Result<IntelContext, ContextError> {
    m.pmu
        .context_from_page(area, saved, &GuestPolicy::guest_default())
}

/// A refusal of `register` with `reason` (`XENPMU_REFUSED_*`), naming the MSR a WRMSR of it
/// would name (the SDM's numbers, written out here independently of the backend).
fn refusal(register: &'static str, index: Option<u32>, value: u64, reason: u32) -> ContextError {
    let msr = match (register, index) {
        ("global_ctrl", None) => 0x38f,
        ("fixed_ctrl", None) => 0x38d,
        ("global_status", None) => 0x38e,
        ("global_ovf_ctrl", None) => 0x390,
        ("ds_area", None) => 0x600,
        ("pebs_enable", None) => 0x3f1,
        ("fixed_counter", Some(i)) => 0x309 + i,
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

#[test]
fn page_round_trip_is_the_identity() {
    let mut m = Machine::v5();
    let ctx = busy_context(&mut m);
    let area = area_of(&m, &ctx);
    let ctxt = area.intel_ctxt();
    assert_eq!((ctxt.fixed_count, ctxt.arch_count), (4, 8));
    assert_eq!(ctxt.global_ctrl, 0x9_0000_00ff);
    assert_eq!(ctxt.global_status, 1 << 7);
    assert_eq!(ctxt.fixed_ctrl, 0xb00b);
    let b = banks(&m);
    assert_eq!(b.fixed_counter(&area, 3), Ok(0x42));
    assert_eq!(
        b.pair(&area, 2),
        Ok(CounterPair {
            counter: 0x301,
            control: ENABLE_ALL_RINGS | EVTSEL_INT | BRANCHES
        })
    );
    assert_eq!(flush(&m, &area, &ctx), Ok(ctx));
}

#[test]
fn edited_page_is_loaded_as_written() {
    let mut m = Machine::v5();
    let ctx = busy_context(&mut m);
    let mut area = area_of(&m, &ctx);
    let b = banks(&m);
    b.set_pair(
        &mut area,
        5,
        CounterPair {
            counter: 0xabc,
            control: ENABLE_ALL_RINGS | INSTRUCTIONS,
        },
    )
    .expect("in bank");
    let mut ctxt = area.intel_ctxt();
    ctxt.global_ovf_ctrl = 1 << 7;
    area.set_intel_ctxt(&ctxt);
    let mut vcpu = Vcpu {
        ctx: flush(&m, &area, &ctx).expect("legal edits"),
        loaded: false,
    };
    assert_eq!(
        vcpu.ctx.virtual_status(),
        0,
        "OVF_CTRL acknowledged counter 7"
    );
    m.load(&mut vcpu);
    assert_eq!(m.hw.registers().gp_counters[5], 0xabc);
    assert_eq!(
        m.hw.registers().event_selects[5],
        ENABLE_ALL_RINGS | INSTRUCTIONS
    );
    m.run(HwEvent::Instructions, 4, USER);
    assert_eq!(m.get(&mut vcpu, PMC0 + 5), 0xac0);
    m.save(&mut vcpu);
    let again = area_of(&m, &vcpu.ctx);
    assert_eq!(again.intel_ctxt().global_ovf_ctrl, 0, "reads as 0 again");
}

#[test]
fn geometry_words_in_the_page_are_ignored() {
    let mut m = Machine::v5();
    let ctx = busy_context(&mut m);
    let mut area = area_of(&m, &ctx);
    let mut ctxt = area.intel_ctxt();
    // Point the banks somewhere else, as a malicious guest would.
    ctxt.fixed_counters = 512;
    ctxt.arch_counters = 600;
    ctxt.fixed_count = 60;
    ctxt.arch_count = 200;
    area.set_intel_ctxt(&ctxt);
    assert_eq!(flush(&m, &area, &ctx), Ok(ctx));
}

#[test]
fn every_illegal_register_is_refused_with_its_name() {
    let mut m = Machine::v5();
    let ctx = busy_context(&mut m);
    let clean = area_of(&m, &ctx);
    let b = banks(&m);
    type Edit = fn(&mut VendorArea, &IntelBanks);
    let cases: [(Edit, ContextError); 13] = [
        (
            |a, _| edit_ctxt(a, |c| c.global_ctrl = 1 << 8),
            refusal("global_ctrl", None, 1 << 8, RESERVED),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.fixed_ctrl = 0x4),
            refusal("fixed_ctrl", None, 0x4, FORBIDDEN),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.global_status = 1 << 7 | 1),
            refusal("global_status", None, 1 << 7 | 1, STATUS),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.global_ovf_ctrl = 1 << 61),
            refusal("global_ovf_ctrl", None, 1 << 61, RESERVED),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.ds_area = 0xffff_8000_0000_0000),
            refusal("ds_area", None, 0xffff_8000_0000_0000, FORBIDDEN),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.pebs_enable = 1),
            refusal("pebs_enable", None, 1, FORBIDDEN),
        ),
        (
            |a, b| b.set_fixed_counter(a, 2, 1 << 48).expect("in bank"),
            refusal("fixed_counter", Some(2), 1 << 48, WIDTH),
        ),
        (
            |a, b| b.set_fixed_counter(a, 0, u64::MAX - 999).expect("in bank"),
            refusal("fixed_counter", Some(0), u64::MAX - 999, WIDTH),
        ),
        (
            |a, b| set_control(a, b, 3, ENABLE_ALL_RINGS | 1 << 21 | 1 << 40),
            refusal(
                "evtsel",
                Some(3),
                ENABLE_ALL_RINGS | 1 << 21 | 1 << 40,
                RESERVED,
            ),
        ),
        (
            |a, b| set_control(a, b, 1, ENABLE_ALL_RINGS | 1 << 21),
            refusal("evtsel", Some(1), ENABLE_ALL_RINGS | 1 << 21, FORBIDDEN),
        ),
        (
            |a, b| set_control(a, b, 4, ENABLE_ALL_RINGS | 1 << 19),
            refusal("evtsel", Some(4), ENABLE_ALL_RINGS | 1 << 19, FORBIDDEN),
        ),
        (
            |a, b| set_control(a, b, 7, 1 << 32),
            refusal("evtsel", Some(7), 1 << 32, RESERVED),
        ),
        (
            |a, _| edit_ctxt(a, |c| c.fixed_ctrl = 0x7000),
            refusal("fixed_ctrl", None, 0x7000, FORBIDDEN),
        ),
    ];
    for (edit, expected) in cases {
        let mut area = clean.clone();
        edit(&mut area, &b);
        assert_eq!(flush(&m, &area, &ctx), Err(expected));
    }
}

/// A GP counter in the page is taken as the WRMSR of the counter that accepts the value takes
/// it: within the width whole (IA32_A_PMCx), otherwise as IA32_PMCx does (bits 31:0
/// sign-extended). A 64-bit `-period` re-arms it; it is never refused.
#[test]
fn gp_counters_in_the_page_are_taken_as_their_wrmsr_takes_them() {
    let mut m = Machine::v5();
    let ctx = busy_context(&mut m);
    let clean = area_of(&m, &ctx);
    let b = banks(&m);
    let mask = (1u64 << 48) - 1;
    for (value, taken) in [
        (0u64.wrapping_sub(1000), mask - 999),
        (0xffff_ff01_2345_6789, 0x2345_6789),
        (0xffff_8000_0000, 0xffff_8000_0000),
        (1 << 48, 0),
        (u64::MAX, mask),
    ] {
        let mut area = clean.clone();
        set_counter(&mut area, &b, 6, value);
        let flushed = flush(&m, &area, &ctx).expect("never refused");
        assert_eq!(flushed.gp_counter(6), Some(taken), "{value:#x}");
    }
}

fn edit_ctxt(area: &mut VendorArea, change: impl FnOnce(&mut vpmu::abi::IntelCtxt)) {
    let mut ctxt = area.intel_ctxt();
    change(&mut ctxt);
    area.set_intel_ctxt(&ctxt);
}

fn set_counter(area: &mut VendorArea, banks: &IntelBanks, index: usize, counter: u64) {
    let pair = banks.pair(area, index).expect("in bank");
    banks
        .set_pair(area, index, CounterPair { counter, ..pair })
        .expect("in bank");
}

fn set_control(area: &mut VendorArea, banks: &IntelBanks, index: usize, control: u64) {
    let pair = banks.pair(area, index).expect("in bank");
    banks
        .set_pair(area, index, CounterPair { control, ..pair })
        .expect("in bank");
}

#[test]
fn holes_of_a_sparse_fixed_bank_must_stay_zero() {
    let m = Machine::new(SyntheticCpuid::v5(4, 0, 0b1001), None);
    let ctx = m.vcpu().ctx;
    let mut area = area_of(&m, &ctx);
    assert_eq!(area.intel_ctxt().fixed_count, 4);
    let b = banks(&m);
    b.set_fixed_counter(&mut area, 3, 7).expect("present");
    assert!(flush(&m, &area, &ctx).is_ok());
    b.set_fixed_counter(&mut area, 1, 7).expect("hole");
    assert_eq!(
        flush(&m, &area, &ctx),
        Err(refusal("fixed_counter", Some(1), 7, ABSENT))
    );
}

#[test]
fn flush_applies_features_and_filter_like_wrmsr() {
    let mut m = Machine::v5();
    let ctx = m.vcpu().ctx;
    let b = banks(&m);
    let mut area = area_of(&m, &ctx);
    set_control(&mut area, &b, 0, ENABLE_ALL_RINGS | BRANCHES);

    let ipc = GuestPolicy {
        features: XENPMU_FEATURE_IPC_ONLY,
        ..GuestPolicy::guest_default()
    };
    assert_eq!(
        m.pmu.context_from_page(&area, &ctx, &ipc),
        Err(refusal(
            "evtsel",
            Some(0),
            ENABLE_ALL_RINGS | BRANCHES,
            EVENT
        ))
    );

    struct NoBranches;
    impl EventFilter for NoBranches {
        fn allows(&self, event: RawEvent) -> bool {
            event.select != 0xc4
        }
        fn allows_fixed(&self, _index: u32) -> bool {
            true
        }
    }
    let filtered = GuestPolicy {
        features: 0,
        filter: &NoBranches,
        may_count_host: false,
    };
    let mut vcpu = Vcpu {
        ctx: m
            .pmu
            .context_from_page(&area, &ctx, &filtered)
            .expect("a filtered event is legal"),
        loaded: false,
    };
    assert_eq!(vcpu.ctx.event_select(0), Some(ENABLE_ALL_RINGS | BRANCHES));
    assert!(
        !m.pmu.is_active(&vcpu.ctx),
        "the filtered counter cannot count"
    );
    m.load(&mut vcpu);
    assert_eq!(
        m.hw.registers().event_selects[0],
        (1 << 17) | (1 << 16) | BRANCHES
    );

    let bts = GuestPolicy {
        features: XENPMU_FEATURE_INTEL_BTS,
        ..GuestPolicy::guest_default()
    };
    edit_ctxt(&mut area, |c| c.ds_area = 0xffff_8000_0000_0000);
    assert!(m.pmu.context_from_page(&area, &ctx, &bts).is_ok());
}

/// A PMU with fewer counters than the context has slots (v2: 4 GP, 3 fixed): the banks are
/// shorter than the windows a flush reads them through, so the words past each bank (the GP
/// bank right after the fixed one, then whatever follows) are not the bank's and must neither
/// be judged nor loaded.
#[test]
fn words_past_short_banks_are_not_the_banks() {
    let mut m = Machine::v2();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, PMC0, 0x1234);
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | BRANCHES);
    m.set(&mut vcpu, FIXED_CTR0 + 2, 0x42);
    m.save(&mut vcpu);
    let ctx = vcpu.ctx;
    let mut area = area_of(&m, &ctx);
    let ctxt = area.intel_ctxt();
    assert_eq!((ctxt.fixed_count, ctxt.arch_count), (3, 4));
    assert_eq!(flush(&m, &area, &ctx), Ok(ctx.clone()));
    // Past the GP bank: words no bank owns, anything at all in them.
    let past = (ctxt.arch_counters as usize) / 8 + 2 * ctxt.arch_count as usize;
    for word in &mut area.words[past..past + 8] {
        *word = u64::MAX;
    }
    assert_eq!(flush(&m, &area, &ctx), Ok(ctx));
}
