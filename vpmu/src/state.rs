//! Per-vCPU and per-pCPU state objects, embedded by the integrator in its own vCPU and CPU
//! structures (the core allocates nothing).

use vpmu_abi::{Regs, VendorArea, XENPMU_CALLCHAIN_MAX};

use crate::backend::{Overflow, PublishedImages};
use crate::bank::HwRecord;
use crate::core::{Mode, PolicySnapshot};
use crate::msr::{CountingBus, MsrAccessStats, MsrBus};
use crate::platform::{Interrupted, PageSlot, RingSlot, VcpuId};
use crate::ring::{ProducerCounters, RecordBuffer, Ring};

/// Where the sample cached in a vCPU's page came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleSource {
    /// The vCPU's own counters, which overflowed on `pcpu` (self and hv modes).
    Own {
        /// The pCPU the overflow happened on.
        pcpu: u32,
    },
    /// The system-wide counters of `pcpu`, which the vCPU profiles (all mode); they stay
    /// stopped on that pCPU until the flush.
    System {
        /// The sampled pCPU.
        pcpu: u32,
    },
}

/// The policy epoch a context's hardware images (each control as the policy lets it reach the
/// hardware) were computed under, as far as the core can vouch for it. A flush whose policy has
/// that epoch takes the images of the controls the guest left unedited instead of judging them
/// again (docs/core.md, "Unedited controls at a flush").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ImagesUnder {
    /// No image of the context was computed under an older epoch than this one (epochs only
    /// grow, so under this very epoch every image is that epoch's).
    Epoch(u64),
    /// The context came by a path that does not keep track: its images are judged again.
    Unvouched,
}

impl ImagesUnder {
    /// What a flush under `epoch` may assume of the images.
    #[inline]
    pub(crate) fn at(self, epoch: u64) -> PublishedImages {
        if self == ImagesUnder::Epoch(epoch) {
            PublishedImages::Current
        } else {
            PublishedImages::Stale
        }
    }

    /// After a control of the context was judged again under `epoch`, the one in force: the
    /// images stay vouched for only if all of them were of that epoch already.
    #[inline]
    pub(crate) fn after_write(self, epoch: u64) -> Self {
        if self == ImagesUnder::Epoch(epoch) {
            self
        } else {
            ImagesUnder::Unvouched
        }
    }
}

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
    Cached {
        /// Whose counters were sampled.
        from: SampleSource,
    },
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
    /// Overflows with their interrupt enabled that were saved with the context before their
    /// PMI was handled (and were then delivered when the vCPU next ran).
    pub pmis_kept_pending: u64,
    /// Intercepted guest RDMSRs of PMU registers.
    pub msr_reads: u64,
    /// Intercepted guest WRMSRs of PMU registers.
    pub msr_writes: u64,
    /// Guest RDPMCs performed for the guest (each also counted as the RDMSR it reads).
    pub rdpmcs: u64,
    /// Intercepted accesses answered with #GP.
    pub gp_faults: u64,
    /// Times the context was loaded onto hardware.
    pub loads: u64,
    /// Times the context was saved from hardware.
    pub saves: u64,
    /// Times a policy change restricted something this context had programmed.
    pub restrictions: u64,
    /// Hardware MSR accesses made on this vCPU's behalf.
    pub hw_msr: MsrAccessStats,
}

/// What a MODE_SET or FEATURE_SET asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PolicyChange {
    /// MODE_SET to this mode.
    Mode(Mode),
    /// FEATURE_SET to these features.
    Features(u64),
}

/// A policy change a vCPU began that was still being applied on other pCPUs when its call
/// returned `-EAGAIN`: its retry answers 0 once epoch `epoch` is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingChange {
    pub(crate) request: PolicyChange,
    pub(crate) epoch: u64,
}

/// A FINISH a vCPU called that returned `-EAGAIN`: the teardown of its sibling `target` was
/// left to the pCPU holding that vCPU's context. Its retry answers 0 once the target's
/// `teardowns` differs from the count seen then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingFinish {
    pub(crate) target: u32,
    pub(crate) teardowns: u64,
}

/// A registered shared page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedPage {
    pub(crate) slot: PageSlot,
    /// The guest frame it was registered with (one frame is one vCPU's page at most).
    pub(crate) gfn: u64,
    /// Samples generated for the page since init, published or dropped: the sequence number
    /// of the last one (`SampleInfo::sequence`). Kept here, never read back from the page.
    pub(crate) samples: u64,
    /// Call-chain entries the last sample published in the page wrote: those past a shorter
    /// next chain are cleared then. Kept here, never read back from the page.
    pub(crate) chain_written: u32,
}

/// The outcome of a vCPU's last full intercept entry, kept so that the next intercepts under
/// the same policy skip it: under policy word `word` (the packed mode, features and epoch,
/// which every change of mode, features or event filter replaces) the vCPU had a vPMU, the
/// mode switched contexts, and its context was validated. While the word is unchanged, the
/// pCPU has caught up with it and the context is loaded on that pCPU, every check of the
/// full entry passes, so the fast path is the full path with its answers known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FastIntercepts {
    /// The policy word of the checks; `u64::MAX` (an epoch no vPMU reaches) for none.
    pub(crate) word: u64,
    /// `GuestPolicy::may_count_host` under that policy.
    pub(crate) may_count_host: bool,
}

impl FastIntercepts {
    /// No fast path until a full entry has passed.
    pub(crate) const NONE: FastIntercepts = FastIntercepts {
        word: u64::MAX,
        may_count_host: false,
    };
}

/// The vPMU part of a vCPU.
#[derive(Clone, Debug)]
pub struct VcpuPmu<C> {
    pub(crate) id: VcpuId,
    pub(crate) state: VcpuState,
    pub(crate) ctx: C,
    /// The policy epoch `ctx` was last validated against. Outside a cached window no image in
    /// `ctx` was computed under an older one (a window moves it on without touching `ctx`).
    pub(crate) validated: u64,
    /// When this vCPU's intercepts may skip the entry checks (see `intercept.rs`).
    pub(crate) fast: FastIntercepts,
    pub(crate) page: Option<SharedPage>,
    /// The registered sample ring (ABI 1.4), if any: samples go there instead of the page.
    pub(crate) ring: Option<Ring>,
    /// The page path's virtual LVTPC mask, as last applied by lvtpc_set or flush.
    pub(crate) page_lvtpc_masked: bool,
    pub(crate) running_on: Option<u32>,
    /// An overflow with its interrupt enabled, saved with the context before its PMI was
    /// handled: delivered once when the vCPU next runs (KVM keeps KVM_REQ_PMI pending).
    pub(crate) pending_pmi: Option<Overflow>,
    /// All mode, privileged vCPU: the system-wide programming its WRMSRs built, which every
    /// pCPU it profiles loads (its own instance values aside).
    pub(crate) program: Option<C>,
    /// All mode: pCPUs holding a system-wide instance of this vCPU's program, counted since
    /// epoch `.1` (void if all mode was left and entered again since).
    pub(crate) system_instances: (u32, u64),
    /// All mode: a flushed sample's verified context waiting to be loaded on the pCPU it
    /// was sampled on (a `ResumeSystem` request to it is in flight), and the epoch it was
    /// verified under.
    pub(crate) handover: Option<(u32, C, ImagesUnder)>,
    /// All mode: the sampled system-wide context as saved at the sample cached in the page
    /// (what the flush verifies the page against).
    pub(crate) sampled: Option<C>,
    /// The epoch of the images in the context the cached sample was published from (`ctx`
    /// or `sampled`), taken when the window opened.
    pub(crate) published_images: ImagesUnder,
    /// A MODE_SET/FEATURE_SET this vCPU began that was still in progress at its last call.
    pub(crate) pending_change: Option<PendingChange>,
    /// A FINISH this vCPU called that was still pending at its last call.
    pub(crate) pending_finish: Option<PendingFinish>,
    /// Times this vCPU's vPMU was torn down (finish, domain destruction), wherever that
    /// happened: what a pending FINISH waits for.
    pub(crate) teardowns: u64,
    pub(crate) stats: VcpuStats,
}

impl<C> VcpuPmu<C> {
    /// A vCPU's vPMU state in its reset state; `ctx` is the backend's `new_context()`. Made
    /// through `Vpmu::new_vcpu`, which checks `id`.
    pub(crate) fn new(id: VcpuId, ctx: C) -> Self {
        Self {
            id,
            state: VcpuState::Allocated,
            ctx,
            validated: 0,
            fast: FastIntercepts::NONE,
            page: None,
            ring: None,
            page_lvtpc_masked: true,
            running_on: None,
            pending_pmi: None,
            program: None,
            system_instances: (0, 0),
            handover: None,
            sampled: None,
            published_images: ImagesUnder::Unvouched,
            pending_change: None,
            pending_finish: None,
            teardowns: 0,
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
        self.page.map(|p| p.slot)
    }

    /// The registered sample ring (ABI 1.4), as the producer keeps it.
    pub fn ring(&self) -> Option<RingStatus> {
        self.ring.as_ref().map(|ring| RingStatus {
            slot: ring.slot,
            gfn: ring.gfn,
            head: ring.head,
            counters: ring.counters,
            pending_lost: ring.pending_lost.map_or(0, |p| p.count),
        })
    }

    /// The pCPU it is scheduled on, if any.
    pub fn running_on(&self) -> Option<u32> {
        self.running_on
    }

    /// The vendor context (saved copy; stale while loaded).
    pub fn context(&self) -> &C {
        &self.ctx
    }

    /// An overflow saved with the context and not yet delivered.
    pub fn pending_pmi(&self) -> Option<Overflow> {
        self.pending_pmi
    }

    /// Whether this vCPU counts as an active vPMU for the mode-change rules: it has used the
    /// PMU or registered a page.
    pub fn in_use(&self) -> bool {
        self.state != VcpuState::Allocated || self.page.is_some()
    }
}

/// A registered sample ring as the producer keeps it (never read back from the guest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingStatus {
    /// The platform's mapping of the ring area.
    pub slot: RingSlot,
    /// The control page's guest frame.
    pub gfn: u64,
    /// The producer's head: where the next record goes.
    pub head: u64,
    /// The producer's counters, as last written to the control page.
    pub counters: ProducerCounters,
    /// Samples lost and not yet reported by a lost record.
    pub pending_lost: u64,
}

/// Where a pCPU's system-wide context is (all mode): the privileged profiler's counters on
/// it. The context itself is kept beside this state in [`PcpuPmu`] (see
/// [`PcpuPmu::system_context`]), so that a sample (`Loaded` to `Cached`) and its flush change
/// the state without moving the context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SystemContext {
    /// None programmed.
    Absent,
    /// Counting on this pCPU's hardware for `profiler` (the context is authoritative except
    /// for live counter values).
    Loaded {
        /// The privileged vCPU whose program it is.
        profiler: VcpuId,
    },
    /// Stopped: its sample is cached in `profiler`'s page until the flush (the context is as
    /// saved at the sample).
    Cached {
        /// The privileged vCPU whose page holds the sample.
        profiler: VcpuId,
    },
}

/// The vPMU part of a physical CPU: its PMU hardware and, in all mode, the system-wide context
/// the privileged profiler programs on it. Only code running on this CPU may use it.
#[derive(Debug)]
pub struct PcpuPmu<C, H> {
    pub(crate) index: u32,
    pub(crate) hw: H,
    /// What `hw` is known to hold while no context is loaded on it (save and load keep it).
    pub(crate) record: HwRecord,
    pub(crate) current: Option<VcpuId>,
    pub(crate) system: SystemContext,
    /// The system-wide context while `system` is not `Absent`; a leftover, never used, while
    /// it is.
    pub(crate) system_ctx: C,
    /// The epoch of the images in `system_ctx`.
    pub(crate) system_images: ImagesUnder,
    /// The vCPU whose cached sample masked this pCPU's physical LVTPC, if any.
    pub(crate) lvtpc_masked_for: Option<VcpuId>,
    /// The policy this pCPU's state was last brought in line with.
    pub(crate) seen: PolicySnapshot,
    /// A flush's copy of the guest's vendor area: the words the backend's layout uses, copied
    /// once, verified, and wiped before the flush goes on (no guest data outlives it, and a
    /// refused flush leaves this pCPU as it was). Kept here rather than on the stack, where it
    /// would be zeroed whole (1 KiB) for every flush.
    pub(crate) page_copy: VendorArea,
    /// How many words of the vendor area the backend's layout uses (its `used_words`).
    pub(crate) page_copy_words: usize,
    /// Where a sample's call chain is walked before it is copied into the page (the walk reads
    /// through the platform, which lends the page only afterwards). Kept here so that a sample
    /// does not clear a stack buffer first: only the entries the walk wrote are ever read.
    pub(crate) chain: [u64; XENPMU_CALLCHAIN_MAX],
    /// What an all-mode PMI interrupted, as the platform wrote it
    /// (`Platform::interrupted_into`): the sample borrows its registers from here, so that
    /// they are copied once on their way into the page, not moved through return values.
    /// Hypervisor state, like the rest of this structure: never shown to a guest but through
    /// a sample the core publishes.
    pub(crate) interrupted: Interrupted,
    /// Where a ring sample's record is built before its one write into the ring (ABI 1.4):
    /// 736 bytes, the largest record.
    pub(crate) ring_record: RecordBuffer,
}

impl<C, H: MsrBus> PcpuPmu<C, H> {
    pub(crate) fn new(
        index: u32,
        hw: H,
        seen: PolicySnapshot,
        page_copy_words: usize,
        system_ctx: C,
    ) -> Self {
        Self {
            index,
            hw,
            record: HwRecord::unknown(),
            current: None,
            system: SystemContext::Absent,
            system_ctx,
            system_images: ImagesUnder::Unvouched,
            lvtpc_masked_for: None,
            seen,
            page_copy: VendorArea::default(),
            page_copy_words,
            chain: [0; XENPMU_CALLCHAIN_MAX],
            interrupted: Interrupted::Hypervisor {
                regs: Regs::default(),
                on_behalf_of: None,
            },
            ring_record: RecordBuffer::new(),
        }
    }

    /// This pCPU's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The hardware.
    pub fn hw(&self) -> &H {
        &self.hw
    }

    /// The hardware, mutably (for feeding events to a software model). A caller that writes
    /// PMU MSRs through it must call [`PcpuPmu::forget_hardware`] afterwards.
    pub fn hw_mut(&mut self) -> &mut H {
        &mut self.hw
    }

    /// Tells the core that someone else wrote this pCPU's PMU: the next load writes every
    /// register it needs instead of only those it does not know the hardware holds.
    pub fn forget_hardware(&mut self) {
        self.record.forget();
    }

    /// What the core knows the hardware holds between contexts.
    pub fn hw_record(&self) -> &HwRecord {
        &self.record
    }

    /// The vCPU currently scheduled here.
    pub fn current(&self) -> Option<VcpuId> {
        self.current
    }

    /// Whether the core has masked this pCPU's physical LVTPC (a sample is cached).
    pub fn lvtpc_masked(&self) -> bool {
        self.lvtpc_masked_for.is_some()
    }

    /// Where the system-wide context is (all mode).
    pub fn system(&self) -> &SystemContext {
        &self.system
    }

    /// The system-wide context (all mode), unless it is absent.
    pub fn system_context(&self) -> Option<&C> {
        (self.system != SystemContext::Absent).then_some(&self.system_ctx)
    }

    /// The mode this pCPU last caught up with.
    pub fn mode_seen(&self) -> Mode {
        self.seen.mode
    }

    /// The hardware wrapped so that the accesses made through it can be charged to a vCPU.
    pub(crate) fn counted(&mut self) -> (CountingBus<&mut H>, &mut HwRecord) {
        (CountingBus::new(&mut self.hw), &mut self.record)
    }
}
