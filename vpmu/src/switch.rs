//! Context switch: the PMU state follows its vCPU with the fewest hardware accesses.
//!
//! Nothing is done for a vCPU that never used the PMU, when a vCPU is switched to itself, or in
//! all mode (the profiler's counters run system-wide). Otherwise the previous vCPU's context is
//! saved (leaving the hardware clean) and the next one's loaded if it has anything enabled.
//! Contexts are never left on a pCPU after their vCPU leaves it: Xen's lazy cross-CPU residency
//! (removed in 2022, commit defa4e51d2) needed IPIs and raced with migration.

use vpmu_abi::XENPMU_MODE_ALL;

use crate::backend::PmuBackend;
use crate::core::{VcpuTable, Vpmu};
use crate::msr::{MsrBus, MsrFault};
use crate::platform::{Platform, VcpuId};
use crate::state::{PcpuPmu, VcpuState};

impl<B: PmuBackend> Vpmu<B> {
    /// `pcpu` stops running its current vCPU (if any) and starts running `next` (`None`:
    /// the idle loop or hypervisor work).
    pub fn context_switch<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
        pcpu: u32,
        next: Option<VcpuId>,
    ) -> Result<(), MsrFault> {
        let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
            return Ok(());
        };
        let prev = cpu.current;
        if prev == next {
            return Ok(());
        }
        cpu.current = next;
        if let Some(prev) = prev.and_then(|id| vcpus.get_mut(id)) {
            prev.running_on = None;
            if self.switches_contexts() {
                self.save_vcpu(pcpus, prev)?;
            }
            // A cached sample stops its vCPU's counters, so the physical LVTPC masked for it
            // need not stay masked for whoever runs here next.
            if prev.state == VcpuState::Cached && prev.cached_from == Some(pcpu) {
                self.unmask_physical_lvtpc(platform, pcpus, pcpu);
            }
        }
        if let Some(next) = next.and_then(|id| vcpus.get_mut(id)) {
            next.running_on = Some(pcpu);
            self.load_if_active(pcpus, next)?;
        }
        Ok(())
    }

    /// Stops `vcpu`'s vPMU for good: saves its context, discards a pending sample, unmaps its
    /// page. For vCPUs of a domain being destroyed, without the guest's help, and for finish.
    /// In all mode the privileged profiler's counters are the system-wide contexts of the
    /// pCPUs it profiles: those are stopped and dropped too, as its own context is reset.
    pub fn teardown_vcpu<P: Platform, H: MsrBus>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut crate::state::VcpuPmu<B::Context>,
    ) -> Result<(), MsrFault> {
        let privileged = platform.privileged_domain();
        let was_in_use = vcpu.in_use();
        self.save_vcpu(pcpus, vcpu)?;
        if self.mode == XENPMU_MODE_ALL && vcpu.id.domain == privileged {
            for (index, cpu) in (0u32..).zip(pcpus.iter_mut()) {
                if Self::profiler_of(platform, index) == Some(vcpu.id) {
                    self.drop_system_context(platform, cpu, index)?;
                }
            }
        }
        // With its system-wide context dropped, a cached all-mode sample has nothing to
        // restart: releasing it only unmasks and clears the page.
        if vcpu.state == VcpuState::Cached {
            self.release_cached(platform, pcpus, vcpu)?;
        }
        if let Some(slot) = vcpu.page.take() {
            platform.unmap_page(slot);
        }
        vcpu.ctx = self.backend.new_context();
        vcpu.state = VcpuState::Allocated;
        vcpu.page_lvtpc_masked = true;
        vcpu.cached_from = None;
        self.track_use(privileged, vcpu, was_in_use);
        Ok(())
    }

    /// Ends a cached window without loading the page's context: in all mode the pCPU's
    /// system-wide context as it was saved at the sample is put back and restarted.
    pub(crate) fn release_cached<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut crate::state::VcpuPmu<B::Context>,
    ) -> Result<(), MsrFault> {
        if let Some(from) = vcpu.cached_from.take() {
            if let Some(cpu) = pcpus.get_mut(from as usize) {
                if cpu.system_cached {
                    if let Some(ctx) = cpu.system.as_ref() {
                        self.backend.load(ctx, &mut cpu.hw)?;
                    }
                    cpu.system_cached = false;
                }
            }
            self.unmask_physical_lvtpc(platform, pcpus, from);
        }
        if let Some(slot) = vcpu.page {
            platform.with_page(slot, vpmu_abi::writer::clear_cached);
        }
        vcpu.state = VcpuState::Saved;
        Ok(())
    }

    pub(crate) fn unmask_physical_lvtpc<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        pcpu: u32,
    ) {
        if let Some(cpu) = pcpus.get_mut(pcpu as usize) {
            if cpu.lvtpc_masked {
                cpu.lvtpc_masked = false;
                platform.set_physical_lvtpc_masked(pcpu, false);
            }
        }
    }

    /// Before a mode change that starts or ends all mode: every privileged context goes off
    /// the hardware and every pending sample is discarded, so the new mode starts clean.
    pub(crate) fn quiesce<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
    ) -> Result<(), MsrFault> {
        let privileged = platform.privileged_domain();
        let mut result = Ok(());
        vcpus.for_each_in_domain(privileged, &mut |vcpu| {
            if result.is_ok() {
                result = self.save_vcpu(pcpus, vcpu);
            }
            if result.is_ok() && vcpu.state == VcpuState::Cached {
                result = self.release_cached(platform, pcpus, vcpu);
            }
        });
        result?;
        for (index, cpu) in (0u32..).zip(pcpus.iter_mut()) {
            self.drop_system_context(platform, cpu, index)?;
        }
        Ok(())
    }

    /// Stops and discards pCPU `index`'s system-wide context (leaving its hardware clean), and
    /// releases its physical LVTPC if a sample of that context was cached.
    fn drop_system_context<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        cpu: &mut PcpuPmu<B::Context, H>,
        index: u32,
    ) -> Result<(), MsrFault> {
        if let Some(mut ctx) = cpu.system.take() {
            if !cpu.system_cached {
                self.backend.save(&mut ctx, &mut cpu.hw)?;
            }
        }
        cpu.system_cached = false;
        if cpu.lvtpc_masked {
            cpu.lvtpc_masked = false;
            platform.set_physical_lvtpc_masked(index, false);
        }
        Ok(())
    }
}
