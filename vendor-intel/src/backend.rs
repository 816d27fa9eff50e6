//! The backend: [`IntelPmu`] implements the core's `PmuBackend` for one enumerated PMU. The
//! work is split by responsibility: `access` (guest RDMSR/WRMSR), `switch` (save, load,
//! overflow), `page` (shared-page vendor area).

use raw_cpuid::CpuIdReader;
use vpmu::abi::{IntelBanks, VendorArea, VendorLayout};
use vpmu::{
    ContextError, GuestPolicy, Msr, MsrBus, MsrFault, MsrOutcome, Overflow, PmuBackend,
    PmuCapabilities,
};

use crate::caps::{EnumerationError, IntelCaps};
use crate::context::IntelContext;
use crate::msrs::MSR_RANGES;
use crate::policy::GuestRules;

/// Why an [`IntelPmu`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The CPU's PMU is not one this backend drives.
    Enumeration(EnumerationError),
    /// The enumerated counters do not fit the shared page's vendor area.
    PageLayout,
}

impl From<EnumerationError> for BackendError {
    fn from(error: EnumerationError) -> Self {
        BackendError::Enumeration(error)
    }
}

impl core::fmt::Display for BackendError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BackendError::Enumeration(error) => write!(f, "unsupported PMU: {error}"),
            BackendError::PageLayout => f.write_str("counters do not fit the vendor area"),
        }
    }
}

/// The Intel architectural-PMU backend for one enumerated PMU.
#[derive(Clone, Debug)]
pub struct IntelPmu {
    pub(crate) caps: IntelCaps,
    pub(crate) capabilities: PmuCapabilities,
    pub(crate) rules: GuestRules,
    pub(crate) banks: IntelBanks,
}

impl IntelPmu {
    /// The backend for the PMU `caps` describes.
    pub fn new(caps: IntelCaps) -> Result<Self, BackendError> {
        let banks = IntelBanks::new(caps.fixed_bank_len(), caps.gp_counters())
            .map_err(|_| BackendError::PageLayout)?;
        Ok(IntelPmu {
            caps,
            capabilities: caps.pmu_capabilities(),
            rules: GuestRules::new(&caps),
            banks,
        })
    }

    /// Enumerates through `reader` and builds the backend (see
    /// [`IntelCaps::from_cpuid_reader`]).
    pub fn from_cpuid_reader<R: CpuIdReader>(
        reader: R,
        perf_capabilities: Option<u64>,
    ) -> Result<Self, BackendError> {
        Self::new(IntelCaps::from_cpuid_reader(reader, perf_capabilities)?)
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

    fn capabilities(&self) -> &PmuCapabilities {
        &self.capabilities
    }

    fn msr_ranges(&self) -> &'static [(u32, u32)] {
        MSR_RANGES
    }

    fn new_context(&self) -> IntelContext {
        IntelContext::reset(&self.caps)
    }

    fn init_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        self.clean_hardware(hw)
    }

    fn is_active(&self, ctx: &IntelContext) -> bool {
        ctx.counts_anything() || ctx.ds_area != 0
    }

    fn guest_read<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        msr: Msr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        self.read_register(ctx, hw, msr)
    }

    fn guest_write<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        self.write_register(ctx, hw, policy, msr, value)
    }

    fn save<B: MsrBus>(&self, ctx: &mut IntelContext, hw: &mut B) -> Result<Overflow, MsrFault> {
        self.save_context(ctx, hw)
    }

    fn load<B: MsrBus>(&self, ctx: &IntelContext, hw: &mut B) -> Result<(), MsrFault> {
        self.load_context(ctx, hw)
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
        VendorLayout::Intel(self.banks)
    }

    fn context_to_page(&self, ctx: &IntelContext, area: &mut VendorArea) {
        self.write_page(ctx, area);
    }

    fn restrict(&self, ctx: &mut IntelContext, policy: &GuestPolicy<'_>) -> Option<ContextError> {
        self.restrict_context(ctx, policy)
    }

    fn context_from_page(
        &self,
        area: &VendorArea,
        saved: &IntelContext,
        policy: &GuestPolicy<'_>,
    ) -> Result<IntelContext, ContextError> {
        self.read_page(area, saved, policy)
    }
}
