//! The shared page: one 4 KiB page per vCPU, little-endian, identical for 32-bit and 64-bit
//! consumers.
//!
//! Every `u64` sits at an 8-aligned offset and every struct size is a multiple of 8, with all
//! padding spelled out as `_pad`/`_reserved` fields. The layout therefore does not depend on
//! whether the consumer aligns `uint64_t` to 4 (i386) or 8 (x86-64) bytes; `layout` and the
//! compile-time assertions in `asserts` prove it.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::vendor::VendorArea;

/// Size of the shared page in bytes.
pub const XENPMU_PAGE_SIZE: usize = 4096;

/// `magic` of a page written by this ABI: the bytes `"XPMU"` at offset 0.
pub const XENPMU_MAGIC: u32 = 0x554D_5058;

/// Major version. A consumer must refuse a page (and the hypervisor a control operation) whose
/// major differs from its own: a major change may move or reinterpret anything.
pub const XENPMU_VERSION_MAJOR: u16 = 1;

/// Minor version. A newer minor only gives meaning to bytes that older minors defined as
/// reserved (always written as zero), so an older consumer can read a newer page unchanged,
/// or adds operations. 1.1 added `XENPMU_OP_COVERAGE`; 1.2 added the sample details
/// (`Page::sample`: timestamp, sequence number, overflowed counters, call chain); 1.3 added
/// the flush refusal report (`Page::flush_refusal`) in bytes 1.2 reserved; 1.4 added the sample
/// ring (`ring`, `XENPMU_OP_RING_INIT`/`_FINISH`), leaving the page as 1.3 defined it.
pub const XENPMU_VERSION_MINOR: u16 = 4;

/// Size in bytes of the part of the page that version 1.0 defines (header through the vendor
/// area). The hypervisor writes the size of the part *its* minor defines into
/// `Header::defined_size`; it is never smaller than this for major 1.
pub const XENPMU_DEFINED_SIZE_1_0: u32 = 1280;

/// Size in bytes of the part of the page that version 1.2 defines (1.0's part and
/// `Page::sample`). A consumer reads `Page::sample` only from a page whose
/// `Header::defined_size` is at least this.
pub const XENPMU_DEFINED_SIZE_1_2: u32 = 1864;

/// Entries of `SampleInfo::callchain`: the deepest call chain a sample carries.
pub const XENPMU_CALLCHAIN_MAX: usize = 64;

/// `SampleInfo::chain_end`: no call chain was walked (the platform cannot read the sampled
/// context's memory, or the context is 16-bit or real mode). `chain_len` is 0.
pub const XENPMU_CHAIN_NONE: u32 = 0;
/// `SampleInfo::chain_end`: the walk reached the outermost frame (a zero frame pointer or a
/// zero return address).
pub const XENPMU_CHAIN_COMPLETE: u32 = 1;
/// `SampleInfo::chain_end`: the chain is longer than `XENPMU_CALLCHAIN_MAX`; the outermost
/// frames are missing.
pub const XENPMU_CHAIN_TRUNCATED: u32 = 2;
/// `SampleInfo::chain_end`: the walk stopped at a frame pointer that cannot be one (not
/// canonical, misaligned, below the stack pointer or not above the previous frame), e.g. in
/// code built without frame pointers.
pub const XENPMU_CHAIN_BAD_FRAME: u32 = 3;
/// `SampleInfo::chain_end`: the walk stopped at a frame the hypervisor could not read (not
/// mapped, or not readable, in the sampled context's address space).
pub const XENPMU_CHAIN_UNREADABLE: u32 = 4;

/// `FlushRefusal::reason`: nothing refused (an initialised page, or a hypervisor older than
/// 1.3, which leaves the report zero).
pub const XENPMU_REFUSED_NONE: u32 = 0;
/// `FlushRefusal::reason`: a bit the register does not have for this guest: a reserved bit, or
/// a bit naming a counter the PMU does not have. A WRMSR of the value would fault (#GP).
pub const XENPMU_REFUSED_RESERVED: u32 = 1;
/// `FlushRefusal::reason`: a counter value with bits above the counter's width, for a counter
/// whose WRMSR faults on them (Intel fixed counters). A WRMSR of the value would fault (#GP).
pub const XENPMU_REFUSED_WIDTH: u32 = 2;
/// `FlushRefusal::reason`: a defined bit or value the hypervisor does not let this guest use
/// (Intel AnyThread and PinControl, AMD HostOnly, a DS area without the BTS feature or not
/// canonical, PEBS). A WRMSR of the value would fault (#GP).
pub const XENPMU_REFUSED_FORBIDDEN: u32 = 3;
/// `FlushRefusal::reason`: an enabled event that `XENPMU_FEATURE_IPC_ONLY` or
/// `XENPMU_FEATURE_ARCH_ONLY` does not allow. A WRMSR of the value would fault (#GP).
pub const XENPMU_REFUSED_EVENT: u32 = 4;
/// `FlushRefusal::reason`: the global status has a bit set that the hypervisor did not set
/// (an overflow may only be acknowledged, by clearing its bit, never invented).
pub const XENPMU_REFUSED_STATUS: u32 = 5;
/// `FlushRefusal::reason`: the register does not exist on this PMU (AMD global registers
/// without PerfMonV2, a fixed counter missing from a sparse bank); its word must stay 0.
pub const XENPMU_REFUSED_ABSENT: u32 = 6;

/// `Header::vendor`: no vendor context has been set up (the page is not initialised).
pub const XENPMU_VENDOR_NONE: u32 = 0;
/// `Header::vendor`: the vendor area holds an Intel context (`IntelCtxt` and its banks).
pub const XENPMU_VENDOR_INTEL: u32 = 1;
/// `Header::vendor`: the vendor area holds an AMD context (`AmdCtxt` and its banks). Also used
/// for Hygon processors, whose PMU is AMD's.
pub const XENPMU_VENDOR_AMD: u32 = 2;

/// First reserved domain id; real domains have ids below it.
pub const XENPMU_DOMID_FIRST_RESERVED: u32 = 0x7FF0;
/// `Identity::domain_id` when the sample belongs to the vCPU that owns the page.
pub const XENPMU_DOMID_SELF: u32 = 0x7FF0;
/// `Identity::domain_id` when the sample was taken while the hypervisor itself was running.
/// Only ever delivered to the privileged profiling domain.
pub const XENPMU_DOMID_HYPERVISOR: u32 = 0x7FF2;

/// `Page::pmu_flags`: a sample is pending. The hypervisor has copied the counter context into the
/// vendor area, masked the physical LVTPC and raised the PMU VIRQ. Until the owner issues the
/// flush operation, the vendor area is the owner's to read and edit, and no further sample is
/// written to this page (later PMIs are counted as dropped).
pub const XENPMU_FLAG_CACHED: u64 = 1 << 0;
/// `Page::pmu_flags`: the sampled context was running in user mode (CPL 3).
pub const XENPMU_FLAG_SAMPLE_USER: u64 = 1 << 1;
/// `Page::pmu_flags`: the sampled context was in real mode or virtual-8086 mode.
pub const XENPMU_FLAG_SAMPLE_REAL: u64 = 1 << 2;
/// Every `pmu_flags` bit version 1.0 defines; the others are reserved and written as zero.
pub const XENPMU_FLAGS_DEFINED: u64 =
    XENPMU_FLAG_CACHED | XENPMU_FLAG_SAMPLE_USER | XENPMU_FLAG_SAMPLE_REAL;

/// `Page::lapic_lvtpc`: the LVT mask bit, the only bit of the virtual LVTPC the guest controls.
pub const XENPMU_LVTPC_MASKED: u32 = 1 << 16;

/// `Regs::mode`: the sampled code ran in 64-bit mode.
pub const XENPMU_REGS_MODE_64: u32 = 1 << 0;
/// `Regs::mode`: the sampled code ran with a 32-bit code segment (protected or compatibility mode).
pub const XENPMU_REGS_MODE_32: u32 = 1 << 1;
/// `Regs::mode`: the sampled code ran with a 16-bit protected-mode code segment.
pub const XENPMU_REGS_MODE_16: u32 = 1 << 2;
/// `Regs::mode`: the sampled code ran in real mode or virtual-8086 mode.
pub const XENPMU_REGS_MODE_REAL: u32 = 1 << 3;
/// `Regs::mode`: the sampled code ran in user mode (CPL 3).
pub const XENPMU_REGS_MODE_USER: u32 = 1 << 4;
/// `Regs::mode`: the sample was taken while the hypervisor itself was running; the registers are
/// the hypervisor's.
pub const XENPMU_REGS_MODE_HYPERVISOR: u32 = 1 << 5;
/// The code-size bits of `Regs::mode`, of which a valid sample has exactly one.
pub const XENPMU_REGS_MODE_CODE_SIZE: u32 =
    XENPMU_REGS_MODE_64 | XENPMU_REGS_MODE_32 | XENPMU_REGS_MODE_16 | XENPMU_REGS_MODE_REAL;
/// Every `Regs::mode` bit version 1.0 defines.
pub const XENPMU_REGS_MODE_DEFINED: u32 =
    XENPMU_REGS_MODE_CODE_SIZE | XENPMU_REGS_MODE_USER | XENPMU_REGS_MODE_HYPERVISOR;

/// The version header at offset 0. Written by the hypervisor at init; the consumer checks it
/// before reading anything else, and the hypervisor never reads it back.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Header {
    /// `XENPMU_MAGIC`.
    pub magic: u32,
    /// `XENPMU_VERSION_MAJOR` of the hypervisor that wrote the page.
    pub version_major: u16,
    /// `XENPMU_VERSION_MINOR` of the hypervisor that wrote the page.
    pub version_minor: u16,
    /// Bytes from offset 0 that the writer's version defines; the rest is reserved.
    pub defined_size: u32,
    /// `XENPMU_VENDOR_*`: which vendor context the vendor area holds.
    pub vendor: u32,
}

/// Who the sample in the page belongs to.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Identity {
    /// `XENPMU_DOMID_SELF` for the page owner's own samples, `XENPMU_DOMID_HYPERVISOR` for
    /// samples of the hypervisor, otherwise the sampled domain's id (profiling domain, all mode).
    pub domain_id: u32,
    /// The sampled vCPU (within `domain_id`).
    pub vcpu_id: u32,
    /// The physical CPU that took the sample, for the privileged domain; for any other domain
    /// it equals `vcpu_id`, so the physical topology is not revealed.
    pub pcpu_id: u32,
    /// Reserved, zero.
    pub _pad0: u32,
}

/// The sampled context: the full 64-bit general-purpose register set, instruction pointer,
/// flags, segment selectors and privilege.
///
/// Registers of a context that ran in 32-bit or 16-bit code hold their full 64-bit values (the
/// upper halves as the CPU had them); a 32-bit consumer reads each as a `uint64_t`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Regs {
    /// RAX.
    pub rax: u64,
    /// RBX.
    pub rbx: u64,
    /// RCX.
    pub rcx: u64,
    /// RDX.
    pub rdx: u64,
    /// RSI.
    pub rsi: u64,
    /// RDI.
    pub rdi: u64,
    /// RBP.
    pub rbp: u64,
    /// RSP.
    pub rsp: u64,
    /// R8.
    pub r8: u64,
    /// R9.
    pub r9: u64,
    /// R10.
    pub r10: u64,
    /// R11.
    pub r11: u64,
    /// R12.
    pub r12: u64,
    /// R13.
    pub r13: u64,
    /// R14.
    pub r14: u64,
    /// R15.
    pub r15: u64,
    /// RIP of the instruction the sample is attributed to.
    pub rip: u64,
    /// RFLAGS.
    pub rflags: u64,
    /// CS selector.
    pub cs: u16,
    /// SS selector.
    pub ss: u16,
    /// DS selector.
    pub ds: u16,
    /// ES selector.
    pub es: u16,
    /// FS selector.
    pub fs: u16,
    /// GS selector.
    pub gs: u16,
    /// Current privilege level, 0 to 3 (the SS descriptor's DPL; 0 in real mode).
    pub cpl: u8,
    /// Reserved, zero.
    pub _pad0: [u8; 3],
    /// `XENPMU_REGS_MODE_*` bits: exactly one code-size bit, plus user and hypervisor.
    pub mode: u32,
    /// Reserved, zero.
    pub _pad1: u32,
}

/// Details of the sample in the page (version 1.2; all zero in pages of older minors, which
/// define these bytes as reserved). Written by the hypervisor with each sample, together with
/// `Page::identity` and `Page::regs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SampleInfo {
    /// The time-stamp counter of the physical CPU that took the PMI, read when the hypervisor
    /// handled it (0 if the hypervisor has no TSC to read).
    pub tsc: u64,
    /// The TSC frequency in kHz, so that `tsc` converts to time (0: unknown). Written at init
    /// and with every sample.
    pub tsc_khz: u64,
    /// Samples generated for this page since init, this one included: published and dropped
    /// alike, so a consumer sees a gap of n - 1 where n - 1 samples were dropped.
    pub sequence: u64,
    /// The counters whose overflow raised this PMI: bit i for general-purpose counter i, bit
    /// 32 + i for Intel fixed counter i (the bit layout of Intel's GLOBAL_STATUS and AMD's
    /// PerfCntrGlobalStatus).
    pub overflowed: u64,
    /// Valid entries of `callchain`.
    pub chain_len: u32,
    /// `XENPMU_CHAIN_*`: why the call chain ends where it does.
    pub chain_end: u32,
    /// Return addresses of the sampled context's call chain, walked by the hypervisor through
    /// its frame-pointer chain: the caller of the function `regs.rip` is in first, then its
    /// caller, outwards. Entries from `chain_len` on are zero.
    pub callchain: [u64; XENPMU_CALLCHAIN_MAX],
    /// Reserved, zero.
    pub _reserved0: [u64; 4],
}

impl Default for SampleInfo {
    fn default() -> Self {
        <Self as FromZeros>::new_zeroed()
    }
}

impl SampleInfo {
    /// The valid part of the call chain (at most `XENPMU_CALLCHAIN_MAX` entries, whatever
    /// `chain_len` says).
    pub fn chain(&self) -> &[u64] {
        let len = (self.chain_len as usize).min(XENPMU_CALLCHAIN_MAX);
        &self.callchain[..len]
    }
}

/// The register a refused flush refused, and why (version 1.3; all zero in pages of older
/// minors, which define these bytes as reserved). The hypervisor writes it at each flush that
/// fails with `-EIO` because a register of the vendor area failed verification, before it
/// returns; it is meaningful right after such a flush and not cleared by a successful one.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct FlushRefusal {
    /// The MSR number a WRMSR of the refused register would name (e.g. 0x309 + i for Intel
    /// IA32_FIXED_CTRi, 0xC001_0200 + 2i for AMD PERF_CTLi with PerfCtrExtCore, 0xC001_0000
    /// + i without it); 0 if no register was refused.
    pub msr: u32,
    /// `XENPMU_REFUSED_*`: why.
    pub reason: u32,
    /// The refused value, as the hypervisor copied it from the vendor area.
    pub value: u64,
}

impl FlushRefusal {
    /// A short name of `reason` (`"reserved bit"`, `"above the counter width"`, ...), for
    /// messages; `"unknown"` for a value this version does not define.
    pub fn reason_name(&self) -> &'static str {
        match self.reason {
            XENPMU_REFUSED_NONE => "nothing refused",
            XENPMU_REFUSED_RESERVED => "reserved bit",
            XENPMU_REFUSED_WIDTH => "above the counter width",
            XENPMU_REFUSED_FORBIDDEN => "forbidden bit",
            XENPMU_REFUSED_EVENT => "event not allowed",
            XENPMU_REFUSED_STATUS => "status bit not set by the hypervisor",
            XENPMU_REFUSED_ABSENT => "register absent",
            _ => "unknown",
        }
    }
}

/// The whole shared page.
#[repr(C)]
#[derive(Clone, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct Page {
    /// Version header (hypervisor-written at init, read-only for the guest).
    pub header: Header,
    /// Sample identity (hypervisor-written at each sample).
    pub identity: Identity,
    /// `XENPMU_FLAG_*` (hypervisor-written; read-only for the guest).
    pub pmu_flags: u64,
    /// The guest's virtual LVTPC. The guest writes it and issues the lvtpc_set or flush
    /// operation; the hypervisor honours only `XENPMU_LVTPC_MASKED`.
    pub lapic_lvtpc: u32,
    /// Reserved, zero.
    pub _pad0: u32,
    /// Sampled registers (hypervisor-written at each sample).
    pub regs: Regs,
    /// Samples for this page that the hypervisor dropped because the previous one was still
    /// cached, counted since init (hypervisor-written; read-only for the guest).
    pub dropped_samples: u64,
    /// Which register the last refused flush refused, and why (version 1.3; hypervisor-written
    /// at each flush that fails with `-EIO`, read-only for the guest).
    pub flush_refusal: FlushRefusal,
    /// Reserved, zero; a later minor version may define it.
    pub _reserved0: [u8; 16],
    /// Vendor counter context (`IntelCtxt` or `AmdCtxt` and their banks, per `Header::vendor`).
    pub vendor: VendorArea,
    /// Details of the sample (version 1.2: read only if `Header::defined_size` is at least
    /// `XENPMU_DEFINED_SIZE_1_2`).
    pub sample: SampleInfo,
    /// Reserved, zero; a later minor version may define it.
    pub _reserved1: [u8; 2232],
}

impl Page {
    /// An all-zero page: what a guest hands to the init operation.
    pub fn zeroed() -> Self {
        <Self as FromZeros>::new_zeroed()
    }
}

impl Default for Page {
    fn default() -> Self {
        Self::zeroed()
    }
}
