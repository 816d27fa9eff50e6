//! [`PcpuPlatform`]: the hypervisor services as one pCPU's thread sees them. Each thread has
//! its own; what must be common (guest memory, mappings, virtual local APICs, request queues,
//! filters) is in [`Shared`]. The calls the core may only make about its own pCPU (physical
//! LVTPC, interrupted state) and requests to itself are findings here.

use std::sync::atomic::Ordering;

use vpmu::abi::{Page, Regs, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_HYPERVISOR};
use vpmu::{
    AllowAll, CrossCpuRequest, Diagnostic, EventFilter, Interrupted, Interruption, LvtpcDelivery,
    MapError, PageSlot, Platform, VcpuId,
};

use super::rng::Rng;
use super::shared::{Shared, lock};

static ALLOW_ALL: AllowAll = AllowAll;

/// Hypervisor registers at `rip` (the tag `seq` in `rbx`).
pub fn hypervisor_regs(rip: u64, seq: u64) -> Regs {
    Regs {
        rip,
        rflags: 0x2,
        cs: 0xe008,
        ss: 0xe010,
        rbx: seq,
        mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_HYPERVISOR,
        ..Regs::default()
    }
}

/// One pCPU's platform.
#[derive(Debug)]
pub struct PcpuPlatform<'s> {
    shared: &'s Shared,
    /// This pCPU.
    pub pcpu: u32,
    /// What this pCPU is running, as a PMI arriving now would find it.
    pub interrupted: Interrupted,
    /// The physical LVTPC's mask bit.
    pub physical_masked: bool,
    /// Requests sent to other pCPUs.
    pub requests_sent: u64,
    /// Diagnostics reported.
    pub diagnostics: u64,
    rng: Rng,
}

impl<'s> PcpuPlatform<'s> {
    /// pCPU `pcpu`'s platform; `rng` decides which LVTPC deliveries are queued.
    pub fn new(shared: &'s Shared, pcpu: u32, rng: Rng) -> Self {
        Self {
            shared,
            pcpu,
            interrupted: Interrupted::Hypervisor {
                regs: hypervisor_regs(0xffff_8000_0000_0000, 0),
                on_behalf_of: None,
            },
            physical_masked: false,
            requests_sent: 0,
            diagnostics: 0,
            rng,
        }
    }

    fn wrong_pcpu(&self, what: &str, pcpu: u32) {
        self.shared.finding(
            "core acted on another pCPU's local state",
            format!(
                "seed {:#x}: pCPU {} was asked to {what} of pCPU {pcpu}",
                self.shared.seed, self.pcpu
            ),
        );
    }
}

impl Platform for PcpuPlatform<'_> {
    fn privileged_domain(&self) -> u32 {
        0
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        self.shared.vcpu_counts.get(domain as usize).copied()
    }

    fn event_filter(&self, domain: u32) -> &dyn EventFilter {
        match self.shared.filters.get(domain as usize) {
            Some(filter) => filter,
            None => &ALLOW_ALL,
        }
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        if !self.shared.memory.contains_key(&(domain, gfn)) {
            return Err(MapError::InvalidFrame);
        }
        let slot = self.shared.new_slot();
        lock(&self.shared.mappings).insert(slot, (domain, gfn));
        Ok(PageSlot(slot))
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        if lock(&self.shared.mappings).remove(&slot.0).is_none() {
            self.shared.finding(
                "page unmapped twice or never mapped",
                format!(
                    "seed {:#x}: pCPU {} unmapped slot {}",
                    self.shared.seed, self.pcpu, slot.0
                ),
            );
        }
    }

    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        self.shared.with_mapped(slot.0, access)
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        let flat = self.shared.flat(vcpu);
        let runner = self.shared.claims[flat].load(Ordering::SeqCst);
        if runner != self.pcpu {
            self.shared.finding(
                "PMI delivered to a vCPU not running on the pCPU",
                format!(
                    "seed {:#x}: pCPU {} delivered to {vcpu:?}, claimed by {runner:#x}",
                    self.shared.seed, self.pcpu
                ),
            );
        }
        let mut vlapic = lock(&self.shared.vlapics[flat]);
        // Some deliveries are left to the vCPU's own context, as a VMM must when the vCPU's
        // local APIC belongs to its thread: the PMI is then in flight until reported.
        if self.rng.chance(1, 3) {
            vlapic.queued.push_back(mask_on_delivery);
            return LvtpcDelivery::Queued;
        }
        if vlapic.masked {
            return LvtpcDelivery::Masked;
        }
        vlapic.delivered += 1;
        vlapic.masked |= mask_on_delivery;
        LvtpcDelivery::Delivered
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        lock(&self.shared.vlapics[self.shared.flat(vcpu)]).virqs += 1;
    }

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        if pcpu == self.pcpu || pcpu >= self.shared.pcpus {
            self.wrong_pcpu("send itself a request", pcpu);
            return;
        }
        self.requests_sent += 1;
        self.shared
            .note(self.pcpu, format!("sent {request:?} to pCPU {pcpu}"));
        lock(&self.shared.queues[pcpu as usize]).push_back(request);
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        if pcpu != self.pcpu {
            self.wrong_pcpu("mask the physical LVTPC", pcpu);
            return;
        }
        self.physical_masked = masked;
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        if pcpu != self.pcpu {
            self.wrong_pcpu("tell the interrupted state", pcpu);
        }
        self.interrupted
    }

    fn interruption(&self, pcpu: u32) -> Interruption {
        if pcpu != self.pcpu {
            self.wrong_pcpu("tell the interrupted state", pcpu);
        }
        self.interrupted.interruption()
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        Some(*lock(&self.shared.last_regs[self.shared.flat(vcpu)]))
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        self.diagnostics += 1;
        if let Diagnostic::PublishedImagesDiffer { vcpu } = diagnostic {
            // Only a filter change in flight (the platform answering with the new filter, the
            // epoch not yet made) lets one epoch judge a control two ways. It cannot complete
            // during the flush that found it: this pCPU has not caught up with it yet.
            let changing = self
                .shared
                .filters
                .get(vcpu.domain as usize)
                .is_some_and(|filter| filter.changing.load(Ordering::SeqCst));
            if changing {
                self.shared
                    .coverage
                    .hit("flushes that kept images judged before a filter change");
            } else {
                self.shared.finding(
                    "a flush took published images that are not its policy's",
                    format!("seed {:#x}: {vcpu:?}", self.shared.seed),
                );
            }
        }
    }
}
