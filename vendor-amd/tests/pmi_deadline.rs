//! `SoftwarePmu::cycles_until_pmi` of the AMD model against its definition: the smallest `n`
//! for which a copy of the model, its PMI line taken, raises it again after
//! `count(CoreCycles, n); count(RefCycles, n)` — found by bisection over clones
//! (`vpmu_models::oracle`).

mod common;

use common::*;
use proptest::prelude::*;
use vpmu::{Msr, MsrBus};
use vpmu_amd::PmuShape;
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::oracle::{bisect_cycles_until_pmi, raises_pmi_after};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

const HORIZON: u64 = 1 << 48;

#[derive(Clone, Debug)]
struct Program {
    shape: PmuShape,
    counters: Vec<(u64, u64)>,
    global_ctl: u64,
    warm_up: u64,
    mode: ExecMode,
}

fn shape() -> impl Strategy<Value = PmuShape> {
    prop_oneof![
        Just(PmuShape::LegacyK7),
        Just(PmuShape::PerfCtrExtCore),
        (1u8..=6).prop_map(|counters| PmuShape::PerfMonV2 { counters }),
    ]
}

/// A counter value, mostly near the wrap; the model keeps the low 48 bits.
fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (1u64..5000).prop_map(|distance| distance.wrapping_neg()),
        1 => any::<u64>(),
        1 => 0u64..16,
    ]
}

/// A PERF_CTL: cycles or another event (a unit mask or high event bits make it another
/// event), EN, INT, OS, USR, GuestOnly, HostOnly at random, sometimes a qualifier.
fn control() -> impl Strategy<Value = u64> {
    let event = prop::sample::select(vec![
        CYCLES,
        CYCLES,
        INSTRUCTIONS,
        CYCLES | 1 << 8,
        CYCLES | 1 << 32,
    ]);
    let qualifier = prop::sample::select(vec![0u64, 0, 0, 0, 0, 0, 1 << 18, 1 << 23, 1 << 24]);
    (event, 0u64..64, qualifier).prop_map(|(event, flags, qualifier)| {
        [EN, INT, OS, USR, GUEST_ONLY, HOST_ONLY]
            .into_iter()
            .enumerate()
            .filter(|&(i, _)| flags & (1 << i) != 0)
            .fold(event | qualifier, |value, (_, bit)| value | bit)
    })
}

fn program() -> impl Strategy<Value = Program> {
    let mode = (prop::sample::select(vec![0u8, 1, 3]), any::<bool>())
        .prop_map(|(cpl, host)| ExecMode { cpl, host });
    (
        shape(),
        prop::collection::vec((value(), control()), 6),
        any::<u64>(),
        prop_oneof![Just(0u64), 0u64..3000],
        mode,
    )
        .prop_map(|(shape, counters, global_ctl, warm_up, mode)| Program {
            shape,
            counters,
            global_ctl,
            warm_up,
            mode,
        })
}

/// The model programmed through its MSRs, then run a little.
fn programmed(p: &Program) -> AmdPmuModel {
    let pmu = pmu(p.shape);
    let mut m = AmdPmuModel::new(pmu);
    for (i, &(value, control)) in (0..pmu.gp_counters()).zip(&p.counters) {
        m.write(Msr(ctr_msr(p.shape, i)), value).expect("counter");
        m.write(Msr(ctl_msr(p.shape, i)), control).expect("control");
    }
    if pmu.has_perfmon_v2() {
        m.write(Msr(GLOBAL_CTL), p.global_ctl & pmu.counter_mask())
            .expect("global control");
    }
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
fn only_interrupting_cycle_counters_of_the_current_context_set_the_deadline() {
    let shape = PmuShape::PerfMonV2 { counters: 4 };
    let mut m = AmdPmuModel::new(pmu(shape));
    assert_eq!(m.cycles_until_pmi(KERNEL), None, "nothing programmed");
    let program = [
        (MASK48 - 99, EN | OS | INT | CYCLES),              // 100 away
        (MASK48 - 9, EN | OS | CYCLES),                     // no INT
        (MASK48 - 19, EN | OS | USR | INT | INSTRUCTIONS),  // not cycles
        (MASK48 - 49, EN | OS | INT | GUEST_ONLY | CYCLES), // 50 away, guest only
    ];
    for (i, (value, control)) in (0..).zip(program) {
        m.write(Msr(ext_ctr(i)), value).unwrap();
        m.write(Msr(ext_ctl(i)), control).unwrap();
    }
    assert_eq!(m.cycles_until_pmi(KERNEL), Some(50));
    assert_eq!(m.cycles_until_pmi(HOST), Some(100));
    assert_eq!(m.cycles_until_pmi(USER), None, "OS only");
    m.write(Msr(GLOBAL_CTL), 0b0111).unwrap();
    assert_eq!(
        m.cycles_until_pmi(KERNEL),
        Some(100),
        "counter 3 disabled globally"
    );
}
