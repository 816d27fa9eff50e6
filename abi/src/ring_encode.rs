//! The producer's side of the ring's records (1.4): encoding a sample, a lost or a PAD record
//! into bytes, and appending a record at a head the way docs/abi.md "Records" requires (a PAD
//! over the rest of the data area when the record does not fit before its end, never an unread
//! byte overwritten). Used by the tests and fuzz seeds to build rings, and available to any
//! producer; [`crate::ring_reader`] reads what these write.

use zerocopy::IntoBytes;

use crate::page::XENPMU_CALLCHAIN_MAX;
use crate::ring::{
    RecordHeader, RingLost, RingSample, XENPMU_RECORD_ALIGN, XENPMU_RECORD_LOST, XENPMU_RECORD_PAD,
    XENPMU_RECORD_SAMPLE, XENPMU_RING_SAMPLE_SIZE,
};

/// Why a record could not be encoded or appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EncodeError {
    /// The output (or the whole data area) is smaller than the record.
    TooSmall {
        /// Bytes the record needs.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A call chain longer than `XENPMU_CALLCHAIN_MAX`.
    ChainTooLong {
        /// Entries given.
        len: usize,
    },
    /// A record (or PAD) size that is not a multiple of 8, below 8 or above 65528.
    BadSize {
        /// The size asked for.
        size: usize,
    },
    /// The data area is not a power of two of at least 8 bytes, or a position is not a
    /// multiple of 8, or `tail` is ahead of `head` or more than the area behind it.
    BadRing,
    /// Not enough free bytes for the record (and the PAD its wrap needs).
    Full {
        /// Bytes the record and its PAD need.
        need: u64,
        /// Free bytes.
        free: u64,
    },
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            EncodeError::TooSmall { need, have } => {
                write!(f, "record needs {need} bytes, {have} available")
            }
            EncodeError::ChainTooLong { len } => {
                write!(
                    f,
                    "call chain of {len} entries, at most {XENPMU_CALLCHAIN_MAX}"
                )
            }
            EncodeError::BadSize { size } => write!(f, "record size {size} is not encodable"),
            EncodeError::BadRing => f.write_str("invalid data area or positions"),
            EncodeError::Full { need, free } => {
                write!(f, "ring full: {need} bytes needed, {free} free")
            }
        }
    }
}

impl core::error::Error for EncodeError {}

/// The largest size a record header can hold that is a multiple of 8.
const MAX_RECORD: usize = 65528;

fn header(kind: u16, size: usize, misc: u32) -> Result<RecordHeader, EncodeError> {
    if size % XENPMU_RECORD_ALIGN != 0 || !(XENPMU_RECORD_ALIGN..=MAX_RECORD).contains(&size) {
        return Err(EncodeError::BadSize { size });
    }
    Ok(RecordHeader {
        kind,
        size: size as u16,
        misc,
    })
}

/// The size of a sample record with `chain_len` call-chain entries.
pub const fn sample_record_size(chain_len: usize) -> usize {
    XENPMU_RING_SAMPLE_SIZE + 8 * chain_len
}

/// Writes a sample record at the start of `out`: `fixed` (its `header.misc`, `sequence`, `tsc`,
/// `identity`, `overflowed`, `chain_end` and `regs`) with `header.kind`, `header.size` and
/// `chain_len` set from `chain`, then the chain. Returns the record's size (224 + 8 × entries);
/// bytes after it are untouched.
pub fn encode_sample(
    out: &mut [u8],
    fixed: &RingSample,
    chain: &[u64],
) -> Result<usize, EncodeError> {
    if chain.len() > XENPMU_CALLCHAIN_MAX {
        return Err(EncodeError::ChainTooLong { len: chain.len() });
    }
    let size = sample_record_size(chain.len());
    let Some(record) = out.get_mut(..size) else {
        return Err(EncodeError::TooSmall {
            need: size,
            have: out.len(),
        });
    };
    let mut sample = *fixed;
    sample.header = header(XENPMU_RECORD_SAMPLE, size, fixed.header.misc)?;
    sample.chain_len = chain.len() as u32;
    let (head, tail) = record.split_at_mut(XENPMU_RING_SAMPLE_SIZE);
    head.copy_from_slice(sample.as_bytes());
    tail.copy_from_slice(chain.as_bytes());
    Ok(size)
}

/// Writes a lost record (32 bytes) at the start of `out`: `lost` samples, the last of them
/// numbered `sequence` and taken at `tsc`. Returns 32.
pub fn encode_lost(
    out: &mut [u8],
    lost: u64,
    sequence: u64,
    tsc: u64,
) -> Result<usize, EncodeError> {
    let size = size_of::<RingLost>();
    let Some(record) = out.get_mut(..size) else {
        return Err(EncodeError::TooSmall {
            need: size,
            have: out.len(),
        });
    };
    let record_value = RingLost {
        header: header(XENPMU_RECORD_LOST, size, 0)?,
        lost,
        sequence,
        tsc,
    };
    record.copy_from_slice(record_value.as_bytes());
    Ok(size)
}

/// Makes all of `out` one PAD record: writes its 8-byte header (size = `out.len()`, which must
/// be a multiple of 8 from 8 to 65528) and leaves the padding bytes as they are. Returns the
/// size.
pub fn encode_pad(out: &mut [u8]) -> Result<usize, EncodeError> {
    let size = out.len();
    let pad = header(XENPMU_RECORD_PAD, size, 0)?;
    out[..XENPMU_RECORD_ALIGN].copy_from_slice(pad.as_bytes());
    Ok(size)
}

/// Appends `record` (one encoded record: its size a multiple of 8, at least 8) to the data
/// area `data` at `head`, as a producer must: if it does not fit before the end of the area, a
/// PAD over the rest first and the record at offset 0; and only into free bytes (`tail` is the
/// consumer's). Returns the new head; on `Full` nothing is written.
pub fn append_record(
    data: &mut [u8],
    tail: u64,
    head: u64,
    record: &[u8],
) -> Result<u64, EncodeError> {
    let data_size = data.len();
    if !data_size.is_power_of_two() || data_size < XENPMU_RECORD_ALIGN {
        return Err(EncodeError::BadRing);
    }
    let unread = head.wrapping_sub(tail);
    if (tail | head) % XENPMU_RECORD_ALIGN as u64 != 0 || unread > data_size as u64 {
        return Err(EncodeError::BadRing);
    }
    let size = record.len();
    if size % XENPMU_RECORD_ALIGN != 0 || !(XENPMU_RECORD_ALIGN..=MAX_RECORD).contains(&size) {
        return Err(EncodeError::BadSize { size });
    }
    if size > data_size {
        return Err(EncodeError::TooSmall {
            need: size,
            have: data_size,
        });
    }
    let offset = (head & (data_size as u64 - 1)) as usize;
    let rest = data_size - offset;
    let pad = if size > rest { rest } else { 0 };
    let need = (pad + size) as u64;
    let free = data_size as u64 - unread;
    if need > free {
        return Err(EncodeError::Full { need, free });
    }
    if pad != 0 {
        encode_pad(&mut data[offset..])?;
    }
    let at = if pad != 0 { 0 } else { offset };
    data[at..at + size].copy_from_slice(record);
    Ok(head.wrapping_add(need))
}
