//! Per-vCPU and per-pCPU state objects, embedded by the integrator in its own vCPU and CPU
//! structures (the core allocates nothing).

use crate::msr::{CountingBus, MsrAccessStats, MsrBus};
use crate::platform::{PageSlot, VcpuId};

/// Where a vCPU's PMU context is. One value, not a set of flags: each variant is a state the
/// context can be in, and the transitions are the core's functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuState {
    /// Allocated, never used: the guest has not touched a PMU register and has no page.
    /// Nothing is ever switched for it.
    Allocated,
    /// The context is in memory (the vCPU is descheduled, or runs with nothing enabled).
    Saved,
    /// The context is on the hardware of `pcpu`, where the vCPU is running.
    Loaded {
        /// The physical CPU holding it.
        pcpu: u32,
    },
    /// A sample is pending in the vCPU's page: its counters are stopped and the context is
    /// the page's to edit until the vCPU flushes.
    Cached,
}

/// Per-vCPU statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuStats {
    /// PMIs routed to this vCPU (overflows with the interrupt enabled).
    pub pmis_generated: u64,
    /// Of those, delivered (injected through the virtual LVTPC, or published to the page).
    pub pmis_delivered: u64,
    /// Of those, dropped (previous sample still cached, virtual LVTPC masked, or no page to
    /// receive a profiling sample).
    pub pmis_dropped: u64,
    /// Of those, queued by the platform for delivery from the vCPU's own context and not yet
    /// reported done: `pmis_generated == pmis_delivered + pmis_dropped + pmis_in_flight`.
    pub pmis_in_flight: u64,
    /// Intercepted guest RDMSRs of PMU registers.
    pub msr_reads: u64,
    /// Intercepted guest WRMSRs of PMU registers.
    pub msr_writes: u64,
    /// Intercepted accesses answered with #GP.
    pub gp_faults: u64,
    /// Times the context was loaded onto hardware.
    pub loads: u64,
    /// Times the context was saved from hardware.
    pub saves: u64,
    /// Hardware MSR accesses made on this vCPU's behalf.
    pub hw_msr: MsrAccessStats,
}

/// The vPMU part of a vCPU.
#[derive(Clone, Debug)]
pub struct VcpuPmu<C> {
    pub(crate) id: VcpuId,
    pub(crate) state: VcpuState,
    pub(crate) ctx: C,
    pub(crate) page: Option<PageSlot>,
    /// The page path's virtual LVTPC mask, as last applied by lvtpc_set or flush.
    pub(crate) page_lvtpc_masked: bool,
    /// In all mode, the pCPU whose system-wide context is cached in this vCPU's page.
    pub(crate) cached_from: Option<u32>,
    pub(crate) running_on: Option<u32>,
    pub(crate) stats: VcpuStats,
}

impl<C> VcpuPmu<C> {
    /// A vCPU's vPMU state in its reset state; `ctx` is the backend's `new_context()`.
    pub fn new(id: VcpuId, ctx: C) -> Self {
        Self {
            id,
            state: VcpuState::Allocated,
            ctx,
            page: None,
            page_lvtpc_masked: true,
            cached_from: None,
            running_on: None,
            stats: VcpuStats::default(),
        }
    }

    /// Which vCPU this is.
    pub fn id(&self) -> VcpuId {
        self.id
    }

    /// The state of its context.
    pub fn state(&self) -> VcpuState {
        self.state
    }

    /// Its statistics.
    pub fn stats(&self) -> &VcpuStats {
        &self.stats
    }

    /// The registered page, if any.
    pub fn page(&self) -> Option<PageSlot> {
        self.page
    }

    /// The pCPU it is scheduled on, if any.
    pub fn running_on(&self) -> Option<u32> {
        self.running_on
    }

    /// The vendor context (saved copy; stale while loaded).
    pub fn context(&self) -> &C {
        &self.ctx
    }

    /// Whether this vCPU counts as an active vPMU for the mode-change rules: it has used the
    /// PMU or registered a page.
    pub fn in_use(&self) -> bool {
        self.state != VcpuState::Allocated || self.page.is_some()
    }
}

/// The vPMU part of a physical CPU: its PMU hardware and, in all mode, the system-wide context
/// the privileged profiler programs on it.
#[derive(Debug)]
pub struct PcpuPmu<C, H> {
    pub(crate) hw: H,
    pub(crate) current: Option<VcpuId>,
    /// All mode: the system-wide context, always loaded on this pCPU unless `system_cached`.
    pub(crate) system: Option<C>,
    pub(crate) system_cached: bool,
    pub(crate) lvtpc_masked: bool,
}

impl<C, H: MsrBus> PcpuPmu<C, H> {
    /// A pCPU with PMU hardware `hw` (clean: no counter programmed).
    pub fn new(hw: H) -> Self {
        Self {
            hw,
            current: None,
            system: None,
            system_cached: false,
            lvtpc_masked: false,
        }
    }

    /// The hardware.
    pub fn hw(&self) -> &H {
        &self.hw
    }

    /// The hardware, mutably (for feeding events to a software model).
    pub fn hw_mut(&mut self) -> &mut H {
        &mut self.hw
    }

    /// The vCPU currently scheduled here.
    pub fn current(&self) -> Option<VcpuId> {
        self.current
    }

    /// Whether the core has masked this pCPU's physical LVTPC (a sample is cached).
    pub fn lvtpc_masked(&self) -> bool {
        self.lvtpc_masked
    }

    /// The hardware wrapped so that the accesses made through it can be charged to a vCPU.
    pub(crate) fn counted(&mut self) -> CountingBus<&mut H> {
        CountingBus::new(&mut self.hw)
    }
}
