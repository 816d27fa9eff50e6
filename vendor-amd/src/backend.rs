//! The AMD [`PmuBackend`]: MSR emulation, save/load, and overflow detection.

use raw_cpuid::CpuIdReader;
use vpmu::abi::{AmdBanks, VendorArea, VendorLayout, XENPMU_REFUSED_RESERVED};
use vpmu::bank::{self, BankMap, HwRecord, SaveControls, StatusMsrs};
use vpmu::{
    ContextError, CounterIndex, CounterSet, GuestPolicy, Msr, MsrBus, MsrFault, MsrOutcome,
    Overflow, PmuBackend, PmuCapabilities, PublishedImages, RearmPeriods,
};

use crate::caps::{AmdCaps, EXT_CORE_BANK, EnumerationError, K7_BANK, Lookup};
use crate::context::{AmdContext, PageWindows};
use crate::msrs::{
    COUNTER_TOP_BIT, GLOBAL_CTL, GLOBAL_STATUS, GLOBAL_STATUS_CLR, MSR_RANGES, Register, ctl,
};
use crate::policy;

/// Why an [`AmdPmu`] could not be built.
pub type BackendError = vpmu::BackendError<EnumerationError>;

const STATUS: StatusMsrs = StatusMsrs {
    status: Msr(GLOBAL_STATUS),
    acknowledge: Msr(GLOBAL_STATUS_CLR),
};

/// Where overflow detection before PerfMonV2 reads a counter's value.
#[derive(Clone, Copy, Debug)]
enum CounterValues {
    /// From the hardware (at a PMI, the context loaded).
    Hardware,
    /// From the context (at save, which has just read them from the hardware).
    Saved,
}

/// The AMD core-PMU backend for one enumerated PMU.
#[derive(Clone, Copy, Debug)]
pub struct AmdPmu {
    caps: AmdCaps,
    capabilities: PmuCapabilities,
    /// The one counter bank, in the form the core's bank loops take.
    msr_banks: [BankMap; 1],
    /// Every counter present (`capabilities.all_counters()`, which every load needs).
    present: CounterSet,
    page_banks: AmdBanks,
    /// `page_banks` as the flush reads it.
    page_windows: PageWindows,
}

impl AmdPmu {
    /// The backend for the PMU `caps` describes.
    pub fn new(caps: AmdCaps) -> Result<Self, BackendError> {
        let page_banks =
            AmdBanks::new(caps.gp_counters()).map_err(vpmu::BackendError::PageLayout)?;
        let page_windows = PageWindows::new(&page_banks).map_err(vpmu::BackendError::PageLayout)?;
        Ok(Self {
            caps,
            capabilities: caps.pmu_capabilities(),
            present: caps.pmu_capabilities().all_counters(),
            msr_banks: caps.banks(),
            page_banks,
            page_windows,
        })
    }

    /// Enumerates through `reader` and builds the backend (see [`AmdCaps::from_cpuid`]).
    pub fn from_cpuid<R: CpuIdReader>(reader: R) -> Result<Self, BackendError> {
        Self::new(AmdCaps::from_cpuid(reader)?)
    }

    /// The enumeration this backend was built from.
    pub fn caps(&self) -> &AmdCaps {
        &self.caps
    }

    /// The counter bank.
    pub(crate) fn bank(&self) -> &BankMap {
        &self.msr_banks[0]
    }

    /// Cleans a CPU's PMU: every control 0 and, with PerfMonV2, GlobalCtl 0 and no status
    /// bit. Call once per CPU before the first `load` (hardware resets GlobalCtl to
    /// all-enabled); a [`HwRecord`] of this CPU then knows every control 0 and nothing else.
    pub fn clean_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        if self.caps.has_perfmon_v2() {
            hw.write(Msr(GLOBAL_CTL), 0)?;
        }
        for i in 0..self.caps.gp_counters() {
            hw.write(self.bank().control_msr(i), 0)?;
        }
        if self.caps.has_perfmon_v2() {
            hw.write(Msr(GLOBAL_STATUS_CLR), self.caps.counter_mask())?;
        }
        Ok(())
    }

    /// Whether a loaded context must have its GlobalCtl written when its first counter is put
    /// in use (a loaded context always has one in use, so this is a fallback: `load` makes
    /// the hardware GlobalCtl the context's, and `save` clears it).
    fn global_on_hardware(&self, ctx: &AmdContext) -> bool {
        self.caps.has_perfmon_v2() && !ctx.in_use.is_empty() && ctx.global_ctl != 0
    }

    /// Finds the counters of the loaded `ctx` that overflowed and records them. PerfMonV2:
    /// GlobalStatus read, folded into the virtual status, acknowledged with STATUS_CLR.
    /// Before PerfMonV2 (no status register), Linux's rule: an in-use, armed counter with EN
    /// on the hardware and INT, whose value now has its top bit clear, has wrapped; it is
    /// disarmed. `values` says where that value is read. The controls now stand for the
    /// controls at the overflow: a control write that sets INT retires the overflows found
    /// before it ([`AmdPmu::retire_silent_overflow`]).
    #[inline]
    fn collect_overflows<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: &mut B,
        values: CounterValues,
    ) -> Result<Overflow, MsrFault> {
        let overflowed = if self.caps.has_perfmon_v2() {
            let mask = self.caps.counter_mask();
            CounterSet(STATUS.fold(hw, mask, mask, &mut ctx.global_status)?)
        } else {
            let mut overflowed = CounterSet::EMPTY;
            for i in ctx.in_use.intersection(ctx.armed).gp_indices() {
                let (guest, hardware) = (ctx.guest_ctl[i as usize], ctx.hw_ctl[i as usize]);
                if hardware & ctl::EN == 0 || guest & ctl::INT == 0 {
                    continue;
                }
                let value = match values {
                    CounterValues::Hardware => self.bank().read_counter(hw, i)?,
                    CounterValues::Saved => ctx.counters[i as usize],
                };
                if value & COUNTER_TOP_BIT == 0 {
                    overflowed = overflowed.union(CounterSet::gp(i));
                    ctx.armed.0 &= !CounterSet::gp(i).0;
                }
            }
            overflowed
        };
        Ok(bank::overflow(&self.msr_banks, ctx, overflowed))
    }

    /// Called before a control write sets INT on counter `index`. An overflow that already
    /// happened raised no PMI, as INT was clear: it is retired so that it never becomes one
    /// (the guest still sees it). PerfMonV2, in use: its hardware status bit is recorded in the
    /// virtual status and acknowledged, so that a hardware status bit of a counter with INT
    /// always means an overflow that raised a PMI. Before PerfMonV2: an armed counter that
    /// already wrapped (top bit clear) is disarmed. `hw` as for `guest_write`.
    fn retire_silent_overflow<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        index: u32,
    ) -> Result<(), MsrFault> {
        let counter = CounterSet::gp(index);
        let live = match hw {
            Some(hw) if ctx.in_use.contains(counter) => hw,
            // Not on the hardware: the context's value is current, and the hardware status
            // holds nothing of this counter (it is clean between contexts).
            _ => {
                if !self.caps.has_perfmon_v2()
                    && ctx.counter(index).is_some_and(|v| v & COUNTER_TOP_BIT == 0)
                {
                    ctx.armed.0 &= !counter.0;
                }
                return Ok(());
            }
        };
        if self.caps.has_perfmon_v2() {
            STATUS.fold(live, counter.0, counter.0, &mut ctx.global_status)?;
        } else if ctx.armed.contains(counter)
            && self.bank().read_counter(live, index)? & COUNTER_TOP_BIT == 0
        {
            ctx.armed.0 &= !counter.0;
        }
        Ok(())
    }

    #[inline(always)]
    fn write_control<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        mut hw: Option<&mut B>,
        index: u32,
        control: policy::Control,
    ) -> Result<(), MsrFault> {
        let i = index as usize;
        // The interrupt enable this write turns on (the new value's bit tested first: most
        // writes have none to turn on).
        if control.guest & ctl::INT != 0 && ctx.control(index).unwrap_or(0) & ctl::INT == 0 {
            self.retire_silent_overflow(ctx, hw.as_deref_mut(), index)?;
        }
        let starts = control.hardware & ctl::EN != 0;
        let counter = CounterSet::gp(index);
        match hw {
            Some(hw) if ctx.in_use.contains(counter) => {
                hw.write(self.bank().control_msr(index), control.hardware)?;
            }
            Some(hw) if starts => {
                // The hardware counter may hold another vCPU's value: program ours first.
                let first = ctx.in_use.is_empty();
                bank::write_counters(&self.msr_banks, ctx, counter, hw)?;
                hw.write(self.bank().control_msr(index), control.hardware)?;
                ctx.in_use = ctx.in_use.union(counter);
                if first && self.global_on_hardware(ctx) {
                    hw.write(Msr(GLOBAL_CTL), ctx.global_ctl)?;
                }
            }
            Some(_) => {}
            None => {
                if starts {
                    ctx.in_use = ctx.in_use.union(counter);
                } else {
                    ctx.in_use.0 &= !counter.0;
                }
            }
        }
        if let (Some(guest), Some(hardware)) = (ctx.guest_ctl.get_mut(i), ctx.hw_ctl.get_mut(i)) {
            *guest = control.guest;
            *hardware = control.hardware;
        }
        Ok(())
    }
}

impl AmdPmu {
    /// A guest write of counter `index` (present): through to the hardware while in use.
    #[inline]
    fn write_counter_value<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        index: u32,
        value: u64,
    ) -> Result<(), MsrFault> {
        let value = policy::counter(value);
        if let Some(hw) = hw {
            if ctx.in_use.contains(CounterSet::gp(index)) {
                self.bank().write_counter(hw, index, value)?;
            }
        }
        ctx.set_counter(index as usize, value);
        Ok(())
    }

    /// `read_register` of a present register that is not a counter value.
    #[inline(never)]
    fn read_control_register<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        register: Register,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        let value = match register {
            Register::Control(index) => ctx.control(index),
            // Not reached through `read_register`, which reads counters itself.
            Register::Counter(_) => return self.read_register(ctx, hw, Lookup::Present(register)),
            Register::GlobalCtl => Some(ctx.global_ctl),
            Register::GlobalStatus => {
                // Overflows since the last PMI are still only in the hardware register.
                let pending = match hw {
                    Some(hw) if !ctx.in_use.is_empty() => hw.read(Msr(GLOBAL_STATUS))?,
                    _ => 0,
                };
                Some(ctx.global_status | (pending & self.caps.counter_mask()))
            }
            Register::GlobalStatusClr | Register::GlobalStatusSet => Some(0),
        };
        // `lookup` only answers Present for indices below the counter count.
        Ok(value.map_or(MsrOutcome::GeneralProtection, MsrOutcome::Handled))
    }

    /// A guest write of PERF_CTL `index`, validated by [`policy::control`] (its one owner).
    #[inline(always)]
    fn write_control_checked<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        guest_policy: &GuestPolicy<'_>,
        index: u32,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Ok(control) = policy::control(value, guest_policy) else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        self.write_control(ctx, hw, index, control)?;
        Ok(MsrOutcome::Handled(()))
    }

    /// A guest write of PerfCntrGlobalCtl: written through only if it changes what the
    /// hardware holds (the context's value while loaded with a counter in use).
    #[inline(never)]
    fn write_global_ctl<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Ok(value) = policy::global_ctl(value, self.present.0) else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        if let Some(hw) = hw {
            if !ctx.in_use.is_empty() && value != ctx.global_ctl {
                hw.write(Msr(GLOBAL_CTL), value)?;
            }
        }
        ctx.global_ctl = value;
        Ok(MsrOutcome::Handled(()))
    }

    /// `write_register` of a present register that is none of those it dispatches itself.
    #[inline(never)]
    fn write_control_register<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        guest_policy: &GuestPolicy<'_>,
        register: Register,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        // The counter mask, precomputed at enumeration (`present`).
        let mask = self.present.0;
        match register {
            Register::Counter(_) | Register::Control(_) | Register::GlobalCtl => {
                return self.write_register(
                    ctx,
                    hw,
                    guest_policy,
                    Lookup::Present(register),
                    value,
                );
            }
            // Read-only. KVM ignores the write (AMD's "writes to read-only MSRs are ignored");
            // faulting tells a confused guest at once and leaves nothing half-done.
            Register::GlobalStatus => return Ok(MsrOutcome::GeneralProtection),
            Register::GlobalStatusClr => {
                let bits = policy::global_status_clear(value, mask);
                if let Some(hw) = hw {
                    if !ctx.in_use.is_empty() && bits != 0 {
                        hw.write(Msr(GLOBAL_STATUS_CLR), bits)?;
                    }
                }
                ctx.global_status &= !bits;
            }
            Register::GlobalStatusSet => {
                let Ok(bits) = policy::global_status_set(value, mask) else {
                    return Ok(MsrOutcome::GeneralProtection);
                };
                ctx.global_status |= bits;
            }
        }
        Ok(MsrOutcome::Handled(()))
    }
}

impl PmuBackend for AmdPmu {
    type Context = AmdContext;
    /// The decoded register, or `Absent` for an MSR of the architecture this PMU lacks.
    type Register = Lookup;

    fn capabilities(&self) -> &PmuCapabilities {
        &self.capabilities
    }

    fn msr_ranges(&self) -> &'static [(u32, u32)] {
        MSR_RANGES
    }

    #[inline]
    fn classify(&self, msr: Msr) -> Option<Lookup> {
        match self.caps.lookup(msr) {
            Lookup::NotPmu => None,
            found => Some(found),
        }
    }

    fn new_context(&self) -> AmdContext {
        AmdContext::reset(&self.caps)
    }

    fn init_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        self.clean_hardware(hw)
    }

    /// True while a counter is in use: one is programmed to count, or one was stopped while
    /// loaded and its value is still only on the hardware (the next `save` fetches it).
    fn is_active(&self, ctx: &AmdContext) -> bool {
        !ctx.in_use.is_empty()
    }

    /// RDPMC ECX 0..n reads core counter n: the K7 PERF_CTRs, or with PerfCtrExtCore the
    /// interleaved core counters (APM vol. 3, RDPMC). The northbridge and L2I/L3 counters
    /// (ECX 6..15) are not modelled, and ECX bits 31:30 are not an index: all of them #GP,
    /// as RDPMC of an unimplemented counter does.
    fn rdpmc_counter(&self, selector: u32) -> Option<Msr> {
        (selector < self.caps.gp_counters()).then(|| self.caps.counter_msr(selector))
    }

    #[inline]
    fn read_register<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        register: Lookup,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        let Lookup::Present(register) = register else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        // Counter values inline, every other register out of line (as for writes).
        let Register::Counter(index) = register else {
            return self.read_control_register(ctx, hw, register);
        };
        let value = match hw {
            Some(hw) if ctx.in_use.contains(CounterSet::gp(index)) => {
                Some(self.bank().read_counter(hw, index)?)
            }
            _ => ctx.counter(index),
        };
        // `lookup` only answers Present for indices below the counter count.
        Ok(value.map_or(MsrOutcome::GeneralProtection, MsrOutcome::Handled))
    }

    #[inline(always)]
    fn write_register<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: Option<&mut B>,
        guest_policy: &GuestPolicy<'_>,
        register: Lookup,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Lookup::Present(register) = register else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        // Counter values, the most frequent writes, stay in the caller's frame; every other
        // register is emulated out of line, one function each for the frequent controls, so
        // that a write takes one dispatch (this match) and one call.
        match register {
            Register::Counter(index) => {
                self.write_counter_value(ctx, hw, index, value)?;
                Ok(MsrOutcome::Handled(()))
            }
            Register::Control(index) => {
                self.write_control_checked(ctx, hw, guest_policy, index, value)
            }
            Register::GlobalCtl => self.write_global_ctl(ctx, hw, value),
            _ => self.write_control_register(ctx, hw, guest_policy, register, value),
        }
    }

    /// Stops and reads back the counters in use. PerfMonV2: GlobalCtl ← 0 (one write stops
    /// them all; none if the context's GlobalCtl, which the hardware holds while it is loaded,
    /// is 0), each counter read, the controls left programmed and recorded. Before PerfMonV2
    /// there is no global stop: each non-zero control ← 0 (what freezes its counter), then
    /// each counter read. Then the overflows are collected as a PMI would: PerfMonV2's
    /// hardware status folded into the virtual one and cleared only if non-zero; before
    /// PerfMonV2 the top-bit rule applied to the values just read (disarming what it finds, so
    /// the wrap is reported once, here or at a PMI). Returns every overflow found, as a PMI
    /// would: one already in the virtual status (the guest has not acknowledged it yet) that
    /// happened again raised a PMI again. Nothing in use: no access at all.
    #[inline]
    fn save<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault> {
        if ctx.in_use.is_empty() {
            return Ok(Overflow::default());
        }
        let in_use = ctx.in_use;
        let controls = if self.caps.has_perfmon_v2() {
            if ctx.global_ctl != 0 {
                record.set_global(None);
                hw.write(Msr(GLOBAL_CTL), 0)?;
            }
            record.set_global(Some(0));
            SaveControls::Keep
        } else {
            SaveControls::Clear
        };
        // The map as a constant of either kind, so that the inlined loop folds it.
        if self.caps.has_ext_core() {
            bank::save(&[EXT_CORE_BANK], ctx, in_use, controls, hw, record)?;
        } else {
            bank::save(&[K7_BANK], ctx, in_use, controls, hw, record)?;
        }
        let overflow = self.collect_overflows(ctx, hw, CounterValues::Saved)?;
        ctx.in_use = ctx.enabled_within(in_use);
        Ok(overflow)
    }

    /// Counters, then controls, then GlobalCtl (once something is in use) — each only if the record does not know the
    /// hardware holds it; the controls another context left on counters this one does not
    /// use are cleared. The virtual status stays in the context (guest reads combine it with
    /// the hardware's), so a counter that overflows again while its bit is pending still
    /// shows up as a new hardware status bit.
    #[inline]
    fn load<B: MsrBus>(
        &self,
        ctx: &AmdContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault> {
        // Even with nothing in use (the core loads no such context, but a caller may, and
        // then put counters in use by WRMSR): the controls other contexts left are cleared.
        let present = self.present;
        // The map as a constant of either kind, so that the inlined loops fold it.
        if self.caps.has_ext_core() {
            bank::load(&[EXT_CORE_BANK], ctx, ctx.in_use, present, hw, record)?;
        } else {
            bank::load(&[K7_BANK], ctx, ctx.in_use, present, hw, record)?;
        }
        if self.caps.has_perfmon_v2()
            && !ctx.in_use.is_empty()
            && record.global() != Some(ctx.global_ctl)
        {
            record.set_global(None);
            hw.write(Msr(GLOBAL_CTL), ctx.global_ctl)?;
            record.set_global(Some(ctx.global_ctl));
        }
        Ok(())
    }

    /// PerfMonV2: GlobalStatus read, folded into the virtual status, acknowledged with
    /// STATUS_CLR.
    ///
    /// Before PerfMonV2 there is no status register. An overflow is recognised the way Linux
    /// does it: a counter written with its top bit (47) set that now reads with it clear has
    /// wrapped. Only in-use, enabled counters with INT are read (only they raise a PMI). Limits:
    /// a counter armed with bit 47 clear (a period above 2^47) or one that wraps past bit 47
    /// again before the PMI is handled is not recognised; the guest's own driver, which applies
    /// the same rule to the values it reads, is the final judge, as in Xen.
    fn handle_overflow<B: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: &mut B,
    ) -> Result<Overflow, MsrFault> {
        if ctx.in_use.is_empty() {
            return Ok(Overflow::default());
        }
        self.collect_overflows(ctx, hw, CounterValues::Hardware)
    }

    /// Recomputes each control's hardware image with [`policy::restricted_control`]: the
    /// WRMSR validator's image where it still accepts the guest value, an image that cannot
    /// count (HostOnly dropped, GuestOnly forced, EN clear) where it now refuses it. The guest
    /// values stay; `in_use` follows the new images (the context is saved).
    fn restrict(
        &self,
        ctx: &mut AmdContext,
        guest_policy: &GuestPolicy<'_>,
    ) -> Option<ContextError> {
        let mut first = None;
        let controls = ctx.guest_ctl.iter().zip(&mut ctx.hw_ctl);
        for (index, (&guest, hardware)) in (0..self.caps.gp_counters()).zip(controls) {
            let control = policy::restricted_control(guest, guest_policy).unwrap_or_else(|c| {
                first = first.or_else(|| {
                    Some(ContextError {
                        register: "ctrl",
                        index: Some(index),
                        value: guest,
                        msr: self.caps.control_msr(index).0,
                        reason: policy::control(guest, guest_policy)
                            .err()
                            .map_or(XENPMU_REFUSED_RESERVED, |policy::Refused(r)| r),
                    })
                });
                c
            });
            *hardware = control.hardware;
        }
        ctx.in_use = ctx.enabled_on_hardware();
        first
    }

    fn masks_lvtpc_on_pmi(&self) -> bool {
        false
    }

    fn page_layout(&self) -> VendorLayout {
        VendorLayout::Amd(self.page_banks)
    }

    #[inline]
    fn context_to_page(&self, ctx: &AmdContext, area: &mut VendorArea) {
        ctx.to_page(&self.caps, &self.page_banks, area);
    }

    fn context_from_page_into(
        &self,
        area: &VendorArea,
        saved: &AmdContext,
        images: PublishedImages,
        guest_policy: &GuestPolicy<'_>,
        out: &mut AmdContext,
    ) -> Result<(), ContextError> {
        AmdContext::from_page_into(
            &self.caps,
            &self.page_windows,
            area,
            saved,
            images,
            guest_policy,
            out,
        )
    }

    fn rearm_period_max(&self, counter: CounterIndex) -> Option<u64> {
        self.period_max(counter)
    }

    fn rearm_overflowed<H: MsrBus>(
        &self,
        ctx: &mut AmdContext,
        hw: &mut H,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault> {
        self.rearm(ctx, hw, overflowed, periods)
    }
}
