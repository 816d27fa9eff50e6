//! The global vPMU: mode, features, the backend, and the rules that tie per-vCPU state to them.
//!
//! The entry points live in sibling modules as further `impl Vpmu` blocks: MSR intercepts
//! (`intercept`), context switch (`switch`), PMI routing (`pmi`) and the control operations
//! (`ops`).

use vpmu_abi::{XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF};

use crate::backend::{GuestPolicy, PmuBackend};
use crate::msr::{MsrBus, MsrFault};
use crate::platform::{Platform, VcpuId};
use crate::state::{PcpuPmu, VcpuPmu, VcpuState};

/// The integrator's table of vCPU states, so that the core can reach a vCPU other than the
/// one at hand (the profiling vCPU at a PMI, the target of init and finish, the previous and
/// next vCPU of a context switch).
pub trait VcpuTable<C> {
    /// The vCPU's state, if it exists.
    fn get_mut(&mut self, id: VcpuId) -> Option<&mut VcpuPmu<C>>;
    /// Calls `visit` on every vCPU of `domain`.
    fn for_each_in_domain(&mut self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>));
}

/// The global vPMU state.
#[derive(Debug)]
pub struct Vpmu<B: PmuBackend> {
    pub(crate) backend: B,
    pub(crate) available: bool,
    pub(crate) mode: u64,
    pub(crate) features: u64,
    /// Unprivileged vCPUs whose vPMU is in use (`VcpuPmu::in_use`): mode and feature changes
    /// are refused while there are any.
    pub(crate) unprivileged_in_use: u32,
}

impl<B: PmuBackend> Vpmu<B> {
    /// A vPMU over `backend`, starting in `mode` (one of `XENPMU_MODE_*`).
    pub fn new(backend: B, mode: u64) -> Self {
        let mode = if vpmu_abi::ops::is_valid_mode(mode) {
            mode
        } else {
            XENPMU_MODE_OFF
        };
        Self {
            backend,
            available: true,
            mode,
            features: 0,
            unprivileged_in_use: 0,
        }
    }

    /// A hypervisor built or booted without a vPMU: every operation is `-EOPNOTSUPP` and every
    /// PMU MSR faults.
    pub fn unavailable(backend: B) -> Self {
        Self {
            backend,
            available: false,
            mode: XENPMU_MODE_OFF,
            features: 0,
            unprivileged_in_use: 0,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The current mode.
    pub fn mode(&self) -> u64 {
        self.mode
    }

    /// The current features.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Unprivileged vCPUs with a vPMU in use.
    pub fn unprivileged_in_use(&self) -> u32 {
        self.unprivileged_in_use
    }

    /// Takes over a pCPU's PMU hardware: cleans it (see `PmuBackend::init_hardware`) and
    /// returns the per-pCPU state to embed.
    pub fn attach_pcpu<H: MsrBus>(&self, mut hw: H) -> Result<PcpuPmu<B::Context, H>, MsrFault> {
        self.backend.init_hardware(&mut hw)?;
        Ok(PcpuPmu::new(hw))
    }

    /// A fresh per-vCPU state for `id`.
    pub fn new_vcpu(&self, id: VcpuId) -> VcpuPmu<B::Context> {
        VcpuPmu::new(id, self.backend.new_context())
    }

    /// Whether contexts are switched with their vCPUs (self and hv modes); in all mode the
    /// profiler's counters run system-wide and nothing is switched.
    pub(crate) fn switches_contexts(&self) -> bool {
        self.available && (self.mode == XENPMU_MODE_SELF || self.mode == XENPMU_MODE_HV)
    }

    /// Whether `vcpu` has a vPMU in the current mode.
    pub(crate) fn has_vpmu(&self, privileged: u32, vcpu: VcpuId) -> bool {
        match self.mode {
            _ if !self.available => false,
            XENPMU_MODE_SELF | XENPMU_MODE_HV => true,
            XENPMU_MODE_ALL => vcpu.domain == privileged,
            _ => false,
        }
    }

    /// The policy for `domain`'s accesses.
    pub(crate) fn policy<'p, P: Platform>(&self, platform: &'p P, domain: u32) -> GuestPolicy<'p> {
        let privileged = domain == platform.privileged_domain();
        GuestPolicy {
            features: self.features,
            filter: platform.event_filter(domain),
            may_count_host: privileged
                && (self.mode == XENPMU_MODE_HV || self.mode == XENPMU_MODE_ALL),
        }
    }

    /// Keeps `unprivileged_in_use` right after an operation that may have changed whether
    /// `vcpu` is in use (`was_in_use` is the value before).
    pub(crate) fn track_use<C>(&mut self, privileged: u32, vcpu: &VcpuPmu<C>, was_in_use: bool) {
        if vcpu.id.domain == privileged {
            return;
        }
        match (was_in_use, vcpu.in_use()) {
            (false, true) => self.unprivileged_in_use += 1,
            (true, false) => self.unprivileged_in_use = self.unprivileged_in_use.saturating_sub(1),
            _ => {}
        }
    }

    /// In all mode, the privileged vCPU that profiles `pcpu` (pCPU p → vCPU p mod n).
    pub(crate) fn profiler_of<P: Platform>(platform: &P, pcpu: u32) -> Option<VcpuId> {
        let domain = platform.privileged_domain();
        let count = platform.vcpu_count(domain).filter(|&n| n > 0)?;
        Some(VcpuId {
            domain,
            vcpu: pcpu % count,
        })
    }

    /// Saves `vcpu`'s context if it is on hardware, charging the accesses to it.
    pub(crate) fn save_vcpu<H: MsrBus>(
        &self,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), MsrFault> {
        if let VcpuState::Loaded { pcpu } = vcpu.state {
            let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
                return Ok(());
            };
            let mut bus = cpu.counted();
            let result = self.backend.save(&mut vcpu.ctx, &mut bus);
            vcpu.stats.hw_msr = vcpu.stats.hw_msr + bus.stats();
            result?;
            vcpu.stats.saves += 1;
            vcpu.state = VcpuState::Saved;
        }
        Ok(())
    }

    /// Loads `vcpu`'s context onto the pCPU it runs on if it is saved and has anything to run.
    pub(crate) fn load_if_active<H: MsrBus>(
        &self,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
    ) -> Result<(), MsrFault> {
        let (VcpuState::Saved, Some(pcpu)) = (vcpu.state, vcpu.running_on) else {
            return Ok(());
        };
        if !self.switches_contexts() || !self.backend.is_active(&vcpu.ctx) {
            return Ok(());
        }
        let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
            return Ok(());
        };
        let mut bus = cpu.counted();
        let result = self.backend.load(&vcpu.ctx, &mut bus);
        vcpu.stats.hw_msr = vcpu.stats.hw_msr + bus.stats();
        result?;
        vcpu.stats.loads += 1;
        vcpu.state = VcpuState::Loaded { pcpu };
        Ok(())
    }
}

impl core::ops::Add for crate::msr::MsrAccessStats {
    type Output = crate::msr::MsrAccessStats;

    fn add(self, other: crate::msr::MsrAccessStats) -> crate::msr::MsrAccessStats {
        crate::msr::MsrAccessStats {
            reads: self.reads + other.reads,
            writes: self.writes + other.writes,
            faults: self.faults + other.faults,
        }
    }
}
