//! The sample ring (version 1.4): a per-vCPU ring of variable-length records in guest frames,
//! so that passive profiling is not bounded by one outstanding sample per page.
//!
//! The owner registers a **ring area** with `XENPMU_OP_RING_INIT`: one control page
//! (`RingControl`: the owner's configuration, the hypervisor's description of the ring, the
//! producer's line and the consumer's line) followed, guest-physically contiguous, by
//! `RingConfig::data_pages` data pages. The hypervisor appends records at `RingProducer::head`
//! and publishes the new head with a release store; the owner reads records from
//! `RingConsumer::tail` up to the head it loaded with an acquire, then stores the new tail
//! with a release. Positions are free-running byte counts (never masked); a record's offset in
//! the data area is its position modulo the data size, a power of two.
//!
//! A record never straddles the end of the data area: when the next record does not fit before
//! the end, the producer fills the rest with a `XENPMU_RECORD_PAD` record and starts the
//! record at offset 0. Every record begins with a `RecordHeader` and its size is a multiple of
//! 8. `docs/abi.md` ("The sample ring") is the specification.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::page::{Identity, Regs, XENPMU_CALLCHAIN_MAX};

/// `RingInfo::magic` of a ring area the hypervisor accepted: the bytes `"XPMR"`.
pub const XENPMU_RING_MAGIC: u32 = 0x524D_5058;

/// Size of the control page, and the offset of the data area from its start.
pub const XENPMU_RING_CONTROL_SIZE: usize = 4096;

/// Size of one data page.
pub const XENPMU_RING_PAGE_SIZE: usize = 4096;

/// The most data pages a ring may have (1 MiB of records). `RingConfig::data_pages` is a power
/// of two from 1 to this.
pub const XENPMU_RING_MAX_DATA_PAGES: u32 = 256;

/// Alignment and size granule of every record.
pub const XENPMU_RECORD_ALIGN: usize = 8;

/// `RecordHeader::kind`: a sample (`RingSample`, then `chain_len` call-chain entries).
pub const XENPMU_RECORD_SAMPLE: u16 = 1;
/// `RecordHeader::kind`: samples were lost because the ring was full (`RingLost`).
pub const XENPMU_RECORD_LOST: u16 = 2;
/// `RecordHeader::kind`: padding up to the end of the data area; the next record is at offset
/// 0. Only a header; `size` covers the padding.
pub const XENPMU_RECORD_PAD: u16 = 3;

/// `RecordHeader::misc` of a sample record: the sampled context ran in user mode (CPL 3). The
/// same bit as `XENPMU_FLAG_SAMPLE_USER` in the page's `pmu_flags`.
pub const XENPMU_RECORD_MISC_USER: u32 = 1 << 1;
/// `RecordHeader::misc` of a sample record: the sampled context was in real or virtual-8086
/// mode. The same bit as `XENPMU_FLAG_SAMPLE_REAL`.
pub const XENPMU_RECORD_MISC_REAL: u32 = 1 << 2;

/// General-purpose counters whose re-arm period the configuration holds.
pub const XENPMU_RING_GP_PERIODS: usize = 8;
/// Intel fixed counters whose re-arm period the configuration holds.
pub const XENPMU_RING_FIXED_PERIODS: usize = 4;

/// The header every record starts with (8 bytes, like Linux's `perf_event_header`).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RecordHeader {
    /// `XENPMU_RECORD_*`. 0 is never a record; a consumer skips a kind it does not know by
    /// `size`.
    pub kind: u16,
    /// Bytes of the whole record, header included: a multiple of 8, at least 8, at most
    /// `RingInfo::record_max`, and never past the end of the data area.
    pub size: u16,
    /// Per kind: for a sample, `XENPMU_RECORD_MISC_*`; 0 otherwise.
    pub misc: u32,
}

/// The fixed part of a sample record (224 bytes), followed by `chain_len` `u64` call-chain
/// entries. The fields mean what the page's `identity`, `regs` and `sample` fields mean.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingSample {
    /// `kind` = `XENPMU_RECORD_SAMPLE`, `size` = 224 + 8 × `chain_len`.
    pub header: RecordHeader,
    /// The vCPU's sample number since `XENPMU_OP_INIT` (shared with the page's numbering).
    pub sequence: u64,
    /// TSC of the physical CPU that took the PMI (0: none).
    pub tsc: u64,
    /// Who was sampled.
    pub identity: Identity,
    /// The counters whose overflow this sample reports (bit *i*: GP counter *i*; bit 32 + *i*:
    /// Intel fixed counter *i*).
    pub overflowed: u64,
    /// Call-chain entries that follow the fixed part, 0 to `XENPMU_CALLCHAIN_MAX`.
    pub chain_len: u32,
    /// `XENPMU_CHAIN_*`: why the chain ends where it does.
    pub chain_end: u32,
    /// The sampled context's registers.
    pub regs: Regs,
}

/// Size of `RingSample`, the fixed part of a sample record.
pub const XENPMU_RING_SAMPLE_SIZE: usize = 224;

/// Size of the largest record: a sample with a full call chain.
pub const XENPMU_RECORD_MAX: usize = XENPMU_RING_SAMPLE_SIZE + 8 * XENPMU_CALLCHAIN_MAX;

/// A lost-samples record: samples that found the ring full since the previous lost record.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingLost {
    /// `kind` = `XENPMU_RECORD_LOST`, `size` = 32.
    pub header: RecordHeader,
    /// Samples lost since the previous lost record (at least 1).
    pub lost: u64,
    /// The sequence number of the last of them.
    pub sequence: u64,
    /// TSC of the last of them (0: none).
    pub tsc: u64,
}

/// What the owner writes into the control page before `XENPMU_OP_RING_INIT`; the hypervisor
/// copies it once, during the operation, and never reads it again.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingConfig {
    /// Data pages following the control page: a power of two, 1 to
    /// `XENPMU_RING_MAX_DATA_PAGES`.
    pub data_pages: u32,
    /// Wake the owner (PMU VIRQ) once at least this many bytes of records were published since
    /// the last wakeup; 0 means half the data area. At most the data area's size.
    pub wakeup_bytes: u32,
    /// Wake the owner at most this many microseconds after a record was published, even below
    /// `wakeup_bytes`; 0 wakes it at every record.
    pub max_latency_us: u32,
    /// Reserved, zero.
    pub flags: u32,
    /// Reserved, zero.
    pub _reserved0: [u64; 6],
    /// Re-arm period of general-purpose counter *i* (0: not re-armed by the hypervisor).
    pub period_gp: [u64; XENPMU_RING_GP_PERIODS],
    /// Re-arm period of Intel fixed counter *i* (0: not re-armed; must be 0 on AMD).
    pub period_fixed: [u64; XENPMU_RING_FIXED_PERIODS],
    /// Reserved, zero.
    pub _reserved1: [u64; 12],
}

/// The hypervisor's description of the ring it accepted, written during
/// `XENPMU_OP_RING_INIT` and never changed until the ring is torn down.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingInfo {
    /// `XENPMU_RING_MAGIC`.
    pub magic: u32,
    /// The hypervisor's `XENPMU_VERSION_MAJOR`.
    pub version_major: u16,
    /// The hypervisor's `XENPMU_VERSION_MINOR`.
    pub version_minor: u16,
    /// Bytes from the start of the control page to the data area (4096).
    pub data_offset: u32,
    /// Bytes of the data area: `data_pages` × 4096, a power of two.
    pub data_size: u32,
    /// The largest record the hypervisor writes (`XENPMU_RECORD_MAX` for this version).
    pub record_max: u32,
    /// The wakeup watermark in force, in bytes (the configuration's, or half the data area).
    pub wakeup_bytes: u32,
    /// Frequency of the records' `tsc`, in kHz (0: unknown).
    pub tsc_khz: u64,
    /// Reserved, zero.
    pub _reserved0: [u64; 4],
}

/// The producer's cache line: written only by the hypervisor.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingProducer {
    /// Position after the last published record; stored with release semantics after the
    /// records it covers. Free-running, wraps at 2^64.
    pub head: u64,
    /// Sample records published since `XENPMU_OP_RING_INIT`.
    pub records: u64,
    /// Samples lost because the ring was full (each is also counted by a lost record).
    pub lost: u64,
    /// Samples withheld because the page's LVTPC was masked (they take a sequence number).
    pub withheld: u64,
    /// PMU VIRQs raised for the ring.
    pub wakeups: u64,
    /// Times the hypervisor found `RingConsumer::tail` impossible (ahead of the head, more than
    /// the data area behind it, or not 8-aligned): the ring then counts as full.
    pub bad_tail: u64,
    /// Reserved, zero.
    pub _reserved0: [u64; 2],
}

/// The consumer's cache line: written only by the owner.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RingConsumer {
    /// Position after the last record the owner has consumed; stored with release semantics
    /// after the owner's reads of those records.
    pub tail: u64,
    /// Reserved, zero.
    pub _reserved0: [u64; 7],
}

/// The control page of a ring area (4096 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct RingControl {
    /// The owner's configuration (bytes 0–255).
    pub config: RingConfig,
    /// The hypervisor's description (bytes 256–319).
    pub info: RingInfo,
    /// The producer's line (bytes 320–383).
    pub producer: RingProducer,
    /// The consumer's line (bytes 384–447).
    pub consumer: RingConsumer,
    /// Reserved, zero (bytes 448–4095).
    pub _reserved: [u64; 456],
}

impl Default for RingControl {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// Page offset of `RingControl::info`.
pub const XENPMU_RING_INFO_OFFSET: usize = 256;
/// Page offset of `RingControl::producer`.
pub const XENPMU_RING_PRODUCER_OFFSET: usize = 320;
/// Page offset of `RingControl::consumer`.
pub const XENPMU_RING_CONSUMER_OFFSET: usize = 384;
