//! The backend: [`IntelPmu`] implements the core's `PmuBackend` for one enumerated PMU. The
//! work is split by responsibility: `access` (guest RDMSR/WRMSR), `switch` (save, load,
//! overflow), `page` (shared-page vendor area).

use raw_cpuid::CpuIdReader;
use vpmu::abi::{IntelBanks, VendorArea, VendorLayout};
use vpmu::bank::{BankMap, HwRecord};
use vpmu::{
    ContextError, CounterIndex, CounterSet, GuestPolicy, Msr, MsrBus, MsrFault, MsrOutcome,
    Overflow, PmuBackend, PmuCapabilities, PublishedImages, RearmPeriods,
};

use crate::caps::{EnumerationError, IntelCaps};
use crate::context::IntelContext;
use crate::msrs::IntelMsr;
use crate::msrs::MSR_RANGES;
use crate::page::PageWindows;
use crate::policy::GuestRules;

/// Why an [`IntelPmu`] could not be built.
pub type BackendError = vpmu::BackendError<EnumerationError>;

/// The Intel architectural-PMU backend for one enumerated PMU.
#[derive(Clone, Debug)]
pub struct IntelPmu {
    pub(crate) caps: IntelCaps,
    pub(crate) capabilities: PmuCapabilities,
    pub(crate) rules: GuestRules,
    /// The general-purpose and the fixed bank, in the form the core's bank loops take.
    pub(crate) msr_banks: [BankMap; 2],
    /// Every counter present (`capabilities.all_counters()`, which every load needs).
    pub(crate) present: CounterSet,
    pub(crate) page_banks: IntelBanks,
    /// `page_banks` as the flush reads it.
    pub(crate) page_windows: PageWindows,
}

impl IntelPmu {
    /// The backend for the PMU `caps` describes.
    pub fn new(caps: IntelCaps) -> Result<Self, BackendError> {
        let page_banks = IntelBanks::new(caps.fixed_bank_len(), caps.gp_counters())
            .map_err(vpmu::BackendError::PageLayout)?;
        let page_windows = PageWindows::new(&page_banks, caps.fixed_counters())
            .map_err(vpmu::BackendError::PageLayout)?;
        Ok(IntelPmu {
            caps,
            capabilities: caps.pmu_capabilities(),
            present: caps.pmu_capabilities().all_counters(),
            rules: GuestRules::new(&caps),
            msr_banks: caps.banks(),
            page_banks,
            page_windows,
        })
    }

    /// Enumerates through `reader` and builds the backend (see [`IntelCaps::from_cpuid`]).
    pub fn from_cpuid<R: CpuIdReader>(
        reader: R,
        perf_capabilities: Option<u64>,
    ) -> Result<Self, BackendError> {
        Self::new(IntelCaps::from_cpuid(reader, perf_capabilities)?)
    }

    /// The enumeration this backend was built from.
    pub fn caps(&self) -> &IntelCaps {
        &self.caps
    }

    /// The guest register rules in force.
    pub fn rules(&self) -> &GuestRules {
        &self.rules
    }
}

impl PmuBackend for IntelPmu {
    type Context = IntelContext;
    type Register = IntelMsr;

    fn capabilities(&self) -> &PmuCapabilities {
        &self.capabilities
    }

    fn msr_ranges(&self) -> &'static [(u32, u32)] {
        MSR_RANGES
    }

    #[inline]
    fn classify(&self, msr: Msr) -> Option<IntelMsr> {
        IntelMsr::classify(msr)
    }

    fn new_context(&self) -> IntelContext {
        IntelContext::reset(&self.caps)
    }

    fn init_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        self.clean_hardware(hw)
    }

    #[inline]
    fn is_active(&self, ctx: &IntelContext) -> bool {
        ctx.counts_anything() || ctx.ds_area != 0
    }

    fn rdpmc_counter(&self, selector: u32) -> Option<Msr> {
        crate::msrs::rdpmc_counter(selector)
    }

    #[inline]
    fn read_register<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        register: IntelMsr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        self.emulate_read(ctx, hw, register)
    }

    // Always inline: the core's intercept dispatches on the register once, here.
    #[inline(always)]
    fn write_register<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        register: IntelMsr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        self.emulate_write(ctx, hw, policy, register, value)
    }

    #[inline]
    fn save<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault> {
        self.save_context(ctx, hw, record)
    }

    #[inline]
    fn load<B: MsrBus>(
        &self,
        ctx: &IntelContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault> {
        self.load_context(ctx, hw, record)
    }

    fn handle_overflow<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
    ) -> Result<Overflow, MsrFault> {
        self.collect_overflow(ctx, hw)
    }

    fn masks_lvtpc_on_pmi(&self) -> bool {
        true
    }

    fn page_layout(&self) -> VendorLayout {
        VendorLayout::Intel(self.page_banks)
    }

    #[inline]
    fn context_to_page(&self, ctx: &IntelContext, area: &mut VendorArea) {
        self.write_page(ctx, area);
    }

    fn restrict(&self, ctx: &mut IntelContext, policy: &GuestPolicy<'_>) -> Option<ContextError> {
        self.restrict_context(ctx, policy)
    }

    fn context_from_page_into(
        &self,
        area: &VendorArea,
        saved: &IntelContext,
        images: PublishedImages,
        policy: &GuestPolicy<'_>,
        out: &mut IntelContext,
    ) -> Result<(), ContextError> {
        self.read_page_into(area, saved, images, policy, out)
    }

    fn rearm_period_max(&self, counter: CounterIndex) -> Option<u64> {
        self.period_max(counter)
    }

    fn rearm_overflowed<H: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut H,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault> {
        self.rearm(ctx, hw, overflowed, periods)
    }
}
