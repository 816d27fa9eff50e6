//! Ground truth: what the counters a guest programmed must hold, computed from the guest's own
//! writes and the instructions retired while they were enabled — independently of the core, the
//! backends and the models. One [`TruthPmu`] follows each vCPU (self/hv mode) or each pCPU's
//! system-wide context (all mode).

use std::collections::BTreeMap;

use super::vendor::COUNTER_MASK;
use super::workload::Instruction;

/// The events the simulated workloads retire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimEvent {
    /// Instructions retired.
    Instructions,
    /// Branch instructions retired.
    Branches,
}

/// How a guest programs one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterSetup {
    /// Global counter index (GP `i` = `i`, Intel fixed `i` = `32 + i`).
    pub ctr: u32,
    /// The event counted.
    pub event: SimEvent,
    /// Count at CPL 0.
    pub os: bool,
    /// Count at CPL 3.
    pub usr: bool,
    /// Sampling: interrupt every `period` events (preset to `-period`, INT set). `None`:
    /// counting only, from `initial`.
    pub period: Option<u64>,
    /// Start value of a counting counter.
    pub initial: u64,
}

impl CounterSetup {
    /// The value the guest presets the counter to.
    pub fn start_value(&self) -> u64 {
        match self.period {
            Some(period) => period.wrapping_neg() & COUNTER_MASK,
            None => self.initial & COUNTER_MASK,
        }
    }

    /// The counter's bit in overflow status and global control.
    pub fn bit(&self) -> u64 {
        1 << self.ctr
    }

    /// Whether it counts `insn`, given its privilege filter and event.
    pub fn counts(&self, insn: &Instruction) -> bool {
        let ring = if insn.cpl == 0 { self.os } else { self.usr };
        ring && (self.event == SimEvent::Instructions || insn.branch)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TruthCounter {
    setup: CounterSetup,
    enabled: bool,
    /// The domain's event filter lets its event count.
    allowed: bool,
    value: u64,
}

/// The architectural state of the counters one context should have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TruthPmu {
    counters: BTreeMap<u32, TruthCounter>,
    /// Global enables (all ones for shapes without a global control).
    pub global: u64,
    /// Overflows not yet acknowledged.
    pub status: u64,
    /// Counting is stopped: a sample of this context is cached in a page.
    pub stopped: bool,
    /// Overflows seen so far, per counter.
    pub overflows: BTreeMap<u32, u64>,
}

impl TruthPmu {
    /// A context after RESET, with global enables `global`.
    pub fn new(global: u64) -> Self {
        Self {
            counters: BTreeMap::new(),
            global,
            status: 0,
            stopped: false,
            overflows: BTreeMap::new(),
        }
    }

    /// The guest programmed `setup` with the counter holding `value`, and enabled it;
    /// `allowed`: the writer's event filter lets the event count.
    pub fn program(&mut self, setup: CounterSetup, value: u64, allowed: bool) {
        self.counters.insert(
            setup.ctr,
            TruthCounter {
                setup,
                enabled: true,
                allowed,
                value,
            },
        );
    }

    /// The guest enabled or disabled counter `ctr` (it must have been programmed).
    pub fn set_enabled(&mut self, ctr: u32, enabled: bool) {
        if let Some(counter) = self.counters.get_mut(&ctr) {
            counter.enabled = enabled;
        }
    }

    /// The guest wrote `value` to counter `ctr`.
    pub fn set_value(&mut self, ctr: u32, value: u64) {
        if let Some(counter) = self.counters.get_mut(&ctr) {
            counter.value = value;
        }
    }

    /// Whether counter `ctr` is programmed and enabled.
    pub fn enabled(&self, ctr: u32) -> bool {
        self.counters.get(&ctr).is_some_and(|c| c.enabled)
    }

    /// Counter `ctr`'s value.
    pub fn value(&self, ctr: u32) -> Option<u64> {
        self.counters.get(&ctr).map(|c| c.value)
    }

    /// The programmed counters.
    pub fn setups(&self) -> impl Iterator<Item = CounterSetup> + '_ {
        self.counters.values().map(|c| c.setup)
    }

    /// Counters that interrupt on overflow.
    pub fn interrupt_bits(&self) -> u64 {
        self.counters
            .values()
            .filter(|c| c.setup.period.is_some())
            .fold(0, |bits, c| bits | c.setup.bit())
    }

    /// `insn` retires in this context: every enabled counter that counts it advances; returns
    /// the counters that wrapped (now in `status`).
    pub fn retire(&mut self, insn: &Instruction) -> u64 {
        if self.stopped {
            return 0;
        }
        let mut wrapped = 0;
        for (ctr, counter) in &mut self.counters {
            let live = counter.enabled && counter.allowed && self.global & counter.setup.bit() != 0;
            if !(live && counter.setup.counts(insn)) {
                continue;
            }
            counter.value = (counter.value + 1) & COUNTER_MASK;
            if counter.value == 0 {
                wrapped |= counter.setup.bit();
                *self.overflows.entry(*ctr).or_default() += 1;
            }
        }
        self.status |= wrapped;
        wrapped
    }
}
