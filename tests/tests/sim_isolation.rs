//! Isolation: every guest reads exactly the events of its own workload while its counters were
//! enabled, never another's — over random topologies, workloads, schedules (with migration and
//! idling) and guest MSR programs (counting and sampling counters, enable toggles, reads at
//! random points, PMIs through the virtual LVTPC or the shared page, handled at once or when
//! the vCPU next runs), for both vendors. Every run also checks every PMI against the ground
//! truth's prediction and PMI conservation (`vpmu_sim::World`).

use proptest::prelude::*;
use vpmu::abi::{XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF};
use vpmu_sim::strategies::{Knobs, scenario_strategy};
use vpmu_sim::{
    CounterSpec, PlanSpec, Run, Scenario, SimEvent, SimVendor, Step, Timing, World, amd_legacy,
    amd_v2, intel_v2, intel_v5,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: vpmu_tests::proptest_cases(64),
        ..ProptestConfig::default()
    }
}

fn knobs() -> Knobs {
    Knobs {
        modes: vec![XENPMU_MODE_SELF, XENPMU_MODE_HV, XENPMU_MODE_OFF],
        ..Knobs::default()
    }
}

fn check<V: SimVendor>(vendor: V, scenario: &Scenario) {
    let world = World::run(vendor, scenario);
    let programmed = world.guests.iter().any(|g| !g.plan.counters.is_empty());
    if programmed && scenario.mode != XENPMU_MODE_OFF {
        assert!(world.reads_checked > 0, "some counter was read back");
    }
}

/// Two domains on one pCPU: a counting vCPU, a sampling one, and one that never uses the PMU.
fn smoke(timing: Timing) -> Scenario {
    let counting = CounterSpec {
        slot: 0,
        event: SimEvent::Instructions,
        os: true,
        usr: false,
        period: None,
        initial: 7,
    };
    let sampling = CounterSpec {
        slot: 1,
        event: SimEvent::Branches,
        os: true,
        usr: true,
        period: Some(5),
        initial: 0,
    };
    let runs = |function| {
        vec![
            Run {
                function,
                len: 9,
                branch_every: 2,
            },
            Run {
                function: function + 4,
                len: 13,
                branch_every: 3,
            },
        ]
    };
    Scenario {
        pcpus: 2,
        domains: vec![1, 2],
        mode: XENPMU_MODE_SELF,
        timing,
        workloads: vec![runs(0), runs(1), runs(2)],
        plans: vec![
            PlanSpec {
                counters: vec![counting, sampling],
                page: false,
            },
            PlanSpec {
                counters: vec![sampling, counting],
                page: true,
            },
            PlanSpec::default(),
        ],
        steps: vec![
            Step::Run {
                pcpu: 0,
                vcpu: 0,
                count: 50,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 1,
                count: 70,
            },
            Step::Run {
                pcpu: 1,
                vcpu: 2,
                count: 30,
            },
            Step::Read { vcpu: 0 },
            Step::Run {
                pcpu: 1,
                vcpu: 0,
                count: 40,
            },
            Step::Toggle {
                vcpu: 1,
                counter: 1,
            },
            Step::Run {
                pcpu: 0,
                vcpu: 1,
                count: 33,
            },
            Step::Idle { pcpu: 0 },
            Step::Run {
                pcpu: 0,
                vcpu: 2,
                count: 10,
            },
        ],
        filters: Vec::new(),
    }
}

#[test]
fn smoke_scenario_all_vendors() {
    for timing in [Timing::Immediate, Timing::Deferred] {
        let scenario = smoke(timing);
        check(intel_v5(), &scenario);
        check(intel_v2(), &scenario);
        check(amd_v2(), &scenario);
        check(amd_legacy(), &scenario);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn intel_v5_guests_count_only_their_own_events(scenario in scenario_strategy(knobs())) {
        check(intel_v5(), &scenario);
    }

    #[test]
    fn intel_v2_guests_count_only_their_own_events(scenario in scenario_strategy(knobs())) {
        check(intel_v2(), &scenario);
    }

    #[test]
    fn amd_v2_guests_count_only_their_own_events(scenario in scenario_strategy(knobs())) {
        check(amd_v2(), &scenario);
    }

    #[test]
    fn amd_legacy_guests_count_only_their_own_events(scenario in scenario_strategy(knobs())) {
        check(amd_legacy(), &scenario);
    }
}
