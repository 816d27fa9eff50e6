//! What the hypervisor shares between its physical CPUs, and what it provides the core: the
//! vCPU table ([`Vcpus`], one lock per vCPU) and the platform services ([`HostCpu`], one per
//! pCPU thread, over the shared [`Host`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, MutexGuard};

use vpmu_vendor_any::VendorContext;
use vpmu_vendor_any::VendorPmu;
use vpmu_vendor_any::vpmu::abi::{Page, Regs, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_HYPERVISOR};
use vpmu_vendor_any::vpmu::{
    AllowAll, CrossCpuRequest, Diagnostic, EventFilter, Interrupted, LvtpcDelivery, MapError,
    PageSlot, Platform, VcpuId, VcpuPmu, VcpuTable, Vpmu,
};

use crate::pcpu::Job;

/// A vCPU's PMU state, as the core defines it for the vendor-erased backend.
pub type Vcpu = VcpuPmu<VendorContext>;

/// Every vCPU's PMU state, each behind its own lock (the core's locking rule: it locks one vCPU
/// at a time through `with_vcpu`, so per-vCPU locks cannot deadlock against it).
#[derive(Debug)]
pub struct Vcpus {
    vcpus: BTreeMap<VcpuId, Mutex<Vcpu>>,
}

impl Vcpus {
    /// The table of `vcpus`.
    pub fn new(vcpus: impl IntoIterator<Item = Vcpu>) -> Self {
        Vcpus {
            vcpus: vcpus.into_iter().map(|v| (v.id(), Mutex::new(v))).collect(),
        }
    }

    /// Locks `id`'s state (for an intercept of the vCPU running on the caller's pCPU).
    ///
    /// # Panics
    /// If there is no such vCPU, or its lock is poisoned.
    pub fn lock(&self, id: VcpuId) -> MutexGuard<'_, Vcpu> {
        self.vcpus[&id].lock().expect("vCPU lock")
    }

    /// vCPUs of `domain`.
    pub fn count(&self, domain: u32) -> u32 {
        self.vcpus.keys().filter(|id| id.domain == domain).count() as u32
    }
}

impl VcpuTable<VendorContext> for Vcpus {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut Vcpu)) -> bool {
        match self.vcpus.get(&id) {
            Some(vcpu) => {
                visit(&mut vcpu.lock().expect("vCPU lock"));
                true
            }
            None => false,
        }
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut Vcpu)) {
        let first = VcpuId { domain, vcpu: 0 };
        for (_, vcpu) in self
            .vcpus
            .range(first..)
            .take_while(|(id, _)| id.domain == domain)
        {
            visit(&mut vcpu.lock().expect("vCPU lock"));
        }
    }
}

/// A guest's virtual local APIC, as far as the PMU is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualLapic {
    /// The LVTPC mask bit (the guest's driver clears it).
    pub lvtpc_masked: bool,
    /// PMIs delivered through the LVTPC.
    pub pmis: u32,
}

/// A local APIC resets with its LVTPC masked.
impl Default for VirtualLapic {
    fn default() -> Self {
        VirtualLapic {
            lvtpc_masked: true,
            pmis: 0,
        }
    }
}

/// The hypervisor's state shared by every pCPU thread.
#[derive(Debug)]
pub struct Host {
    /// The vPMU: one for the whole machine, whichever vendor it is.
    pub vpmu: Vpmu<VendorPmu>,
    /// The vCPUs' PMU state.
    pub vcpus: Vcpus,
    /// The domain with the profiling rights (`XENPMU_OP_MODE_SET` and friends).
    pub privileged: u32,
    /// Guest RAM: the frames guests may register as their shared page, by (domain, frame).
    pub memory: Mutex<BTreeMap<(u32, u64), Box<Page>>>,
    /// Shared pages the core mapped: slot → (domain, frame).
    pub mappings: Mutex<BTreeMap<u64, (u32, u64)>>,
    /// The virtual local APICs.
    pub lapics: Mutex<BTreeMap<VcpuId, VirtualLapic>>,
    /// PMU VIRQs raised (a sample waits in that vCPU's page), oldest first.
    pub virqs: Mutex<VecDeque<VcpuId>>,
    /// Per pCPU, the requests other pCPUs sent it that it has not completed yet, in order.
    pub inboxes: Vec<Mutex<VecDeque<CrossCpuRequest>>>,
    /// Per pCPU, how to interrupt it (the IPI of a ring-0 hypervisor): a job on its thread.
    pub kick: Vec<Sender<Job>>,
    /// The registers each vCPU resumes at (its last guest instruction).
    pub resume_regs: Mutex<BTreeMap<VcpuId, Regs>>,
    /// Diagnostics the core reported (a real hypervisor rate-limits and logs them).
    pub diagnostics: Mutex<Vec<Diagnostic>>,
}

/// The platform as one pCPU's thread presents it to the core: the shared host, plus what only
/// this pCPU knows (what it runs, its physical LVTPC).
#[derive(Debug)]
pub struct HostCpu<'h> {
    /// The shared host.
    pub host: &'h Host,
    /// This pCPU's index.
    pub index: u32,
    /// The guest instruction being executed, if a guest runs: what a PMI interrupts.
    pub in_guest: Option<(VcpuId, Regs)>,
    /// This pCPU's physical LVTPC mask (the core masks it while a sample is in a page).
    pub lvtpc_masked: bool,
    /// Requests this pCPU sent others.
    pub requests_sent: u32,
}

/// Every domain counts every event here; a real hypervisor keeps KVM-style filters per domain.
static NO_FILTER: AllowAll = AllowAll;

impl Platform for HostCpu<'_> {
    fn privileged_domain(&self) -> u32 {
        self.host.privileged
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        Some(self.host.vcpus.count(domain)).filter(|&n| n > 0)
    }

    fn event_filter(&self, _domain: u32) -> &dyn EventFilter {
        &NO_FILTER
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        if !self
            .host
            .memory
            .lock()
            .unwrap()
            .contains_key(&(domain, gfn))
        {
            return Err(MapError::InvalidFrame);
        }
        let mut mappings = self.host.mappings.lock().unwrap();
        let slot = (0..)
            .find(|s| !mappings.contains_key(s))
            .expect("a free slot");
        mappings.insert(slot, (domain, gfn));
        Ok(PageSlot(slot))
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        self.host.mappings.lock().unwrap().remove(&slot.0);
    }

    /// The core gets a private copy of the page, written back after: guests touch their
    /// memory only under the same lock here, so nothing they write meanwhile can be undone.
    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let frame = *self.host.mappings.lock().unwrap().get(&slot.0)?;
        let mut memory = self.host.memory.lock().unwrap();
        let guest_frame = memory.get_mut(&frame)?;
        let mut copy = guest_frame.clone();
        let result = access(&mut copy);
        if copy != *guest_frame {
            *guest_frame = copy;
        }
        Some(result)
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        let mut lapics = self.host.lapics.lock().unwrap();
        let lapic = lapics.entry(vcpu).or_default();
        if lapic.lvtpc_masked {
            return LvtpcDelivery::Masked;
        }
        lapic.pmis += 1;
        lapic.lvtpc_masked = mask_on_delivery;
        LvtpcDelivery::Delivered
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        self.host.virqs.lock().unwrap().push_back(vcpu);
    }

    /// Queued for that pCPU, which is kicked: its thread completes the queue before it next
    /// enters a guest (a ring-0 hypervisor sends an IPI instead).
    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        assert_ne!(
            pcpu, self.index,
            "the core never sends a pCPU a request to itself"
        );
        self.host.inboxes[pcpu as usize]
            .lock()
            .unwrap()
            .push_back(request);
        self.requests_sent += 1;
        // The target drains its inbox before any job, so an empty job is a kick. A stopped
        // pCPU has nothing left to complete.
        let kick: Job = Box::new(|_| {});
        let _ = self.host.kick[pcpu as usize].send(kick);
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        assert_eq!(pcpu, self.index, "only the caller's own LVTPC");
        self.lvtpc_masked = masked;
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        assert_eq!(pcpu, self.index, "a PMI is handled on its own pCPU");
        match self.in_guest {
            Some((vcpu, regs)) => Interrupted::Guest { vcpu, regs },
            None => Interrupted::Hypervisor {
                regs: Regs {
                    mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_HYPERVISOR,
                    ..Regs::default()
                },
                on_behalf_of: None,
            },
        }
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        self.host.resume_regs.lock().unwrap().get(&vcpu).copied()
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        self.host.diagnostics.lock().unwrap().push(diagnostic);
    }
}
