//! The vCPU table: every vCPU's core state behind its own lock, next to the test's book on it
//! (what its guest programmed, and the PMIs its hardware raised). Every access to a vCPU —
//! the core's through [`VcpuTable`], the threads' own — goes through [`Slot::observed`], which
//! notices from the state before and after what the book must follow: a teardown resets the
//! guest's counters, a pending PMI discarded without being generated is counted.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use vpmu::{VcpuId, VcpuPmu, VcpuState, VcpuTable};

use vpmu_sim::Driver;
use vpmu_sim::vendor::{COUNTER_MASK, FIXED0};

use super::shared::lock;

/// What the guest knows about one counter it programs: it counts instructions at CPL 3 only,
/// from `base`, and must have advanced by at least `lo` and at most `hi` since.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterBook {
    /// The control enables counting (EN and USR; the fixed counter's USR nibble bit).
    pub ctrl_on: bool,
    /// The value last written, as the counter holds it.
    pub base: u64,
    /// Instructions it must have counted since.
    pub lo: u64,
    /// Instructions it may have counted since.
    pub hi: u64,
}

/// An unprivileged guest's knowledge of its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ledger {
    /// Per counter (global index).
    pub counters: BTreeMap<u32, CounterBook>,
    /// The global enables the guest last wrote (all ones without a global control).
    pub global: u64,
    has_global: bool,
}

impl Ledger {
    /// The guest's view after RESET (and after finish or teardown).
    pub fn new(driver: &Driver) -> Self {
        Self {
            counters: driver
                .counters()
                .into_iter()
                .map(|c| (c, CounterBook::default()))
                .collect(),
            global: driver.global_reset(),
            has_global: driver.has_global(),
        }
    }

    /// Whether the guest has counter `ctr` counting.
    pub fn enabled(&self, ctr: u32) -> bool {
        let on = self.counters.get(&ctr).is_some_and(|c| c.ctrl_on);
        on && (!self.has_global || self.global & (1 << ctr) != 0)
    }

    /// Whether the domain's event filter applies to counter `ctr` (fixed counters are never
    /// filtered in this run).
    pub fn filtered(ctr: u32) -> bool {
        ctr < FIXED0
    }

    /// The counter's advance since its base, as read back.
    pub fn advance(&self, ctr: u32, read: u64) -> u64 {
        let base = self.counters.get(&ctr).map_or(0, |c| c.base);
        read.wrapping_sub(base) & COUNTER_MASK
    }
}

/// The test's book on one vCPU.
#[derive(Clone, Debug)]
pub struct Book {
    /// The guest's counters (unprivileged vCPUs only: the privileged domain's counters count
    /// other contexts by design in all mode).
    pub ledger: Option<Ledger>,
    /// PMIs its hardware raised: the line rose while its own context, or (all mode) a
    /// system-wide context of its program, was loaded.
    pub due: u64,
    /// Pending PMIs the core dropped without generating them (finish or teardown, a mode
    /// without contexts at the next switch-in): documented discards.
    pub discarded: u64,
    /// System-wide PMIs dropped by leaving all mode between the overflow and the interrupt.
    pub system_discarded: u64,
    /// PMIs already reported as findings when they were lost.
    pub reported_lost: u64,
    /// Recent events, for the findings.
    pub history: std::collections::VecDeque<String>,
}

impl Book {
    /// Events kept.
    const HISTORY: usize = 24;

    /// The recent events, one per line.
    pub fn history_text(&self) -> String {
        self.history.iter().map(|e| format!("\n    {e}")).collect()
    }

    /// Records an event (with the pCPU and step of the calling thread).
    pub fn event(&mut self, what: String) {
        if self.history.len() == Self::HISTORY {
            self.history.pop_front();
        }
        let (pcpu, step) = CONTEXT.with(Cell::get);
        self.history
            .push_back(format!("pCPU {pcpu} #{step}: {what}"));
    }
}

thread_local! {
    static CONTEXT: Cell<(u32, u64)> = const { Cell::new((u32::MAX, 0)) };
}

/// Names the calling thread's pCPU and step in the books' histories.
pub fn set_context(pcpu: u32, step: u64) {
    CONTEXT.with(|c| c.set((pcpu, step)));
}

/// A vCPU's lock: its core state and the test's book on it.
#[derive(Debug)]
pub struct Slot<C> {
    /// The core's state.
    pub pmu: VcpuPmu<C>,
    /// The test's book.
    pub book: Book,
    driver: Driver,
}

#[derive(Clone, Copy)]
struct Seen {
    in_use: bool,
    allocated: bool,
    pending: bool,
    generated: u64,
}

impl Seen {
    fn of<C>(pmu: &VcpuPmu<C>) -> Self {
        Self {
            in_use: pmu.in_use(),
            allocated: pmu.state() == VcpuState::Allocated && pmu.page().is_none(),
            pending: pmu.pending_pmi().is_some(),
            generated: pmu.stats().pmis_generated,
        }
    }
}

impl<C> Slot<C> {
    /// Runs `access` on the core state and brings the book in line with what it did.
    ///
    /// It sees only the state before and after: an overflow the core keeps pending and
    /// discards within the same visit (a catch-up with a mode without vCPU contexts, on the
    /// pCPU the vCPU runs on) leaves no trace here; the runner accounts for it where the PMI
    /// is taken.
    pub fn observed<R>(&mut self, access: impl FnOnce(&mut VcpuPmu<C>) -> R) -> R {
        let before = Seen::of(&self.pmu);
        let result = access(&mut self.pmu);
        let after = Seen::of(&self.pmu);
        // Only a teardown (finish, domain destruction) takes a used vCPU back to its reset
        // state, and it resets the guest's counters with it.
        if before.in_use && after.allocated {
            if let Some(ledger) = self.book.ledger.as_mut() {
                *ledger = Ledger::new(&self.driver);
            }
        }
        if before.pending && !after.pending && after.generated == before.generated {
            self.book.discarded += 1;
            self.book.event("pending discarded".into());
        }
        if before.pending != after.pending
            || before.generated != after.generated
            || (before.in_use && after.allocated)
        {
            let what = format!(
                "pending {} -> {} ({:?}), generated {} -> {}, state {:?}{}",
                before.pending,
                after.pending,
                self.pmu.pending_pmi(),
                before.generated,
                after.generated,
                self.pmu.state(),
                if before.in_use && after.allocated {
                    ", torn down"
                } else {
                    ""
                }
            );
            self.book.event(what);
        }
        result
    }
}

/// Every vCPU's slot.
#[derive(Debug)]
pub struct SharedTable<C> {
    slots: Vec<Mutex<Slot<C>>>,
    first: Vec<usize>,
}

impl<C> SharedTable<C> {
    /// A table of `vcpus` (in flat order: domain by domain); the domain 0 is privileged.
    pub fn new(vcpus: Vec<VcpuPmu<C>>, driver: Driver) -> Self {
        let mut first = Vec::new();
        for (index, pmu) in vcpus.iter().enumerate() {
            let id = pmu.id();
            if id.vcpu == 0 {
                assert_eq!(first.len(), id.domain as usize, "vCPUs in flat order");
                first.push(index);
            }
        }
        let slots = vcpus
            .into_iter()
            .map(|pmu| {
                let id = pmu.id();
                Mutex::new(Slot {
                    book: Book {
                        ledger: (id.domain != 0).then(|| Ledger::new(&driver)),
                        due: 0,
                        discarded: 0,
                        system_discarded: 0,
                        reported_lost: 0,
                        history: std::collections::VecDeque::new(),
                    },
                    pmu,
                    driver,
                })
            })
            .collect();
        Self { slots, first }
    }

    fn slot(&self, id: VcpuId) -> Option<&Mutex<Slot<C>>> {
        let first = *self.first.get(id.domain as usize)?;
        let end = self
            .first
            .get(id.domain as usize + 1)
            .copied()
            .unwrap_or(self.slots.len());
        let index = first + id.vcpu as usize;
        (index < end).then(|| &self.slots[index])
    }

    /// Locks `id`'s slot (the caller must go through [`Slot::observed`] for core calls).
    pub fn lock(&self, id: VcpuId) -> SlotGuard<'_, C> {
        SlotGuard::new(self.slot(id).expect("a vCPU of the table"))
    }
}

thread_local! {
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// A locked slot. The thread counts the slots it holds, so that a core visiting a vCPU while
/// its caller holds one (which would deadlock on a per-vCPU lock) panics instead of hanging.
#[derive(Debug)]
pub struct SlotGuard<'a, C> {
    guard: MutexGuard<'a, Slot<C>>,
}

impl<'a, C> SlotGuard<'a, C> {
    fn new(slot: &'a Mutex<Slot<C>>) -> Self {
        let guard = lock(slot);
        HELD.with(|held| held.set(held.get() + 1));
        Self { guard }
    }
}

impl<C> Drop for SlotGuard<'_, C> {
    fn drop(&mut self) {
        HELD.with(|held| held.set(held.get() - 1));
    }
}

impl<C> Deref for SlotGuard<'_, C> {
    type Target = Slot<C>;

    fn deref(&self) -> &Slot<C> {
        &self.guard
    }
}

impl<C> DerefMut for SlotGuard<'_, C> {
    fn deref_mut(&mut self) -> &mut Slot<C> {
        &mut self.guard
    }
}

fn visit_unnested<C>(slot: &Mutex<Slot<C>>, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
    let held = HELD.with(Cell::get);
    assert_eq!(
        held, 0,
        "the core visited a vCPU while its caller held another vCPU's lock"
    );
    SlotGuard::new(slot).observed(|pmu| visit(pmu));
}

impl<C> VcpuTable<C> for SharedTable<C> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        let Some(slot) = self.slot(id) else {
            return false;
        };
        visit_unnested(slot, visit);
        true
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        let Some(&first) = self.first.get(domain as usize) else {
            return;
        };
        let end = self
            .first
            .get(domain as usize + 1)
            .copied()
            .unwrap_or(self.slots.len());
        for slot in &self.slots[first..end] {
            visit_unnested(slot, visit);
        }
    }
}
