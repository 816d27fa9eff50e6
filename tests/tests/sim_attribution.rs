//! Attribution and conservation.
//!
//! * All mode: the privileged domain's vCPU *v* profiles every pCPU *p* with *p* mod *n* = *v*;
//!   every sample's (domain, vCPU, pCPU, RIP, user/kernel, registers) must be exactly the
//!   instruction that was retiring when the counter wrapped, whoever ran it.
//! * Self and hv mode: every vCPU samples; every PMI must reach the vCPU whose counter wrapped,
//!   through its page (with that instruction as the sample) or its virtual LVTPC.
//! * Conservation: per vCPU, PMIs generated = delivered + dropped, and each verdict is the one
//!   the guests' state predicts (a drop when the receiving page still holds a sample, when the
//!   page's or the virtual LVTPC is masked, or when an all-mode profiler has no page).
//!
//! `World` checks every PMI against the ground truth as it happens; the tests here add the
//! end-to-end views (samples as the profiler recorded them) and make sure the interesting
//! cases (drops, cross-domain samples) actually occur.

use proptest::prelude::*;
use vpmu::abi::{XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF};
use vpmu_sim::strategies::{Knobs, sampling_plans, scenario_strategy};
use vpmu_sim::workload::symbolize;
use vpmu_sim::{
    CounterSpec, PlanSpec, Run, Scenario, SimEvent, SimVendor, Step, Timing, World, amd_legacy,
    amd_v2, intel_v2, intel_v5,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: vpmu_tests::proptest_cases(48),
        ..ProptestConfig::default()
    }
}

/// Scenarios where every vCPU samples with a short period.
fn sampling(modes: Vec<u64>) -> impl Strategy<Value = Scenario> {
    let knobs = Knobs {
        modes,
        max_counters: 3,
        ..Knobs::default()
    };
    (
        scenario_strategy(knobs),
        proptest::collection::vec(5..40u64, 12),
    )
        .prop_map(|(mut scenario, periods)| {
            let plans = std::mem::take(&mut scenario.plans);
            let mut plans = sampling_plans(plans, periods);
            if scenario.mode == XENPMU_MODE_ALL {
                // The profilers need a counter and a page; everybody else has no vPMU.
                for plan in plans.iter_mut().take(scenario.domains[0] as usize) {
                    plan.page = true;
                    if plan.counters.is_empty() {
                        plan.counters.push(instructions(Some(17)));
                    }
                }
            }
            scenario.plans = plans;
            scenario
        })
}

fn instructions(period: Option<u64>) -> CounterSpec {
    CounterSpec {
        slot: 0,
        event: SimEvent::Instructions,
        os: true,
        usr: true,
        period,
        initial: 0,
    }
}

/// Checks what the profilers recorded, beyond the per-PMI checks `World` makes.
fn check<V: SimVendor>(vendor: V, scenario: &Scenario) -> World<V> {
    let world = World::run(vendor, scenario);
    let privileged = world.m.platform.privileged;
    for sample in &world.samples {
        // The RIP is inside a function of the sampled domain, with the function's privilege.
        let function = symbolize(sample.domain, sample.rip)
            .unwrap_or_else(|| panic!("{sample:?}: RIP outside the sampled domain"));
        assert_eq!(sample.user, vpmu_sim::workload::is_user_function(function));
        if sample.receiver.domain != privileged {
            // An unprivileged guest only ever sees itself, never the physical topology.
            assert_eq!(sample.domain_id, XENPMU_DOMID_SELF, "{sample:?}");
            assert_eq!(sample.vcpu_id, sample.receiver.vcpu, "{sample:?}");
            assert_eq!(sample.pcpu_id, sample.vcpu_id, "{sample:?}");
        }
    }
    if scenario.mode == XENPMU_MODE_ALL {
        // Every all-mode sample went to the profiler of the pCPU it was taken on.
        let n = scenario.domains[0];
        for sample in &world.samples {
            assert_eq!(sample.receiver.domain, privileged);
            assert_eq!(sample.receiver.vcpu, sample.pcpu_id % n, "{sample:?}");
        }
    }
    world
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn intel_v5_all_mode_samples_are_the_retiring_instruction(s in sampling(vec![XENPMU_MODE_ALL])) {
        check(intel_v5(), &s);
    }

    #[test]
    fn intel_v2_all_mode_samples_are_the_retiring_instruction(s in sampling(vec![XENPMU_MODE_ALL])) {
        check(intel_v2(), &s);
    }

    #[test]
    fn amd_v2_all_mode_samples_are_the_retiring_instruction(s in sampling(vec![XENPMU_MODE_ALL])) {
        check(amd_v2(), &s);
    }

    #[test]
    fn amd_legacy_all_mode_samples_are_the_retiring_instruction(s in sampling(vec![XENPMU_MODE_ALL])) {
        check(amd_legacy(), &s);
    }

    #[test]
    fn intel_v5_self_mode_pmis_reach_the_right_vcpu(s in sampling(vec![XENPMU_MODE_SELF, XENPMU_MODE_HV])) {
        check(intel_v5(), &s);
    }

    #[test]
    fn intel_v2_self_mode_pmis_reach_the_right_vcpu(s in sampling(vec![XENPMU_MODE_SELF, XENPMU_MODE_HV])) {
        check(intel_v2(), &s);
    }

    #[test]
    fn amd_v2_self_mode_pmis_reach_the_right_vcpu(s in sampling(vec![XENPMU_MODE_SELF, XENPMU_MODE_HV])) {
        check(amd_v2(), &s);
    }

    #[test]
    fn amd_legacy_self_mode_pmis_reach_the_right_vcpu(s in sampling(vec![XENPMU_MODE_SELF, XENPMU_MODE_HV])) {
        check(amd_legacy(), &s);
    }
}

/// One privileged profiler for two pCPUs, handling its samples only when it runs: samples from
/// the second pCPU arrive while the first one's is cached and must be dropped and counted, in
/// the page and in the statistics. (The profiler sees `dropped_samples` grow and re-arms its
/// counters by WRMSR, so that sampling goes on on both pCPUs.)
fn crowded_profiler() -> Scenario {
    let profiler = PlanSpec {
        counters: vec![instructions(Some(7))],
        page: true,
    };
    let runs = |f| {
        vec![
            Run {
                function: f,
                len: 11,
                branch_every: 2,
            },
            Run {
                function: f + 4,
                len: 5,
                branch_every: 0,
            },
        ]
    };
    Scenario {
        pcpus: 2,
        domains: vec![1, 2],
        mode: XENPMU_MODE_ALL,
        timing: Timing::Deferred,
        workloads: vec![runs(0), runs(1), runs(2)],
        plans: vec![profiler, PlanSpec::default(), PlanSpec::default()],
        steps: vec![
            Step::Run {
                pcpu: 0,
                vcpu: 1,
                count: 40,
            },
            Step::Run {
                pcpu: 1,
                vcpu: 2,
                count: 40,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 0,
                count: 3,
            },
            Step::Run {
                pcpu: 1,
                vcpu: 1,
                count: 30,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 2,
                count: 30,
            },
            Step::Run {
                pcpu: 1,
                vcpu: 0,
                count: 3,
            },
        ],
        filters: Vec::new(),
    }
}

/// Two sampling counters delivered through the virtual LVTPC, handled late: on Intel the LVTPC
/// masks itself at delivery, so the second counter's PMI is dropped.
fn masked_lvtpc() -> Scenario {
    let plan = PlanSpec {
        counters: vec![
            instructions(Some(5)),
            CounterSpec {
                slot: 1,
                ..instructions(Some(8))
            },
        ],
        page: false,
    };
    Scenario {
        pcpus: 1,
        domains: vec![1, 1],
        mode: XENPMU_MODE_SELF,
        timing: Timing::Deferred,
        workloads: vec![
            vec![Run {
                function: 0,
                len: 3,
                branch_every: 0
            }];
            2
        ],
        plans: vec![PlanSpec::default(), plan],
        steps: vec![
            Step::Run {
                pcpu: 0,
                vcpu: 1,
                count: 30,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 0,
                count: 1,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 1,
                count: 30,
            },
        ],
        filters: Vec::new(),
    }
}

fn drops<V: SimVendor>(world: &World<V>) -> (u64, u64) {
    world.guests.iter().fold((0, 0), |(d, c), g| {
        (d + g.stats.dropped, c + g.stats.dropped_cached)
    })
}

#[test]
fn a_busy_all_mode_profiler_drops_and_counts_samples() {
    fn run<V: SimVendor>(vendor: V) {
        let world = check(vendor.clone(), &crowded_profiler());
        let (dropped, cached) = drops(&world);
        assert!(
            cached > 0 && dropped == cached,
            "{}: {dropped} dropped, {cached} while cached",
            vendor.name()
        );
        assert!(
            world.samples.iter().any(|s| s.pcpu_id == 0)
                && world.samples.iter().any(|s| s.pcpu_id == 1)
        );
        assert!(
            world
                .samples
                .iter()
                .all(|s| s.domain_id != XENPMU_DOMID_SELF || s.vcpu_id == 0)
        );
    }
    run(intel_v5());
    run(intel_v2());
    run(amd_v2());
    run(amd_legacy());
}

#[test]
fn a_masked_virtual_lvtpc_drops_pmis_on_intel_only() {
    for (name, dropped) in [
        (
            intel_v5().name(),
            drops(&check(intel_v5(), &masked_lvtpc())).0,
        ),
        (
            intel_v2().name(),
            drops(&check(intel_v2(), &masked_lvtpc())).0,
        ),
        (amd_v2().name(), drops(&check(amd_v2(), &masked_lvtpc())).0),
        (
            amd_legacy().name(),
            drops(&check(amd_legacy(), &masked_lvtpc())).0,
        ),
    ] {
        let intel = name.starts_with("intel");
        assert_eq!(
            dropped > 0,
            intel,
            "{name}: {dropped} PMIs dropped at a masked LVTPC"
        );
    }
}
