//! Property tests with the software model as the hardware.
//!
//! * Random guest write sequences (loaded context, switches to another vCPU in between, several
//!   PMU shapes and policies) never leave a reserved or forbidden bit in the model's registers,
//!   never make the model fault, and leave the hardware clean after every save.
//! * Differential: a guest going through the backend (with switches and another vCPU using the
//!   hardware in between) observes exactly what it would observe owning a bare model.
//! * The shared page: random contexts survive the page unchanged; random page corruption is
//!   refused or yields a context that loads without a forbidden bit.

mod common;

use common::*;
use proptest::prelude::*;
use vpmu::abi::{
    VendorArea, XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY,
};
use vpmu::{
    AllowAll, EventFilter, GuestPolicy, Msr, MsrBus, MsrOutcome, PmuBackend, PublishedImages,
    RawEvent,
};
use vpmu_intel::PERF_CAP_FW_WRITES;
use vpmu_intel::events::{ARCH_ONLY_EVENTS, IPC_ONLY_EVENTS, umask_event};
use vpmu_intel::msrs::MSR_RANGES;
use vpmu_models::intel::{IntelPmuModel, SyntheticCpuid};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

const EVENTS: [HwEvent; 7] = HwEvent::ALL;

#[derive(Clone, Debug)]
enum Op {
    Write {
        msr: u32,
        value: u64,
    },
    Read {
        msr: u32,
    },
    Count {
        event: usize,
        n: u64,
        cpl: u8,
    },
    /// Save, let another vCPU use the hardware with values derived from `noise`, reload.
    Switch {
        noise: u64,
    },
    /// Save and reload with nobody in between.
    Reschedule,
    /// What a guest PMI handler does: read GLOBAL_STATUS, write it to OVF_CTRL.
    AckStatus,
}

fn pmu_msrs() -> Vec<u32> {
    MSR_RANGES
        .iter()
        .flat_map(|&(first, last)| first..=last)
        .collect()
}

fn msr_strategy() -> impl Strategy<Value = u32> {
    let msrs = pmu_msrs();
    prop_oneof![
        9 => proptest::sample::select(msrs),
        1 => any::<u32>(),
    ]
}

/// Values biased towards the interesting ones: selectors with architectural events and flag
/// bits (forbidden ones included), nibble patterns, single bits, small negatives, anything.
fn value_strategy() -> impl Strategy<Value = u64> {
    let arch = proptest::sample::select(ARCH_ONLY_EVENTS.to_vec());
    prop_oneof![
        3 => (arch, 0u64..=0xff, any::<bool>(), any::<bool>()).prop_map(|(event, flags, int, any_thread)| {
            let mut sel = u64::from(event) | (flags & 0x7) << 16 | 1 << 22;
            if flags & 0x8 != 0 { sel |= 1 << 19; }
            if int { sel |= 1 << 20; }
            if any_thread { sel |= 1 << 21; }
            if flags & 0x30 == 0x30 { sel |= 1 << 32; }
            sel
        }),
        2 => 0u64..=0xffff,
        2 => (0u32..64).prop_map(|bit| 1u64 << bit),
        1 => (0u64..=0xff).prop_map(|bits| bits | 0xf << 32),
        2 => (1u64..=64).prop_map(|n| n.wrapping_neg()),
        1 => (1u64..=64).prop_map(|n| n.wrapping_neg() & ((1 << 48) - 1)),
        2 => any::<u64>(),
        1 => Just(0u64),
    ]
}

/// A selector that counts an architectural event in some ring, with or without INT.
fn countable_selector() -> impl Strategy<Value = u64> {
    let arch = proptest::sample::select(ARCH_ONLY_EVENTS.to_vec());
    (arch, 1u64..=3, any::<bool>()).prop_map(|(event, rings, int)| {
        u64::from(event) | rings << 16 | 1 << 22 | u64::from(int) << 20
    })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (msr_strategy(), value_strategy()).prop_map(|(msr, value)| Op::Write { msr, value }),
        3 => (0u32..8, countable_selector())
            .prop_map(|(i, value)| Op::Write { msr: EVTSEL0 + i, value }),
        1 => (0u64..=0xffff).prop_map(|nibbles| Op::Write {
            msr: FIXED_CTR_CTRL,
            value: nibbles & 0xbbbb,
        }),
        1 => (0u32..8, 1u64..=300).prop_map(|(i, n)| Op::Write {
            msr: PMC0 + i,
            value: n.wrapping_neg(),
        }),
        3 => msr_strategy().prop_map(|msr| Op::Read { msr }),
        5 => (0usize..EVENTS.len(), prop_oneof![1u64..=8, 1u64..=100_000], 0u8..4)
            .prop_map(|(event, n, cpl)| Op::Count { event, n, cpl }),
        1 => any::<u64>().prop_map(|noise| Op::Switch { noise }),
        1 => Just(Op::Reschedule),
        1 => Just(Op::AckStatus),
    ]
}

fn shapes() -> Vec<(SyntheticCpuid, Option<u64>)> {
    vec![
        (v2_shape(), None),
        (v5_shape(), Some(RICH_PERF_CAPABILITIES)),
        (
            SyntheticCpuid {
                debug_store: true,
                ..SyntheticCpuid::v5(6, 2, 0b1000)
            },
            Some(0),
        ),
        (
            SyntheticCpuid {
                version: 3,
                unavailable_events: 0b0010_0100,
                ..SyntheticCpuid::v2(2, 3)
            },
            None,
        ),
    ]
}

/// Denies branches-retired and fixed counter 1.
struct DenySome;

impl EventFilter for DenySome {
    fn allows(&self, event: RawEvent) -> bool {
        !(event.select == 0xc4 && event.umask == 0)
    }

    fn allows_fixed(&self, index: u32) -> bool {
        index != 1
    }
}

static DENY_SOME: DenySome = DenySome;

fn policy(features: u64, filtered: bool) -> GuestPolicy<'static> {
    GuestPolicy {
        features,
        filter: if filtered { &DENY_SOME } else { &AllowAll },
        may_count_host: false,
    }
}

/// Both ways a flush may treat the images of unedited controls.
const IMAGES: [PublishedImages; 2] = [PublishedImages::Stale, PublishedImages::Current];

const FEATURE_SETS: [u64; 5] = [
    0,
    XENPMU_FEATURE_IPC_ONLY,
    XENPMU_FEATURE_ARCH_ONLY,
    XENPMU_FEATURE_INTEL_BTS,
    XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_ARCH_ONLY,
];

/// Checks that nothing forbidden is in the model's registers.
fn assert_no_forbidden_bits(hw: &IntelPmuModel, policy: &GuestPolicy<'_>) {
    let r = hw.registers();
    let restricted = policy.features & (XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY);
    let whitelist: &[u16] = if policy.features & XENPMU_FEATURE_ARCH_ONLY != 0 {
        &ARCH_ONLY_EVENTS
    } else {
        &IPC_ONLY_EVENTS
    };
    for (i, &sel) in r.event_selects.iter().enumerate() {
        assert_eq!(sel & !0xffff_ffff, 0, "evtsel {i} high bits: {sel:#x}");
        assert_eq!(sel & (1 << 21), 0, "evtsel {i} AnyThread: {sel:#x}");
        assert_eq!(sel & (1 << 19), 0, "evtsel {i} Pin Control: {sel:#x}");
        if sel & (1 << 22) != 0 {
            if restricted != 0 {
                assert!(
                    whitelist.contains(&umask_event(sel)),
                    "evtsel {i}: {sel:#x}"
                );
            }
            let event = RawEvent {
                select: (sel & 0xff) as u16,
                umask: (sel >> 8) as u8,
            };
            assert!(policy.filter.allows(event), "filtered evtsel {i} enabled");
        }
    }
    for i in 0..4u32 {
        let nibble = (r.fixed_ctrl >> (4 * i)) & 0xf;
        assert_eq!(nibble & 0x4, 0, "fixed {i} AnyThread: {:#x}", r.fixed_ctrl);
        if nibble & 0x3 != 0 {
            assert!(policy.filter.allows_fixed(i), "filtered fixed {i} enabled");
            assert!(
                !(restricted != 0 && i == 3),
                "topdown slots under a whitelist"
            );
        }
    }
    assert_eq!(r.pebs_enable, 0, "PEBS_ENABLE");
    if policy.features & XENPMU_FEATURE_INTEL_BTS == 0 || restricted != 0 {
        assert_eq!(r.ds_area, 0, "DS_AREA without BTS");
    }
}

/// Another vCPU uses every counter with values derived from `noise`, then is saved.
fn noisy_neighbour(m: &mut Machine, noise: u64) {
    let mut other = m.vcpu();
    m.load(&mut other);
    let gp = m.pmu.caps().gp_counters();
    for i in 0..gp {
        m.set(&mut other, PMC0 + i, noise.rotate_left(i * 7) & 0x7fff_ffff);
        let event = ARCH_ONLY_EVENTS[(noise >> i) as usize % ARCH_ONLY_EVENTS.len()];
        m.set(
            &mut other,
            EVTSEL0 + i,
            ENABLE_ALL_RINGS | EVTSEL_INT | u64::from(event),
        );
    }
    let fixed = m.pmu.caps().fixed_counters();
    for i in (0..4).filter(|i| fixed & (1 << i) != 0) {
        m.set(
            &mut other,
            FIXED_CTR0 + i,
            noise.rotate_right(i * 5) & 0xffff_ffff,
        );
    }
    let nibbles = (0..4)
        .filter(|i| fixed & (1 << i) != 0)
        .fold(0, |bits, i| bits | 0xb << (4 * i));
    m.set(&mut other, FIXED_CTR_CTRL, nibbles);
    m.set(&mut other, GLOBAL_CTRL, m.pmu.caps().all_counters().0);
    for event in EVENTS {
        m.run(event, noise % 5000, KERNEL);
    }
    if m.hw.take_pmi() {
        m.pmu
            .handle_overflow(&mut other.ctx, &mut m.hw)
            .expect("pmi");
    }
    m.save(&mut other);
    m.assert_nothing_counts();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(192)))]

    #[test]
    fn guest_writes_never_put_forbidden_bits_in_hardware(
        shape in 0usize..4,
        features in proptest::sample::select(FEATURE_SETS.to_vec()),
        filtered in any::<bool>(),
        ops in proptest::collection::vec(op_strategy(), 1..60),
    ) {
        let (cpuid, perf_caps) = shapes()[shape];
        let mut m = Machine::new(cpuid, perf_caps);
        let policy = policy(features, filtered);
        let mut vcpu = m.vcpu();
        m.load(&mut vcpu);
        for op in ops {
            match op {
                Op::Write { msr, value } => {
                    let outcome = m.wrmsr_with(&mut vcpu, &policy, msr, value);
                    let readable = matches!(msr, 0x186..=0x18d | 0x38d | 0x38f);
                    if outcome == MsrOutcome::Handled(()) && readable {
                        prop_assert_eq!(m.get(&mut vcpu, msr), value, "read back {:#x}", msr);
                    }
                }
                Op::Read { msr } => { m.rdmsr(&mut vcpu, msr); }
                Op::Count { event, n, cpl } => {
                    m.run(EVENTS[event], n, ExecMode { cpl, host: false });
                    if m.hw.take_pmi() {
                        m.pmu.handle_overflow(&mut vcpu.ctx, &mut m.hw).expect("pmi");
                    }
                }
                Op::Switch { noise } => {
                    m.save(&mut vcpu);
                    m.assert_nothing_counts();
                    noisy_neighbour(&mut m, noise);
                    m.load(&mut vcpu);
                }
                Op::Reschedule => {
                    m.save(&mut vcpu);
                    m.assert_nothing_counts();
                    m.load(&mut vcpu);
                }
                Op::AckStatus => {
                    let status = m.get(&mut vcpu, GLOBAL_STATUS);
                    m.set(&mut vcpu, GLOBAL_OVF_CTRL, status);
                    prop_assert_eq!(m.get(&mut vcpu, GLOBAL_STATUS), 0);
                }
            }
            assert_no_forbidden_bits(&m.hw, &policy);
            prop_assert_eq!(m.stats().faults, 0, "the backend made the hardware fault");
        }
        m.save(&mut vcpu);
        m.assert_nothing_counts();
        prop_assert_eq!(m.hw.registers().ds_area, 0);
    }

    #[test]
    fn guest_sees_what_a_bare_pmu_would_show(
        v5 in any::<bool>(),
        start_loaded in any::<bool>(),
        ops in proptest::collection::vec(op_strategy(), 1..80),
    ) {
        // Full-width writes on both: without them a restored count that crossed bit 31 comes
        // back sign-extended (the documented limitation), which a bare PMU never shows.
        let (cpuid, perf_caps) = if v5 {
            (v5_shape(), Some(PERF_CAP_FW_WRITES))
        } else {
            (SyntheticCpuid { debug_store: true, pdcm: true, ..v2_shape() }, Some(PERF_CAP_FW_WRITES))
        };
        let mut m = Machine::new(cpuid, perf_caps);
        let mut bare = IntelPmuModel::new(*m.pmu.caps());
        let mut vcpu = m.vcpu();
        if start_loaded {
            m.load(&mut vcpu);
        }
        let observable: Vec<u32> = pmu_msrs()
            .into_iter()
            .filter(|&msr| msr != PERF_CAPABILITIES)
            .collect();
        for op in ops {
            match op {
                Op::Write { msr, value } => {
                    let outcome = m.wrmsr(&mut vcpu, msr, value);
                    match outcome {
                        MsrOutcome::Handled(()) => {
                            let hardware = bare.write(Msr(msr), value);
                            prop_assert!(
                                hardware.is_ok(),
                                "backend accepted what hardware refuses: {:#x} <- {:#x}", msr, value
                            );
                        }
                        MsrOutcome::NotPmu => {
                            prop_assert!(bare.clone().write(Msr(msr), value).is_err());
                        }
                        // The policy may be stricter than the hardware: a refused write does
                        // not reach the bare PMU either, as the guest's #GP handler would see.
                        MsrOutcome::GeneralProtection => {}
                    }
                }
                Op::Read { .. } => {}
                Op::Count { event, n, cpl } => {
                    let mode = ExecMode { cpl, host: false };
                    if vcpu.loaded {
                        m.run(EVENTS[event], n, mode);
                        bare.count(EVENTS[event], n, mode);
                        let pmi = m.hw.take_pmi();
                        prop_assert_eq!(pmi, bare.take_pmi(), "PMI line");
                        if pmi {
                            let overflow = m.pmu.handle_overflow(&mut vcpu.ctx, &mut m.hw).expect("pmi");
                            prop_assert!(overflow.interrupt);
                        }
                    }
                }
                Op::Switch { noise } => {
                    if vcpu.loaded {
                        m.save(&mut vcpu);
                    }
                    noisy_neighbour(&mut m, noise);
                    m.load(&mut vcpu);
                }
                Op::Reschedule => {
                    if vcpu.loaded { m.save(&mut vcpu); } else { m.load(&mut vcpu); }
                }
                Op::AckStatus => {
                    let status = m.get(&mut vcpu, GLOBAL_STATUS);
                    m.set(&mut vcpu, GLOBAL_OVF_CTRL, status);
                    bare.write(Msr(GLOBAL_OVF_CTRL), status).expect("guest-visible status bits");
                }
            }
            for &msr in &observable {
                let through_backend = m.rdmsr(&mut vcpu, msr);
                let on_bare = bare.read(Msr(msr));
                match (through_backend, on_bare) {
                    (MsrOutcome::Handled(a), Ok(b)) => prop_assert_eq!(a, b, "msr {:#x}", msr),
                    (MsrOutcome::GeneralProtection, Err(_)) => {}
                    (a, b) => prop_assert!(false, "msr {:#x}: backend {:?}, bare {:?}", msr, a, b),
                }
            }
            prop_assert_eq!(m.stats().faults, 0);
        }
    }

    #[test]
    fn page_round_trip_and_corruption(
        ops in proptest::collection::vec(op_strategy(), 1..40),
        corruptions in proptest::collection::vec((0usize..28, value_strategy()), 1..4),
        later in (0..FEATURE_SETS.len(), any::<bool>()),
    ) {
        let mut m = Machine::v5();
        let policy = policy(XENPMU_FEATURE_INTEL_BTS, false);
        let mut vcpu = m.vcpu();
        m.load(&mut vcpu);
        for op in ops {
            match op {
                Op::Write { msr, value } => { m.wrmsr_with(&mut vcpu, &policy, msr, value); }
                Op::Count { event, n, cpl } => {
                    m.run(EVENTS[event], n, ExecMode { cpl, host: false });
                    if m.hw.take_pmi() {
                        m.pmu.handle_overflow(&mut vcpu.ctx, &mut m.hw).expect("pmi");
                    }
                }
                Op::AckStatus => {
                    let status = m.get(&mut vcpu, GLOBAL_STATUS);
                    m.set(&mut vcpu, GLOBAL_OVF_CTRL, status & 1);
                }
                _ => {}
            }
        }
        m.save(&mut vcpu);
        let saved = vcpu.ctx.clone();
        let mut area = VendorArea::default();
        m.pmu.context_to_page(&saved, &mut area);
        prop_assert_eq!(m.pmu.context_from_page(&area, &saved, &policy), Ok(saved.clone()));

        // Words 2..8 are the fixed part's registers, 8..12 the fixed bank, 12..28 the GP bank.
        for (word, value) in corruptions {
            area.words[word] = value;
        }
        // In place: every register written when accepted, whatever the target held (the
        // flush reuses contexts), and none when refused. `saved` was written under `policy`,
        // so its images are current: taking them unjudged gives the same result.
        let by_value = m.pmu.context_from_page(&area, &saved, &policy);
        let targets = [saved.clone(), m.pmu.new_context()];
        for (prefill, images) in targets.iter().flat_map(|t| IMAGES.map(|images| (t, images))) {
            let mut out = prefill.clone();
            let verdict = m.pmu.context_from_page_into(&area, &saved, images, &policy, &mut out);
            match &by_value {
                Ok(ctx) => {
                    prop_assert_eq!(verdict, Ok(()));
                    prop_assert_eq!(&out, ctx);
                }
                Err(error) => {
                    prop_assert_eq!(verdict, Err(*error));
                    prop_assert_eq!(&out, prefill);
                }
            }
        }
        // After a policy change the restricted context's images are those of the new policy:
        // taken unjudged for the unedited controls, they give what judging them gives.
        let later = GuestPolicy {
            features: FEATURE_SETS[later.0],
            filter: if later.1 { &DENY_SOME } else { &AllowAll },
            may_count_host: false,
        };
        let mut restricted = saved.clone();
        m.pmu.restrict(&mut restricted, &later);
        let judged = m.pmu.context_from_page(&area, &restricted, &later);
        let mut out = m.pmu.new_context();
        let taken = m.pmu.context_from_page_into(
            &area, &restricted, PublishedImages::Current, &later, &mut out,
        );
        prop_assert_eq!(taken, judged.as_ref().map(|_| ()).map_err(|error| *error));
        if let Ok(judged) = judged {
            prop_assert_eq!(out, judged);
        }
        if let Ok(ctx) = by_value {
            let mut edited = Vcpu { ctx, loaded: false };
            m.load(&mut edited);
            assert_no_forbidden_bits(&m.hw, &policy);
            prop_assert_eq!(m.stats().faults, 0);
            prop_assert_eq!(
                edited.ctx.virtual_status() & !saved.virtual_status(), 0,
                "no overflow invented through the page"
            );
            m.save(&mut edited);
            m.assert_nothing_counts();
        }
    }
}

/// `PROPTEST_CASES` when set (one variable scales every property suite), else this suite's own.
fn cases(own: u32) -> u32 {
    std::env::var("PROPTEST_CASES").map_or(own, |v| v.parse().expect("PROPTEST_CASES: a count"))
}
