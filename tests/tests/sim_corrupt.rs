//! A corrupted shared page at flush: a guest (or, in all mode, the privileged profiler) takes a
//! sample, overwrites its page's vendor area, and flushes. The flush must fail with `-EIO`
//! and change nothing but the page's report of the refused register (version 1.3) — no
//! register of any model, no core state (the vCPU stays cached, the physical LVTPC masked), no
//! other byte of any page; restoring the area then flushes fine, and
//! the run goes on with every counter still matching the ground truth.
//!
//! Corruptions: one bit each vendor's rules certainly refuse (a reserved or forbidden control
//! bit, a counter above its width, a global-control bit of an absent counter, an overflow the
//! hypervisor did not report, a PEBS/DS value without the feature); random byte spans followed
//! by such a bit; and a fully random area, which is refused whenever its global-control word
//! names an absent counter (cases where it does not — probability about 2^-52 — are skipped,
//! not counted as passes). Random bytes only in the bank-geometry words, which the hypervisor
//! never reads back, must flush fine.

use proptest::prelude::*;
use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    PageView, VendorArea, XENPMU_MODE_ALL, XENPMU_MODE_SELF, XENPMU_OP_FLUSH, XENPMU_REFUSED_NONE,
};
use vpmu::{Diagnostic, VcpuState};
use vpmu_sim::world::Pending;
use vpmu_sim::{
    CounterSpec, PlanSpec, Run, Scenario, SimEvent, SimVendor, Snapshot, Step, Timing, World,
    amd_legacy, amd_v2, intel_v2, intel_v5,
};
use zerocopy::IntoBytes;

#[derive(Clone, Debug)]
enum Corruption {
    /// One certainly-refused bit (`Driver::make_invalid`).
    Targeted { pick: u32, bit: u32 },
    /// Random byte spans, then one certainly-refused bit.
    Spans {
        spans: Vec<(usize, Vec<u8>)>,
        pick: u32,
        bit: u32,
    },
    /// 1 KiB of random bytes.
    Random { words: Vec<u64> },
}

fn corruption() -> impl Strategy<Value = Corruption> {
    let spans = proptest::collection::vec(
        (0..1024usize, proptest::collection::vec(any::<u8>(), 1..64)),
        1..6,
    );
    prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(pick, bit)| Corruption::Targeted { pick, bit }),
        (spans, any::<u32>(), any::<u32>()).prop_map(|(spans, pick, bit)| Corruption::Spans {
            spans,
            pick,
            bit
        }),
        proptest::collection::vec(any::<u64>(), 128).prop_map(|words| Corruption::Random { words }),
    ]
}

/// The subject (dom1 vCPU 0 in self mode, the profiler dom0 vCPU 0 in all mode) samples
/// instructions every 5 and counts branches; dom1 vCPU 0 runs, handling deferred.
fn scenario(mode: u64) -> Scenario {
    let plan = PlanSpec {
        counters: vec![
            CounterSpec {
                slot: 0,
                event: SimEvent::Instructions,
                os: true,
                usr: true,
                period: Some(5),
                initial: 0,
            },
            CounterSpec {
                slot: 1,
                event: SimEvent::Branches,
                os: true,
                usr: false,
                period: None,
                initial: 3,
            },
        ],
        page: true,
    };
    let (profiler, guest) = if mode == XENPMU_MODE_ALL {
        (plan, PlanSpec::default())
    } else {
        (PlanSpec::default(), plan)
    };
    let runs = vec![
        Run {
            function: 1,
            len: 7,
            branch_every: 2,
        },
        Run {
            function: 5,
            len: 4,
            branch_every: 1,
        },
    ];
    Scenario {
        pcpus: 1,
        domains: vec![1, 1],
        mode,
        timing: Timing::Deferred,
        workloads: vec![runs.clone(), runs],
        plans: vec![profiler, guest],
        steps: Vec::new(),
        filters: Vec::new(),
    }
}

/// Runs dom1 vCPU 0 until the subject has a sample cached; returns the subject's index.
fn take_sample<V: SimVendor>(world: &mut World<V>, mode: u64) -> usize {
    let subject = if mode == XENPMU_MODE_ALL { 0 } else { 1 };
    world.step(Step::Run {
        pcpu: 0,
        vcpu: 1,
        count: 12,
    });
    let id = world.guests[subject].id;
    assert_eq!(world.guests[subject].pending.front(), Some(&Pending::Virq));
    assert!(matches!(world.m.vcpu(id).state(), VcpuState::Cached { .. }));
    subject
}

fn apply(
    area: &mut VendorArea,
    corruption: &Corruption,
    world_driver: vpmu_sim::Driver,
    status: u64,
    host: bool,
) -> bool {
    match corruption {
        Corruption::Targeted { pick, bit } => {
            world_driver.make_invalid(area, status, host, *pick, *bit);
        }
        Corruption::Spans { spans, pick, bit } => {
            for (offset, bytes) in spans {
                let bytes_of_area = area.as_mut_bytes();
                for (i, byte) in bytes.iter().enumerate() {
                    if let Some(slot) = bytes_of_area.get_mut(offset + i) {
                        *slot = *byte;
                    }
                }
            }
            world_driver.make_invalid(area, status, host, *pick, *bit);
        }
        Corruption::Random { words } => {
            area.words.copy_from_slice(words);
            return world_driver.certainly_invalid(area);
        }
    }
    true
}

fn check<V: SimVendor>(vendor: V, mode: u64, corruption: &Corruption) -> Result<(), TestCaseError> {
    let mut world = World::new(vendor, &scenario(mode));
    let g = take_sample(&mut world, mode);
    let id = world.guests[g].id;
    let gfn = world.guests[g].page_gfn.expect("a page");
    let original = world.m.platform.frame(id.domain, gfn).clone();
    let status = world
        .driver
        .page_status(&PageView::new(&original).expect("page"));
    let host = mode == XENPMU_MODE_ALL;
    let driver = world.driver;
    let frame = world.m.platform.frame_mut(id.domain, gfn);
    prop_assume!(
        apply(&mut frame.vendor, corruption, driver, status, host),
        "random area happens to name only present counters"
    );

    let before = Snapshot::take(&world.m);
    for _ in 0..2 {
        let result = world.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0));
        prop_assert_eq!(result, Err(OpError::InvalidContext));
        // The one write a refused flush makes: the report of the refused register (1.3),
        // which the owner reads and clears here, so that nothing else may differ.
        let frame = world.m.platform.frame_mut(id.domain, gfn);
        let refusal = core::mem::take(&mut frame.flush_refusal);
        prop_assert!(
            refusal.msr != 0 && refusal.reason != XENPMU_REFUSED_NONE,
            "the refused register is reported in the page: {:?}",
            refusal
        );
        prop_assert_eq!(
            &before,
            &Snapshot::take(&world.m),
            "a refused flush changes nothing"
        );
        let reported = matches!(
            world.m.platform.diagnostics.last(),
            Some(Diagnostic::InvalidContextAtFlush { vcpu, .. }) if *vcpu == id
        );
        prop_assert!(reported, "the refusal is reported");
    }
    let cached = matches!(world.m.vcpu(id).state(), VcpuState::Cached { .. });
    prop_assert!(cached, "the sample is cached");
    prop_assert!(
        PageView::new(world.m.platform.frame(id.domain, gfn))
            .expect("page")
            .is_cached()
    );
    if host {
        prop_assert!(
            world.m.platform.physical_masked[0],
            "the sampled pCPU stays masked"
        );
    }

    // The owner repairs the area: its handler now checks the sample and flushes it.
    *world.m.platform.frame_mut(id.domain, gfn) = original;
    world.handle_pending(g);
    world.step(Step::Run {
        pcpu: 0,
        vcpu: 1,
        count: 23,
    });
    world.finish();
    prop_assert!(world.samples.len() >= 2);
    Ok(())
}

fn check_geometry<V: SimVendor>(vendor: V, mode: u64, words: [u64; 2]) {
    let mut world = World::new(vendor, &scenario(mode));
    let g = take_sample(&mut world, mode);
    let id = world.guests[g].id;
    let gfn = world.guests[g].page_gfn.expect("a page");
    let frame = world.m.platform.frame_mut(id.domain, gfn);
    frame.vendor.words[..2].copy_from_slice(&words);
    let result = world.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0));
    assert!(
        result.is_ok(),
        "geometry words are never read back: {result:?}"
    );
    assert!(!matches!(
        world.m.vcpu(id).state(),
        VcpuState::Cached { .. }
    ));
    world.abandon_sample(g);
    world.step(Step::Run {
        pcpu: 0,
        vcpu: 1,
        count: 23,
    });
    world.finish();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: vpmu_tests::proptest_cases(96), ..ProptestConfig::default() })]

    #[test]
    fn intel_v5_corrupted_page_is_refused_and_nothing_loaded(c in corruption(), all in any::<bool>()) {
        check(intel_v5(), if all { XENPMU_MODE_ALL } else { XENPMU_MODE_SELF }, &c)?;
    }

    #[test]
    fn intel_v2_corrupted_page_is_refused_and_nothing_loaded(c in corruption(), all in any::<bool>()) {
        check(intel_v2(), if all { XENPMU_MODE_ALL } else { XENPMU_MODE_SELF }, &c)?;
    }

    #[test]
    fn amd_v2_corrupted_page_is_refused_and_nothing_loaded(c in corruption(), all in any::<bool>()) {
        check(amd_v2(), if all { XENPMU_MODE_ALL } else { XENPMU_MODE_SELF }, &c)?;
    }

    #[test]
    fn amd_legacy_corrupted_page_is_refused_and_nothing_loaded(c in corruption(), all in any::<bool>()) {
        check(amd_legacy(), if all { XENPMU_MODE_ALL } else { XENPMU_MODE_SELF }, &c)?;
    }

    #[test]
    fn corrupted_geometry_words_are_ignored(words in any::<[u64; 2]>(), all in any::<bool>()) {
        let mode = if all { XENPMU_MODE_ALL } else { XENPMU_MODE_SELF };
        check_geometry(intel_v5(), mode, words);
        check_geometry(amd_v2(), mode, words);
    }
}

/// Every certainly-invalid register choice of each vendor, in both modes, exhaustively.
#[test]
fn every_targeted_corruption_is_refused() {
    for all in [false, true] {
        let mode = if all {
            XENPMU_MODE_ALL
        } else {
            XENPMU_MODE_SELF
        };
        for pick in 0..8 {
            for bit in [0, 5, 13, 63] {
                let c = Corruption::Targeted { pick, bit };
                check(intel_v5(), mode, &c).expect("intel v5");
                check(intel_v2(), mode, &c).expect("intel v2");
                check(amd_v2(), mode, &c).expect("amd v2");
                check(amd_legacy(), mode, &c).expect("amd legacy");
            }
        }
    }
}

/// Inside the cached window the context belongs to the page: a WRMSR of a PMU register would be
/// overwritten by the flush (or make it fail), so it is refused with #GP and changes nothing;
/// reads still answer from the saved context.
fn wrmsr_in_cached_window_faults<V: SimVendor>(vendor: V, mode: u64) {
    let mut world = World::new(vendor, &scenario(mode));
    let g = take_sample(&mut world, mode);
    let id = world.guests[g].id;
    let driver = world.driver;
    let before = Snapshot::take(&world.m);
    let faults_before = world.m.vcpu(id).stats().gp_faults;
    let (msr, value) = driver.write_counter(0, 1);
    assert_eq!(
        world.m.wrmsr(id, msr, value),
        vpmu::MsrOutcome::GeneralProtection
    );
    let (msr, value) = driver.disable(0);
    assert_eq!(
        world.m.wrmsr(id, msr, value),
        vpmu::MsrOutcome::GeneralProtection
    );
    let after = Snapshot::take(&world.m);
    assert!(matches!(world.m.vcpu(id).state(), VcpuState::Cached { .. }));
    assert!(matches!(
        world.m.rdmsr(id, driver.read_counter(1)),
        vpmu::MsrOutcome::Handled(_)
    ));
    // The refused writes are counted as faults, and change no hardware, page or global state.
    assert_eq!(world.m.vcpu(id).stats().gp_faults, faults_before + 2);
    assert_eq!(before.pcpus, after.pcpus, "no hardware access");
    assert_eq!(
        before.platform, after.platform,
        "no page or interrupt change"
    );
    assert_eq!(
        (before.mode, before.unprivileged_in_use),
        (after.mode, after.unprivileged_in_use)
    );
}

#[test]
fn wrmsr_inside_the_cached_window_is_refused() {
    for mode in [XENPMU_MODE_SELF, XENPMU_MODE_ALL] {
        wrmsr_in_cached_window_faults(intel_v5(), mode);
        wrmsr_in_cached_window_faults(intel_v2(), mode);
        wrmsr_in_cached_window_faults(amd_v2(), mode);
        wrmsr_in_cached_window_faults(amd_legacy(), mode);
    }
}
