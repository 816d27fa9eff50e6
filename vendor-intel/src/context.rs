//! A vCPU's Intel PMU context: the guest-visible registers, the values the hardware is
//! programmed with, the virtual GLOBAL_STATUS, and which counters must be on the hardware.

use vpmu::bank::CounterBanks;
use vpmu::{CounterSet, Indices};

use crate::caps::{FIXED_COUNTER_LIMIT, IntelCaps, MAX_GP_COUNTERS};
use crate::msrs::{EVTSEL_EN, EVTSEL_INT, FIXED_OS, FIXED_PMI, FIXED_USR, fixed_nibble};

pub(crate) const GP_SLOTS: usize = MAX_GP_COUNTERS as usize;
pub(crate) const FIXED_SLOTS: usize = FIXED_COUNTER_LIMIT as usize;

/// The indices with a slot, as bitmaps: loops over a set of counters iterate its bits within
/// these, and the compiler then sees every index in range (no bound checked per counter).
/// Counters outside them never enter `in_use`.
const GP_SLOT_BITS: u32 = ((1u64 << GP_SLOTS) - 1) as u32;
const FIXED_SLOT_BITS: u32 = ((1u64 << FIXED_SLOTS) - 1) as u32;

/// The positions of the banks in [`IntelCaps::banks`].
pub(crate) const GP_BANK: usize = 0;
pub(crate) const FIXED_BANK: usize = 1;

/// One vCPU's Intel PMU state.
///
/// While the context is loaded, the hardware is the authority for the values of the counters in
/// [`IntelContext::in_use`] and for live overflow status; everything else is here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntelContext {
    pub(crate) gp_counters: [u64; GP_SLOTS],
    /// PERFEVTSELx as the guest wrote them (what it reads back).
    pub(crate) event_selects: [u64; GP_SLOTS],
    /// PERFEVTSELx as programmed into the hardware (EN cleared for filtered events).
    pub(crate) event_selects_hw: [u64; GP_SLOTS],
    pub(crate) fixed_counters: [u64; FIXED_SLOTS],
    pub(crate) fixed_ctrl: u64,
    pub(crate) fixed_ctrl_hw: u64,
    pub(crate) global_ctrl: u64,
    /// The virtual GLOBAL_STATUS: overflows recorded and not yet cleared by the guest.
    pub(crate) global_status: u64,
    pub(crate) ds_area: u64,
    /// Counters with a non-zero value or control: the ones save and load touch.
    pub(crate) in_use: CounterSet,
}

impl IntelContext {
    /// The state after RESET: everything 0 except GLOBAL_CTRL, whose GP enable bits are set
    /// (SDM; software written for v1 expects the GP counters enabled, and KVM does the same).
    pub(crate) fn reset(caps: &IntelCaps) -> Self {
        IntelContext {
            gp_counters: [0; GP_SLOTS],
            event_selects: [0; GP_SLOTS],
            event_selects_hw: [0; GP_SLOTS],
            fixed_counters: [0; FIXED_SLOTS],
            fixed_ctrl: 0,
            fixed_ctrl_hw: 0,
            global_ctrl: CounterSet::first_gp(caps.gp_counters()).0,
            global_status: 0,
            ds_area: 0,
            in_use: CounterSet::EMPTY,
        }
    }

    /// Counters whose state must be on the hardware while the context is loaded.
    pub fn in_use(&self) -> CounterSet {
        self.in_use
    }

    /// The virtual GLOBAL_STATUS (overflows recorded at save or PMI, not yet cleared).
    pub fn virtual_status(&self) -> u64 {
        self.global_status
    }

    /// The guest-visible IA32_PERF_GLOBAL_CTRL.
    pub fn global_ctrl(&self) -> u64 {
        self.global_ctrl
    }

    /// General-purpose counter `index` as last saved (stale while loaded and in use).
    pub fn gp_counter(&self, index: u32) -> Option<u64> {
        self.gp_counters.get(index as usize).copied()
    }

    /// Fixed counter `index` as last saved (stale while loaded and in use).
    pub fn fixed_counter(&self, index: u32) -> Option<u64> {
        self.fixed_counters.get(index as usize).copied()
    }

    /// PERFEVTSEL`index` as the guest wrote it.
    pub fn event_select(&self, index: u32) -> Option<u64> {
        self.event_selects.get(index as usize).copied()
    }

    /// IA32_FIXED_CTR_CTRL as the guest wrote it.
    pub fn fixed_ctrl(&self) -> u64 {
        self.fixed_ctrl
    }

    /// Recomputes [`IntelContext::in_use`] from the saved values: only valid when the context
    /// is not loaded (while loaded the counters' live values are on the hardware).
    pub(crate) fn recompute_in_use(&mut self) {
        let mut in_use = CounterSet::EMPTY;
        for (index, (&value, &control)) in
            (0u32..).zip(self.gp_counters.iter().zip(&self.event_selects))
        {
            if value != 0 || control != 0 {
                in_use = in_use.union(CounterSet::gp(index));
            }
        }
        for (index, &value) in (0u32..).zip(&self.fixed_counters) {
            if value != 0 || fixed_nibble(self.fixed_ctrl, index) != 0 {
                in_use = in_use.union(CounterSet::fixed(index));
            }
        }
        self.in_use = in_use;
    }

    /// After a save, with the values just read: drops from [`IntelContext::in_use`] the
    /// counters whose value and control are both 0. Only counters in use can leave: a counter
    /// outside it has value 0 and control 0 while the context is loaded (a write of anything
    /// else puts it in use, and `in_use` only grows while loaded), so the result is what
    /// [`IntelContext::recompute_in_use`] gives, without scanning every counter. `read_zero`
    /// is what the save returned, the counters that read 0: only their controls are looked
    /// at (almost always none).
    #[inline]
    pub(crate) fn shrink_in_use(&mut self, read_zero: CounterSet) {
        // One test for the usual case: without it the two scans' set-up and the final mask
        // cost about 10 instructions a save.
        if !read_zero.is_empty() {
            let mut idle = 0u64;
            let candidates = read_zero.intersection(self.in_use);
            for index in Indices(candidates.gp_bits() & GP_SLOT_BITS) {
                if self.event_selects[index as usize] == 0 {
                    idle |= CounterSet::gp(index).0;
                }
            }
            for index in Indices(candidates.fixed_bits() & FIXED_SLOT_BITS) {
                if fixed_nibble(self.fixed_ctrl, index) == 0 {
                    idle |= CounterSet::fixed(index).0;
                }
            }
            self.in_use.0 &= !idle;
        }
        #[cfg(debug_assertions)]
        {
            let shrunk = self.in_use;
            self.recompute_in_use();
            debug_assert_eq!(
                shrunk, self.in_use,
                "a counter outside in_use was programmed"
            );
        }
    }

    /// Whether any counter can count on the hardware: enabled locally (after the filter) and
    /// globally. Only counters in use can: a hardware control is the guest's with bits
    /// cleared, and a counter with a non-zero guest control is in use.
    #[inline]
    pub(crate) fn counts_anything(&self) -> bool {
        let candidates = self.in_use.intersection(CounterSet(self.global_ctrl));
        let gp = Indices(candidates.gp_bits() & GP_SLOT_BITS)
            .any(|i| self.event_selects_hw[i as usize] & EVTSEL_EN != 0);
        gp || candidates
            .fixed_indices()
            .any(|i| fixed_nibble(self.fixed_ctrl_hw, i) & (FIXED_OS | FIXED_USR) != 0)
    }

    /// The GLOBAL_STATUS bits live on the hardware that belong to this context: its in-use
    /// counters, and OvfBuffer when it owns a DS area.
    pub(crate) fn live_status_bits(&self) -> u64 {
        let buffer = if self.ds_area != 0 {
            crate::msrs::STATUS_OVF_BUFFER
        } else {
            0
        };
        self.in_use.0 | buffer
    }
}

/// The two banks of [`IntelCaps::banks`], for the core's save/load loops.
impl CounterBanks for IntelContext {
    fn values(&self, bank: usize) -> &[u64] {
        match bank {
            GP_BANK => &self.gp_counters,
            _ => &self.fixed_counters,
        }
    }

    fn saved_mut(&mut self, bank: usize) -> (&mut [u64], &[u64]) {
        match bank {
            GP_BANK => (&mut self.gp_counters, &self.event_selects_hw),
            _ => (
                &mut self.fixed_counters,
                core::slice::from_ref(&self.fixed_ctrl_hw),
            ),
        }
    }

    fn hardware_controls(&self, bank: usize) -> &[u64] {
        match bank {
            GP_BANK => &self.event_selects_hw,
            _ => core::slice::from_ref(&self.fixed_ctrl_hw),
        }
    }

    fn interrupt_enabled(&self, bank: usize, index: u32) -> bool {
        match bank {
            GP_BANK => self
                .event_select(index)
                .is_some_and(|select| select & EVTSEL_INT != 0),
            _ => fixed_nibble(self.fixed_ctrl, index) & FIXED_PMI != 0,
        }
    }
}
