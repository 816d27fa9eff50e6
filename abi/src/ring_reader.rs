//! The consumer's side of the sample ring (1.4): checking `RingInfo` and reading records.
//!
//! [`check_ring_info`] checks the hypervisor's description of the ring before the owner takes
//! `data_size` and `record_max` from it. [`next_record`] reads the record at a `tail`, given
//! the `head` the owner loaded with an acquire, and returns it (copied out of the data area)
//! with the position after it; [`RingRecords`] walks `tail..head` with it. Every rule of
//! docs/abi.md "Records" and "Positions" is checked, in a fixed order, and each refusal is a
//! [`RingError`] whose [`RingError::code`] is the `XENPMU_CHECK_*` value the C helpers
//! (`xenpmu_ring_info_check()`, `xenpmu_ring_next()`) return for the same bytes. Nothing here
//! panics or reads outside the data area, whatever the bytes and positions.

use zerocopy::FromBytes;

use crate::page::{XENPMU_CALLCHAIN_MAX, XENPMU_VERSION_MAJOR};
use crate::ring::{
    RecordHeader, RingInfo, RingLost, RingSample, XENPMU_RECORD_ALIGN, XENPMU_RECORD_LOST,
    XENPMU_RECORD_PAD, XENPMU_RECORD_SAMPLE, XENPMU_RING_CONTROL_SIZE, XENPMU_RING_MAX_DATA_PAGES,
    XENPMU_RING_PAGE_SIZE,
};

/// `RingError::code`: `RingInfo::magic` is not `XENPMU_RING_MAGIC`.
pub const XENPMU_CHECK_RING_BAD_MAGIC: u32 = 16;
/// `RingError::code`: `RingInfo::version_major` is not `XENPMU_VERSION_MAJOR`, or its minor is
/// below 4 (no hypervisor older than 1.4 writes a ring).
pub const XENPMU_CHECK_RING_VERSION: u32 = 17;
/// `RingError::code`: `RingInfo::data_offset` is not `XENPMU_RING_CONTROL_SIZE`.
pub const XENPMU_CHECK_RING_DATA_OFFSET: u32 = 18;
/// `RingError::code`: `RingInfo::data_size` is not a power of two from one page to
/// `XENPMU_RING_MAX_DATA_PAGES` pages.
pub const XENPMU_CHECK_RING_DATA_SIZE: u32 = 19;
/// `RingError::code`: `RingInfo::record_max` is not a multiple of 8 from
/// `XENPMU_RING_RECORD_MAX_MIN` to `XENPMU_RING_RECORD_MAX_MAX`, or exceeds `data_size`.
pub const XENPMU_CHECK_RING_RECORD_MAX: u32 = 20;
/// `RingError::code`: `RingInfo::wakeup_bytes` is 0 or above `data_size`.
pub const XENPMU_CHECK_RING_WAKEUP: u32 = 21;
/// `RingError::code`: the data area given to the reader is not a power of two from
/// `XENPMU_RECORD_ALIGN` bytes to `XENPMU_RING_MAX_DATA_PAGES` pages.
pub const XENPMU_CHECK_RING_GEOMETRY: u32 = 24;
/// `RingError::code`: `tail` or `head` is not a multiple of 8.
pub const XENPMU_CHECK_RING_MISALIGNED: u32 = 25;
/// `RingError::code`: `tail` is ahead of `head`.
pub const XENPMU_CHECK_RING_TAIL_AHEAD: u32 = 26;
/// `RingError::code`: `tail` is more than the data area's size behind `head`.
pub const XENPMU_CHECK_RING_TAIL_BEHIND: u32 = 27;
/// `RingError::code`: a record of kind 0 (never a record: zeroed or corrupt memory).
pub const XENPMU_CHECK_RECORD_KIND_ZERO: u32 = 28;
/// `RingError::code`: a record size that is not a multiple of 8.
pub const XENPMU_CHECK_RECORD_SIZE_UNALIGNED: u32 = 29;
/// `RingError::code`: a record size below 8 (smaller than its header).
pub const XENPMU_CHECK_RECORD_TOO_SMALL: u32 = 30;
/// `RingError::code`: a record size above `record_max`.
pub const XENPMU_CHECK_RECORD_TOO_LARGE: u32 = 31;
/// `RingError::code`: a record that runs past the end of the data area.
pub const XENPMU_CHECK_RECORD_PAST_END: u32 = 32;
/// `RingError::code`: a record that runs past `head` (into bytes not yet published).
pub const XENPMU_CHECK_RECORD_PAST_HEAD: u32 = 33;
/// `RingError::code`: a sample record whose `chain_len` exceeds `XENPMU_CALLCHAIN_MAX`.
pub const XENPMU_CHECK_SAMPLE_CHAIN_LEN: u32 = 34;
/// `RingError::code`: a sample record whose size is not 224 + 8 × `chain_len`.
pub const XENPMU_CHECK_SAMPLE_SIZE: u32 = 35;
/// `RingError::code`: a lost record whose size is not 32.
pub const XENPMU_CHECK_LOST_SIZE: u32 = 36;
/// `RingError::code`: a PAD record that does not end at the end of the data area.
pub const XENPMU_CHECK_PAD_SHORT: u32 = 37;

/// What `xenpmu_ring_next()` returns when `tail` equals `head`: nothing to read. (Rust's
/// [`next_record`] returns `Ok(None)`.)
pub const XENPMU_RING_EMPTY: i32 = 1;

/// The smallest `RingInfo::record_max` a consumer accepts: a lost record must fit.
pub const XENPMU_RING_RECORD_MAX_MIN: u32 = 32;
/// The largest `RingInfo::record_max` a consumer accepts: the largest multiple of 8 a
/// `RecordHeader::size` can hold.
pub const XENPMU_RING_RECORD_MAX_MAX: u32 = 65528;

/// The largest data area: `XENPMU_RING_MAX_DATA_PAGES` pages.
const MAX_DATA_SIZE: usize = XENPMU_RING_MAX_DATA_PAGES as usize * XENPMU_RING_PAGE_SIZE;
/// Half the position space: an unread count at or above it means `tail` is ahead of `head`.
const AHEAD: u64 = 1 << 63;

/// Why a ring, or a record in it, was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RingError {
    /// `RingInfo::magic` is not `XENPMU_RING_MAGIC` (no ring was accepted here).
    BadMagic {
        /// The magic found.
        found: u32,
    },
    /// `RingInfo`'s version is not this major, or a minor older than the ring (1.4).
    Version {
        /// The major found.
        major: u16,
        /// The minor found.
        minor: u16,
    },
    /// `RingInfo::data_offset` is not 4096.
    DataOffset {
        /// The offset found.
        found: u32,
    },
    /// `RingInfo::data_size` is not a power of two from 4096 to 1 MiB.
    DataSize {
        /// The size found.
        found: u32,
    },
    /// `RingInfo::record_max` is out of range, not a multiple of 8, or exceeds `data_size`.
    RecordMax {
        /// The value found.
        found: u32,
    },
    /// `RingInfo::wakeup_bytes` is 0 or above `data_size`.
    Wakeup {
        /// The value found.
        found: u32,
    },
    /// The data area given to the reader is not a power of two from 8 bytes to 1 MiB.
    Geometry {
        /// Its length.
        data_size: usize,
    },
    /// `tail` or `head` is not a multiple of 8.
    Misaligned {
        /// The tail given.
        tail: u64,
        /// The head given.
        head: u64,
    },
    /// `tail` is ahead of `head`.
    TailAhead {
        /// The tail given.
        tail: u64,
        /// The head given.
        head: u64,
    },
    /// `tail` is more than the data area's size behind `head`.
    TailBehind {
        /// The tail given.
        tail: u64,
        /// The head given.
        head: u64,
    },
    /// The record at `offset` has kind 0.
    KindZero {
        /// Its offset in the data area.
        offset: usize,
    },
    /// The record at `offset` has a size that is not a multiple of 8.
    SizeUnaligned {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The record at `offset` is smaller than its header.
    TooSmall {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The record at `offset` is larger than `record_max`.
    TooLarge {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The record at `offset` runs past the end of the data area.
    PastEnd {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The record at `offset` runs past `head`.
    PastHead {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The sample record at `offset` claims more call-chain entries than the ABI allows.
    ChainLen {
        /// Its offset in the data area.
        offset: usize,
        /// The `chain_len` found.
        chain_len: u32,
    },
    /// The sample record at `offset` has a size other than 224 + 8 × `chain_len` (or one too
    /// small to hold `chain_len`).
    SampleSize {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The lost record at `offset` has a size other than 32.
    LostSize {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
    /// The PAD record at `offset` does not end at the end of the data area.
    PadShort {
        /// Its offset in the data area.
        offset: usize,
        /// Its size.
        size: u16,
    },
}

impl RingError {
    /// The `XENPMU_CHECK_*` code of this error: what `xenpmu_ring_info_check()` or
    /// `xenpmu_ring_next()` returns for the same bytes.
    pub fn code(&self) -> u32 {
        match self {
            RingError::BadMagic { .. } => XENPMU_CHECK_RING_BAD_MAGIC,
            RingError::Version { .. } => XENPMU_CHECK_RING_VERSION,
            RingError::DataOffset { .. } => XENPMU_CHECK_RING_DATA_OFFSET,
            RingError::DataSize { .. } => XENPMU_CHECK_RING_DATA_SIZE,
            RingError::RecordMax { .. } => XENPMU_CHECK_RING_RECORD_MAX,
            RingError::Wakeup { .. } => XENPMU_CHECK_RING_WAKEUP,
            RingError::Geometry { .. } => XENPMU_CHECK_RING_GEOMETRY,
            RingError::Misaligned { .. } => XENPMU_CHECK_RING_MISALIGNED,
            RingError::TailAhead { .. } => XENPMU_CHECK_RING_TAIL_AHEAD,
            RingError::TailBehind { .. } => XENPMU_CHECK_RING_TAIL_BEHIND,
            RingError::KindZero { .. } => XENPMU_CHECK_RECORD_KIND_ZERO,
            RingError::SizeUnaligned { .. } => XENPMU_CHECK_RECORD_SIZE_UNALIGNED,
            RingError::TooSmall { .. } => XENPMU_CHECK_RECORD_TOO_SMALL,
            RingError::TooLarge { .. } => XENPMU_CHECK_RECORD_TOO_LARGE,
            RingError::PastEnd { .. } => XENPMU_CHECK_RECORD_PAST_END,
            RingError::PastHead { .. } => XENPMU_CHECK_RECORD_PAST_HEAD,
            RingError::ChainLen { .. } => XENPMU_CHECK_SAMPLE_CHAIN_LEN,
            RingError::SampleSize { .. } => XENPMU_CHECK_SAMPLE_SIZE,
            RingError::LostSize { .. } => XENPMU_CHECK_LOST_SIZE,
            RingError::PadShort { .. } => XENPMU_CHECK_PAD_SHORT,
        }
    }

    /// The errno `xenpmu_verdict_errno()` gives for this error's code: a ring of another ABI
    /// (bad magic or version) is `-XENPMU_EPROTONOSUPPORT`, anything else `-XENPMU_EINVAL`.
    pub fn errno(&self) -> i32 {
        match self {
            RingError::BadMagic { .. } | RingError::Version { .. } => {
                -crate::XENPMU_EPROTONOSUPPORT
            }
            _ => -crate::XENPMU_EINVAL,
        }
    }
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            RingError::BadMagic { found } => write!(f, "ring magic {found:#010x}: no ring here"),
            RingError::Version { major, minor } => {
                write!(
                    f,
                    "ring of ABI {major}.{minor}, not {XENPMU_VERSION_MAJOR}.4 or later"
                )
            }
            RingError::DataOffset { found } => write!(f, "ring data offset {found}, not 4096"),
            RingError::DataSize { found } => write!(
                f,
                "ring data size {found}: not a power of two from 4096 to {MAX_DATA_SIZE}"
            ),
            RingError::RecordMax { found } => write!(f, "ring record_max {found} is invalid"),
            RingError::Wakeup { found } => write!(f, "ring wakeup_bytes {found} is invalid"),
            RingError::Geometry { data_size } => write!(
                f,
                "a data area of {data_size} bytes: not a power of two from 8 to {MAX_DATA_SIZE}"
            ),
            RingError::Misaligned { tail, head } => {
                write!(f, "tail {tail:#x} or head {head:#x} not a multiple of 8")
            }
            RingError::TailAhead { tail, head } => {
                write!(f, "tail {tail:#x} is ahead of head {head:#x}")
            }
            RingError::TailBehind { tail, head } => write!(
                f,
                "tail {tail:#x} is more than the data area behind head {head:#x}"
            ),
            RingError::KindZero { offset } => write!(f, "record of kind 0 at offset {offset}"),
            RingError::SizeUnaligned { offset, size } => {
                write!(f, "record at {offset}: size {size} not a multiple of 8")
            }
            RingError::TooSmall { offset, size } => {
                write!(f, "record at {offset}: size {size} below its header")
            }
            RingError::TooLarge { offset, size } => {
                write!(f, "record at {offset}: size {size} above record_max")
            }
            RingError::PastEnd { offset, size } => {
                write!(f, "record at {offset}: size {size} runs past the data area")
            }
            RingError::PastHead { offset, size } => {
                write!(f, "record at {offset}: size {size} runs past head")
            }
            RingError::ChainLen { offset, chain_len } => {
                write!(f, "sample at {offset}: chain_len {chain_len} above 64")
            }
            RingError::SampleSize { offset, size } => {
                write!(
                    f,
                    "sample at {offset}: size {size} disagrees with chain_len"
                )
            }
            RingError::LostSize { offset, size } => {
                write!(f, "lost record at {offset}: size {size}, not 32")
            }
            RingError::PadShort { offset, size } => write!(
                f,
                "PAD at {offset}: size {size} stops before the end of the data area"
            ),
        }
    }
}

impl core::error::Error for RingError {}

/// Checks the hypervisor's description of a ring (docs/abi.md "The ring area") before the
/// owner takes `data_offset`, `data_size` and `record_max` from it. The checks run in this
/// order, as in `xenpmu_ring_info_check()`: magic, version, data offset, data size,
/// `record_max`, `wakeup_bytes`. Reserved words are not checked (a later minor may use them).
pub fn check_ring_info(info: &RingInfo) -> Result<(), RingError> {
    if info.magic != crate::ring::XENPMU_RING_MAGIC {
        return Err(RingError::BadMagic { found: info.magic });
    }
    if info.version_major != XENPMU_VERSION_MAJOR || info.version_minor < 4 {
        return Err(RingError::Version {
            major: info.version_major,
            minor: info.version_minor,
        });
    }
    if info.data_offset as usize != XENPMU_RING_CONTROL_SIZE {
        return Err(RingError::DataOffset {
            found: info.data_offset,
        });
    }
    let size = info.data_size;
    if !size.is_power_of_two()
        || (size as usize) < XENPMU_RING_PAGE_SIZE
        || size as usize > MAX_DATA_SIZE
    {
        return Err(RingError::DataSize { found: size });
    }
    let record_max = info.record_max;
    if record_max % 8 != 0
        || !(XENPMU_RING_RECORD_MAX_MIN..=XENPMU_RING_RECORD_MAX_MAX).contains(&record_max)
        || record_max > size
    {
        return Err(RingError::RecordMax { found: record_max });
    }
    if info.wakeup_bytes == 0 || info.wakeup_bytes > size {
        return Err(RingError::Wakeup {
            found: info.wakeup_bytes,
        });
    }
    Ok(())
}

/// A sample record, copied out of the data area: the fixed part and its call chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRecord {
    /// The fixed part (`chain_len` is at most `XENPMU_CALLCHAIN_MAX`, checked).
    pub fixed: RingSample,
    chain: [u64; XENPMU_CALLCHAIN_MAX],
}

impl SampleRecord {
    /// The call chain: `fixed.chain_len` entries, innermost caller first.
    pub fn chain(&self) -> &[u64] {
        // chain_len was checked against XENPMU_CALLCHAIN_MAX before this record was built; the
        // `get` keeps a hand-built value from panicking all the same.
        self.chain
            .get(..self.fixed.chain_len as usize)
            .unwrap_or(&self.chain)
    }
}

/// One record, copied out of the data area.
// A sample record is 736 bytes and the others are small, but a ring consumer reads one record
// at a time into a local: boxing (and so allocating) per record would be the worse trade.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// `XENPMU_RECORD_SAMPLE`.
    Sample(SampleRecord),
    /// `XENPMU_RECORD_LOST`.
    Lost(RingLost),
    /// `XENPMU_RECORD_PAD`: the rest of the data area is padding; the next record is at 0.
    Pad,
    /// A kind this consumer does not know (4 and up, reserved for later minors), skipped by
    /// its size.
    Unknown {
        /// Its kind.
        kind: u16,
        /// Its size.
        size: u16,
    },
}

/// A record read at a tail, and where it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingEntry {
    /// The record.
    pub record: Record,
    /// Its offset in the data area (`tail` modulo the data size).
    pub offset: usize,
    /// Its size in bytes (a multiple of 8, within the data area and before `head`).
    pub size: usize,
    /// The position after it: the tail to read the next record at, or to store.
    pub next_tail: u64,
}

/// Reads the record at `tail` of the data area `data` (its length is the data size), given
/// `record_max` from `RingInfo` and the `head` loaded with an acquire: `Ok(None)` when `tail`
/// equals `head`, else the record copied out with the tail after it, or the first rule it
/// breaks. The checks run in this order, as in `xenpmu_ring_next()`: the data size, the
/// positions' alignment, empty, tail ahead of head, tail too far behind, then the record's
/// kind 0, size unaligned, too small, too large, past the end, past head, and per kind (a
/// sample's size too small for its fixed part, its chain length, its size; a lost record's
/// size; a PAD's end).
pub fn next_record(
    data: &[u8],
    record_max: u32,
    tail: u64,
    head: u64,
) -> Result<Option<RingEntry>, RingError> {
    let data_size = data.len();
    if !data_size.is_power_of_two() || !(XENPMU_RECORD_ALIGN..=MAX_DATA_SIZE).contains(&data_size) {
        return Err(RingError::Geometry { data_size });
    }
    if (tail | head) % XENPMU_RECORD_ALIGN as u64 != 0 {
        return Err(RingError::Misaligned { tail, head });
    }
    if tail == head {
        return Ok(None);
    }
    let unread = head.wrapping_sub(tail);
    if unread >= AHEAD {
        return Err(RingError::TailAhead { tail, head });
    }
    if unread > data_size as u64 {
        return Err(RingError::TailBehind { tail, head });
    }
    // data_size is a power of two no larger than 1 MiB, so the offset fits and is 8-aligned,
    // and the 8-byte header lies inside the area.
    let offset = (tail & (data_size as u64 - 1)) as usize;
    let header_bytes = data.get(offset..).unwrap_or_default();
    let Ok((header, _)) = RecordHeader::read_from_prefix(header_bytes) else {
        return Err(RingError::Geometry { data_size });
    };
    let size = header.size;
    let bytes = usize::from(size);
    if header.kind == 0 {
        return Err(RingError::KindZero { offset });
    }
    if bytes % XENPMU_RECORD_ALIGN != 0 {
        return Err(RingError::SizeUnaligned { offset, size });
    }
    if bytes < XENPMU_RECORD_ALIGN {
        return Err(RingError::TooSmall { offset, size });
    }
    if u32::from(size) > record_max {
        return Err(RingError::TooLarge { offset, size });
    }
    let Some(body) = data.get(offset..offset + bytes) else {
        return Err(RingError::PastEnd { offset, size });
    };
    if bytes as u64 > unread {
        return Err(RingError::PastHead { offset, size });
    }
    let record = match header.kind {
        XENPMU_RECORD_SAMPLE => Record::Sample(read_sample(body, offset)?),
        XENPMU_RECORD_LOST => {
            let lost = RingLost::read_from_bytes(body)
                .map_err(|_| RingError::LostSize { offset, size })?;
            Record::Lost(lost)
        }
        XENPMU_RECORD_PAD => {
            if offset + bytes != data_size {
                return Err(RingError::PadShort { offset, size });
            }
            Record::Pad
        }
        kind => Record::Unknown { kind, size },
    };
    Ok(Some(RingEntry {
        record,
        offset,
        size: bytes,
        next_tail: tail.wrapping_add(bytes as u64),
    }))
}

/// The sample record in `body` (exactly the record's bytes).
fn read_sample(body: &[u8], offset: usize) -> Result<SampleRecord, RingError> {
    let size = body.len() as u16;
    let Ok((fixed, chain_bytes)) = RingSample::read_from_prefix(body) else {
        return Err(RingError::SampleSize { offset, size });
    };
    let chain_len = fixed.chain_len;
    if chain_len as usize > XENPMU_CALLCHAIN_MAX {
        return Err(RingError::ChainLen { offset, chain_len });
    }
    if chain_bytes.len() != 8 * chain_len as usize {
        return Err(RingError::SampleSize { offset, size });
    }
    let mut chain = [0u64; XENPMU_CALLCHAIN_MAX];
    for (entry, bytes) in chain.iter_mut().zip(chain_bytes.chunks_exact(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        *entry = u64::from_le_bytes(word);
    }
    Ok(SampleRecord { fixed, chain })
}

/// The records from a tail up to a head, in order: each item is a [`RingEntry`] (whose
/// `next_tail` is the tail after it) or the error that stops the walk; after an error or at
/// `head` the iterator ends. [`RingRecords::tail`] is the position after the last record read,
/// the value to store as the consumer's tail.
#[derive(Clone, Debug)]
pub struct RingRecords<'a> {
    data: &'a [u8],
    record_max: u32,
    tail: u64,
    head: u64,
    failed: bool,
}

impl<'a> RingRecords<'a> {
    /// Walks `data` (the data area) from `tail` to `head`.
    pub fn new(data: &'a [u8], record_max: u32, tail: u64, head: u64) -> Self {
        Self {
            data,
            record_max,
            tail,
            head,
            failed: false,
        }
    }

    /// The position after the last record read (the starting tail before any).
    pub fn tail(&self) -> u64 {
        self.tail
    }
}

impl Iterator for RingRecords<'_> {
    type Item = Result<RingEntry, RingError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match next_record(self.data, self.record_max, self.tail, self.head) {
            Ok(None) => None,
            Ok(Some(entry)) => {
                self.tail = entry.next_tail;
                Some(Ok(entry))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }
}

#[cfg(test)]
mod tests;
