//! The cross-CPU request queues, the inner platform's counters, and `InnerPlatform` (the
//! `Platform` of the inner hypervisor).

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};

use vpmu::{
    AllowAll, CrossCpuRequest, Diagnostic, EventFilter, Interrupted, LvtpcDelivery, MapError,
    PageSlot, Platform, VcpuId,
};
use vpmu_guest_protocol::ring0 as proto;

use crate::hw::{LVT_MASKED, PMI_VECTOR, X2APIC_ICR, X2APIC_LVTPC, apic_write, trace_word};
use crate::{PCPUS, PRIVILEGED, VCPUS, guest, index_of};

/// A small FIFO of the requests sent to one pCPU.
pub(crate) struct Queue {
    items: [Option<CrossCpuRequest>; 16],
    head: usize,
    len: usize,
}

impl Queue {
    const fn new() -> Self {
        Queue {
            items: [None; 16],
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, r: CrossCpuRequest) -> bool {
        if self.len == self.items.len() {
            return false;
        }
        let at = (self.head + self.len) % self.items.len();
        self.items[at] = Some(r);
        self.len += 1;
        true
    }

    pub(crate) fn pop(&mut self) -> Option<CrossCpuRequest> {
        if self.len == 0 {
            return None;
        }
        let r = self.items[self.head].take();
        self.head = (self.head + 1) % self.items.len();
        self.len -= 1;
        r
    }
}

/// Requests sent to each pCPU, completed by its IPI handler.
pub(crate) static QUEUES: [spin::Mutex<Queue>; PCPUS] =
    [const { spin::Mutex::new(Queue::new()) }; PCPUS];

pub(crate) const NONE: u32 = 0xffff;
/// Per inner pCPU: the inner vCPU it runs (table index, `NONE` for none).
pub(crate) static CURRENT: [AtomicU32; PCPUS] = [const { AtomicU32::new(NONE) }; PCPUS];
/// LVTPC deliveries per inner vCPU (the inner platform's virtual LVTPC).
pub(crate) static LVTPC_PMIS: [AtomicU64; VCPUS] = [const { AtomicU64::new(0) }; VCPUS];
/// Per pCPU: request IPIs sent to it, taken by it, requests it completed.
pub(crate) static IPIS_SENT: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
pub(crate) static IPIS_TAKEN: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
pub(crate) static REQUESTS_DONE: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
/// Per pCPU: core calls that failed inside an interrupt handler.
pub(crate) static HANDLER_ERRORS: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
/// Per pCPU: PMIs taken, and those the core found no overflow for.
pub(crate) static PMIS_TAKEN: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
pub(crate) static PMIS_SPURIOUS: [AtomicU64; PCPUS] = [const { AtomicU64::new(0) }; PCPUS];
pub(crate) static QUEUE_FULL: AtomicBool = AtomicBool::new(false);

/// The inner platform (its state is the statics above: the same for every pCPU).
pub(crate) struct InnerPlatform;

pub(crate) fn vcpu_of_index(i: u32) -> Option<VcpuId> {
    match i {
        0 => Some(PRIVILEGED),
        i if (i as usize) < VCPUS => Some(guest(i - 1)),
        _ => None,
    }
}

pub(crate) fn index_word(id: Option<VcpuId>) -> u32 {
    id.and_then(index_of).map_or(NONE, |i| i as u32)
}

impl Platform for InnerPlatform {
    fn privileged_domain(&self) -> u32 {
        PRIVILEGED.domain
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        match domain {
            0 => Some(1),
            1 => Some(VCPUS as u32 - 1),
            _ => None,
        }
    }

    fn event_filter(&self, _domain: u32) -> &dyn EventFilter {
        &AllowAll
    }

    fn map_page(&mut self, _domain: u32, _gfn: u64) -> Result<PageSlot, MapError> {
        // No shared pages in this guest: its inner vCPUs use their virtual LVTPC.
        Err(MapError::NoMemory)
    }

    fn unmap_page(&mut self, _slot: PageSlot) {}

    fn with_page<R>(
        &mut self,
        _slot: PageSlot,
        _access: impl FnOnce(&mut vpmu::abi::Page) -> R,
    ) -> Option<R> {
        None
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, _mask_on_delivery: bool) -> LvtpcDelivery {
        if let Some(i) = index_of(vcpu) {
            LVTPC_PMIS[i].fetch_add(1, SeqCst);
        }
        LvtpcDelivery::Delivered
    }

    fn raise_pmu_virq(&mut self, _vcpu: VcpuId) {}

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        let Some(queue) = QUEUES.get(pcpu as usize) else {
            return;
        };
        if !queue.lock().push(request) {
            QUEUE_FULL.store(true, SeqCst);
            return;
        }
        if cfg!(feature = "sabotage-local-request") {
            // Sabotage: no IPI; the caller runs the request itself (`run_sent_here`).
            return;
        }
        IPIS_SENT[pcpu as usize].fetch_add(1, SeqCst);
        trace_word(proto::TRACE_IPI_SENT, 0, pcpu, 0);
        // Fixed delivery, physical destination = the target's x2APIC ID (= its pCPU index).
        apic_write(
            X2APIC_ICR,
            u64::from(pcpu) << 32 | u64::from(proto::IPI_VECTOR),
        );
    }

    fn set_physical_lvtpc_masked(&mut self, _pcpu: u32, masked: bool) {
        apic_write(
            X2APIC_LVTPC,
            PMI_VECTOR | if masked { LVT_MASKED } else { 0 },
        );
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        let current = CURRENT[pcpu as usize % PCPUS].load(SeqCst);
        match vcpu_of_index(current) {
            Some(vcpu) => Interrupted::Guest {
                vcpu,
                regs: Default::default(),
            },
            None => Interrupted::Hypervisor {
                regs: Default::default(),
                on_behalf_of: None,
            },
        }
    }

    fn diagnostic(&mut self, _diagnostic: Diagnostic) {}
}
