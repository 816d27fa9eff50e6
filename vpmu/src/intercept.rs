//! Guest RDMSR/WRMSR intercepts. The backend validates and emulates; the core decides which
//! context an access reaches (the vCPU's own, or in all mode the system-wide contexts of the
//! pCPUs the privileged vCPU profiles) and whether that context is on hardware.

use crate::backend::{MsrOutcome, PmuBackend};
use crate::core::Vpmu;
use crate::msr::{Msr, MsrBus, MsrFault};
use crate::platform::Platform;
use crate::state::{PcpuPmu, VcpuPmu, VcpuState};

impl<B: PmuBackend> Vpmu<B> {
    /// A guest RDMSR on the vCPU `vcpu`, running on one of `pcpus`.
    pub fn rdmsr<P: Platform, H: MsrBus>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
        msr: Msr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        if !self.backend.owns(msr) {
            return Ok(MsrOutcome::NotPmu);
        }
        vcpu.stats.msr_reads += 1;
        let privileged = platform.privileged_domain();
        let outcome = if !self.has_vpmu(privileged, vcpu.id) {
            MsrOutcome::GeneralProtection
        } else if self.mode == vpmu_abi::XENPMU_MODE_ALL {
            self.system_read(platform, pcpus, vcpu, msr)?
        } else {
            let hw = match vcpu.state {
                VcpuState::Loaded { pcpu } => pcpus.get_mut(pcpu as usize).map(|cpu| &mut cpu.hw),
                _ => None,
            };
            self.backend.guest_read(&mut vcpu.ctx, hw, msr)?
        };
        if outcome == MsrOutcome::GeneralProtection {
            vcpu.stats.gp_faults += 1;
        }
        Ok(outcome)
    }

    /// A guest WRMSR on the vCPU `vcpu`, running on one of `pcpus`.
    pub fn wrmsr<P: Platform, H: MsrBus>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        if !self.backend.owns(msr) {
            return Ok(MsrOutcome::NotPmu);
        }
        vcpu.stats.msr_writes += 1;
        let privileged = platform.privileged_domain();
        let was_in_use = vcpu.in_use();
        let outcome = if !self.has_vpmu(privileged, vcpu.id) {
            MsrOutcome::GeneralProtection
        } else if vcpu.state == VcpuState::Cached {
            // Inside the cached window the context is the page's: a WRMSR would be overwritten
            // by the flush (or make it fail), so it is refused rather than silently lost.
            MsrOutcome::GeneralProtection
        } else if self.mode == vpmu_abi::XENPMU_MODE_ALL {
            self.system_write(platform, pcpus, vcpu, msr, value)?
        } else {
            let policy = self.policy(platform, vcpu.id.domain);
            let hw = match vcpu.state {
                VcpuState::Loaded { pcpu } => pcpus.get_mut(pcpu as usize).map(|cpu| &mut cpu.hw),
                _ => None,
            };
            let outcome = self
                .backend
                .guest_write(&mut vcpu.ctx, hw, &policy, msr, value)?;
            if outcome == MsrOutcome::Handled(()) {
                if vcpu.state == VcpuState::Allocated {
                    vcpu.state = VcpuState::Saved;
                }
                // First use on this pCPU: a context that now has something enabled goes onto
                // the hardware it runs on (a cached context stays in the page until flush).
                self.load_if_active(pcpus, vcpu)?;
            }
            outcome
        };
        if outcome == MsrOutcome::GeneralProtection {
            vcpu.stats.gp_faults += 1;
        }
        self.track_use(privileged, vcpu, was_in_use);
        Ok(outcome)
    }

    /// All mode, privileged vCPU: the pCPUs it profiles (p mod n == its index).
    fn profiled_pcpus<P: Platform>(
        platform: &P,
        vcpu: u32,
        pcpu_count: usize,
    ) -> impl Iterator<Item = usize> {
        let n = platform
            .vcpu_count(platform.privileged_domain())
            .unwrap_or(0)
            .max(1) as usize;
        (0..pcpu_count).filter(move |p| p % n == vcpu as usize)
    }

    fn system_read<P: Platform, H: MsrBus>(
        &self,
        platform: &P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &VcpuPmu<B::Context>,
        msr: Msr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        // Read the instance of the pCPU the profiler runs on if it profiles it, else of the
        // first pCPU it profiles; every instance was programmed with the same writes.
        let mut profiled = Self::profiled_pcpus(platform, vcpu.id.vcpu, pcpus.len());
        let first = profiled.next();
        let here = vcpu
            .running_on
            .map(|p| p as usize)
            .filter(|&p| Self::profiled_pcpus(platform, vcpu.id.vcpu, pcpus.len()).any(|q| q == p));
        let Some(cpu) = here.or(first).and_then(|p| pcpus.get_mut(p)) else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        let loaded = !cpu.system_cached;
        let ctx = cpu.system.get_or_insert_with(|| self.backend.new_context());
        self.backend
            .guest_read(ctx, if loaded { Some(&mut cpu.hw) } else { None }, msr)
    }

    fn system_write<P: Platform, H: MsrBus>(
        &self,
        platform: &P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &VcpuPmu<B::Context>,
        msr: Msr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let policy = self.policy(platform, vcpu.id.domain);
        let mut outcome = MsrOutcome::GeneralProtection;
        for p in Self::profiled_pcpus(platform, vcpu.id.vcpu, pcpus.len()) {
            let Some(cpu) = pcpus.get_mut(p) else {
                continue;
            };
            let loaded = !cpu.system_cached;
            let ctx = cpu.system.get_or_insert_with(|| self.backend.new_context());
            let hw = if loaded { Some(&mut cpu.hw) } else { None };
            outcome = self.backend.guest_write(ctx, hw, &policy, msr, value)?;
            if outcome != MsrOutcome::Handled(()) {
                // Validation is the same for every instance: the first refusal refuses all,
                // and a refused write changed nothing.
                break;
            }
        }
        Ok(outcome)
    }
}
