//! `SoftwarePmu::cycles_until_pmi` of the Intel model against its definition: the smallest `n`
//! for which a copy of the model, its PMI line taken, raises it again after
//! `count(CoreCycles, n); count(RefCycles, n)` — found by bisection over clones
//! (`vpmu_models::oracle`).

mod common;

use common::*;
use proptest::prelude::*;
use vpmu::{Msr, MsrBus};
use vpmu_intel::{IntelCaps, PERF_CAP_FW_WRITES};
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::oracle::{bisect_cycles_until_pmi, raises_pmi_after};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

const HORIZON: u64 = 1 << 48;

#[derive(Clone, Debug)]
struct Program {
    shape: SyntheticCpuid,
    gp: Vec<(u64, u64)>,
    fixed: Vec<u64>,
    fixed_ctrl: u64,
    global_ctrl: u64,
    warm_up: u64,
    mode: ExecMode,
}

fn width() -> impl Strategy<Value = u8> {
    prop::sample::select(vec![32u8, 40, 48, 64])
}

fn shape() -> impl Strategy<Value = SyntheticCpuid> {
    (1u8..=8, 0u8..=4, width(), width(), 0u32..0x80).prop_map(
        |(gp, fixed, gp_width, fixed_width, unavailable_events)| SyntheticCpuid {
            gp_width,
            fixed_width,
            unavailable_events,
            ..SyntheticCpuid::v5(gp, fixed, 0)
        },
    )
}

/// A counter value, mostly near the wrap (`distance` before it); masked to the width later.
fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (1u64..5000).prop_map(|distance| distance.wrapping_neg()),
        1 => any::<u64>(),
        1 => 0u64..16,
    ]
}

fn selector() -> impl Strategy<Value = u64> {
    let event = prop::sample::select(vec![0x003cu64, 0x013c, 0x00c0, 0x00c4, 0x4f2e]);
    let qualifier = prop::sample::select(vec![0u64, 0, 0, 0, 0, 0, 1 << 18, 1 << 23, 1 << 24]);
    // EN, INT, OS, USR each at random.
    (event, 0u64..16, qualifier).prop_map(|(event, flags, qualifier)| {
        let bit = |i: u64, b: u64| if flags & (1 << i) != 0 { b } else { 0 };
        event | bit(0, 1 << 22) | bit(1, 1 << 20) | bit(2, 1 << 17) | bit(3, 1 << 16) | qualifier
    })
}

fn program() -> impl Strategy<Value = Program> {
    let mode = (prop::sample::select(vec![0u8, 1, 3]), any::<bool>())
        .prop_map(|(cpl, host)| ExecMode { cpl, host });
    (
        shape(),
        prop::collection::vec((value(), selector()), 8),
        prop::collection::vec(value(), 4),
        any::<u16>(),
        any::<u64>(),
        prop_oneof![Just(0u64), 0u64..3000],
        mode,
    )
        .prop_map(
            |(shape, gp, fixed, fixed_ctrl, global_ctrl, warm_up, mode)| Program {
                shape,
                gp,
                fixed,
                fixed_ctrl: u64::from(fixed_ctrl),
                global_ctrl,
                warm_up,
                mode,
            },
        )
}

fn width_mask(width: u8) -> u64 {
    if width >= 64 {
        u64::MAX
    } else {
        (1 << width) - 1
    }
}

/// The model programmed through its MSRs (full-width counter writes), then run a little.
fn programmed(p: &Program) -> IntelPmuModel {
    let caps = IntelCaps::from_cpuid(p.shape, Some(PERF_CAP_FW_WRITES)).expect("shape");
    let mut m = IntelPmuModel::new(caps);
    let (gp_mask, fixed_mask) = (
        width_mask(p.shape.gp_width),
        width_mask(p.shape.fixed_width),
    );
    for (i, &(value, sel)) in (0..caps.gp_counters()).zip(&p.gp) {
        m.write(Msr(A_PMC0 + i), value & gp_mask).expect("counter");
        m.write(Msr(EVTSEL0 + i), sel).expect("selector");
    }
    let present = (0..4u32)
        .filter(|&i| caps.has_fixed(i))
        .fold(0u64, |bits, i| bits | 0xf << (4 * i));
    for (i, &value) in (0..4u32).zip(&p.fixed) {
        if caps.has_fixed(i) {
            m.write(Msr(FIXED_CTR0 + i), value & fixed_mask)
                .expect("fixed counter");
        }
    }
    m.write(Msr(FIXED_CTR_CTRL), p.fixed_ctrl & present)
        .expect("fixed control");
    m.write(Msr(GLOBAL_CTRL), p.global_ctrl & caps.all_counters().0)
        .expect("global control");
    m.count(HwEvent::CoreCycles, p.warm_up, p.mode);
    m.count(HwEvent::Instructions, p.warm_up, p.mode);
    m
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn cycles_until_pmi_is_the_first_cycle_count_that_raises_the_line(p in program()) {
        let m = programmed(&p);
        let computed = m.cycles_until_pmi(p.mode);
        prop_assert_eq!(computed, bisect_cycles_until_pmi(&m, p.mode));
        if let Some(n) = computed {
            prop_assert!((1..=HORIZON).contains(&n));
            prop_assert!(raises_pmi_after(&m, n, p.mode));
            prop_assert!(!raises_pmi_after(&m, n - 1, p.mode));
        }
    }
}

#[test]
fn fixed_and_general_purpose_cycle_counters_set_the_deadline() {
    let caps = IntelCaps::from_cpuid(SyntheticCpuid::v5(2, 3, 0), Some(PERF_CAP_FW_WRITES))
        .expect("shape");
    let mut m = IntelPmuModel::new(caps);
    let mask = (1u64 << 48) - 1;
    assert_eq!(m.cycles_until_pmi(KERNEL), None, "nothing programmed");
    // GP0: reference cycles, INT, 500 before the wrap.
    m.write(Msr(A_PMC0), mask - 499).unwrap();
    m.write(Msr(EVTSEL0), (1 << 22) | (1 << 20) | (1 << 17) | 0x013c)
        .unwrap();
    // Fixed 1 (core cycles): 300 before the wrap, but no PMI bit; fixed 2 (reference
    // cycles): 400 before, PMI, user only.
    m.write(Msr(FIXED_CTR0 + 1), mask - 299).unwrap();
    m.write(Msr(FIXED_CTR0 + 2), mask - 399).unwrap();
    m.write(Msr(FIXED_CTR_CTRL), 0xa10).unwrap();
    m.write(Msr(GLOBAL_CTRL), 0x7_0000_0003).unwrap();
    assert_eq!(m.cycles_until_pmi(KERNEL), Some(500));
    assert_eq!(m.cycles_until_pmi(USER), Some(400));
    m.write(Msr(GLOBAL_CTRL), 0x7_0000_0002).unwrap();
    assert_eq!(m.cycles_until_pmi(KERNEL), None, "GP0 disabled globally");
    // A pending line does not matter: the question is when it is raised anew.
    m.write(Msr(GLOBAL_CTRL), 0x7_0000_0003).unwrap();
    m.count(HwEvent::RefCycles, 500, KERNEL);
    assert!(m.pmi_pending());
    assert_eq!(m.cycles_until_pmi(KERNEL), Some(mask + 1));
}
