//! PMI routing: the backend finds the overflow, the core decides where the interrupt goes.
//!
//! * A vCPU without a page gets it through its virtual LVTPC (counters keep running; the
//!   overflow is in its virtual status).
//! * A vCPU with a page gets a sample in the page (the cached window opens, its counters stop,
//!   the physical LVTPC is masked until flush) and the PMU VIRQ.
//! * In all mode every PMI goes, as a sample, to the privileged vCPU that profiles the pCPU.
//!   In hv mode, a PMI of the privileged profiler's own counters that interrupted the
//!   hypervisor goes to it with the hypervisor's registers. Hypervisor registers never reach
//!   any other domain.

use vpmu_abi::writer::{publish_sample, record_dropped_sample};
use vpmu_abi::{
    Identity, Regs, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_MODE_HV,
};

use crate::backend::{Overflow, PmuBackend};
use crate::core::{VcpuTable, Vpmu};
use crate::msr::{MsrBus, MsrFault};
use crate::platform::{Diagnostic, Interrupted, LvtpcDelivery, Platform, VcpuId};
use crate::state::{PcpuPmu, VcpuPmu, VcpuState};

/// What became of a PMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmiOutcome {
    /// No context on this pCPU had an overflow: not ours.
    Spurious,
    /// Counters overflowed, but none with its interrupt enabled.
    NoInterrupt(Overflow),
    /// Delivered to `to` (through its LVTPC, or as a sample in its page).
    Delivered {
        /// The receiving vCPU.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
    /// Routed to `to`, whose platform queued the LVTPC delivery (see `LvtpcDelivery::Queued`).
    Queued {
        /// The receiving vCPU.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
    /// Routed to `to` but dropped (sample still cached, LVTPC masked, or no page).
    Dropped {
        /// The vCPU it was routed to.
        to: VcpuId,
        /// What overflowed.
        overflow: Overflow,
    },
}

/// The sample to publish: who it is attributed to and the registers.
struct Sample {
    domain_id: u32,
    vcpu_id: u32,
    regs: Regs,
}

impl<B: PmuBackend> Vpmu<B> {
    /// The PMU interrupt of `pcpu`.
    pub fn handle_pmi<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
        pcpu: u32,
    ) -> Result<PmiOutcome, MsrFault> {
        if !self.available {
            return Ok(PmiOutcome::Spurious);
        }
        if self.mode == XENPMU_MODE_ALL {
            return self.system_pmi(platform, pcpus, vcpus, pcpu);
        }
        let Some(current) = pcpus.get(pcpu as usize).and_then(|cpu| cpu.current) else {
            return Ok(PmiOutcome::Spurious);
        };
        let Some(vcpu) = vcpus.get_mut(current) else {
            return Ok(PmiOutcome::Spurious);
        };
        if vcpu.state != (VcpuState::Loaded { pcpu }) {
            return Ok(PmiOutcome::Spurious);
        }
        let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
            return Ok(PmiOutcome::Spurious);
        };
        let mut bus = cpu.counted();
        let overflow = self.backend.handle_overflow(&mut vcpu.ctx, &mut bus);
        vcpu.stats.hw_msr = vcpu.stats.hw_msr + bus.stats();
        let overflow = overflow?;
        if overflow.counters.is_empty() {
            return Ok(PmiOutcome::Spurious);
        }
        if !overflow.interrupt {
            return Ok(PmiOutcome::NoInterrupt(overflow));
        }
        vcpu.stats.pmis_generated += 1;
        let privileged = platform.privileged_domain();
        let sample = match platform.interrupted(pcpu) {
            Interrupted::Hypervisor { regs, .. }
                if self.mode == XENPMU_MODE_HV && vcpu.id.domain == privileged =>
            {
                Some(Sample {
                    domain_id: XENPMU_DOMID_HYPERVISOR,
                    vcpu_id: vcpu.id.vcpu,
                    regs,
                })
            }
            Interrupted::Hypervisor {
                on_behalf_of: Some((id, regs)),
                ..
            }
            | Interrupted::Guest { vcpu: id, regs }
                if id == vcpu.id =>
            {
                Some(Sample {
                    domain_id: XENPMU_DOMID_SELF,
                    vcpu_id: vcpu.id.vcpu,
                    regs,
                })
            }
            // The loaded context is not the interrupted vCPU's: nothing to attribute it to.
            _ => None,
        };
        let Some(sample) = sample else {
            vcpu.stats.pmis_dropped += 1;
            return Ok(PmiOutcome::Dropped {
                to: vcpu.id,
                overflow,
            });
        };
        let to = vcpu.id;
        let delivered = if vcpu.page.is_some() {
            self.publish(platform, pcpus, vcpu, pcpu, &sample)?
        } else {
            match platform.deliver_lvtpc_pmi(to, self.backend.masks_lvtpc_on_pmi()) {
                LvtpcDelivery::Delivered => true,
                LvtpcDelivery::Masked => false,
                LvtpcDelivery::Queued => {
                    vcpu.stats.pmis_in_flight += 1;
                    return Ok(PmiOutcome::Queued { to, overflow });
                }
            }
        };
        Ok(self.account(vcpu, delivered, overflow))
    }

    /// The platform reports the outcome of an LVTPC delivery it queued: `delivered` if the PMI
    /// reached the guest, `false` if its LVTPC turned out masked. Returns `false` (and changes
    /// nothing) if no delivery was in flight for `vcpu`.
    pub fn lvtpc_delivery_done(&self, vcpu: &mut VcpuPmu<B::Context>, delivered: bool) -> bool {
        if vcpu.stats.pmis_in_flight == 0 {
            return false;
        }
        vcpu.stats.pmis_in_flight -= 1;
        if delivered {
            vcpu.stats.pmis_delivered += 1;
        } else {
            vcpu.stats.pmis_dropped += 1;
        }
        true
    }

    fn account(
        &self,
        vcpu: &mut VcpuPmu<B::Context>,
        delivered: bool,
        overflow: Overflow,
    ) -> PmiOutcome {
        if delivered {
            vcpu.stats.pmis_delivered += 1;
            PmiOutcome::Delivered {
                to: vcpu.id,
                overflow,
            }
        } else {
            vcpu.stats.pmis_dropped += 1;
            PmiOutcome::Dropped {
                to: vcpu.id,
                overflow,
            }
        }
    }

    /// Page path for a vCPU's own loaded context: save it into the page with the sample.
    fn publish<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpu: &mut VcpuPmu<B::Context>,
        pcpu: u32,
        sample: &Sample,
    ) -> Result<bool, MsrFault> {
        let Some(slot) = vcpu.page else {
            return Ok(false);
        };
        if vcpu.page_lvtpc_masked {
            return Ok(false);
        }
        self.save_vcpu(pcpus, vcpu)?;
        let identity = self.identity(platform, vcpu.id, pcpu, sample);
        let backend = &self.backend;
        let ctx = &vcpu.ctx;
        let written = platform.with_page(slot, |page| {
            backend.context_to_page(ctx, &mut page.vendor);
            publish_sample(page, &identity, &sample.regs);
        });
        if written.is_none() {
            return Ok(false);
        }
        vcpu.state = VcpuState::Cached;
        vcpu.cached_from = Some(pcpu);
        self.mask_physical_lvtpc(platform, pcpus, pcpu);
        platform.raise_pmu_virq(vcpu.id);
        Ok(true)
    }

    fn identity<P: Platform>(
        &self,
        platform: &P,
        receiver: VcpuId,
        pcpu: u32,
        sample: &Sample,
    ) -> Identity {
        let privileged = receiver.domain == platform.privileged_domain();
        Identity {
            domain_id: sample.domain_id,
            vcpu_id: sample.vcpu_id,
            // The physical topology is only the privileged domain's to see.
            pcpu_id: if privileged { pcpu } else { sample.vcpu_id },
            _pad0: 0,
        }
    }

    fn mask_physical_lvtpc<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        pcpu: u32,
    ) {
        if let Some(cpu) = pcpus.get_mut(pcpu as usize) {
            cpu.lvtpc_masked = true;
        }
        platform.set_physical_lvtpc_masked(pcpu, true);
    }

    /// All mode: the pCPU's system-wide context overflowed; the sample goes to its profiler.
    fn system_pmi<P: Platform, H: MsrBus, T: VcpuTable<B::Context>>(
        &mut self,
        platform: &mut P,
        pcpus: &mut [PcpuPmu<B::Context, H>],
        vcpus: &mut T,
        pcpu: u32,
    ) -> Result<PmiOutcome, MsrFault> {
        let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
            return Ok(PmiOutcome::Spurious);
        };
        let (Some(ctx), false) = (cpu.system.as_mut(), cpu.system_cached) else {
            return Ok(PmiOutcome::Spurious);
        };
        let overflow = self.backend.handle_overflow(ctx, &mut cpu.hw)?;
        if overflow.counters.is_empty() {
            return Ok(PmiOutcome::Spurious);
        }
        if !overflow.interrupt {
            return Ok(PmiOutcome::NoInterrupt(overflow));
        }
        let Some(profiler) = Self::profiler_of(platform, pcpu).and_then(|id| vcpus.get_mut(id))
        else {
            return Ok(PmiOutcome::Spurious);
        };
        profiler.stats.pmis_generated += 1;
        let (slot, masked) = (profiler.page, profiler.page_lvtpc_masked);
        let Some(slot) = slot.filter(|_| !masked) else {
            return Ok(self.account(profiler, false, overflow));
        };
        if profiler.state == VcpuState::Cached {
            // Never overwrite an unconsumed sample.
            platform.with_page(slot, record_dropped_sample);
            platform.diagnostic(Diagnostic::SampleDropped { vcpu: profiler.id });
            return Ok(self.account(profiler, false, overflow));
        }
        let sample = match platform.interrupted(pcpu) {
            Interrupted::Guest { vcpu, regs } => Sample {
                domain_id: if vcpu == profiler.id {
                    XENPMU_DOMID_SELF
                } else {
                    vcpu.domain
                },
                vcpu_id: vcpu.vcpu,
                regs,
            },
            Interrupted::Hypervisor { regs, on_behalf_of } => Sample {
                domain_id: XENPMU_DOMID_HYPERVISOR,
                vcpu_id: on_behalf_of.map_or(0, |(id, _)| id.vcpu),
                regs,
            },
        };
        let identity = self.identity(platform, profiler.id, pcpu, &sample);
        let Some(cpu) = pcpus.get_mut(pcpu as usize) else {
            return Ok(PmiOutcome::Spurious);
        };
        let Some(ctx) = cpu.system.as_mut() else {
            return Ok(PmiOutcome::Spurious);
        };
        self.backend.save(ctx, &mut cpu.hw)?;
        cpu.system_cached = true;
        let backend = &self.backend;
        let ctx = &*ctx;
        let written = platform.with_page(slot, |page| {
            backend.context_to_page(ctx, &mut page.vendor);
            publish_sample(page, &identity, &sample.regs);
        });
        if written.is_none() {
            // The page vanished under us: restart the counters and count the loss.
            self.backend.load(ctx, &mut cpu.hw)?;
            cpu.system_cached = false;
            return Ok(self.account(profiler, false, overflow));
        }
        profiler.state = VcpuState::Cached;
        profiler.cached_from = Some(pcpu);
        self.mask_physical_lvtpc(platform, pcpus, pcpu);
        platform.raise_pmu_virq(profiler.id);
        Ok(self.account(profiler, true, overflow))
    }
}
