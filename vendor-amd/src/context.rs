//! A vCPU's AMD PMU state, and its conversion to and from the shared page's vendor area.

use core::mem::offset_of;

use vpmu::abi::{
    AbiError, AmdBanks, AmdCtxt, VendorArea, XENPMU_REFUSED_ABSENT, XENPMU_REFUSED_RESERVED,
};
use vpmu::bank::CounterBanks;
use vpmu::{ContextError, CounterSet, GuestPolicy, Indices, Msr, PublishedImages};

use crate::caps::AmdCaps;
use crate::msrs::{COUNTER_TOP_BIT, GLOBAL_CTL, GLOBAL_STATUS, MAX_COUNTERS, ctl};
use crate::policy::{self, Control, Refused};

const N: usize = MAX_COUNTERS as usize;
/// The indices with a slot, as a bitmap.
const SLOT_BITS: u32 = ((1u64 << N) - 1) as u32;

/// A vCPU's virtual AMD PMU.
///
/// Controls are kept twice: as the guest wrote them (what it reads back and what the page
/// shows) and as they go to the hardware (GuestOnly forced, EN cleared for filtered events), so
/// policy is applied once, at write time.
///
/// `in_use` is the set of counters whose value is on the hardware while the context is loaded:
/// at rest it is exactly the counters with EN in their hardware control; while loaded it only
/// grows (a counter the guest stops keeps its value on the hardware until the next save).
/// Counters outside it are read from and written to the context alone, which is what keeps a
/// stale value of another vCPU in an unused hardware counter invisible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmdContext {
    pub(crate) counters: [u64; N],
    pub(crate) guest_ctl: [u64; N],
    pub(crate) hw_ctl: [u64; N],
    pub(crate) global_ctl: u64,
    pub(crate) global_status: u64,
    pub(crate) in_use: CounterSet,
    /// Pre-PerfMonV2 overflow detection: counters last written with the top bit set, not yet
    /// seen wrapped.
    pub(crate) armed: CounterSet,
}

impl AmdContext {
    /// The reset state of `caps`: everything zero, except PerfMonV2's GlobalCtl which resets to
    /// all counters enabled (KVM's `GENMASK(nr - 1, 0)`, emulating the hardware RESET value so
    /// that software written for the version-1 PMU counts without knowing GlobalCtl).
    pub(crate) fn reset(caps: &AmdCaps) -> Self {
        Self {
            counters: [0; N],
            guest_ctl: [0; N],
            hw_ctl: [0; N],
            global_ctl: if caps.has_perfmon_v2() {
                caps.counter_mask()
            } else {
                0
            },
            global_status: 0,
            in_use: CounterSet::EMPTY,
            armed: CounterSet::EMPTY,
        }
    }

    /// Counter `index` as last saved or written (not the live hardware value while loaded).
    pub fn counter(&self, index: u32) -> Option<u64> {
        self.counters.get(index as usize).copied()
    }

    /// PERF_CTL `index` as the guest wrote it.
    pub fn control(&self, index: u32) -> Option<u64> {
        self.guest_ctl.get(index as usize).copied()
    }

    /// PERF_CTL `index` as it is programmed on the hardware.
    pub fn hardware_control(&self, index: u32) -> Option<u64> {
        self.hw_ctl.get(index as usize).copied()
    }

    /// PerfCntrGlobalCtl (0 without PerfMonV2).
    pub fn global_ctl(&self) -> u64 {
        self.global_ctl
    }

    /// The virtual PerfCntrGlobalStatus as of the last save or PMI (0 without PerfMonV2).
    pub fn global_status(&self) -> u64 {
        self.global_status
    }

    /// Counters whose value lives on the hardware while loaded: the ones save and load touch.
    pub fn in_use(&self) -> CounterSet {
        self.in_use
    }

    /// The counters whose hardware control has EN: what must be in use at the next load.
    pub(crate) fn enabled_on_hardware(&self) -> CounterSet {
        (0..MAX_COUNTERS)
            .filter(|&i| self.hw_ctl[i as usize] & ctl::EN != 0)
            .fold(CounterSet::EMPTY, |set, i| set.union(CounterSet::gp(i)))
    }

    /// The counters of `set` whose hardware control has EN: after a save, with `set` the
    /// counters in use, what [`AmdContext::enabled_on_hardware`] gives (a control with EN
    /// puts its counter in use, and `in_use` only grows while loaded).
    #[inline(always)]
    pub(crate) fn enabled_within(&self, set: CounterSet) -> CounterSet {
        // Within the slots (no counter outside them is ever in use), so that the compiler sees
        // every index in range. Every counter starts enabled and the few without EN (a
        // counter the guest stopped since the load) leave, out of line: the loop is a test
        // and a branch not taken per counter.
        let mut enabled = set.gp_bits() & SLOT_BITS;
        for index in Indices(enabled) {
            if self.hw_ctl[index as usize] & ctl::EN == 0 {
                enabled = without(enabled, index);
            }
        }
        let enabled = CounterSet(u64::from(enabled));
        debug_assert_eq!(enabled, self.enabled_on_hardware(), "EN outside in_use");
        enabled
    }

    pub(crate) fn set_counter(&mut self, index: usize, value: u64) {
        if let Some(slot) = self.counters.get_mut(index) {
            *slot = value;
            let counter = CounterSet::gp(index as u32);
            if value & COUNTER_TOP_BIT != 0 {
                self.armed = self.armed.union(counter);
            } else {
                self.armed.0 &= !counter.0;
            }
        }
    }

    /// Writes this context into `area` through the backend's own `banks`.
    #[inline]
    pub(crate) fn to_page(&self, caps: &AmdCaps, banks: &AmdBanks, area: &mut VendorArea) {
        let mut fixed = AmdCtxt::default();
        banks.describe_in(&mut fixed);
        if caps.has_perfmon_v2() {
            fixed.global_ctrl = self.global_ctl;
            fixed.global_status = self.global_status;
        }
        area.set_amd_ctxt(&fixed);
        // `banks` was built for exactly `caps.gp_counters()` counters, and both arrays hold
        // `MAX_COUNTERS` ≥ that many: every counter is written.
        banks.set_banks(area, &self.counters, &self.guest_ctl);
    }

    /// Verifies a guest-edited `area`, addressing the banks through `windows` (the backend's
    /// layout, never the geometry words in the area) and checking every register with the
    /// WRMSR validators, and only if all pass writes the context it describes into `out`: on a
    /// refusal `out` is left as it was. `saved` is the context the page was filled from: a
    /// control left exactly as it published it is not refused but restricted
    /// ([`policy::restricted_control`]), so an unedited page flushes whatever the policy became
    /// since; with `images` [`PublishedImages::Current`] its image is the one `saved` holds,
    /// taken as it is.
    ///
    /// The banks are read in one straight pass over whole slots; the counters are judged as a
    /// bank and taken as a WRMSR takes them ([`policy::page_counters`]: bits above the 48
    /// counter bits dropped, never refused), and only the live slots' controls one by one, in
    /// the page's order (the controls, then the global registers). A refusal names the
    /// register, the MSR a WRMSR of it would name (the PerfCtrExtCore alias where the PMU has
    /// it, else the K7 one) and the validator's reason.
    pub(crate) fn from_page_into(
        caps: &AmdCaps,
        windows: &PageWindows,
        area: &VendorArea,
        saved: &AmdContext,
        images: PublishedImages,
        guest_policy: &GuestPolicy<'_>,
        out: &mut AmdContext,
    ) -> Result<(), ContextError> {
        let current = images == PublishedImages::Current;
        let bank_error = |register, msr: Msr| ContextError {
            register,
            index: Some(0),
            value: 0,
            msr: msr.0,
            reason: XENPMU_REFUSED_RESERVED,
        };
        // Never taken: the windows were checked against the area when they were made.
        let Some(counter_window) = windows.counters(area) else {
            return Err(bank_error("counter", caps.counter_msr(0)));
        };
        let Some(ctrl_window) = windows.ctrls(area) else {
            return Err(bank_error("ctrl", caps.control_msr(0)));
        };
        // A counter and control both 0 pass every validator as 0: only the others ("live")
        // are judged, lowest index first; most slots are not live (a branch each).
        let mut counters = *counter_window;
        let mut guest_ctl = *ctrl_window;
        let mut union = 0u64;
        let mut live_set = 0u32;
        for (i, (&counter, &control)) in counters.iter().zip(&guest_ctl).enumerate() {
            union |= counter;
            if counter | control != 0 {
                live_set |= 1 << i;
            }
        }
        if windows.partial {
            // The words of a window past its bank are not the bank's: 0, as the context holds
            // the slots past the bank.
            windows.trim(&mut counters, &mut guest_ctl);
            live_set &= windows.slots;
            union = counters.iter().fold(0, |union, &value| union | value);
        }
        // Counters are taken as their WRMSR takes them; `live_set` stays a superset of the
        // slots with a non-zero word, which is all the loop below needs.
        policy::page_counters(&mut counters, union);
        let mut hw_ctl = [0u64; N];
        let mut armed = 0u64;
        let mut in_use = 0u64;
        let mut live = live_set;
        while live != 0 {
            let index = live.trailing_zeros();
            live &= live - 1;
            let i = index as usize;
            let (
                Some(&counter),
                Some(&raw_ctl),
                Some(&published),
                Some(&published_hw),
                Some(hardware),
            ) = (
                counters.get(i),
                guest_ctl.get(i),
                saved.guest_ctl.get(i),
                saved.hw_ctl.get(i),
                hw_ctl.get_mut(i),
            )
            else {
                continue;
            };
            let refused = |register, value, Refused(reason)| ContextError {
                register,
                index: Some(index),
                value,
                msr: caps.control_msr(index).0,
                reason,
            };
            if counter & COUNTER_TOP_BIT != 0 {
                armed |= CounterSet::gp(index).0;
            }
            let control = if raw_ctl == published {
                if current {
                    Control {
                        guest: raw_ctl,
                        hardware: published_hw,
                    }
                } else {
                    policy::restricted_control(raw_ctl, guest_policy).unwrap_or_else(|c| c)
                }
            } else {
                policy::control(raw_ctl, guest_policy)
                    .map_err(|why| refused("ctrl", raw_ctl, why))?
            };
            debug_assert_eq!(control.guest, raw_ctl);
            *hardware = control.hardware;
            if control.hardware & ctl::EN != 0 {
                in_use |= CounterSet::gp(index).0;
            }
        }
        // The two registers of `AmdCtxt` (not its geometry words, which are never read back),
        // each read from its own word: no copy of the whole fixed part. Both lie in the fixed
        // part, well inside the area (8-byte aligned `repr(C)`, checked by the ABI).
        let at = |offset: usize| area.words.get(offset / size_of::<u64>()).map_or(0, |&w| w);
        let (page_global_ctrl, page_global_status) = (
            at(offset_of!(AmdCtxt, global_ctrl)),
            at(offset_of!(AmdCtxt, global_status)),
        );
        let refused = |register, msr, value, Refused(reason)| ContextError {
            register,
            index: None,
            value,
            msr,
            reason,
        };
        let (global_ctl, global_status) = if caps.has_perfmon_v2() {
            (
                policy::global_ctl(page_global_ctrl, caps.counter_mask())
                    .map_err(|why| refused("global_ctrl", GLOBAL_CTL, page_global_ctrl, why))?,
                policy::global_status_from_page(page_global_status, saved.global_status).map_err(
                    |why| refused("global_status", GLOBAL_STATUS, page_global_status, why),
                )?,
            )
        } else {
            // Without PerfMonV2 these registers do not exist; the only legal content is 0.
            let absent = Refused(XENPMU_REFUSED_ABSENT);
            if page_global_ctrl != 0 {
                return Err(refused("global_ctrl", GLOBAL_CTL, page_global_ctrl, absent));
            }
            if page_global_status != 0 {
                return Err(refused(
                    "global_status",
                    GLOBAL_STATUS,
                    page_global_status,
                    absent,
                ));
            }
            (0, 0)
        };

        // Verified: from here on nothing fails.
        out.counters = counters;
        out.guest_ctl = guest_ctl;
        out.hw_ctl = hw_ctl;
        out.global_ctl = global_ctl;
        out.global_status = global_status;
        out.armed = CounterSet(armed);
        out.in_use = CounterSet(in_use);
        debug_assert_eq!(out.in_use, out.enabled_on_hardware());
        Ok(())
    }
}

/// `set` without bit `index`, out of line (see [`AmdContext::enabled_within`]).
#[cold]
#[inline(never)]
fn without(set: u32, index: u32) -> u32 {
    set & !(1 << (index & 31))
}

/// Where the backend's layout puts the two banks in the vendor area, as windows of `N` words
/// each, computed once from [`AmdBanks`]: a flush reads both banks in one straight pass. The
/// words of a window past its bank (a PMU with fewer counters than slots) belong to whatever
/// follows it: they are zeroed (`trim`), never judged and never loaded. Only the backend's
/// layout is used: the geometry words in the page are the guest's to scribble on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageWindows {
    counters_word: usize,
    ctrls_word: usize,
    /// The slots inside the banks, as a bitmap, and whether the windows reach past them.
    slots: u32,
    partial: bool,
}

impl PageWindows {
    /// The windows of `banks`. Fails if a window would reach past the vendor area (it never
    /// does for the canonical layout: the fixed part and two banks of 6 take 20 of its 128
    /// words).
    pub(crate) fn new(banks: &AmdBanks) -> Result<Self, AbiError> {
        let mut ctxt = AmdCtxt::default();
        banks.describe_in(&mut ctxt);
        let word = |bytes: u32| bytes as usize / size_of::<u64>();
        let (counters_word, ctrls_word) = (word(ctxt.counters), word(ctxt.ctrls));
        let area_words = VendorArea::default().words.len();
        for (bank, start) in [("amd counters", counters_word), ("amd ctrls", ctrls_word)] {
            if start + N > area_words {
                return Err(AbiError::BankOutOfBounds {
                    bank,
                    offset: start * size_of::<u64>(),
                    count: ctxt.counter_count as usize,
                });
            }
        }
        let slots = ((1u64 << ctxt.counter_count.min(N as u32)) - 1) as u32;
        Ok(PageWindows {
            counters_word,
            ctrls_word,
            slots,
            partial: slots != SLOT_BITS,
        })
    }

    fn counters<'a>(&self, area: &'a VendorArea) -> Option<&'a [u64; N]> {
        area.words.get(self.counters_word..)?.first_chunk()
    }

    fn ctrls<'a>(&self, area: &'a VendorArea) -> Option<&'a [u64; N]> {
        area.words.get(self.ctrls_word..)?.first_chunk()
    }

    /// Zeroes the slots read past the banks.
    #[cold]
    fn trim(&self, counters: &mut [u64; N], controls: &mut [u64; N]) {
        for (i, (counter, control)) in counters.iter_mut().zip(controls).enumerate() {
            if self.slots & 1 << i == 0 {
                (*counter, *control) = (0, 0);
            }
        }
    }
}

/// The one bank of [`AmdCaps::banks`], for the core's save/load loops.
impl CounterBanks for AmdContext {
    fn values(&self, _bank: usize) -> &[u64] {
        &self.counters
    }

    fn saved_mut(&mut self, _bank: usize) -> (&mut [u64], &[u64]) {
        (&mut self.counters, &self.hw_ctl)
    }

    fn hardware_controls(&self, _bank: usize) -> &[u64] {
        &self.hw_ctl
    }

    fn interrupt_enabled(&self, _bank: usize, index: u32) -> bool {
        self.control(index)
            .is_some_and(|control| control & ctl::INT != 0)
    }
}
