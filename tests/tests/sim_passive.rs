//! The passive-domain check (xenoprof's bug, seed 002): a domain profiled from the privileged
//! domain in all mode must give the same function histogram as the same workload profiling
//! itself in self mode.
//!
//! * Pinned: domain D's vCPU *i* runs alone on pCPU *i*, profiled in all mode by privileged
//!   vCPU *i*; then each pCPU's instruction stream is exactly vCPU *i*'s, so the two runs must
//!   give the same samples in the same order — not merely similar histograms.
//! * Random schedule: D shares the pCPUs with another domain and the privileged domain's own
//!   vCPUs, migrating freely; the per-pCPU streams differ, but the all-mode samples attributed
//!   to D must still resolve to D's functions and rank D's hot function first, as self mode
//!   does.
//!
//! Samples are resolved to names with the symbol table of the domain the sample names — the
//! way a profiler does, and the step xenoprof got wrong.

use std::collections::BTreeMap;

use proptest::prelude::*;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF};
use vpmu_sim::workload::{
    FUNCTIONS, function_name, skewed_workload_strategy, symbolize, workload_strategy,
};
use vpmu_sim::{
    CounterSpec, PlanSpec, Run, Sample, Scenario, SimEvent, SimVendor, Step, Timing, World,
    amd_legacy, amd_v2, intel_v2, intel_v5,
};

const D: u32 = 1;

/// What a profiler reports for a sample: the function name and the mode.
fn resolve(sample: &Sample) -> (String, bool) {
    let function = symbolize(sample.domain, sample.rip).map_or_else(
        || "<unknown>".to_string(),
        |f| function_name(sample.domain, f),
    );
    (function, sample.user)
}

fn histogram<'a>(samples: impl Iterator<Item = &'a Sample>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for sample in samples {
        *counts.entry(resolve(sample).0).or_default() += 1;
    }
    counts
}

/// The same scenario in self mode (D's vCPUs sample themselves through their pages) and in all
/// mode (the privileged vCPUs sample the pCPUs with the same counter).
fn both_modes(base: &Scenario, counter: CounterSpec) -> (Scenario, Scenario) {
    let sampling = PlanSpec {
        counters: vec![counter],
        page: true,
    };
    let privileged = base.domains[0] as usize;
    let d_vcpus = privileged..privileged + base.domains[1] as usize;
    let mut self_mode = base.clone();
    self_mode.mode = XENPMU_MODE_SELF;
    self_mode.plans = (0..base.workloads.len())
        .map(|i| {
            if d_vcpus.contains(&i) {
                sampling.clone()
            } else {
                PlanSpec::default()
            }
        })
        .collect();
    let mut all_mode = base.clone();
    all_mode.mode = XENPMU_MODE_ALL;
    all_mode.plans = (0..base.workloads.len())
        .map(|i| {
            if i < privileged {
                sampling.clone()
            } else {
                PlanSpec::default()
            }
        })
        .collect();
    (self_mode, all_mode)
}

fn counter_strategy() -> impl Strategy<Value = CounterSpec> {
    (
        prop_oneof![Just(SimEvent::Instructions), Just(SimEvent::Branches)],
        prop_oneof![Just((true, true)), Just((true, false)), Just((false, true))],
        4..40u64,
    )
        .prop_map(|(event, (os, usr), period)| CounterSpec {
            slot: 0,
            event,
            os,
            usr,
            period: Some(period),
            initial: 0,
        })
}

/// D has `k` vCPUs pinned to pCPUs `0..k`; nobody else runs.
fn pinned_strategy() -> impl Strategy<Value = (Scenario, CounterSpec)> {
    (1..=3u32).prop_flat_map(|k| {
        (
            proptest::collection::vec(workload_strategy(8, 60), k as usize),
            proptest::collection::vec((0..k, 1..200u32), 1..40),
            counter_strategy(),
        )
            .prop_map(move |(workloads, slices, counter)| {
                let mut all_workloads = vec![Vec::new(); k as usize];
                all_workloads.extend(workloads);
                let scenario = Scenario {
                    pcpus: k,
                    domains: vec![k, k],
                    mode: XENPMU_MODE_SELF,
                    timing: Timing::Immediate,
                    workloads: all_workloads,
                    plans: Vec::new(),
                    steps: slices
                        .into_iter()
                        .map(|(i, count)| Step::Run {
                            pcpu: i,
                            vcpu: (k + i) as usize,
                            count,
                        })
                        .collect(),
                    filters: Vec::new(),
                };
                (scenario, counter)
            })
    })
}

fn check_pinned<V: SimVendor>(vendor: V, base: &Scenario, counter: CounterSpec) {
    let (self_mode, all_mode) = both_modes(base, counter);
    let own = World::run(vendor.clone(), &self_mode);
    let passive = World::run(vendor, &all_mode);
    let k = base.pcpus;
    for i in 0..k {
        let own_samples: Vec<_> = own
            .samples
            .iter()
            .filter(|s| s.receiver.vcpu == i)
            .map(resolve)
            .collect();
        let passive_samples: Vec<_> = passive
            .samples
            .iter()
            .filter(|s| s.pcpu_id == i)
            .inspect(|s| assert_eq!((s.domain_id, s.vcpu_id), (D, i), "{s:?}"))
            .map(resolve)
            .collect();
        assert_eq!(
            own_samples, passive_samples,
            "vCPU {i}: the same samples in the same order"
        );
    }
    assert_eq!(
        histogram(own.samples.iter()),
        histogram(passive.samples.iter())
    );
    let instructions: u64 = (k..2 * k)
        .map(|i| own.guests[i as usize].retired() as u64)
        .sum();
    if counter.os && counter.usr && counter.event == SimEvent::Instructions {
        assert!(
            own.samples.len() as u64 >= instructions / counter.period.unwrap_or(1) / 2,
            "samples are taken"
        );
    }
}

/// D (2 vCPUs, one hot function) shares pCPUs with E and the privileged vCPUs. The checks
/// are rankings, not equality: the two modes sample different instruction streams.
fn shared_strategy() -> impl Strategy<Value = (Scenario, u32)> {
    (2..=3u32, 0..FUNCTIONS, 1..=2u32).prop_flat_map(|(pcpus, hot, e)| {
        let vcpus = (pcpus + 2 + e) as usize;
        (
            proptest::collection::vec(skewed_workload_strategy(hot, 40..=60), 2),
            proptest::collection::vec(workload_strategy(6, 40), vcpus - 2),
            proptest::collection::vec((0..pcpus, 0..vcpus, 1..150u32), 10..40),
        )
            .prop_map(move |(d_workloads, others, slices)| {
                let privileged = pcpus as usize;
                let mut workloads = others;
                for (offset, workload) in d_workloads.into_iter().enumerate() {
                    workloads.insert(privileged + offset, workload);
                }
                let mut steps: Vec<Step> = slices
                    .into_iter()
                    .map(|(pcpu, vcpu, count)| Step::Run { pcpu, vcpu, count })
                    .collect();
                // Enough of D for a meaningful histogram, on whichever pCPUs (and less than
                // its workload, which does not repeat).
                for (offset, pcpu) in [(0, 0), (1, pcpus - 1)] {
                    steps.push(Step::Run {
                        pcpu,
                        vcpu: privileged + offset,
                        count: 500,
                    });
                }
                let scenario = Scenario {
                    pcpus,
                    domains: vec![pcpus, 2, e],
                    mode: XENPMU_MODE_SELF,
                    timing: Timing::Immediate,
                    workloads,
                    plans: Vec::new(),
                    steps,
                    filters: Vec::new(),
                };
                (scenario, hot)
            })
    })
}

fn top(histogram: &BTreeMap<String, u64>) -> Option<&String> {
    histogram
        .iter()
        .max_by_key(|entry| *entry.1)
        .map(|entry| entry.0)
}

fn check_shared<V: SimVendor>(vendor: V, base: &Scenario, hot: u32, period: u64) {
    let counter = CounterSpec {
        slot: 0,
        event: SimEvent::Instructions,
        os: true,
        usr: true,
        period: Some(period),
        initial: 0,
    };
    let (self_mode, all_mode) = both_modes(base, counter);
    let own = World::run(vendor.clone(), &self_mode);
    let passive = World::run(vendor, &all_mode);
    let own_histogram = histogram(own.samples.iter());
    let d_samples: Vec<&Sample> = passive.samples.iter().filter(|s| s.domain == D).collect();
    for sample in &d_samples {
        // The exact instruction exists in that vCPU's workload, with that privilege.
        let vcpu = &passive.guests[passive.index(vpmu::VcpuId {
            domain: D,
            vcpu: sample.vcpu_id,
        })];
        assert!(
            vcpu.instructions
                .iter()
                .any(|i| i.rip == sample.rip && (i.cpl == 3) == sample.user),
            "{sample:?}: not an instruction of D's vCPU {}",
            sample.vcpu_id
        );
    }
    let passive_histogram = histogram(d_samples.into_iter());
    let hot_name = function_name(D, hot);
    assert_eq!(
        top(&own_histogram),
        Some(&hot_name),
        "self mode: {own_histogram:?}"
    );
    assert_eq!(
        top(&passive_histogram),
        Some(&hot_name),
        "all mode: {passive_histogram:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: vpmu_tests::proptest_cases(48), ..ProptestConfig::default() })]

    #[test]
    fn intel_v5_pinned_passive_profile_equals_self_profile((s, c) in pinned_strategy()) {
        check_pinned(intel_v5(), &s, c);
    }

    #[test]
    fn intel_v2_pinned_passive_profile_equals_self_profile((s, c) in pinned_strategy()) {
        check_pinned(intel_v2(), &s, c);
    }

    #[test]
    fn amd_v2_pinned_passive_profile_equals_self_profile((s, c) in pinned_strategy()) {
        check_pinned(amd_v2(), &s, c);
    }

    #[test]
    fn amd_legacy_pinned_passive_profile_equals_self_profile((s, c) in pinned_strategy()) {
        check_pinned(amd_legacy(), &s, c);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: vpmu_tests::proptest_cases(24), ..ProptestConfig::default() })]

    #[test]
    fn intel_v5_shared_passive_profile_ranks_like_self_profile((s, hot) in shared_strategy(), period in 8..25u64) {
        check_shared(intel_v5(), &s, hot, period);
    }

    #[test]
    fn amd_v2_shared_passive_profile_ranks_like_self_profile((s, hot) in shared_strategy(), period in 8..25u64) {
        check_shared(amd_v2(), &s, hot, period);
    }
}

/// The same, in a fixed example whose numbers are printed (`--nocapture`).
#[test]
fn passive_and_self_histograms_of_a_fixed_workload() {
    let runs = vec![
        Run {
            function: 2,
            len: 80,
            branch_every: 3,
        },
        Run {
            function: 5,
            len: 15,
            branch_every: 2,
        },
        Run {
            function: 2,
            len: 60,
            branch_every: 0,
        },
        Run {
            function: 7,
            len: 9,
            branch_every: 1,
        },
    ];
    let base = Scenario {
        pcpus: 2,
        domains: vec![2, 2],
        mode: XENPMU_MODE_SELF,
        timing: Timing::Immediate,
        workloads: vec![Vec::new(), Vec::new(), runs.clone(), runs],
        plans: Vec::new(),
        steps: (0..20)
            .map(|i| Step::Run {
                pcpu: i % 2,
                vcpu: 2 + (i % 2) as usize,
                count: 97 + i,
            })
            .collect(),
        filters: Vec::new(),
    };
    let counter = CounterSpec {
        slot: 0,
        event: SimEvent::Instructions,
        os: true,
        usr: true,
        period: Some(13),
        initial: 0,
    };
    let (self_mode, all_mode) = both_modes(&base, counter);
    for (name, own, passive) in [
        (
            intel_v5().name(),
            histogram(World::run(intel_v5(), &self_mode).samples.iter()),
            histogram(World::run(intel_v5(), &all_mode).samples.iter()),
        ),
        (
            amd_v2().name(),
            histogram(World::run(amd_v2(), &self_mode).samples.iter()),
            histogram(World::run(amd_v2(), &all_mode).samples.iter()),
        ),
    ] {
        println!("{name}: self {own:?}\n{name}: all  {passive:?}");
        assert_eq!(own, passive);
        assert!(own.values().sum::<u64>() > 100);
    }
    check_pinned(amd_legacy(), &base, counter);
    check_pinned(intel_v2(), &base, counter);
}
