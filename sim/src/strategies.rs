//! proptest strategies for whole scenarios: a topology (pCPUs, domains, vCPUs), one workload
//! and one perf-driver plan per vCPU, and a schedule interleaving vCPUs on pCPUs with guest
//! actions (counter reads, enable toggles, LVTPC mask changes).

use std::ops::RangeInclusive;

use proptest::prelude::*;
use vpmu::abi::XENPMU_MODE_ALL;

use super::plan::{PlanSpec, plan_strategy};
use super::truth::SimEvent;
use super::workload::workload_strategy;
use super::world::{Scenario, Step, Timing};

/// The knobs of [`scenario_strategy`].
#[derive(Clone, Debug)]
pub struct Knobs {
    /// Modes to pick from.
    pub modes: Vec<u64>,
    /// Handler timings to pick from.
    pub timings: Vec<Timing>,
    /// pCPUs.
    pub pcpus: RangeInclusive<u32>,
    /// Domains (the first is privileged).
    pub domains: RangeInclusive<usize>,
    /// vCPUs per domain.
    pub vcpus: RangeInclusive<u32>,
    /// Counters per plan.
    pub max_counters: usize,
    /// Sampling periods.
    pub periods: RangeInclusive<u64>,
    /// Steps.
    pub max_steps: usize,
    /// Instructions per run step.
    pub max_run: u32,
    /// Whether domains may have event filters.
    pub filters: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            modes: vec![vpmu::abi::XENPMU_MODE_SELF],
            timings: vec![Timing::Immediate, Timing::Deferred],
            pcpus: 1..=3,
            domains: 2..=3,
            vcpus: 1..=3,
            max_counters: 4,
            periods: 3..=40,
            max_steps: 40,
            max_run: 150,
            filters: true,
        }
    }
}

/// A domain's event filter: none, or one denied event.
pub fn filter_strategy(enabled: bool) -> impl Strategy<Value = Option<SimEvent>> {
    let deny = if enabled { 1 } else { 0 };
    prop_oneof![
        3 => Just(None),
        deny => Just(Some(SimEvent::Instructions)),
        deny => Just(Some(SimEvent::Branches)),
    ]
}

/// One step: mostly runs, sometimes idling, toggles, reads and LVTPC mask changes.
pub fn step_strategy(max_run: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..8u32, 0..64usize, 1..=max_run)
            .prop_map(|(pcpu, vcpu, count)| Step::Run { pcpu, vcpu, count }),
        1 => (0..8u32).prop_map(|pcpu| Step::Idle { pcpu }),
        1 => (0..64usize, 0..8usize).prop_map(|(vcpu, counter)| Step::Toggle { vcpu, counter }),
        2 => (0..64usize).prop_map(|vcpu| Step::Read { vcpu }),
        1 => (0..64usize).prop_map(|vcpu| Step::MaskPage { vcpu }),
        1 => (0..64usize).prop_map(|vcpu| Step::Restart { vcpu }),
    ]
}

/// A whole scenario. In all mode the privileged domain has at most one vCPU per pCPU (so that
/// every privileged vCPU profiles at least one pCPU).
pub fn scenario_strategy(knobs: Knobs) -> impl Strategy<Value = Scenario> {
    let topology = (
        proptest::sample::select(knobs.modes.clone()),
        proptest::sample::select(knobs.timings.clone()),
        knobs.pcpus.clone(),
        proptest::collection::vec(knobs.vcpus.clone(), knobs.domains.clone()),
    );
    topology.prop_flat_map(move |(mode, timing, pcpus, mut domains)| {
        if mode == XENPMU_MODE_ALL {
            domains[0] = domains[0].min(pcpus);
        }
        let count: usize = domains.iter().map(|&n| n as usize).sum();
        (
            proptest::collection::vec(workload_strategy(6, 40), count),
            proptest::collection::vec(
                plan_strategy(knobs.max_counters, knobs.periods.clone()),
                count,
            ),
            proptest::collection::vec(step_strategy(knobs.max_run), 1..=knobs.max_steps),
            proptest::collection::vec(filter_strategy(knobs.filters), domains.len()),
        )
            .prop_map(move |(workloads, plans, steps, filters)| Scenario {
                pcpus,
                domains: domains.clone(),
                mode,
                timing,
                workloads,
                plans,
                steps,
                filters,
            })
    })
}

/// Plans where every vCPU samples (a sampling counter first, page or not) — for attribution.
pub fn sampling_plans(plans: Vec<PlanSpec>, periods: Vec<u64>) -> Vec<PlanSpec> {
    plans
        .into_iter()
        .zip(periods)
        .map(|(mut plan, period)| {
            if let Some(first) = plan.counters.first_mut() {
                first.period = Some(period);
                first.os = true;
                first.usr = true;
            }
            plan
        })
        .collect()
}
