//! # vpmu-models: software PMUs and the test shapes
//!
//! The hardware of the machine simulator (`vpmu-sim`), of the reference VMM (`vmm/machine`), of
//! the fuzz targets and of the vendor crates' MSR-emulation tests. None of this is the vPMU: a
//! hypervisor embedding `vpmu` with `vpmu-intel` or `vpmu-amd` drives the real PMU through
//! `vpmu::MsrBus` and needs nothing here.
//!
//! * [`SoftwarePmu`]: a vendor's PMU as an [`MsrBus`] that behaves like the hardware, fed with
//!   events ([`HwEvent`] in an [`ExecMode`]), with a PMI line.
//! * [`intel`]: [`intel::IntelPmuModel`], and [`intel::SyntheticCpuid`], any Intel PMU shape
//!   described as a CPUID.
//! * [`amd`]: the AMD core-PMU model, [`amd::AmdPmuModel`].
//! * [`shapes`]: the four test shapes ([`shapes::Shape`]: `intel-v5`, `intel-v2`,
//!   `amd-perfmonv2`, `amd-k7`) and the set-ups ([`shapes::IntelShape`], [`shapes::AmdShape`])
//!   that build the enumeration, the backend and the model of a shape, for every user.
//! * [`oracle`]: the definitions fast paths of the models are checked against.
//!
//! The models follow the hardware's rules, not the backends' policy, and compute their own
//! masks from the enumeration, so that a backend bug is not hidden by sharing code with it.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod amd;
pub mod intel;
pub mod oracle;
pub mod shapes;

use vpmu::{MsrAccessStats, MsrBus};

/// Kinds of events a software PMU model can be fed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HwEvent {
    /// Instructions retired.
    Instructions,
    /// Branch instructions retired.
    Branches,
    /// Unhalted core cycles.
    CoreCycles,
    /// Unhalted reference cycles.
    RefCycles,
    /// Last-level cache references.
    LlcReferences,
    /// Last-level cache misses.
    LlcMisses,
    /// Mispredicted branches retired.
    BranchMisses,
}

impl HwEvent {
    /// Every event, in declaration order.
    pub const ALL: [HwEvent; 7] = [
        HwEvent::Instructions,
        HwEvent::Branches,
        HwEvent::CoreCycles,
        HwEvent::RefCycles,
        HwEvent::LlcReferences,
        HwEvent::LlcMisses,
        HwEvent::BranchMisses,
    ];
}

/// The context an event happened in, as the PMU's gating sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExecMode {
    /// Current privilege level (0–3); OS counting applies to 0, USR counting to 1–3
    /// (Intel counts CPL>0 as user; so does this model).
    pub cpl: u8,
    /// Whether the CPU was in host (hypervisor) context rather than guest context.
    pub host: bool,
}

/// A software model of a vendor's PMU: an MSR bus that behaves like the hardware, fed with
/// events, with a PMI line.
pub trait SoftwarePmu: MsrBus {
    /// `n` events of `event` happened in `mode`: enabled counters that select it count them,
    /// overflowing (status bit, PMI if enabled) exactly when they wrap.
    fn count(&mut self, event: HwEvent, n: u64, mode: ExecMode);
    /// Whether the PMI line is asserted.
    fn pmi_pending(&self) -> bool;
    /// Acknowledges the PMI line; returns whether it was asserted.
    fn take_pmi(&mut self) -> bool;
    /// The accesses this model has served.
    fn access_stats(&self) -> MsrAccessStats;
    /// After how many core and reference cycles (each counted `n` times in `mode`, as
    /// `count(CoreCycles, n, mode); count(RefCycles, n, mode)` would) the PMI line would be
    /// newly asserted; `None` if never within 2^48 cycles. Computed arithmetically from the
    /// programmed counters, without changing or copying the model.
    fn cycles_until_pmi(&self, mode: ExecMode) -> Option<u64>;
}
