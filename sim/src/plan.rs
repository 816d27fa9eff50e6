//! What each simulated vCPU's perf driver programs: a vendor-independent [`PlanSpec`] (as the
//! strategies generate it), resolved into a [`GuestPlan`] for one vendor's counters.

use proptest::prelude::*;

use super::truth::{CounterSetup, SimEvent};
use super::vendor::Driver;

/// One counter of a plan, independent of the vendor: `slot` picks among the driver's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterSpec {
    /// Index into [`Driver::counters`] (modulo its length).
    pub slot: usize,
    /// The event.
    pub event: SimEvent,
    /// Count at CPL 0.
    pub os: bool,
    /// Count at CPL 3.
    pub usr: bool,
    /// Sampling period, if sampling.
    pub period: Option<u64>,
    /// Start value when counting.
    pub initial: u64,
}

/// What a guest's perf driver sets up, independent of the vendor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSpec {
    /// Counters to program.
    pub counters: Vec<CounterSpec>,
    /// Whether to register a shared page (samples through the page instead of the LVTPC).
    pub page: bool,
}

/// A plan resolved for a vendor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GuestPlan {
    /// Counters (distinct), with their global indices.
    pub counters: Vec<CounterSetup>,
    /// Whether to register a shared page.
    pub page: bool,
}

impl PlanSpec {
    /// The plan for `driver`'s counters: slots taken modulo the counter count, duplicates
    /// dropped, branches on fixed counter 0 replaced by instructions.
    pub fn resolve(&self, driver: &Driver) -> GuestPlan {
        let available = driver.counters();
        let mut counters: Vec<CounterSetup> = Vec::new();
        for spec in &self.counters {
            let ctr = available[spec.slot % available.len()];
            if counters.iter().any(|c| c.ctr == ctr) {
                continue;
            }
            let event = if driver.supports(ctr, spec.event) {
                spec.event
            } else {
                SimEvent::Instructions
            };
            counters.push(CounterSetup {
                ctr,
                event,
                os: spec.os,
                usr: spec.usr,
                period: spec.period,
                initial: spec.initial,
            });
        }
        GuestPlan {
            counters,
            page: self.page,
        }
    }
}

/// A counter: sampling with a period in `periods`, or counting from a small value.
pub fn counter_strategy(
    periods: std::ops::RangeInclusive<u64>,
) -> impl Strategy<Value = CounterSpec> {
    (
        0..16usize,
        prop_oneof![Just(SimEvent::Instructions), Just(SimEvent::Branches)],
        any::<(bool, bool)>(),
        proptest::option::of(periods),
        0..1000u64,
    )
        .prop_map(|(slot, event, (os, usr), period, initial)| CounterSpec {
            slot,
            event,
            os,
            usr,
            period,
            initial,
        })
}

/// A plan of up to `max_counters` counters, with or without a page.
pub fn plan_strategy(
    max_counters: usize,
    periods: std::ops::RangeInclusive<u64>,
) -> impl Strategy<Value = PlanSpec> {
    (
        proptest::collection::vec(counter_strategy(periods), 0..=max_counters),
        any::<bool>(),
    )
        .prop_map(|(counters, page)| PlanSpec { counters, page })
}
