//! A vCPU's AMD PMU state, and its conversion to and from the shared page's vendor area.

use vpmu::abi::{AmdBanks, AmdCtxt, VendorArea};
use vpmu::{ContextError, CounterSet, GuestPolicy};

use crate::caps::AmdPmu;
use crate::msrs::{COUNTER_TOP_BIT, MAX_COUNTERS, ctl};
use crate::policy;

const N: usize = MAX_COUNTERS as usize;

/// A vCPU's virtual AMD PMU.
///
/// Controls are kept twice: as the guest wrote them (what it reads back and what the page
/// shows) and as they go to the hardware (GuestOnly forced, EN cleared for filtered events), so
/// policy is applied once, at write time.
///
/// `live` is the set of counters whose value is on the hardware while the context is loaded:
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
    pub(crate) live: u8,
    /// Pre-PerfMonV2 overflow detection: counters last written with the top bit set, not yet
    /// seen wrapped.
    pub(crate) armed: u8,
}

impl AmdContext {
    /// The reset state of `pmu`: everything zero, except PerfMonV2's GlobalCtl which resets to
    /// all counters enabled (KVM's `GENMASK(nr - 1, 0)`, emulating the hardware RESET value so
    /// that software written for the version-1 PMU counts without knowing GlobalCtl).
    pub(crate) fn reset(pmu: &AmdPmu) -> Self {
        Self {
            counters: [0; N],
            guest_ctl: [0; N],
            hw_ctl: [0; N],
            global_ctl: if pmu.has_perfmon_v2() {
                pmu.counter_mask()
            } else {
                0
            },
            global_status: 0,
            live: 0,
            armed: 0,
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

    /// Counters whose value lives on the hardware while loaded.
    pub fn live_counters(&self) -> CounterSet {
        CounterSet(u64::from(self.live))
    }

    pub(crate) fn is_live(&self, index: u32) -> bool {
        self.live & bit(index) != 0
    }

    /// The counters whose hardware control has EN: what must be live at the next load.
    pub(crate) fn enabled_on_hardware(&self) -> u8 {
        (0..MAX_COUNTERS)
            .filter(|&i| self.hw_ctl[i as usize] & ctl::EN != 0)
            .fold(0, |set, i| set | bit(i))
    }

    pub(crate) fn set_counter(&mut self, index: usize, value: u64) {
        if let Some(slot) = self.counters.get_mut(index) {
            *slot = value;
            let mask = bit(index as u32);
            if value & COUNTER_TOP_BIT != 0 {
                self.armed |= mask;
            } else {
                self.armed &= !mask;
            }
        }
    }

    /// Writes this context into `area` through the backend's own `banks`.
    pub(crate) fn to_page(&self, pmu: &AmdPmu, banks: &AmdBanks, area: &mut VendorArea) {
        let mut fixed = AmdCtxt::default();
        banks.describe_in(&mut fixed);
        if pmu.has_perfmon_v2() {
            fixed.global_ctrl = self.global_ctl;
            fixed.global_status = self.global_status;
        }
        area.set_amd_ctxt(&fixed);
        for i in 0..pmu.counters() as usize {
            // Cannot fail: `banks` was built for exactly `pmu.counters()` counters, and both
            // arrays hold `MAX_COUNTERS` ≥ that many.
            let _ = banks.set_counter(area, i, self.counters[i]);
            let _ = banks.set_ctrl(area, i, self.guest_ctl[i]);
        }
    }

    /// Builds a context from a guest-edited `area`, addressing the banks through `banks` (never
    /// through the geometry words in the area) and checking every register with the WRMSR
    /// validators. `saved` is the context the page was filled from: a control left exactly as
    /// it published it is not refused but restricted ([`policy::restricted_control`]), so an
    /// unedited page flushes whatever the policy became since.
    pub(crate) fn from_page(
        pmu: &AmdPmu,
        banks: &AmdBanks,
        area: &VendorArea,
        saved: &AmdContext,
        guest_policy: &GuestPolicy<'_>,
    ) -> Result<Self, ContextError> {
        let mut ctx = Self::reset(pmu);
        for i in 0..pmu.counters() as usize {
            let index = Some(i as u32);
            let refused = |register, value| ContextError {
                register,
                index,
                value,
            };
            let raw = banks.counter(area, i).map_err(|_| refused("counter", 0))?;
            let value = policy::counter(raw).map_err(|_| refused("counter", raw))?;
            ctx.set_counter(i, value);
            let raw = banks.ctrl(area, i).map_err(|_| refused("ctrl", 0))?;
            let control = if saved.guest_ctl.get(i) == Some(&raw) {
                policy::restricted_control(raw, guest_policy).unwrap_or_else(|c| c)
            } else {
                policy::control(raw, guest_policy).map_err(|_| refused("ctrl", raw))?
            };
            ctx.guest_ctl[i] = control.guest;
            ctx.hw_ctl[i] = control.hardware;
        }
        let fixed = area.amd_ctxt();
        let refused = |register, value| ContextError {
            register,
            index: None,
            value,
        };
        if pmu.has_perfmon_v2() {
            ctx.global_ctl = policy::global_ctl(fixed.global_ctrl, pmu.counter_mask())
                .map_err(|_| refused("global_ctrl", fixed.global_ctrl))?;
            ctx.global_status =
                policy::global_status_from_page(fixed.global_status, saved.global_status)
                    .map_err(|_| refused("global_status", fixed.global_status))?;
        } else {
            // Without PerfMonV2 these registers do not exist; the only legal content is 0.
            if fixed.global_ctrl != 0 {
                return Err(refused("global_ctrl", fixed.global_ctrl));
            }
            if fixed.global_status != 0 {
                return Err(refused("global_status", fixed.global_status));
            }
        }
        ctx.live = ctx.enabled_on_hardware();
        Ok(ctx)
    }
}

pub(crate) const fn bit(index: u32) -> u8 {
    1 << (index & 7)
}
