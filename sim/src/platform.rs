//! [`SimPlatform`]: the hypervisor services the core calls — domains, guest memory, page
//! mappings, the virtual local APICs' LVTPC entries, the PMU VIRQ, the physical LVTPC masks,
//! the interrupted register state and the diagnostics log.

use std::collections::{BTreeMap, VecDeque};

use vpmu::abi::{Page, Regs, XENPMU_PAGE_SIZE, XENPMU_REGS_MODE_64, XENPMU_REGS_MODE_HYPERVISOR};
use vpmu::{
    AllowAll, CrossCpuRequest, Diagnostic, EventFilter, Interrupted, Interruption, LvtpcDelivery,
    MapError, PageSlot, Platform, RawEvent, RingSlot, SampledContext, VcpuId,
};

use zerocopy::IntoBytes;

use crate::workload::stack_words;

/// Guest frames each domain owns.
pub const FRAMES_PER_DOMAIN: u64 = 4;

/// Guest frame `index` of `domain` (valid for `index < FRAMES_PER_DOMAIN`). Frame numbers of
/// different domains never coincide.
pub fn guest_frame(domain: u32, index: u64) -> u64 {
    0x10_000 * u64::from(domain + 1) + index
}

/// A per-domain event filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFilter {
    /// Everything counts.
    AllowAll,
    /// The event select `select` does not count (KVM's filter semantics).
    Deny(u16),
}

impl EventFilter for SimFilter {
    fn allows(&self, event: RawEvent) -> bool {
        match self {
            SimFilter::AllowAll => true,
            SimFilter::Deny(select) => event.select != *select,
        }
    }

    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

static ALLOW_ALL: AllowAll = AllowAll;

/// The simulated hypervisor's side of the core.
#[derive(Clone, Debug, PartialEq)]
pub struct SimPlatform {
    /// The privileged domain.
    pub privileged: u32,
    /// vCPUs per domain (domain ids are indices).
    pub vcpu_counts: Vec<u32>,
    /// Event filter per domain.
    pub filters: Vec<SimFilter>,
    /// Guest memory: (domain, frame) → page.
    pub memory: BTreeMap<(u32, u64), Box<Page>>,
    /// Mapped shared pages: slot → (domain, frame).
    pub mappings: BTreeMap<u64, (u32, u64)>,
    /// Mappings the hypervisor has room for (`map_page` fails with `NoMemory` beyond).
    pub mapping_limit: usize,
    /// Each vCPU's virtual LVTPC mask bit (a local APIC resets it masked).
    pub vlapic_masked: BTreeMap<VcpuId, bool>,
    /// PMIs delivered through virtual LVTPCs and not yet taken by their guests.
    pub lvtpc_deliveries: VecDeque<VcpuId>,
    /// PMU VIRQs raised and not yet taken by their guests.
    pub virqs: VecDeque<VcpuId>,
    /// Physical LVTPC mask per pCPU.
    pub physical_masked: Vec<bool>,
    /// What each pCPU is running, set by the machine before every instruction.
    pub interrupted: Vec<Interrupted>,
    /// Diagnostics reported (the first [`SimPlatform::DIAGNOSTICS_KEPT`]; the rest are counted).
    pub diagnostics: Vec<Diagnostic>,
    /// Diagnostics reported in all.
    pub diagnostics_total: u64,
    /// Whether LVTPC deliveries are queued (as a threaded VMM must, for a vCPU on another
    /// thread) instead of done at once.
    pub queue_lvtpc: bool,
    /// Queued LVTPC deliveries: the vCPU and whether to mask on delivery.
    pub queued_lvtpc: VecDeque<(VcpuId, bool)>,
    /// Per pCPU, the cross-CPU requests sent to it and not yet completed, in order.
    pub requests: Vec<VecDeque<CrossCpuRequest>>,
    /// Requests sent in all.
    pub requests_sent: u64,
    /// The pCPU the machine is calling the core on (a request to it would be the core
    /// asking a pCPU to interrupt itself: a bug the platform refuses loudly).
    pub calling_pcpu: Option<u32>,
    /// Per vCPU, the registers of the last guest instruction it retired: where it resumes.
    pub resume_regs: BTreeMap<VcpuId, Regs>,
    /// Each domain's stack memory, as 8-aligned 64-bit words by linear address: every vCPU's
    /// frame-pointer chain (`workload::stack_words`). The hypervisor's memory is not
    /// readable for call chains.
    pub stacks: BTreeMap<u32, BTreeMap<u64, u64>>,
    /// The simulated TSC: advances by one at every reading.
    pub clock: u64,
    /// Every range the core asked `write_guest` to write (caller, guest-physical address,
    /// length), written or refused.
    pub guest_writes: Vec<(VcpuId, u64, usize)>,
    /// Whether the platform offers sample rings (ABI 1.4; `supports_ring`).
    pub ring_support: bool,
    /// Mapped ring areas: slot → the area (`ring::RingMapping`).
    pub rings: BTreeMap<u64, crate::ring::RingMapping>,
    /// The TSC frequency the platform reports (`tsc_khz`; [`SimPlatform::TSC_KHZ`], 0 for a
    /// platform that does not know it).
    pub tsc_khz: u64,
    /// `ring_write` calls the core made (each one checked against the unread bytes).
    pub ring_write_calls: u64,
}

impl SimPlatform {
    /// Diagnostics kept verbatim: the platform rate-limits what a guest can trigger at will.
    pub const DIAGNOSTICS_KEPT: usize = 64;

    /// A platform with `pcpus` physical CPUs and domains `0..vcpu_counts.len()` (`privileged`
    /// among them), each with [`FRAMES_PER_DOMAIN`] zeroed frames of RAM.
    pub fn new(pcpus: u32, vcpu_counts: &[u32], privileged: u32) -> Self {
        let mut memory = BTreeMap::new();
        for domain in 0..vcpu_counts.len() as u32 {
            for index in 0..FRAMES_PER_DOMAIN {
                memory.insert(
                    (domain, guest_frame(domain, index)),
                    Box::new(Page::zeroed()),
                );
            }
        }
        let mut stacks = BTreeMap::new();
        for (domain, &count) in (0u32..).zip(vcpu_counts) {
            let words: &mut BTreeMap<u64, u64> = stacks.entry(domain).or_default();
            for vcpu in 0..count {
                words.extend(stack_words(VcpuId { domain, vcpu }));
            }
        }
        let idle = Interrupted::Hypervisor {
            regs: Regs {
                mode: XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_HYPERVISOR,
                ..Regs::default()
            },
            on_behalf_of: None,
        };
        Self {
            privileged,
            vcpu_counts: vcpu_counts.to_vec(),
            filters: vec![SimFilter::AllowAll; vcpu_counts.len()],
            memory,
            mappings: BTreeMap::new(),
            mapping_limit: usize::MAX,
            vlapic_masked: BTreeMap::new(),
            lvtpc_deliveries: VecDeque::new(),
            virqs: VecDeque::new(),
            physical_masked: vec![false; pcpus as usize],
            interrupted: vec![idle; pcpus as usize],
            diagnostics: Vec::new(),
            diagnostics_total: 0,
            queue_lvtpc: false,
            queued_lvtpc: VecDeque::new(),
            requests: vec![VecDeque::new(); pcpus as usize],
            requests_sent: 0,
            calling_pcpu: None,
            resume_regs: BTreeMap::new(),
            stacks,
            clock: 0,
            guest_writes: Vec::new(),
            tsc_khz: Self::TSC_KHZ,
            ring_support: true,
            rings: BTreeMap::new(),
            ring_write_calls: 0,
        }
    }

    /// The guest's view of its own frame.
    pub fn frame(&self, domain: u32, gfn: u64) -> &Page {
        self.memory
            .get(&(domain, gfn))
            .expect("a frame of the domain")
    }

    /// The guest writing its own frame.
    pub fn frame_mut(&mut self, domain: u32, gfn: u64) -> &mut Page {
        self.memory
            .get_mut(&(domain, gfn))
            .expect("a frame of the domain")
    }

    /// Whether `vcpu`'s virtual LVTPC is masked.
    pub fn lvtpc_masked(&self, vcpu: VcpuId) -> bool {
        self.vlapic_masked.get(&vcpu).copied().unwrap_or(true)
    }

    /// The guest writes its virtual LVTPC's mask bit.
    pub fn set_lvtpc_masked(&mut self, vcpu: VcpuId, masked: bool) {
        self.vlapic_masked.insert(vcpu, masked);
    }

    /// The state that must not change when an operation fails: everything but the log.
    pub fn observable(&self) -> SimPlatform {
        let mut copy = self.clone();
        copy.diagnostics.clear();
        copy.diagnostics_total = 0;
        copy
    }
}

impl SimPlatform {
    /// The simulated TSC's frequency (1 GHz).
    pub const TSC_KHZ: u64 = 1_000_000;

    fn stack_of(&self, context: SampledContext) -> Option<&BTreeMap<u64, u64>> {
        match context {
            SampledContext::Guest(vcpu) => self.stacks.get(&vcpu.domain),
            SampledContext::Hypervisor => None,
        }
    }
}

impl Platform for SimPlatform {
    fn timestamp(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn tsc_khz(&self) -> u64 {
        self.tsc_khz
    }

    fn reads_sampled_memory(&self, context: SampledContext) -> bool {
        self.stack_of(context).is_some()
    }

    fn read_sampled(&mut self, context: SampledContext, address: u64, out: &mut [u8]) -> bool {
        let Some(words) = self.stack_of(context) else {
            return false;
        };
        let mut at = address;
        let mut filled = 0;
        while filled < out.len() {
            let Some(&word) = words.get(&(at & !7)) else {
                return false;
            };
            let skip = (at & 7) as usize;
            let take = (8 - skip).min(out.len() - filled);
            out[filled..filled + take].copy_from_slice(&word.to_le_bytes()[skip..skip + take]);
            filled += take;
            let Some(next) = at.checked_add(take as u64) else {
                return filled == out.len();
            };
            at = next;
        }
        true
    }

    fn privileged_domain(&self) -> u32 {
        self.privileged
    }

    fn vcpu_count(&self, domain: u32) -> Option<u32> {
        self.vcpu_counts.get(domain as usize).copied()
    }

    fn event_filter(&self, domain: u32) -> &dyn EventFilter {
        match self.filters.get(domain as usize) {
            Some(filter) => filter,
            None => &ALLOW_ALL,
        }
    }

    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError> {
        if !self.memory.contains_key(&(domain, gfn)) {
            return Err(MapError::InvalidFrame);
        }
        if self.mappings.len() >= self.mapping_limit {
            return Err(MapError::NoMemory);
        }
        // The lowest free slot: mapping and unmapping again leaves no trace.
        let slot = (0..)
            .find(|s| !self.mappings.contains_key(s))
            .expect("a free slot");
        self.mappings.insert(slot, (domain, gfn));
        Ok(PageSlot(slot))
    }

    fn unmap_page(&mut self, slot: PageSlot) {
        self.mappings.remove(&slot.0);
    }

    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R> {
        let frame = *self.mappings.get(&slot.0)?;
        let page = self.memory.get_mut(&frame)?;
        Some(access(page))
    }

    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery {
        if self.queue_lvtpc {
            self.queued_lvtpc.push_back((vcpu, mask_on_delivery));
            return LvtpcDelivery::Queued;
        }
        if self.lvtpc_masked(vcpu) {
            return LvtpcDelivery::Masked;
        }
        self.lvtpc_deliveries.push_back(vcpu);
        if mask_on_delivery {
            self.set_lvtpc_masked(vcpu, true);
        }
        LvtpcDelivery::Delivered
    }

    fn raise_pmu_virq(&mut self, vcpu: VcpuId) {
        self.virqs.push_back(vcpu);
    }

    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        self.resume_regs.get(&vcpu).copied()
    }

    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest) {
        assert_ne!(
            Some(pcpu),
            self.calling_pcpu,
            "the core sent {request:?} to its own pCPU"
        );
        self.requests_sent += 1;
        let queue = &mut self.requests[pcpu as usize];
        // Requests are idempotent: a duplicate of the newest one is merged.
        if queue.back() != Some(&request) {
            queue.push_back(request);
        }
    }

    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool) {
        if let Some(calling) = self.calling_pcpu {
            assert_eq!(calling, pcpu, "the core masked another pCPU's LVTPC");
        }
        if let Some(slot) = self.physical_masked.get_mut(pcpu as usize) {
            *slot = masked;
        }
    }

    fn interrupted(&self, pcpu: u32) -> Interrupted {
        self.interrupted[pcpu as usize]
    }

    fn interrupted_into(&self, pcpu: u32, into: &mut Interrupted) {
        *into = self.interrupted[pcpu as usize];
    }

    fn interruption(&self, pcpu: u32) -> Interruption {
        self.interrupted[pcpu as usize].interruption()
    }

    /// Guest-physical address `gfn << 12 | offset` is byte `offset` of frame `gfn` of the
    /// caller's domain; all of `data` must land in its frames, or nothing is written.
    fn write_guest(&mut self, caller: VcpuId, address: u64, data: &[u8]) -> bool {
        self.guest_writes.push((caller, address, data.len()));
        let Some(end) = address.checked_add(data.len() as u64) else {
            return false;
        };
        if data.is_empty() {
            return true;
        }
        let frames = (address >> 12)..=((end - 1) >> 12);
        if !frames
            .clone()
            .all(|gfn| self.memory.contains_key(&(caller.domain, gfn)))
        {
            return false;
        }
        let mut at = address;
        let mut rest = data;
        for gfn in frames {
            let page = self
                .memory
                .get_mut(&(caller.domain, gfn))
                .expect("checked above");
            let offset = (at & 0xfff) as usize;
            let take = (XENPMU_PAGE_SIZE - offset).min(rest.len());
            page.as_mut_bytes()[offset..offset + take].copy_from_slice(&rest[..take]);
            rest = &rest[take..];
            at += take as u64;
        }
        true
    }

    fn supports_ring(&self) -> bool {
        self.ring_support
    }

    fn read_guest(&mut self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        self.read_physical(domain, address, out)
    }

    fn map_ring(&mut self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        self.map_ring_area(domain, gfn, frames)
    }

    fn unmap_ring(&mut self, slot: RingSlot) {
        self.rings.remove(&slot.0);
    }

    fn ring_read(&mut self, slot: RingSlot, offset: u32, out: &mut [u8]) -> bool {
        self.ring_access(slot, offset, out.len())
            .is_some_and(|(domain, address)| self.read_physical(domain, address, out))
    }

    fn ring_write(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        self.write_ring_area(slot, offset, data)
    }

    fn diagnostic(&mut self, diagnostic: Diagnostic) {
        // The simulator changes a filter and calls `event_filter_changed` in one step: no flush
        // runs in between, so images taken unjudged must be what judging gives.
        assert!(
            !matches!(diagnostic, Diagnostic::PublishedImagesDiffer { .. }),
            "{diagnostic:?} with no event filter change in flight"
        );
        self.diagnostics_total += 1;
        if self.diagnostics.len() < Self::DIAGNOSTICS_KEPT {
            self.diagnostics.push(diagnostic);
        }
    }
}
