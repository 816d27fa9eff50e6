//! The integrator's side: what a hypervisor provides to the core.
//!
//! The core owns no memory of its own beyond the state objects the integrator embeds
//! ([`crate::VcpuPmu`] per vCPU, [`crate::PcpuPmu`] per physical CPU) and reaches everything
//! else — guest memory, virtual interrupt controllers, the interrupted register state — through
//! [`Platform`].

use vpmu_abi::{Page, Regs};

use crate::backend::EventFilter;
use crate::request::CrossCpuRequest;

/// A vCPU: its domain and its index within the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VcpuId {
    /// Domain id, below `XENPMU_DOMID_FIRST_RESERVED` (0x7FF0): the ids from there up are the
    /// page's special identities (`XENPMU_DOMID_SELF`, `XENPMU_DOMID_HYPERVISOR`). The core
    /// drops an all-mode sample of a vCPU whose domain is in that range rather than publish it
    /// under a special identity, and `Vpmu::new_vcpu` refuses to make such a vCPU
    /// (`CoreError::ReservedDomain`).
    pub domain: u32,
    /// vCPU index within the domain.
    pub vcpu: u32,
}

/// A registered shared page, as the platform identifies its mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageSlot(pub u64);

/// A registered ring area (ABI 1.4: control page and data pages), as the platform identifies
/// its mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingSlot(pub u64);

/// Why a guest frame could not be mapped as a shared page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// Not a writable RAM page of the calling domain (`-EINVAL`).
    InvalidFrame,
    /// The hypervisor has no room to map it (`-ENOMEM`).
    NoMemory,
}

/// What was running when a PMI arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interrupted {
    /// A guest vCPU was executing guest code.
    Guest {
        /// The vCPU.
        vcpu: VcpuId,
        /// Its registers at the interrupted instruction (`mode` bits filled in).
        regs: Regs,
    },
    /// The hypervisor itself was running (possibly on behalf of a vCPU).
    Hypervisor {
        /// The hypervisor's registers (`mode` has `XENPMU_REGS_MODE_HYPERVISOR`).
        regs: Regs,
        /// The vCPU the pCPU was running, if any, with its last guest registers.
        on_behalf_of: Option<(VcpuId, Regs)>,
    },
}

impl Interrupted {
    /// What was running, without the registers.
    pub fn interruption(&self) -> Interruption {
        match self {
            Interrupted::Guest { vcpu, .. } => Interruption::Guest(*vcpu),
            Interrupted::Hypervisor { on_behalf_of, .. } => Interruption::Hypervisor {
                on_behalf_of: on_behalf_of.map(|(vcpu, _)| vcpu),
            },
        }
    }
}

/// What was running when a PMI arrived, without the registers [`Interrupted`] carries: all
/// that a PMI delivered through a virtual LVTPC needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interruption {
    /// A guest vCPU was executing guest code.
    Guest(VcpuId),
    /// The hypervisor itself was running, on behalf of a vCPU if any.
    Hypervisor {
        /// The vCPU the pCPU was running, if any.
        on_behalf_of: Option<VcpuId>,
    },
}

/// Whose address space a sample's call chain is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampledContext {
    /// A guest vCPU, through its own page tables as they are at the PMI.
    Guest(VcpuId),
    /// The hypervisor, through its own mappings.
    Hypervisor,
}

/// The result of asking the platform to deliver a PMI through a vCPU's virtual LVTPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LvtpcDelivery {
    /// Delivered (as the LVTPC's vector, or as an NMI).
    Delivered,
    /// The guest's LVTPC is masked (or its local APIC disabled): nothing delivered.
    Masked,
    /// The platform cannot touch that vCPU's local APIC from here (it runs on another thread)
    /// and will deliver from the vCPU's own context, then report the outcome with
    /// `Vpmu::lvtpc_delivery_done`. Until then the PMI counts as in flight.
    Queued,
}

/// Diagnostics: guest-reachable ones, which the platform must rate-limit (a guest can trigger
/// them at will; Xen's XSA-152 was log flooding through exactly such messages), and
/// integration bugs the core detected (`PmiOfAnotherVcpu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Diagnostic {
    /// A flush was refused because the guest-edited context failed verification.
    InvalidContextAtFlush {
        /// The vCPU that flushed.
        vcpu: VcpuId,
        /// Which register was refused.
        register: &'static str,
    },
    /// A mode or feature change was refused with `-EBUSY`.
    ChangeRefusedBusy {
        /// The caller.
        caller: VcpuId,
    },
    /// A policy change made a context stop counting something it had programmed (an event
    /// the new filter or features refuse, a host-only qualifier, a DS area without BTS).
    RestrictedByPolicy {
        /// The vCPU.
        vcpu: VcpuId,
        /// The first register restricted.
        register: &'static str,
    },
    /// A PMI's sample was dropped because the receiving page still had one cached.
    SampleDropped {
        /// The receiving vCPU.
        vcpu: VcpuId,
    },
    /// A PMI of `loaded`'s counters, on the pCPU where it runs, interrupted another vCPU,
    /// `interrupted`, by what `Platform::interrupted` / `interruption` answered: the platform
    /// disagrees with the core about what the pCPU runs (`Vpmu::context_switch` not called,
    /// or its state stale). Not guest-reachable: an integration bug. The PMI is dropped
    /// (counted in `loaded`'s `VcpuStats::pmis_dropped`) rather than attributed to either.
    PmiOfAnotherVcpu {
        /// The vCPU whose context is loaded on the pCPU.
        loaded: VcpuId,
        /// The vCPU the platform says was interrupted.
        interrupted: VcpuId,
    },
    /// Debug builds only: a flush took the published hardware images of the controls the
    /// guest left unedited (`PublishedImages::Current`), and judging them again under its
    /// policy gives another context. Expected only while `vcpu`'s domain's event filter
    /// changes (the platform answers with the new filter before `Vpmu::event_filter_changed`
    /// makes the new epoch, and within one epoch a control may have been judged under either);
    /// anything else is a core bug. The flush keeps the images it took.
    PublishedImagesDiffer {
        /// The vCPU that flushed.
        vcpu: VcpuId,
    },
}

/// Services the hypervisor provides to the core.
pub trait Platform {
    /// The privileged (profiling, control) domain.
    fn privileged_domain(&self) -> u32;

    /// Number of vCPUs of `domain`, or `None` if there is no such domain.
    fn vcpu_count(&self, domain: u32) -> Option<u32>;

    /// The per-domain event filter (KVM's PMU event filter model).
    fn event_filter(&self, domain: u32) -> &dyn EventFilter;

    /// Maps guest frame `gfn` of `domain` as a shared page.
    fn map_page(&mut self, domain: u32, gfn: u64) -> Result<PageSlot, MapError>;

    /// Unmaps a page mapped by `map_page`.
    fn unmap_page(&mut self, slot: PageSlot);

    /// Runs `access` on the page behind `slot`; `None` if the slot is not mapped.
    ///
    /// The `&mut Page` must be the hypervisor's **private copy** of the page for the duration
    /// of the call — copied in from the guest frame before `access` runs and, if the core
    /// wrote it, copied back after — never a reference into memory the guest (another of its
    /// vCPUs, a device) can write meanwhile. The core reads a field once and acts on what it
    /// read (a flush verifies the vendor area it copied, the LVTPC mask, the published
    /// sample), and Rust's `&mut` promises no one else writes the memory while it is held: a
    /// reference into live guest memory breaks that promise (undefined behaviour) and lets
    /// the guest change a value between its check and its use. Copy exactly the page (4 KiB),
    /// and write back only what the core changed, so that a guest's concurrent writes to
    /// other fields are not undone (the reference VMM's `with_page` does both).
    fn with_page<R>(&mut self, slot: PageSlot, access: impl FnOnce(&mut Page) -> R) -> Option<R>;

    /// Delivers a PMI to `vcpu` through its virtual LVTPC, and sets the LVTPC mask bit after
    /// delivery when `mask_on_delivery` (Intel's behaviour).
    fn deliver_lvtpc_pmi(&mut self, vcpu: VcpuId, mask_on_delivery: bool) -> LvtpcDelivery;

    /// Raises the PMU virtual interrupt (Xen's VIRQ_XENPMU) on `vcpu`: a sample is in its page.
    fn raise_pmu_virq(&mut self, vcpu: VcpuId);

    /// Delivers `request` to physical CPU `pcpu` (never the caller's own): an IPI in a ring-0
    /// hypervisor, a queue drained before that pCPU's next guest entry and a kick in a
    /// threaded VMM. The target calls `Vpmu::complete_request` with it on that CPU, before it
    /// next enters a guest. Requests to one pCPU must be completed in the order sent;
    /// duplicates may be merged (each is idempotent). See docs/core.md.
    fn send_request(&mut self, pcpu: u32, request: CrossCpuRequest);

    /// Masks or unmasks the physical LVTPC of `pcpu` (always the caller's own pCPU).
    fn set_physical_lvtpc_masked(&mut self, pcpu: u32, masked: bool);

    /// What `pcpu` was running when its PMI arrived.
    fn interrupted(&self, pcpu: u32) -> Interrupted;

    /// What `pcpu` was running when its PMI arrived, written into `into`: the same as
    /// `*into = self.interrupted(pcpu)`, which the default does. The core asks this way for an
    /// all-mode (system-wide) sample, with `into` a buffer of its own that the sample's
    /// registers are then read from in place; a platform that keeps the interrupted state in memory can
    /// override it to copy that state once, straight into `into`, instead of moving it through
    /// a return value.
    fn interrupted_into(&self, pcpu: u32, into: &mut Interrupted) {
        *into = self.interrupted(pcpu);
    }

    /// What `pcpu` was running when its PMI arrived, without the registers (a PMI delivered
    /// through a virtual LVTPC reads none); it must be `interrupted(pcpu).interruption()`.
    /// The default computes exactly that, copying the registers on the way; a platform that
    /// can tell without them (most can) saves that copy on every LVTPC PMI.
    fn interruption(&self, pcpu: u32) -> Interruption {
        self.interrupted(pcpu).interruption()
    }

    /// The registers `vcpu` resumes at, as it is switched in on the caller's pCPU. An overflow
    /// kept pending across a switch-out is delivered then, and this is where the guest takes
    /// the interrupt: its sample. The default (`None`, the platform cannot tell) makes such a
    /// PMI dropped and counted as such (`VcpuStats::pmis_dropped`).
    fn resume_regs(&self, vcpu: VcpuId) -> Option<Regs> {
        let _ = vcpu;
        None
    }

    /// The caller's pCPU's time-stamp counter now: the timestamp of the sample being
    /// published (`SampleInfo::tsc`). The default, 0, means the platform has no clock to give.
    fn timestamp(&mut self) -> u64 {
        0
    }

    /// The frequency of the clock `timestamp` reads, in kHz (0: unknown), written into every
    /// page at init and with every sample.
    fn tsc_khz(&self) -> u64 {
        0
    }

    /// Whether `read_sampled` can read `context`'s memory at all. The default, false, gives
    /// every sample an empty call chain (`XENPMU_CHAIN_NONE`) without calling `read_sampled`.
    fn reads_sampled_memory(&self, context: SampledContext) -> bool {
        let _ = context;
        false
    }

    /// Fills `out` from linear address `address` of `context`'s address space (a guest vCPU's
    /// own page tables as they are at the PMI, whatever the privilege of the page), for the
    /// call-chain walk; false if any byte is not mapped and readable. It must not fault, block
    /// or change the guest's state (no accessed bits, no MMIO reads: RAM only). The core reads
    /// at most `2 * XENPMU_CALLCHAIN_MAX` words per sample, and only for samples it publishes.
    fn read_sampled(&mut self, context: SampledContext, address: u64, out: &mut [u8]) -> bool {
        let _ = (context, address, out);
        false
    }

    /// Reports a guest-reachable diagnostic; the platform rate-limits it.
    fn diagnostic(&mut self, diagnostic: Diagnostic);

    /// Whether the platform can map ring areas (`map_ring`, `ring_read`, `ring_write`). The
    /// default, false, makes `XENPMU_OP_RING_INIT` and `_FINISH` answer `-EOPNOTSUPP`.
    fn supports_ring(&self) -> bool {
        false
    }

    /// Fills `out` from guest-physical `address` of `domain`'s RAM (the ring's configuration,
    /// read once at `XENPMU_OP_RING_INIT`); false if any byte is not RAM of `domain`. Like
    /// `with_page`, the bytes are a private copy: the guest changing them later changes
    /// nothing the core read.
    fn read_guest(&mut self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        let _ = (domain, address, out);
        false
    }

    /// Maps `frames` guest-physically contiguous frames of `domain` from frame `gfn` (a ring
    /// area: the control page and its data pages), all writable RAM of `domain`.
    fn map_ring(&mut self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        let _ = (domain, gfn, frames);
        Err(MapError::InvalidFrame)
    }

    /// Unmaps a ring area mapped by `map_ring`.
    fn unmap_ring(&mut self, slot: RingSlot) {
        let _ = slot;
    }

    /// Copies `out.len()` bytes at byte `offset` of the ring area (0 = the control page's first
    /// byte) into `out`; false if the slot is not mapped or the range leaves the area. The
    /// core reads only the consumer's `tail`, one 8-byte read; the read must be one
    /// single-copy-atomic 8-byte load when `out` is 8 bytes at an 8-aligned offset.
    fn ring_read(&mut self, slot: RingSlot, offset: u32, out: &mut [u8]) -> bool {
        let _ = (slot, offset, out);
        false
    }

    /// Copies `data` to byte `offset` of the ring area; false if the slot is not mapped or the
    /// range leaves the area (nothing written then). The core writes records, then the
    /// producer's line with `head`; the platform must make each call's bytes visible to the
    /// guest before the next call's (a release: on x86 plain stores in program order suffice,
    /// with a compiler barrier), and write an 8-byte `data` at an 8-aligned offset with one
    /// single-copy-atomic store.
    fn ring_write(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        let _ = (slot, offset, data);
        false
    }

    /// Writes `data` into the memory of `caller`'s domain at guest-physical `address`, for
    /// the coverage read (`XENPMU_OP_COVERAGE`); false if any byte falls outside its RAM. The
    /// default refuses: a platform without it answers coverage reads with `-EFAULT`.
    fn write_guest(&mut self, caller: VcpuId, address: u64, data: &[u8]) -> bool {
        let _ = (caller, address, data);
        false
    }
}
