//! Guests at work: the guest's side of PMIs before it runs, batches of retired instructions
//! and the PMIs they raise, each checked against the guest's book of what must count.

use std::sync::PoisonError;

use vpmu::{Interrupted, Mode, PmiOutcome, SystemContext, VcpuId, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use vpmu_sim::SimVendor;
use vpmu_sim::workload::{Instruction, function_base, regs};

use crate::smp::platform::hypervisor_regs;
use crate::smp::shared::{FilterView, lock};
use crate::smp::table::Ledger;

use super::Runner;

/// Whose context raised a PMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The vCPU's own context (self and hv mode).
    Own(VcpuId),
    /// The pCPU's system-wide context of this profiler's program (all mode).
    System(VcpuId),
}

impl Owner {
    fn vcpu(self) -> VcpuId {
        match self {
            Owner::Own(id) | Owner::System(id) => id,
        }
    }
}

impl<V: SimVendor> Runner<'_, V> {
    /// The guest's side of PMIs before it runs: queued LVTPC deliveries are completed from
    /// its own context, and its handlers take what was delivered.
    pub(super) fn housekeeping(&mut self, x: VcpuId) {
        let flat = self.shared.flat(x);
        let mut slot = self.table.lock(x);
        let outcomes: Vec<bool> = {
            let mut vlapic = lock(&self.shared.vlapics[flat]);
            let queued: Vec<bool> = vlapic.queued.drain(..).collect();
            queued
                .into_iter()
                .map(|mask| {
                    let delivered = !vlapic.masked;
                    if delivered {
                        vlapic.delivered += 1;
                        vlapic.masked |= mask;
                    }
                    delivered
                })
                .collect()
        };
        for delivered in outcomes {
            let vpmu = self.vpmu;
            if !slot.observed(|pmu| vpmu.lvtpc_delivery_done(pmu, delivered)) {
                drop(slot);
                self.find("queued LVTPC delivery not in flight", format!("{x:?}"));
                slot = self.table.lock(x);
            }
            self.shared
                .coverage
                .hit("queued LVTPC deliveries completed");
        }
        drop(slot);
        let (delivered, virqs) = {
            let mut vlapic = lock(&self.shared.vlapics[flat]);
            (
                std::mem::take(&mut vlapic.delivered),
                std::mem::take(&mut vlapic.virqs),
            )
        };
        if delivered > 0 {
            self.note(format!("{x:?} takes {delivered} LVTPC PMIs"));
            // A Linux-like handler: acknowledge what overflowed, then unmask the LVTPC.
            if self.rng.chance(3, 4) {
                self.ack_status(x);
            }
            if self.rng.chance(4, 5) {
                lock(&self.shared.vlapics[flat]).masked = false;
            }
        }
        if virqs > 0 {
            self.note(format!("{x:?} takes {virqs} VIRQs"));
            if self.rng.chance(1, 2) {
                self.flush(x);
            }
        }
    }

    pub(super) fn run_guest(&mut self, x: VcpuId) {
        let (pending, history) = {
            let slot = self.table.lock(x);
            (slot.pmu.pending_pmi(), slot.book.history_text())
        };
        if pending.is_some() && self.pcpu.mode_seen().switches_contexts() {
            self.find(
                "PMI withheld from a running vCPU",
                format!(
                    "{x:?} enters the guest on pCPU {} with a PMI kept pending ({pending:?}); it is \
                     delivered only at its next switch-in; its history:{history}",
                    self.here
                ),
            );
        }
        let roll = self.rng.below(100);
        if roll < 60 {
            self.retire(Some(x), 3, false);
        } else if roll < 85 {
            self.retire(Some(x), 0, false);
        } else {
            self.retire(Some(x), 0, true);
        }
    }

    /// `running` (or the idle hypervisor) retires a batch of instructions at `cpl` (`host`:
    /// hypervisor code). The guest's book follows what must count; a PMI the batch raises is
    /// attributed to the context that was loaded, and taken — sometimes only after a switch,
    /// as a real PMI can arrive after the hypervisor has already begun switching.
    pub(super) fn retire(&mut self, running: Option<VcpuId>, cpl: u8, host: bool) {
        let shared = self.shared;
        let _gate = shared.avoid_known_bugs.then(|| {
            shared
                .policy_gate
                .read()
                .unwrap_or_else(PoisonError::into_inner)
        });
        if _gate.is_some() {
            // No policy change reaches this pCPU between an overflow and its interrupt.
            self.drain();
        }
        let k = 1 + self.rng.below(48);
        let seq = self.seq;
        self.seq += k;
        let here = self.here;
        let mut owner = None;
        if self.pcpu.hw().model().pmi_pending() {
            self.find(
                "PMI line left asserted before a batch",
                format!("running {running:?}"),
            );
            self.pcpu.hw_mut().model_mut().take_pmi();
        }
        let mode = ExecMode { cpl, host };
        match running {
            Some(x) => {
                let function = if cpl == 3 { 4 } else { 0 } + self.rng.below(4) as u32;
                let insn = Instruction {
                    rip: function_base(x.domain, function) + 4 * (seq % 0x4000),
                    cpl,
                    branch: false,
                };
                let guest = regs(x, &insn, seq + k - 1);
                self.platform.interrupted = if host {
                    Interrupted::Hypervisor {
                        regs: hypervisor_regs(
                            0xffff_8000_0020_0000 + 4 * (seq % 0x4000),
                            seq + k - 1,
                        ),
                        on_behalf_of: Some((x, self.last_regs(x))),
                    }
                } else {
                    Interrupted::Guest {
                        vcpu: x,
                        regs: guest,
                    }
                };
                let view = self.shared.filters[x.domain as usize].view();
                let mut slot = self.table.lock(x);
                if !host {
                    *lock(&self.shared.last_regs[self.shared.flat(x)]) = guest;
                }
                let state = slot.pmu.state();
                let loaded = state == (VcpuState::Loaded { pcpu: here });
                let mut problem = None;
                if let (Some(ledger), 3, false) = (slot.book.ledger.as_mut(), cpl, host) {
                    let enabled: Vec<u32> = ledger
                        .counters
                        .keys()
                        .copied()
                        .filter(|&c| ledger.enabled(c))
                        .collect();
                    let must_count = enabled
                        .iter()
                        .any(|&c| !Ledger::filtered(c) || view == FilterView::Allow);
                    match state {
                        VcpuState::Loaded { pcpu } if pcpu == here => {
                            for c in enabled {
                                let book =
                                    ledger.counters.get_mut(&c).expect("a counter of the guest");
                                match (Ledger::filtered(c), view) {
                                    (false, _) | (true, FilterView::Allow) => {
                                        book.lo += k;
                                        book.hi += k;
                                    }
                                    (true, FilterView::Changing) => book.hi += k,
                                    (true, FilterView::Deny) => {}
                                }
                            }
                        }
                        VcpuState::Loaded { pcpu } => {
                            problem = Some((
                                "vCPU runs here while its context is loaded elsewhere",
                                pcpu,
                            ));
                        }
                        // The cached window stops the counters.
                        VcpuState::Cached { .. } => {}
                        VcpuState::Saved | VcpuState::Allocated => {
                            if must_count {
                                problem = Some((
                                    "guest counters enabled but its context is not loaded",
                                    here,
                                ));
                            }
                        }
                    }
                }
                self.pcpu
                    .hw_mut()
                    .model_mut()
                    .count(HwEvent::Instructions, k, mode);
                if self.pcpu.hw().model().pmi_pending() && loaded {
                    slot.book.due += 1;
                    slot.book.event(format!("due (own) k {k}"));
                    owner = Some(Owner::Own(x));
                }
                drop(slot);
                if let Some((kind, pcpu)) = problem {
                    self.find(
                        kind,
                        format!(
                            "{x:?} on pCPU {here}, state {state:?} (pCPU {pcpu}), filter {view:?}"
                        ),
                    );
                }
                self.shared.coverage.hit("instruction batches");
            }
            None => {
                self.platform.interrupted = Interrupted::Hypervisor {
                    regs: hypervisor_regs(0xffff_8000_0030_0000 + 4 * (seq % 0x4000), seq + k - 1),
                    on_behalf_of: None,
                };
                self.pcpu
                    .hw_mut()
                    .model_mut()
                    .count(HwEvent::Instructions, k, mode);
            }
        }
        if self.pcpu.hw().model().pmi_pending() && owner.is_none() {
            match *self.pcpu.system() {
                SystemContext::Loaded { profiler, .. } => {
                    let mut slot = self.table.lock(profiler);
                    slot.book.due += 1;
                    slot.book.event(format!("due (system) on pCPU {here}"));
                    drop(slot);
                    owner = Some(Owner::System(profiler));
                }
                _ => {
                    self.find(
                        "PMI raised by hardware no context owns",
                        format!("running {running:?}: {:?}", V::raw(self.pcpu.hw().model())),
                    );
                    self.pcpu.hw_mut().model_mut().take_pmi();
                }
            }
        }
        self.note(format!(
            "{running:?} retires {k} at cpl {cpl} host {host} -> PMI {owner:?}"
        ));
        if let Some(owner) = owner {
            let delayed = running.is_some() && self.rng.chance(1, 4);
            self.take_pmi(owner, delayed);
        }
    }

    /// Whether this pCPU, which had caught up with `before` when an own context of a vCPU
    /// running here overflowed, has since caught up with a mode without vCPU contexts (off, or
    /// all entered): its catch-up saved the loaded context and, the vCPU running on, dropped
    /// the overflow it found (docs/core.md: such a change takes the privileged contexts off
    /// the hardware and discards their pending PMIs). Only privileged vCPUs run with a vPMU in
    /// use across such a change.
    ///
    /// The book cannot see that discard the way it sees the others: the core keeps the
    /// overflow pending and drops it within one visit of the vCPU (`catch_up` saves, then
    /// `deliver_pending` discards), so [`Slot::observed`](crate::smp::table::Slot::observed)
    /// finds nothing pending before and after. The mode the pCPU caught up with is what tells
    /// it: each core call catches up at most once, to the newest epoch, and the windows
    /// checked below hold one core call each.
    fn left_contexts_since(&self, before: Mode) -> bool {
        before.switches_contexts() && !self.pcpu.mode_seen().switches_contexts()
    }

    /// Records the discard `left_contexts_since` found for `x`'s overflow.
    fn discarded_with_mode(&self, x: VcpuId, before: Mode) {
        let mut slot = self.table.lock(x);
        slot.book.discarded += 1;
        slot.book.event(format!(
            "overflow discarded by the catch-up {before:?} -> {:?}",
            self.pcpu.mode_seen()
        ));
    }

    /// The PMI line is up for `owner`'s overflow: the interrupt is taken now, or (`delayed`)
    /// after the hypervisor switched the vCPU out first.
    fn take_pmi(&mut self, owner: Owner, delayed: bool) {
        // No core call since the overflow: the mode this pCPU applied when it happened.
        let seen_at_overflow = self.pcpu.mode_seen();
        if delayed {
            let x = self
                .pcpu
                .current()
                .expect("a delayed PMI interrupts a vCPU");
            let next = self
                .shared
                .vcpu_ids()
                .into_iter()
                .find(|&id| id != x && self.claim(id));
            self.note(format!("PMI delayed: switch {x:?} -> {next:?} first"));
            self.in_hypervisor(next);
            let (before, discarded, generated) = {
                let slot = self.table.lock(x);
                (
                    format!("{:?} {:?}", slot.pmu.state(), slot.pmu.context()),
                    slot.book.discarded,
                    slot.pmu.stats().pmis_generated,
                )
            };
            let hw_before = format!("{:?}", V::raw(self.pcpu.hw().model()));
            let result =
                self.vpmu
                    .context_switch(&mut self.platform, &mut self.pcpu, self.table, next);
            self.core_ok("context_switch", result);
            if let Owner::Own(owner) = owner {
                if owner == x && self.left_contexts_since(seen_at_overflow) {
                    self.discarded_with_mode(x, seen_at_overflow);
                } else if owner == x {
                    let slot = self.table.lock(x);
                    // A sibling's finish may tear the vCPU down (discarding what is pending)
                    // as soon as it is off the hardware; a policy change caught up first may
                    // have saved it and routed it at once, the vCPU still running.
                    let kept = slot.pmu.pending_pmi().is_some()
                        || slot.book.discarded > discarded
                        || slot.pmu.stats().pmis_generated > generated;
                    let after = format!(
                        "{:?} {:?} {:?}",
                        slot.pmu.state(),
                        slot.pmu.context(),
                        slot.pmu.stats()
                    );
                    drop(slot);
                    if !kept {
                        self.table.lock(x).book.reported_lost += 1;
                        self.find(
                            "PMI lost at switch-out",
                            format!(
                                "{x:?}'s overflow was neither kept pending nor delivered when it \
                                 was switched out\n  before: {before}\n  hardware: {hw_before}\n  after: {after}"
                            ),
                        );
                    }
                }
            }
            self.release(x);
            self.shared.coverage.hit("PMIs taken after a switch");
        }
        if !self.pcpu.hw_mut().model_mut().take_pmi() {
            return;
        }
        if self.platform.physical_masked {
            if delayed && matches!(owner, Owner::Own(_)) {
                // The vCPU switched in published a sample of its own (a PMI kept pending for
                // it) and masked the LVTPC; the overflow of the one switched out was checked
                // to be kept with its context above.
                return;
            }
            self.table.lock(owner.vcpu()).book.reported_lost += 1;
            self.find(
                "counters ran under a masked physical LVTPC",
                format!("{owner:?}'s PMI was discarded by the masked LVTPC"),
            );
            return;
        }
        if delayed {
            self.in_hypervisor(self.pcpu.current());
        }
        let (discarded, generated) = {
            let slot = self.table.lock(owner.vcpu());
            (slot.book.discarded, slot.pmu.stats().pmis_generated)
        };
        let result = self
            .vpmu
            .handle_pmi(&mut self.platform, &mut self.pcpu, self.table);
        let outcome = self.core_ok("handle_pmi", result);
        self.note(format!("PMI of {owner:?} -> {outcome:?}"));
        match outcome {
            PmiOutcome::Delivered { to, .. }
            | PmiOutcome::Dropped { to, .. }
            | PmiOutcome::Queued { to, .. } => {
                self.shared.coverage.hit(match (outcome, owner) {
                    (PmiOutcome::Delivered { .. }, Owner::System(_)) => {
                        "system-wide samples delivered"
                    }
                    (PmiOutcome::Delivered { .. }, _) => "PMIs delivered",
                    (PmiOutcome::Dropped { .. }, _) => "PMIs dropped",
                    _ => "PMIs queued",
                });
                let delayed_own = delayed && matches!(owner, Owner::Own(_));
                if delayed_own || to != owner.vcpu() {
                    self.find(
                        "PMI misrouted",
                        format!("{owner:?}'s overflow (delayed {delayed}) went to {to:?}"),
                    );
                }
            }
            PmiOutcome::Spurious | PmiOutcome::NoInterrupt(_) => match owner {
                Owner::System(profiler) => {
                    if self.pcpu.mode_seen() == Mode::All {
                        self.table.lock(profiler).book.reported_lost += 1;
                        self.find(
                            "system-wide PMI lost",
                            format!("{profiler:?}'s overflow on pCPU {}: {outcome:?}", self.here),
                        );
                    } else {
                        // Leaving all mode discards the system-wide contexts with their
                        // overflows (docs/core.md).
                        self.table.lock(profiler).book.system_discarded += 1;
                    }
                }
                Owner::Own(x) if !delayed && self.left_contexts_since(seen_at_overflow) => {
                    self.discarded_with_mode(x, seen_at_overflow);
                }
                Owner::Own(x) if !delayed => {
                    // Not taken now: a policy change caught up at the PMI must have saved the
                    // overflow with the context, and routed it at once (the vCPU runs on) or
                    // kept it.
                    let kept = {
                        let slot = self.table.lock(x);
                        slot.pmu.pending_pmi().is_some()
                            || slot.book.discarded > discarded
                            || slot.pmu.stats().pmis_generated > generated
                    };
                    if !kept {
                        self.table.lock(x).book.reported_lost += 1;
                        self.find(
                            "PMI lost",
                            format!(
                                "{x:?}'s overflow: {outcome:?}, nothing kept pending (mode \
                                 {seen_at_overflow:?} at the overflow, {:?} at the PMI)",
                                self.pcpu.mode_seen()
                            ),
                        );
                    }
                }
                Owner::Own(_) => {}
            },
        }
    }
}
