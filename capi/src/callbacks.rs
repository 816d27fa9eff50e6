//! What the C hypervisor provides: the callback tables (the MSR bus of a pCPU, the CPUID the
//! backend is chosen from, the platform services) and the plain data that crosses them.
//!
//! Every callback takes first the `ctx` pointer its owner registered: the pCPU's context
//! given to `vpmu_pcpu_attach` for the MSR bus and the platform (so a callback knows which
//! pCPU calls it: always the pCPU of the entry point that is running), the CPUID context
//! given to `vpmu_create` for CPUID. Callbacks run on the calling thread, inside the entry
//! point; they must not call back into the API for the same pCPU (that call fails with
//! `VPMU_REASON_PCPU_BUSY`) and must not unwind or `longjmp` out.

use std::ffi::c_void;

use vpmu_abi::Regs;

/// The MSR bus of one physical CPU: RDMSR and WRMSR on the hardware (or a model of it),
/// always called on the pCPU it belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuMsrOps {
    /// Reads MSR `msr` into `*value`; returns 0, or nonzero if the access faulted (#GP).
    pub rdmsr: Option<unsafe extern "C" fn(ctx: *mut c_void, msr: u32, value: *mut u64) -> i32>,
    /// Writes `value` to MSR `msr`; returns 0, or nonzero if the access faulted (#GP).
    pub wrmsr: Option<unsafe extern "C" fn(ctx: *mut c_void, msr: u32, value: u64) -> i32>,
}

/// The CPUID of the host, from which `vpmu_create` chooses the vendor backend.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuCpuidOps {
    /// Executes CPUID with EAX = `leaf`, ECX = `subleaf`; writes EAX, EBX, ECX, EDX to
    /// `out[0..4]`. Required.
    pub cpuid:
        Option<unsafe extern "C" fn(ctx: *mut c_void, leaf: u32, subleaf: u32, out: *mut u32)>,
    /// Reads IA32_PERF_CAPABILITIES (MSR 0x345) into `*value`; returns 0, or nonzero if the
    /// read faulted. Called only on an Intel CPU whose CPUID.1:ECX.PDCM says the MSR exists.
    /// May be NULL: the MSR is then taken as absent (no full-width counter writes).
    pub read_perf_capabilities:
        Option<unsafe extern "C" fn(ctx: *mut c_void, value: *mut u64) -> i32>,
}

/// `deliver_lvtpc_pmi`'s answer: delivered through the vCPU's LVTPC.
pub const VPMU_LVTPC_DELIVERED: u32 = 0;
/// `deliver_lvtpc_pmi`'s answer: the vCPU's LVTPC is masked; nothing delivered.
pub const VPMU_LVTPC_MASKED: u32 = 1;
/// `deliver_lvtpc_pmi`'s answer: the platform delivers it later from the vCPU's own context
/// and then calls `vpmu_lvtpc_delivery_done`.
pub const VPMU_LVTPC_QUEUED: u32 = 2;

/// `vpmu_request::kind`: catch up with the newest policy epoch.
pub const VPMU_REQUEST_CATCH_UP: u32 = 0;
/// `vpmu_request::kind`: tear the vCPU (`domain`, `vcpu`) down if it is loaded here.
pub const VPMU_REQUEST_TEARDOWN: u32 = 1;
/// `vpmu_request::kind`: all mode: the profiler (`domain`, `vcpu`) wrote `value` to `msr`.
pub const VPMU_REQUEST_SYSTEM_WRITE: u32 = 2;
/// `vpmu_request::kind`: all mode: load the context the profiler flushed.
pub const VPMU_REQUEST_RESUME_SYSTEM: u32 = 3;
/// `vpmu_request::kind`: all mode: drop this pCPU's system-wide context of the profiler.
pub const VPMU_REQUEST_DROP_SYSTEM: u32 = 4;

/// Work the core needs done on another pCPU: handed to `send_request`, and given back to
/// `vpmu_complete_request` on the target pCPU. Plain data: copy it into the target's queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VpmuRequest {
    /// `VPMU_REQUEST_*`.
    pub kind: u32,
    /// The vCPU's domain (teardown) or the profiler's (the all-mode kinds); else 0.
    pub domain: u32,
    /// The vCPU's index in its domain; else 0.
    pub vcpu: u32,
    /// `VPMU_REQUEST_SYSTEM_WRITE`: the MSR written; else 0.
    pub msr: u32,
    /// `VPMU_REQUEST_SYSTEM_WRITE`: the value written; else 0.
    pub value: u64,
}

/// `vpmu_interrupted::kind`: a guest vCPU was executing guest code.
pub const VPMU_INTERRUPTED_GUEST: u32 = 0;
/// `vpmu_interrupted::kind`: the hypervisor itself was running.
pub const VPMU_INTERRUPTED_HYPERVISOR: u32 = 1;

/// What a pCPU was running when its PMI arrived, filled by the `interrupted` callback (the
/// library zeroes it first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VpmuInterrupted {
    /// `VPMU_INTERRUPTED_*`; any other value is taken as the hypervisor on behalf of no vCPU.
    pub kind: u32,
    /// Guest: the vCPU that ran. Hypervisor: the vCPU it worked for, if `on_behalf_of`.
    pub domain: u32,
    /// The vCPU's index in its domain.
    pub vcpu: u32,
    /// Hypervisor: nonzero if it ran on behalf of vCPU (`domain`, `vcpu`).
    pub on_behalf_of: u32,
    /// Guest: the vCPU's registers at the interrupted instruction. Hypervisor: the
    /// hypervisor's (`mode` with `XENPMU_REGS_MODE_HYPERVISOR`).
    pub regs: Regs,
    /// Hypervisor on behalf of a vCPU: that vCPU's last guest registers.
    pub vcpu_regs: Regs,
}

/// `read_sampled`'s context: a guest vCPU's address space.
pub const VPMU_SAMPLED_GUEST: u32 = 0;
/// `read_sampled`'s context: the hypervisor's own.
pub const VPMU_SAMPLED_HYPERVISOR: u32 = 1;

/// Diagnostic kinds (`vpmu_diagnostic::kind`), as the core reports them.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VpmuDiagnosticKind {
    /// A flush was refused: the guest-edited context failed verification (`register`).
    InvalidContextAtFlush = 0,
    /// A mode or feature change was refused with `-EBUSY`.
    ChangeRefusedBusy,
    /// A policy change made a context stop counting something (`register`: the first).
    RestrictedByPolicy,
    /// A sample was dropped: the receiving page still had one cached.
    SampleDropped,
    /// A PMI of the loaded vCPU interrupted another vCPU (`other_*`): the platform's answer
    /// to `interrupted` disagrees with the switches it made. An integration bug.
    PmiOfAnotherVcpu,
    /// Debug builds: a flush's published images differ from a fresh judgement.
    PublishedImagesDiffer,
}

/// A diagnostic of the core. Guest-reachable ones must be rate-limited by the platform (a
/// guest triggers them at will).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuDiagnostic {
    /// What happened.
    pub kind: VpmuDiagnosticKind,
    /// The vCPU concerned (for `PMI_OF_ANOTHER_VCPU`: the loaded one).
    pub domain: u32,
    /// Its index.
    pub vcpu: u32,
    /// `PMI_OF_ANOTHER_VCPU`: the interrupted vCPU's domain; else 0.
    pub other_domain: u32,
    /// `PMI_OF_ANOTHER_VCPU`: the interrupted vCPU's index; else 0.
    pub other_vcpu: u32,
    /// The register's name, NUL-terminated (empty if the kind names none).
    pub register_name: [u8; 32],
}

/// The platform services, shared by every pCPU; each call gets the calling pCPU's `ctx`.
/// Required callbacks are marked so; `vpmu_create` refuses a table missing one
/// (`VPMU_REASON_MISSING_CALLBACK`). Optional ones may be NULL, with the effect stated.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuPlatformOps {
    /// Required. Maps guest frame `gfn` of `domain` as a vCPU's shared page; writes a slot
    /// number of the platform's choosing to `*slot`. Returns 0, `-EINVAL` (not a writable RAM
    /// frame of `domain`) or `-ENOMEM`.
    pub map_page: Option<
        unsafe extern "C" fn(ctx: *mut c_void, domain: u32, gfn: u64, slot: *mut u64) -> i32,
    >,
    /// Required. Unmaps a slot `map_page` mapped.
    pub unmap_page: Option<unsafe extern "C" fn(ctx: *mut c_void, slot: u64)>,
    /// Required. Copies the 4096 bytes of the page behind `slot` into `page`; returns 0, or
    /// nonzero if the slot is not mapped. The core works on this private copy only.
    pub read_page: Option<unsafe extern "C" fn(ctx: *mut c_void, slot: u64, page: *mut u8) -> i32>,
    /// Required. Writes `len` bytes at byte `offset` of the page behind `slot`: only the bytes
    /// the core changed in its copy, so a guest's concurrent writes elsewhere stay.
    pub write_page: Option<
        unsafe extern "C" fn(ctx: *mut c_void, slot: u64, offset: u32, bytes: *const u8, len: u32),
    >,
    /// Required. Delivers a PMI through the vCPU's virtual LVTPC, and masks the LVTPC after
    /// delivery if `mask_on_delivery` (Intel's behaviour). Returns `VPMU_LVTPC_*`; any
    /// other value counts as masked.
    pub deliver_lvtpc_pmi: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            domain: u32,
            vcpu: u32,
            mask_on_delivery: bool,
        ) -> u32,
    >,
    /// Required. Raises the PMU virtual interrupt (Xen's VIRQ_XENPMU) on the vCPU: a sample
    /// waits in its page.
    pub raise_pmu_virq: Option<unsafe extern "C" fn(ctx: *mut c_void, domain: u32, vcpu: u32)>,
    /// Required. Delivers `request` to pCPU `target` (never the caller's): queue a copy and
    /// interrupt it (an IPI). The target calls `vpmu_complete_request` with it before its
    /// next guest entry, in the order sent.
    pub send_request:
        Option<unsafe extern "C" fn(ctx: *mut c_void, target: u32, request: *const VpmuRequest)>,
    /// Required. Masks or unmasks the physical LVTPC of `pcpu` (the caller's own).
    pub set_physical_lvtpc_masked:
        Option<unsafe extern "C" fn(ctx: *mut c_void, pcpu: u32, masked: bool)>,
    /// Required. What `pcpu` (the caller's own) was running when its PMI arrived.
    pub interrupted:
        Option<unsafe extern "C" fn(ctx: *mut c_void, pcpu: u32, out: *mut VpmuInterrupted)>,
    /// Required. Reports a diagnostic (rate-limit the guest-reachable ones).
    pub diagnostic:
        Option<unsafe extern "C" fn(ctx: *mut c_void, diagnostic: *const VpmuDiagnostic)>,
    /// Optional. The registers the vCPU resumes at, into `*regs`; false if unknown. NULL: a
    /// PMI kept pending across a switch-out is dropped (and counted) when it is delivered.
    pub resume_regs: Option<
        unsafe extern "C" fn(ctx: *mut c_void, domain: u32, vcpu: u32, regs: *mut Regs) -> bool,
    >,
    /// Optional. The caller's TSC now, stamped on samples. NULL: 0.
    pub timestamp: Option<unsafe extern "C" fn(ctx: *mut c_void) -> u64>,
    /// Optional. The TSC's frequency in kHz. NULL: 0 (unknown).
    pub tsc_khz: Option<unsafe extern "C" fn(ctx: *mut c_void) -> u64>,
    /// Optional. Reads `len` bytes at linear `address` of the sampled context
    /// (`VPMU_SAMPLED_*`; `domain`, `vcpu` for a guest) without faulting or side effects;
    /// false if any byte is unreadable. NULL: samples carry no call chain.
    pub read_sampled: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            kind: u32,
            domain: u32,
            vcpu: u32,
            address: u64,
            out: *mut u8,
            len: u32,
        ) -> bool,
    >,
    /// Optional (ring, ABI 1.4). Reads `len` bytes of `domain`'s RAM at guest-physical
    /// `address`; false if any byte is not its RAM.
    pub read_guest: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            domain: u32,
            address: u64,
            out: *mut u8,
            len: u32,
        ) -> bool,
    >,
    /// Optional (ring). Maps `frames` contiguous frames of `domain` from `gfn`; 0, `-EINVAL`
    /// or `-ENOMEM`. The ring is offered to guests only if `read_guest`, `map_ring`,
    /// `unmap_ring`, `ring_read` and `ring_write` are all given.
    pub map_ring: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            domain: u32,
            gfn: u64,
            frames: u32,
            slot: *mut u64,
        ) -> i32,
    >,
    /// Optional (ring). Unmaps a ring area.
    pub unmap_ring: Option<unsafe extern "C" fn(ctx: *mut c_void, slot: u64)>,
    /// Optional (ring). Copies `len` bytes at `offset` of the ring area into `out`; false if
    /// out of the area. An 8-byte read at an 8-aligned offset must be one atomic load.
    pub ring_read: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            slot: u64,
            offset: u32,
            out: *mut u8,
            len: u32,
        ) -> bool,
    >,
    /// Optional (ring). Copies `len` bytes to `offset` of the ring area, visible before the
    /// next call's; false if out of the area. An 8-byte write at an 8-aligned offset must be
    /// one atomic store.
    pub ring_write: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            slot: u64,
            offset: u32,
            data: *const u8,
            len: u32,
        ) -> bool,
    >,
    /// Optional (`XENPMU_OP_COVERAGE`). Writes `len` bytes into the caller's domain's RAM at
    /// guest-physical `address`; false if any byte is outside it. NULL: `-EFAULT`.
    pub write_guest: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            domain: u32,
            vcpu: u32,
            address: u64,
            data: *const u8,
            len: u32,
        ) -> bool,
    >,
}

impl VpmuPlatformOps {
    /// Whether every required callback is there.
    pub(crate) fn complete(&self) -> bool {
        self.map_page.is_some()
            && self.unmap_page.is_some()
            && self.read_page.is_some()
            && self.write_page.is_some()
            && self.deliver_lvtpc_pmi.is_some()
            && self.raise_pmu_virq.is_some()
            && self.send_request.is_some()
            && self.set_physical_lvtpc_masked.is_some()
            && self.interrupted.is_some()
            && self.diagnostic.is_some()
    }

    /// Whether the ring callbacks are all there.
    pub(crate) fn ring(&self) -> bool {
        self.read_guest.is_some()
            && self.map_ring.is_some()
            && self.unmap_ring.is_some()
            && self.ring_read.is_some()
            && self.ring_write.is_some()
    }
}
