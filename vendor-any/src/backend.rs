//! [`VendorPmu`] as the core's [`PmuBackend`]: every method matches on the vendor and calls
//! the vendor backend's own, with the context and register of that vendor.
//!
//! A context or register belongs to the backend that made it (`new_context`, `classify`), and
//! the core only ever hands a backend its own: a `Vpmu` has one backend, and every context it
//! holds was made by it. The other vendor's (two vPMUs of different vendors whose vCPUs an
//! integrator mixed up, or a direct call with a hand-made one) is an integration bug, answered
//! without panicking and without touching the hardware: a fault naming [`FOREIGN_STATE_MSR`]
//! where the method can fail, and for the three that cannot, a context that counts nothing
//! (`is_active` false, `restrict` reports it), or a page showing this backend's reset context.

use vpmu::abi::{VendorArea, VendorLayout, XENPMU_REFUSED_ABSENT};
use vpmu::bank::HwRecord;
use vpmu::{
    ContextError, CounterIndex, CounterSet, GuestPolicy, Msr, MsrBus, MsrFault, MsrOutcome,
    Overflow, PmuBackend, PmuCapabilities, PublishedImages, RearmPeriods,
};
use vpmu_amd::{AmdContext, Lookup};
use vpmu_intel::IntelContext;
use vpmu_intel::msrs::IntelMsr;

use crate::VendorPmu;

/// The MSR number a fault names when a backend was handed the other vendor's context or
/// register. No PMU MSR of either vendor has it (nor any architectural MSR), so it cannot be
/// mistaken for a hardware fault.
pub const FOREIGN_STATE_MSR: Msr = Msr(0xffff_ffff);

/// The fault of a backend handed the other vendor's context or register.
const FOREIGN: MsrFault = MsrFault {
    msr: FOREIGN_STATE_MSR,
};

/// What `restrict` and a flush report for the other vendor's context: no register of it
/// exists on this PMU.
const FOREIGN_CONTEXT: ContextError = ContextError {
    register: "context of the other vendor",
    index: None,
    value: 0,
    msr: FOREIGN_STATE_MSR.0,
    reason: XENPMU_REFUSED_ABSENT,
};

/// A vCPU's (or a pCPU's system-wide) PMU context: the vendor backend's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VendorContext {
    /// An Intel context.
    Intel(IntelContext),
    /// An AMD context.
    Amd(AmdContext),
}

/// A decoded PMU register: the vendor backend's own decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VendorRegister {
    /// An Intel architectural PMU register.
    Intel(IntelMsr),
    /// An AMD core-PMU register (or one of the architecture this PMU lacks).
    Amd(Lookup),
}

/// Calls `$method` of the vendor backend with the context (and register, where given) of the
/// same vendor; `$foreign` is the answer for the other vendor's.
macro_rules! with_context {
    ($pmu:expr, $ctx:expr, |$backend:ident, $context:ident| $call:expr, $foreign:expr) => {
        match ($pmu, $ctx) {
            (VendorPmu::Intel($backend), VendorContext::Intel($context)) => $call,
            (VendorPmu::Amd($backend), VendorContext::Amd($context)) => $call,
            _ => $foreign,
        }
    };
}

impl PmuBackend for VendorPmu {
    type Context = VendorContext;
    type Register = VendorRegister;

    #[inline]
    fn capabilities(&self) -> &PmuCapabilities {
        match self {
            VendorPmu::Intel(pmu) => pmu.capabilities(),
            VendorPmu::Amd(pmu) => pmu.capabilities(),
        }
    }

    fn msr_ranges(&self) -> &'static [(u32, u32)] {
        match self {
            VendorPmu::Intel(pmu) => pmu.msr_ranges(),
            VendorPmu::Amd(pmu) => pmu.msr_ranges(),
        }
    }

    #[inline]
    fn classify(&self, msr: Msr) -> Option<VendorRegister> {
        match self {
            VendorPmu::Intel(pmu) => pmu.classify(msr).map(VendorRegister::Intel),
            VendorPmu::Amd(pmu) => pmu.classify(msr).map(VendorRegister::Amd),
        }
    }

    fn new_context(&self) -> VendorContext {
        match self {
            VendorPmu::Intel(pmu) => VendorContext::Intel(pmu.new_context()),
            VendorPmu::Amd(pmu) => VendorContext::Amd(pmu.new_context()),
        }
    }

    fn init_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        match self {
            VendorPmu::Intel(pmu) => pmu.init_hardware(hw),
            VendorPmu::Amd(pmu) => pmu.init_hardware(hw),
        }
    }

    #[inline]
    fn is_active(&self, ctx: &VendorContext) -> bool {
        with_context!(self, ctx, |pmu, ctx| pmu.is_active(ctx), false)
    }

    #[inline]
    fn read_register<B: MsrBus>(
        &self,
        ctx: &mut VendorContext,
        hw: Option<&mut B>,
        register: VendorRegister,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        match (self, ctx, register) {
            (VendorPmu::Intel(pmu), VendorContext::Intel(ctx), VendorRegister::Intel(r)) => {
                pmu.read_register(ctx, hw, r)
            }
            (VendorPmu::Amd(pmu), VendorContext::Amd(ctx), VendorRegister::Amd(r)) => {
                pmu.read_register(ctx, hw, r)
            }
            _ => Err(FOREIGN),
        }
    }

    #[inline]
    fn write_register<B: MsrBus>(
        &self,
        ctx: &mut VendorContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        register: VendorRegister,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        match (self, ctx, register) {
            (VendorPmu::Intel(pmu), VendorContext::Intel(ctx), VendorRegister::Intel(r)) => {
                pmu.write_register(ctx, hw, policy, r, value)
            }
            (VendorPmu::Amd(pmu), VendorContext::Amd(ctx), VendorRegister::Amd(r)) => {
                pmu.write_register(ctx, hw, policy, r, value)
            }
            _ => Err(FOREIGN),
        }
    }

    fn rdpmc_counter(&self, selector: u32) -> Option<Msr> {
        match self {
            VendorPmu::Intel(pmu) => pmu.rdpmc_counter(selector),
            VendorPmu::Amd(pmu) => pmu.rdpmc_counter(selector),
        }
    }

    #[inline]
    fn save<B: MsrBus>(
        &self,
        ctx: &mut VendorContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault> {
        with_context!(
            self,
            ctx,
            |pmu, ctx| pmu.save(ctx, hw, record),
            Err(FOREIGN)
        )
    }

    #[inline]
    fn load<B: MsrBus>(
        &self,
        ctx: &VendorContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault> {
        with_context!(
            self,
            ctx,
            |pmu, ctx| pmu.load(ctx, hw, record),
            Err(FOREIGN)
        )
    }

    #[inline]
    fn handle_overflow<B: MsrBus>(
        &self,
        ctx: &mut VendorContext,
        hw: &mut B,
    ) -> Result<Overflow, MsrFault> {
        with_context!(
            self,
            ctx,
            |pmu, ctx| pmu.handle_overflow(ctx, hw),
            Err(FOREIGN)
        )
    }

    fn masks_lvtpc_on_pmi(&self) -> bool {
        match self {
            VendorPmu::Intel(pmu) => pmu.masks_lvtpc_on_pmi(),
            VendorPmu::Amd(pmu) => pmu.masks_lvtpc_on_pmi(),
        }
    }

    fn page_layout(&self) -> VendorLayout {
        match self {
            VendorPmu::Intel(pmu) => pmu.page_layout(),
            VendorPmu::Amd(pmu) => pmu.page_layout(),
        }
    }

    fn context_to_page(&self, ctx: &VendorContext, area: &mut VendorArea) {
        with_context!(self, ctx, |pmu, ctx| pmu.context_to_page(ctx, area), {
            // Never another vendor's layout in a page laid out for this one.
            let reset = self.new_context();
            self.context_to_page(&reset, area);
        })
    }

    fn restrict(&self, ctx: &mut VendorContext, policy: &GuestPolicy<'_>) -> Option<ContextError> {
        with_context!(self, ctx, |pmu, ctx| pmu.restrict(ctx, policy), {
            Some(FOREIGN_CONTEXT)
        })
    }

    fn context_from_page_into(
        &self,
        area: &VendorArea,
        saved: &VendorContext,
        images: PublishedImages,
        policy: &GuestPolicy<'_>,
        out: &mut VendorContext,
    ) -> Result<(), ContextError> {
        match (self, saved, out) {
            (VendorPmu::Intel(pmu), VendorContext::Intel(saved), VendorContext::Intel(out)) => {
                pmu.context_from_page_into(area, saved, images, policy, out)
            }
            (VendorPmu::Amd(pmu), VendorContext::Amd(saved), VendorContext::Amd(out)) => {
                pmu.context_from_page_into(area, saved, images, policy, out)
            }
            _ => Err(FOREIGN_CONTEXT),
        }
    }

    fn rearm_period_max(&self, counter: CounterIndex) -> Option<u64> {
        match self {
            VendorPmu::Intel(pmu) => pmu.rearm_period_max(counter),
            VendorPmu::Amd(pmu) => pmu.rearm_period_max(counter),
        }
    }

    #[inline]
    fn rearm_overflowed<H: MsrBus>(
        &self,
        ctx: &mut VendorContext,
        hw: &mut H,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault> {
        with_context!(
            self,
            ctx,
            |pmu, ctx| pmu.rearm_overflowed(ctx, hw, overflowed, periods),
            Err(FOREIGN)
        )
    }
}
