//! The interface a vendor backend implements and the core drives.
//!
//! A backend owns every rule about its vendor's PMU: which MSRs exist for the enumerated PMU,
//! which guest writes are legal, how a context is saved and loaded, how an overflow shows
//! itself, and how a context maps to the shared page's vendor area. The core never interprets
//! a PMU register value itself; that keeps one owner for each MSR's validation.

use vpmu_abi::{VendorArea, VendorLayout};

use crate::bank::HwRecord;
use crate::msr::{Msr, MsrBus, MsrFault};
pub use crate::rearm::{CounterIndex, RearmPeriods, rearm_value};

/// Which vendor's PMU a backend drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// Intel architectural performance monitoring.
    Intel,
    /// AMD (and Hygon) core performance counters.
    Amd,
}

/// A set of counters in the global index space: general-purpose counter `i` is bit `i`, fixed
/// counter `i` is bit `32 + i` — the bit layout of Intel's GLOBAL_CTRL and GLOBAL_STATUS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CounterSet(pub u64);

impl CounterSet {
    /// Bit of fixed counter 0.
    pub const FIXED_BASE: u32 = 32;
    /// The empty set.
    pub const EMPTY: CounterSet = CounterSet(0);

    /// General-purpose counter `index` (`index` < 32).
    pub const fn gp(index: u32) -> Self {
        CounterSet(1 << (index & 31))
    }

    /// Fixed counter `index` (`index` < 32).
    pub const fn fixed(index: u32) -> Self {
        CounterSet(1 << (Self::FIXED_BASE + (index & 31)))
    }

    /// General-purpose counters `0..count`.
    pub const fn first_gp(count: u32) -> Self {
        if count >= 32 {
            CounterSet(0xffff_ffff)
        } else {
            CounterSet((1 << count) - 1)
        }
    }

    /// Whether every counter of `other` is in `self`.
    pub const fn contains(self, other: CounterSet) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Union.
    pub const fn union(self, other: CounterSet) -> Self {
        CounterSet(self.0 | other.0)
    }

    /// Intersection.
    pub const fn intersection(self, other: CounterSet) -> Self {
        CounterSet(self.0 & other.0)
    }

    /// Number of counters in the set.
    pub const fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// The general-purpose part as a bitmap of indices.
    pub const fn gp_bits(self) -> u32 {
        self.0 as u32
    }

    /// The fixed part as a bitmap of indices.
    pub const fn fixed_bits(self) -> u32 {
        (self.0 >> Self::FIXED_BASE) as u32
    }

    /// The general-purpose counters of the set, lowest index first.
    pub const fn gp_indices(self) -> Indices {
        Indices(self.gp_bits())
    }

    /// The fixed counters of the set, lowest index first.
    pub const fn fixed_indices(self) -> Indices {
        Indices(self.fixed_bits())
    }
}

/// The set bits of a 32-bit bitmap as indices, lowest first ([`CounterSet::gp_indices`],
/// [`CounterSet::fixed_indices`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Indices(pub u32);

impl Iterator for Indices {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let index = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(index)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = self.0.count_ones() as usize;
        (len, Some(len))
    }
}

impl ExactSizeIterator for Indices {}

/// Why a vendor backend could not be built; `E` is the vendor's enumeration error. Both vendor
/// crates name it `BackendError` (`vpmu_intel::BackendError`, `vpmu_amd::BackendError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendError<E> {
    /// The CPU's PMU is not one the backend drives.
    Enumeration(E),
    /// The enumerated counters do not fit the shared page's vendor area.
    PageLayout(vpmu_abi::AbiError),
}

impl<E> From<E> for BackendError<E> {
    fn from(error: E) -> Self {
        BackendError::Enumeration(error)
    }
}

impl<E: core::fmt::Display> core::fmt::Display for BackendError<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BackendError::Enumeration(error) => write!(f, "unsupported PMU: {error}"),
            BackendError::PageLayout(error) => {
                write!(f, "counters do not fit the vendor area: {error}")
            }
        }
    }
}

impl<E: core::error::Error + 'static> core::error::Error for BackendError<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            BackendError::Enumeration(error) => Some(error),
            BackendError::PageLayout(error) => Some(error),
        }
    }
}

/// What the enumerated PMU offers, in vendor-neutral terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmuCapabilities {
    /// The vendor.
    pub vendor: Vendor,
    /// Intel: architectural performance-monitoring version (CPUID.0AH:EAX bits 7:0).
    /// AMD: 1 without PerfMonV2, 2 with it.
    pub version: u8,
    /// Number of general-purpose counters.
    pub gp_counters: u8,
    /// Width of the general-purpose counters in bits.
    pub gp_width: u8,
    /// Fixed counters present, as a bitmap of indices (Intel; 0 on AMD).
    pub fixed_counters: u32,
    /// Width of the fixed counters in bits (Intel; 0 on AMD).
    pub fixed_width: u8,
    /// Whether global control/status registers exist (Intel v2+, AMD PerfMonV2).
    pub global_ctrl: bool,
    /// Intel: full-width counter writes through IA32_A_PMCx (PERF_CAPABILITIES bit 13).
    pub full_width_writes: bool,
}

impl PmuCapabilities {
    /// Every counter present, in the global index space.
    pub fn all_counters(&self) -> CounterSet {
        CounterSet::first_gp(u32::from(self.gp_counters)).union(CounterSet(
            u64::from(self.fixed_counters) << CounterSet::FIXED_BASE,
        ))
    }
}

/// What happened to an intercepted guest RDMSR/WRMSR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsrOutcome<T> {
    /// The access was emulated (the read's value, or the write applied).
    Handled(T),
    /// The access is illegal for this PMU: inject #GP into the guest.
    GeneralProtection,
    /// Not a PMU MSR of this vendor; someone else owns it.
    NotPmu,
}

/// A raw event selection as the event filter sees it: event select (12 bits on AMD, 8 on
/// Intel) and unit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawEvent {
    /// Event select.
    pub select: u16,
    /// Unit mask.
    pub umask: u8,
}

/// Decides which events a guest may actually count. A denied event is not a fault: the
/// guest reads back what it programmed, but the counter does not count (KVM's PMU event filter
/// semantics). Feature restrictions (`XENPMU_FEATURE_IPC_ONLY`, `..._ARCH_ONLY`) are different:
/// programming a forbidden event there is a #GP.
pub trait EventFilter {
    /// Whether a general-purpose counter programmed with `event` may count.
    fn allows(&self, event: RawEvent) -> bool;
    /// Whether fixed counter `index` may count.
    fn allows_fixed(&self, index: u32) -> bool;
}

/// The filter that allows everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllowAll;

impl EventFilter for AllowAll {
    fn allows(&self, _event: RawEvent) -> bool {
        true
    }

    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

/// What a flush may assume of the hardware images (the value each control takes on the
/// hardware once the policy has judged it) held in `saved`, the context a page was published
/// from. The core decides it from the policy epoch the images were computed under; the backend
/// only applies it to the controls the guest left exactly as published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PublishedImages {
    /// Every image in `saved` is the one the policy of this flush gives its control (both were
    /// judged under the same epoch): an unedited control keeps its image without being judged
    /// again. Restricting is a function of the control and the policy alone, so the result is
    /// the one [`PublishedImages::Stale`] computes.
    Current,
    /// The policy may have changed since `saved` was judged (or nobody vouches that it did
    /// not): an unedited control is restricted again, as [`PmuBackend::restrict`] does.
    Stale,
}

/// The policy a backend applies to one guest's accesses.
#[derive(Clone, Copy)]
pub struct GuestPolicy<'a> {
    /// Global `XENPMU_FEATURE_*` bits in force.
    pub features: u64,
    /// Per-domain event filter.
    pub filter: &'a dyn EventFilter,
    /// Whether this guest's counters may count while the hypervisor runs (the privileged
    /// profiler in hv/all mode). Everyone else counts its own guest context only.
    pub may_count_host: bool,
}

impl core::fmt::Debug for GuestPolicy<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GuestPolicy")
            .field("features", &self.features)
            .field("may_count_host", &self.may_count_host)
            .finish_non_exhaustive()
    }
}

impl GuestPolicy<'static> {
    /// No features, no filter, guest context only.
    pub const fn guest_default() -> Self {
        GuestPolicy {
            features: 0,
            filter: &AllowAll,
            may_count_host: false,
        }
    }
}

/// Counters found overflowed at a PMI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overflow {
    /// Which counters overflowed (now recorded in the context's virtual status).
    pub counters: CounterSet,
    /// Whether any of them has its interrupt enable set, so a PMI is due to the guest.
    pub interrupt: bool,
}

/// Why a guest-edited context from the shared page was refused at flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextError {
    /// Which register of the context (e.g. `"global_ctrl"`, `"evtsel"`).
    pub register: &'static str,
    /// Counter index for banked registers, else `None`.
    pub index: Option<u32>,
    /// The value refused.
    pub value: u64,
    /// The MSR number a WRMSR of the register would name (what the page's
    /// `FlushRefusal::msr` reports).
    pub msr: u32,
    /// Why: `vpmu_abi::XENPMU_REFUSED_*` (what the page's `FlushRefusal::reason` reports).
    pub reason: u32,
}

impl ContextError {
    /// The report a refused flush writes into the page (docs/abi.md, version 1.3).
    pub fn refusal(&self) -> vpmu_abi::FlushRefusal {
        vpmu_abi::FlushRefusal {
            msr: self.msr,
            reason: self.reason,
            value: self.value,
        }
    }
}

/// A vendor backend: everything vendor-specific the core needs.
pub trait PmuBackend {
    /// A vCPU's virtual PMU state (plain data, no heap). It is the authority for everything
    /// except the counter and status values while the context is loaded on hardware.
    /// `PartialEq` tells a policy change whether restricting a context changed anything.
    type Context: Clone + core::fmt::Debug + PartialEq;

    /// What the enumerated PMU offers.
    fn capabilities(&self) -> &PmuCapabilities;

    /// Every MSR number this vendor's PMU architecture defines, as inclusive ranges, whether or
    /// not the enumerated PMU has it: an integrator routes all of them to the vPMU so that
    /// absent ones fault instead of being answered by someone else.
    fn msr_ranges(&self) -> &'static [(u32, u32)];

    /// A register of this vendor's PMU MSR map, as [`PmuBackend::classify`] decodes an MSR
    /// number: the one decode of an intercepted access, shared by the core's check that the
    /// access is the vPMU's and the backend's emulation of it.
    type Register: Copy + core::fmt::Debug + PartialEq;

    /// Decodes `msr`: `None` when it is none of this vendor's PMU MSRs. A register of the
    /// architecture that the enumerated PMU lacks still decodes (its accesses #GP), so that
    /// nobody else answers for it. Exactly the MSRs of [`PmuBackend::msr_ranges`] decode.
    fn classify(&self, msr: Msr) -> Option<Self::Register>;

    /// Whether `msr` belongs to this vendor's PMU (present or not).
    fn owns(&self, msr: Msr) -> bool {
        self.classify(msr).is_some()
    }

    /// A context in the state the PMU has after reset.
    fn new_context(&self) -> Self::Context;

    /// Puts a pCPU's PMU into a clean state (no counter enabled, every control 0 — the core
    /// records that in the pCPU's [`HwRecord`] —, no stale status), whatever firmware or a
    /// previous owner left there. Called once per pCPU before its first load.
    fn init_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault>;

    /// Whether the context has anything that must be on the hardware while the vCPU runs
    /// (an enabled counter, or state the guest can observe changing). A context that is not
    /// active need not be loaded or saved at all.
    fn is_active(&self, ctx: &Self::Context) -> bool;

    /// Emulates a guest RDMSR of `register`. `hw` is the bus when the context is loaded on
    /// this CPU (live counter values are then read from it); `None` when it is saved. Never
    /// `NotPmu`: the register is this backend's.
    fn read_register<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: Option<&mut B>,
        register: Self::Register,
    ) -> Result<MsrOutcome<u64>, MsrFault>;

    /// Validates and emulates a guest WRMSR of `register`. Illegal values give
    /// `GeneralProtection` and change nothing. `hw` as for `read_register`: a loaded context
    /// is updated on the hardware too. Never `NotPmu`.
    fn write_register<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        register: Self::Register,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault>;

    /// The counter MSR whose value a guest RDPMC with ECX = `selector` returns, in the
    /// vendor's RDPMC numbering; `None` when the selector names no counter of this PMU (the
    /// RDPMC then raises #GP). The value is read as a guest RDMSR of that MSR reads it: RDPMC
    /// and RDMSR of a counter return the same bits on both vendors.
    fn rdpmc_counter(&self, selector: u32) -> Option<Msr>;

    /// A guest RDMSR of MSR number `msr`: [`PmuBackend::classify`], then
    /// [`PmuBackend::read_register`]; `NotPmu` if the MSR is not this backend's.
    fn guest_read<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: Option<&mut B>,
        msr: Msr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        match self.classify(msr) {
            Some(register) => self.read_register(ctx, hw, register),
            None => Ok(MsrOutcome::NotPmu),
        }
    }

    /// A guest WRMSR of MSR number `msr`: [`PmuBackend::classify`], then
    /// [`PmuBackend::write_register`]; `NotPmu` if the MSR is not this backend's.
    fn guest_write<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        match self.classify(msr) {
            Some(register) => self.write_register(ctx, hw, policy, register, value),
            None => Ok(MsrOutcome::NotPmu),
        }
    }

    /// Stops the context's counters on the hardware and reads their state back into `ctx`,
    /// leaving a hardware on which nothing counts for the next owner: the global control 0
    /// where the PMU has one (the controls stay programmed), every control of the context 0
    /// where it has none. `record` is the pCPU's [`HwRecord`]: save brings it up to date with
    /// what it read and what it left on the hardware (the context's hardware images, which
    /// the hardware holds while the context is loaded). Touches only the registers the
    /// context uses.
    ///
    /// Returns every overflow found on the hardware (folded into the context's virtual
    /// status), with `interrupt` set if any of them has its interrupt enabled: a PMI raised but
    /// not yet handled when the vCPU was switched out, which the core keeps pending and
    /// delivers when the vCPU next runs. A hardware status bit of a counter with its interrupt
    /// enabled always means an overflow that happened with it enabled: a backend acknowledges
    /// a silent overflow when the guest turns the interrupt on, as a new overflow of a counter
    /// whose previous one the guest has not acknowledged must interrupt again.
    ///
    /// On a fault the core makes `record` forget everything, so a backend need not keep it
    /// exact on the error path (nor mark an entry unknown before the write that changes it).
    fn save<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault>;

    /// Programs hardware on which nothing counts, as `record` describes it, with `ctx`:
    /// values and controls first, global enables last, each written only if `record` does not
    /// know the hardware holds it already; a control another context left programmed on a
    /// counter this one does not use is cleared. Updates `record`; on a fault the core makes
    /// it forget everything, as after [`PmuBackend::save`].
    fn load<B: MsrBus>(
        &self,
        ctx: &Self::Context,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault>;

    /// At a PMI, with `ctx` loaded: finds which counters overflowed, records them in the
    /// context's virtual status and acknowledges them on the hardware.
    fn handle_overflow<B: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: &mut B,
    ) -> Result<Overflow, MsrFault>;

    /// Whether delivering a PMI through the virtual LVTPC sets its mask bit (Intel does, AMD
    /// does not).
    fn masks_lvtpc_on_pmi(&self) -> bool;

    /// Where this backend puts its banks in the shared page.
    fn page_layout(&self) -> VendorLayout;

    /// Writes a saved context into the shared page's vendor area (bank geometry included).
    fn context_to_page(&self, ctx: &Self::Context, area: &mut VendorArea);

    /// Brings a saved context in line with `policy` after the policy changed (mode, features,
    /// the domain's event filter): every hardware image the context would load is recomputed
    /// with the same validators a WRMSR uses, and whatever the policy now refuses is made
    /// unable to count on the hardware (an enable cleared in the hardware image, a host-only
    /// qualifier dropped, a DS area no longer loaded) while the guest-visible values stay as
    /// the guest wrote them. Returns the first register that had to be restricted, if any
    /// (for a diagnostic); never fails. Must be idempotent.
    fn restrict(&self, ctx: &mut Self::Context, policy: &GuestPolicy<'_>) -> Option<ContextError>;

    /// Builds a context from a guest-edited vendor area (already copied out of the page).
    /// `saved` is the context as it was when the sample was taken. Every register is verified
    /// as a guest WRMSR of it would be; anything illegal is refused, never fixed up — except a
    /// control the guest left exactly as published in `saved`: it was legal when published,
    /// and if the policy changed since, it is restricted as [`PmuBackend::restrict`] does
    /// instead of refused, so that an unedited page always flushes.
    ///
    /// The by-value form of [`PmuBackend::context_from_page_into`], for callers without a
    /// context to write into; it vouches for nothing ([`PublishedImages::Stale`]).
    fn context_from_page(
        &self,
        area: &VendorArea,
        saved: &Self::Context,
        policy: &GuestPolicy<'_>,
    ) -> Result<Self::Context, ContextError> {
        let mut ctx = self.new_context();
        self.context_from_page_into(area, saved, PublishedImages::Stale, policy, &mut ctx)?;
        Ok(ctx)
    }

    /// [`PmuBackend::context_from_page`] written into `out`, the context the flush loads:
    /// on success every register of `out` is the verified one (nothing of its previous
    /// contents is left), on failure `out` is unchanged. Verifying in place spares the hot
    /// flush path a context built on the stack and moved into place. `images` says whether
    /// the hardware images in `saved` are those of `policy` already
    /// ([`PublishedImages::Current`]): the unedited controls then keep them unjudged, with the
    /// same result.
    fn context_from_page_into(
        &self,
        area: &VendorArea,
        saved: &Self::Context,
        images: PublishedImages,
        policy: &GuestPolicy<'_>,
        out: &mut Self::Context,
    ) -> Result<(), ContextError>;

    /// The largest re-arm period a ring (ABI 1.4) may give `counter`: the largest *p* that a
    /// guest's `wrmsr(counter, -p)` re-arms exactly on this PMU, by the same rule the WRMSR
    /// validator applies (2^(*w*−1) − 1 for a counter of width *w*; 2^31 − 1 for an Intel
    /// general-purpose counter without full-width writes, whose WRMSR sign-extends bit 31).
    /// `None` when the PMU has no such counter. Every period from 1 to the answer is valid.
    fn rearm_period_max(&self, counter: CounterIndex) -> Option<u64>;

    /// Ring mode (ABI 1.4), at a PMI of the loaded `ctx` after
    /// [`PmuBackend::handle_overflow`] found `overflowed`: re-arms, on the hardware, every
    /// counter of `overflowed` with a non-zero period in `periods` to
    /// [`rearm_value`]`(v, p, w)` (`v` what it counted since it wrapped, read now), through
    /// the register that stores the value exactly; and takes `overflowed` out of the
    /// context's virtual overflow status, since the hypervisor handled the overflow. The
    /// context's own records stay consistent with the hardware (AMD without PerfMonV2: a
    /// re-armed counter is armed again for overflow detection). `overflowed` may hold the
    /// overflow an earlier save kept pending: the counter's saved value was loaded again and
    /// is what it reads.
    fn rearm_overflowed<H: MsrBus>(
        &self,
        ctx: &mut Self::Context,
        hw: &mut H,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_sets_follow_the_global_ctrl_bit_layout() {
        let set = CounterSet::gp(0)
            .union(CounterSet::gp(3))
            .union(CounterSet::fixed(1));
        assert_eq!(set.0, 0b1001 | 1 << 33);
        assert_eq!(
            (set.gp_bits(), set.fixed_bits(), set.len()),
            (0b1001, 0b10, 3)
        );
        assert!(set.contains(CounterSet::gp(3)) && !set.contains(CounterSet::fixed(0)));
        assert_eq!(set.intersection(CounterSet::first_gp(2)), CounterSet::gp(0));
        assert_eq!(CounterSet::first_gp(0), CounterSet::EMPTY);
        assert_eq!(CounterSet::first_gp(40).0, 0xffff_ffff);
    }

    #[test]
    fn capabilities_list_present_counters() {
        let caps = PmuCapabilities {
            vendor: Vendor::Intel,
            version: 5,
            gp_counters: 8,
            gp_width: 48,
            fixed_counters: 0b1011,
            fixed_width: 48,
            global_ctrl: true,
            full_width_writes: true,
        };
        assert_eq!(caps.all_counters().0, 0xff | 0b1011 << 32);
    }
}
