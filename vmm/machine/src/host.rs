//! `Host`: the part of the VMM's platform every pCPU thread shares (pCPU mailboxes, per-vCPU
//! signals and queued LVTPC deliveries, the mapped shared pages), lock-free on the hot paths.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;

use vpmu::{CrossCpuRequest, VcpuId};

use super::{Layout, VcpuIndex, lock_shared};
use crate::kick::KickTarget;
use crate::platform::PmiContext;

/// At most this many LVTPC deliveries wait for each receiver (more: answered `Masked`).
const MAX_QUEUED: usize = 1024;

/// An LVTPC delivery to a vCPU other than the one this thread runs (`LvtpcDelivery::Queued`):
/// its LAPIC may only be touched from its own run loop between runs, which performs it before
/// the vCPU's next entry and reports it with `Vpmu::lvtpc_delivery_done`.
#[derive(Clone, Copy, Debug)]
pub(super) struct QueuedPmi {
    pub(super) to: VcpuId,
    pub(super) mask_on_delivery: bool,
    /// The interrupted context (of the vCPU that ran when the PMI was raised).
    pub(super) context: PmiContext,
}

/// One pCPU's inbox, reachable from every thread.
#[derive(Debug)]
pub(super) struct Mailbox {
    /// Requests for this pCPU: a lock-free queue its thread drains before each guest entry.
    requests: Sender<CrossCpuRequest>,
    /// The thread that is this pCPU now, kicked out of `KVM_RUN` when a request arrives.
    pub(super) kick: KickTarget,
    /// Shared layouts: vCPUs of this pCPU waiting to run next (`VcpuSignals::woken` set).
    wakes: AtomicU32,
    /// The order of those wake-ups (first woken, first run).
    wake_seq: AtomicU64,
}

/// What other threads signal to one vCPU, outside its state's lock (the core may hold that
/// lock while it calls the platform).
#[derive(Debug, Default)]
struct VcpuSignals {
    /// LVTPC deliveries queued for this vCPU by other threads or vCPUs.
    queued: Mutex<Vec<QueuedPmi>>,
    /// `queued` is not empty: the run loop looks at this, not the lock, before each entry.
    has_queued: AtomicBool,
    /// Shared layouts: nonzero while the vCPU waits to run next on its pCPU (it was sent the
    /// PMU VIRQ while another vCPU ran there); the value orders the wake-ups of one pCPU.
    woken: AtomicU64,
}

/// Guest frames mapped as shared pages, per domain: lock-free slots holding a frame number (0:
/// free; frame 0 is never mapped).
#[derive(Debug)]
pub(super) struct PageTable {
    domains: Vec<Vec<AtomicU64>>,
}

impl PageTable {
    fn new(counts: &[u32]) -> Self {
        // One registered page per vCPU, plus one mapping in flight per vCPU's INIT (the core
        // maps the frame before it checks the vCPU's state, and unmaps it if a check fails).
        let slots = |n: u32| (0..2 * n.max(1)).map(|_| AtomicU64::new(0)).collect();
        Self {
            domains: counts.iter().map(|&n| slots(n)).collect(),
        }
    }

    pub(super) fn map(&self, domain: u32, gfn: u64) -> bool {
        self.domains.get(domain as usize).is_some_and(|slots| {
            slots.iter().any(|s| {
                s.compare_exchange(0, gfn, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
        })
    }

    pub(super) fn unmap(&self, domain: u32, gfn: u64) {
        if let Some(slots) = self.domains.get(domain as usize) {
            let _ = slots.iter().any(|s| {
                s.compare_exchange(gfn, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            });
        }
    }

    pub(super) fn mapped(&self, domain: u32, gfn: u64) -> bool {
        self.domains
            .get(domain as usize)
            .is_some_and(|slots| slots.iter().any(|s| s.load(Ordering::Acquire) == gfn))
    }
}

/// The platform state every pCPU thread shares: pCPU mailboxes, per-vCPU signals, the mapped
/// pages. Nothing here is locked on a guest's MSR exit.
#[derive(Debug)]
pub(super) struct Host {
    pub(super) layout: Layout,
    pub(super) index: VcpuIndex,
    pub(super) mailboxes: Vec<Mailbox>,
    signals: Vec<VcpuSignals>,
    pub(super) pages: PageTable,
    /// The ring areas mapped for the core (ABI 1.4).
    pub(super) rings: crate::ring::RingTable,
}

impl Host {
    pub(super) fn new(
        layout: Layout,
        index: VcpuIndex,
        requests: Vec<Sender<CrossCpuRequest>>,
    ) -> Self {
        let vcpus = index.counts.iter().map(|&n| n as usize).sum();
        Self {
            layout,
            pages: PageTable::new(&index.counts),
            rings: crate::ring::RingTable::new(&index.counts),
            index,
            mailboxes: requests
                .into_iter()
                .map(|requests| Mailbox {
                    requests,
                    kick: KickTarget::default(),
                    wakes: AtomicU32::new(0),
                    wake_seq: AtomicU64::new(0),
                })
                .collect(),
            signals: (0..vcpus).map(|_| VcpuSignals::default()).collect(),
        }
    }

    fn signals(&self, vcpu: VcpuId) -> Option<&VcpuSignals> {
        self.signals.get(self.index.of(vcpu)?)
    }

    /// Sends `request` to `pcpu` and kicks its thread out of `KVM_RUN`.
    pub(super) fn send(&self, pcpu: u32, request: CrossCpuRequest) {
        let Some(mailbox) = self.mailboxes.get(pcpu as usize) else {
            return;
        };
        // A pCPU whose thread has ended was detached (`Vpmu::detach_pcpu`): the core no
        // longer waits for it, and its queue is gone.
        if mailbox.requests.send(request).is_ok() {
            mailbox.kick.kick();
        }
    }

    /// Shared layouts: `vcpu` runs next on its pCPU (unless it is already waiting to).
    pub(super) fn wake(&self, vcpu: VcpuId) {
        let (Some(signals), Some(mailbox)) = (
            self.signals(vcpu),
            self.mailboxes.get(self.layout.home_pcpu(vcpu) as usize),
        ) else {
            return;
        };
        let stamp = mailbox.wake_seq.fetch_add(1, Ordering::Relaxed) + 1;
        if signals
            .woken
            .compare_exchange(0, stamp, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            mailbox.wakes.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// `vcpu` no longer waits to run (it runs now, or it is done).
    pub(super) fn unwake(&self, vcpu: VcpuId) {
        let (Some(signals), Some(mailbox)) = (
            self.signals(vcpu),
            self.mailboxes.get(self.layout.home_pcpu(vcpu) as usize),
        ) else {
            return;
        };
        if signals.woken.swap(0, Ordering::AcqRel) != 0 {
            mailbox.wakes.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether a vCPU of `pcpu` waits to run next.
    pub(super) fn woken_on(&self, pcpu: u32) -> bool {
        self.mailboxes
            .get(pcpu as usize)
            .is_some_and(|m| m.wakes.load(Ordering::Acquire) > 0)
    }

    /// Of `group`, the vCPU that was woken first and still waits.
    pub(super) fn first_woken(&self, group: &[VcpuId]) -> Option<VcpuId> {
        group
            .iter()
            .filter_map(|&v| {
                let stamp = self.signals(v)?.woken.load(Ordering::Acquire);
                (stamp != 0).then_some((stamp, v))
            })
            .min()
            .map(|(_, v)| v)
    }

    /// Whether LVTPC deliveries wait for `vcpu`.
    pub(super) fn has_queued(&self, vcpu: VcpuId) -> bool {
        self.signals(vcpu)
            .is_some_and(|s| s.has_queued.load(Ordering::Acquire))
    }

    /// The LVTPC deliveries waiting for `vcpu`, in order (removed).
    pub(super) fn take_queued(&self, vcpu: VcpuId) -> Vec<QueuedPmi> {
        let Some(signals) = self.signals(vcpu) else {
            return Vec::new();
        };
        let mut queued = lock_shared(&signals.queued);
        signals.has_queued.store(false, Ordering::Release);
        std::mem::take(&mut *queued)
    }

    /// Drops the LVTPC deliveries waiting for `vcpu` (torn down, or the mode they were routed
    /// under is over): returns how many, for the caller to report to the core as not
    /// delivered. Lock-free when there are none.
    pub(super) fn drop_queued(&self, vcpu: VcpuId) -> usize {
        if !self.has_queued(vcpu) {
            return 0;
        }
        self.take_queued(vcpu).len()
    }

    /// Every vCPU of every domain.
    pub(super) fn vcpu_ids(&self) -> impl Iterator<Item = VcpuId> + '_ {
        (0u32..)
            .zip(&self.index.counts)
            .flat_map(|(domain, &count)| (0..count).map(move |vcpu| VcpuId { domain, vcpu }))
    }

    pub(super) fn queue_lvtpc(&self, pmi: QueuedPmi) -> bool {
        let Some(signals) = self.signals(pmi.to) else {
            return false;
        };
        let mut queued = lock_shared(&signals.queued);
        if queued.len() >= MAX_QUEUED {
            return false;
        }
        queued.push(pmi);
        signals.has_queued.store(true, Ordering::Release);
        true
    }
}
