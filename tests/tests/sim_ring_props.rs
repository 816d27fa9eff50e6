//! The sample ring (ABI 1.4) under random sequences of PMIs, consumers, hostile tails, page
//! LVTPC masking, re-registration, frames taken away, the latency timer and hostile
//! configurations (a refusal changes nothing), in self and all
//! mode on the four test shapes: after every step the `RingWorld` checks that no unread byte
//! was overwritten, that every sample is exactly one of published, lost or withheld and every
//! sequence number is accounted for once, that the producer's line is the hypervisor's, that
//! every wakeup is one VIRQ, that the periods add up to what the counters counted, and that
//! PMIs are conserved. `PROPTEST_CASES` scales the run.

use proptest::prelude::*;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF};
use vpmu_sim::ring_world::{RingStep, RingWorld};
use vpmu_sim::{SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};
use vpmu_tests::proptest_cases;

/// A patch of the configuration: mostly its defined fields, with values near their limits.
fn patch() -> impl Strategy<Value = (u8, u64)> {
    (
        prop_oneof![0u8..16, 64u8..160, any::<u8>()],
        prop_oneof![
            0u64..600,
            Just(1 << 31),
            Just((1 << 31) - 1),
            Just((1 << 47) - 1),
            Just(1 << 47),
            any::<u64>()
        ],
    )
}

fn step() -> impl Strategy<Value = RingStep> {
    prop_oneof![
        6 => (0u8..2, 1u8..40, any::<u16>())
            .prop_map(|(pcpu, bursts, burst)| RingStep::Run { pcpu, bursts, burst }),
        3 => (0u8..2, prop_oneof![Just(255u8), 0u8..6])
            .prop_map(|(subject, limit)| RingStep::Consume { subject, limit }),
        1 => (0u8..2, 0u8..5, prop_oneof![any::<u64>(), 0u64..1 << 14, Just(u64::MAX)])
            .prop_map(|(subject, kind, amount)| RingStep::HostileTail { subject, kind, amount }),
        1 => (0u8..2, any::<bool>()).prop_map(|(subject, masked)| RingStep::Mask { subject, masked }),
        1 => (0u8..2).prop_map(|subject| RingStep::Reregister { subject }),
        1 => (0u8..2, any::<u8>(), 1u8..6)
            .prop_map(|(subject, frame, bursts)| RingStep::Unmapped { subject, frame, bursts }),
        1 => (0u32..400_000).prop_map(|ticks| RingStep::Timer { ticks }),
        1 => (0u8..2, [patch(), patch(), patch(), patch()])
            .prop_map(|(subject, patches)| RingStep::HostileConfig { subject, patches }),
    ]
}

#[derive(Clone, Debug)]
struct Case {
    all: bool,
    periods: [u64; 2],
    pages: [u32; 2],
    wakeup_bytes: u32,
    max_latency_us: u32,
    steps: Vec<RingStep>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        [2u64..400, 2u64..400],
        [
            prop_oneof![Just(1u32), Just(2)],
            prop_oneof![Just(1u32), Just(4)],
        ],
        prop_oneof![Just(0u32), Just(8), 1u32..4096],
        prop_oneof![Just(0u32), 1u32..300],
        prop::collection::vec(step(), 1..60),
    )
        .prop_map(
            |(all, periods, pages, wakeup_bytes, max_latency_us, steps)| Case {
                all,
                periods,
                pages,
                wakeup_bytes,
                max_latency_us,
                steps,
            },
        )
}

fn play<V: SimVendor>(vendor: V, case: &Case) {
    let mode = if case.all {
        XENPMU_MODE_ALL
    } else {
        XENPMU_MODE_SELF
    };
    let mut world = RingWorld::new(
        vendor,
        mode,
        case.periods,
        case.pages,
        case.wakeup_bytes,
        case.max_latency_us,
    );
    for &step in &case.steps {
        world.step(step);
    }
    world.finish();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(proptest_cases(48)))]

    #[test]
    fn ring_invariants_hold_on_intel_v5(case in case()) {
        play(intel_v5(), &case);
    }

    #[test]
    fn ring_invariants_hold_on_intel_v2(case in case()) {
        play(intel_v2(), &case);
    }

    #[test]
    fn ring_invariants_hold_on_amd_v2(case in case()) {
        play(amd_v2(), &case);
    }

    #[test]
    fn ring_invariants_hold_on_amd_legacy(case in case()) {
        play(amd_legacy(), &case);
    }
}

/// A fixed run long enough to fill, wrap and lose on every shape, so that the suite does not
/// depend on the random cases to reach those paths.
#[test]
fn a_long_fixed_run_fills_wraps_and_loses() {
    fn run<V: SimVendor>(vendor: V) {
        for all in [false, true] {
            let case = Case {
                all,
                periods: [17, 113],
                pages: [1, 2],
                wakeup_bytes: 0,
                max_latency_us: 50,
                steps: (0..200u32)
                    .map(|k| match k % 10 {
                        0 => RingStep::Consume {
                            subject: (k / 10 % 2) as u8,
                            limit: 3,
                        },
                        5 => RingStep::Timer { ticks: 60_000 },
                        7 if k % 70 == 7 => RingStep::HostileTail {
                            subject: 1,
                            kind: (k % 4) as u8,
                            amount: 12345,
                        },
                        8 if k % 90 == 8 => RingStep::Unmapped {
                            subject: 0,
                            frame: 0,
                            bursts: 3,
                        },
                        9 if k % 110 == 9 => RingStep::Mask {
                            subject: 1,
                            masked: k % 220 == 9,
                        },
                        _ => RingStep::Run {
                            pcpu: (k % 2) as u8,
                            bursts: 20,
                            burst: k as u16 * 7,
                        },
                    })
                    .collect(),
            };
            let mode = if all {
                XENPMU_MODE_ALL
            } else {
                XENPMU_MODE_SELF
            };
            let mut world = RingWorld::new(vendor.clone(), mode, case.periods, case.pages, 0, 50);
            for &step in &case.steps {
                world.step(step);
            }
            let lost: u64 = world
                .subjects
                .iter()
                .map(|s| world.m.vcpu(s.id).ring().unwrap().counters.lost)
                .sum();
            assert!(lost > 0, "{}: the rings filled up", vendor.name());
            world.finish();
            println!(
                "{} (all {all}): {} samples, {} lost records, {} PADs read",
                vendor.name(),
                world.records_read,
                world.lost_read,
                world.pads_read
            );
            assert!(world.records_read > 50, "{}", vendor.name());
            assert!(
                world.lost_read > 0 && world.pads_read > 0,
                "{}",
                vendor.name()
            );
        }
    }
    vpmu_tests::for_each_vendor!(run);
}
