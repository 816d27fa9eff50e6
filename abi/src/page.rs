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
/// or adds operations. 1.1 added `XENPMU_OP_COVERAGE`; the page is unchanged since 1.0.
pub const XENPMU_VERSION_MINOR: u16 = 1;

/// Size in bytes of the part of the page that version 1.0 defines (header through the vendor
/// area). The hypervisor writes the size of the part *its* minor defines into
/// `Header::defined_size`; it is never smaller than this for major 1.
pub const XENPMU_DEFINED_SIZE_1_0: u32 = 1280;

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
    /// Reserved, zero; a later minor version may define it.
    pub _reserved0: [u8; 32],
    /// Vendor counter context (`IntelCtxt` or `AmdCtxt` and their banks, per `Header::vendor`).
    pub vendor: VendorArea,
    /// Reserved, zero; a later minor version may define it.
    pub _reserved1: [u8; 2816],
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
