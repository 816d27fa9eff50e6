//! The byte layout of a [`VcpuSnapshot`] (docs/snapshot.md, "Byte layout"): little-endian,
//! fixed offsets for everything but the register entries, which follow; every reserved byte
//! and every field of an absent part is zero, and a CRC-32 covers the whole encoding.
//!
//! Decoding reads each byte once, into the snapshot it returns, and checks only the format
//! (magic, version, length, checksum, reserved bytes, encodings); what the values mean is the
//! restore's to verify.

use vpmu_abi::{XENPMU_RING_FIXED_PERIODS, XENPMU_RING_GP_PERIODS};

use super::{
    MAX_REGISTERS, PageRegistration, RegisterKind, Registers, RingLostRecord, RingRegistration,
    SnapshotRegister, SnapshotState, VcpuSnapshot,
};
use crate::backend::{CounterSet, PmuCapabilities, Vendor};
use crate::core::Mode;
use crate::ring::ProducerCounters;

/// The first 8 bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"VPMUSNAP";
/// The layout's major version: a reader refuses any other.
pub const FORMAT_MAJOR: u16 = 1;
/// The layout's minor version: a reader refuses a newer one than its own.
pub const FORMAT_MINOR: u16 = 0;

const CHECKSUM_AT: usize = 16;
const SHAPE_AT: usize = 24;
const POLICY_AT: usize = 40;
const VCPU_AT: usize = 56;
const PAGE_AT: usize = 72;
const RING_AT: usize = 96;
/// Where the register entries start.
const REGISTERS_AT: usize = 304;
/// Bytes of one register entry.
const REGISTER_BYTES: usize = 16;

const VENDOR_INTEL: u8 = 1;
const VENDOR_AMD: u8 = 2;

const SHAPE_GLOBAL_CTRL: u8 = 1 << 0;
const SHAPE_FULL_WIDTH: u8 = 1 << 1;

const VCPU_PAGE: u32 = 1 << 0;
const VCPU_RING: u32 = 1 << 1;
const VCPU_PENDING_PMI: u32 = 1 << 2;
const VCPU_LVTPC_MASKED: u32 = 1 << 3;

const RING_LOSS_SIGNALLED: u32 = 1 << 0;
const RING_PENDING_LOST: u32 = 1 << 1;
const RING_UNSIGNALLED: u32 = 1 << 2;

/// Why bytes are not a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The first 8 bytes are not [`MAGIC`].
    Magic,
    /// A format version this reader does not read.
    Version {
        /// The snapshot's major version.
        major: u16,
        /// Its minor version.
        minor: u16,
    },
    /// The declared length is not the number of bytes given (or not what the register count
    /// makes it).
    Length {
        /// Declared.
        declared: u32,
        /// Given.
        got: usize,
    },
    /// The CRC-32 does not match: the bytes were damaged.
    Checksum {
        /// Stored.
        stored: u32,
        /// Computed over the bytes.
        computed: u32,
    },
    /// More register entries than [`MAX_REGISTERS`].
    TooManyRegisters(u32),
    /// A reserved byte, an undefined flag bit or a field of an absent part is not zero, at
    /// this offset.
    Reserved(usize),
    /// A field holds a value with no meaning (an unknown vendor, mode, state or kind).
    Field(&'static str),
}

/// Why a snapshot could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The buffer is shorter than [`VcpuSnapshot::encoded_len`].
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
    },
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::Truncated { needed, got } => {
                write!(f, "truncated: {got} bytes, {needed} needed")
            }
            DecodeError::Magic => write!(f, "not a vPMU snapshot (magic)"),
            DecodeError::Version { major, minor } => {
                write!(f, "format {major}.{minor} is not readable here")
            }
            DecodeError::Length { declared, got } => {
                write!(f, "declared length {declared}, {got} bytes given")
            }
            DecodeError::Checksum { stored, computed } => {
                write!(f, "checksum {stored:#010x}, computed {computed:#010x}")
            }
            DecodeError::TooManyRegisters(n) => {
                write!(f, "{n} registers (at most {MAX_REGISTERS})")
            }
            DecodeError::Reserved(at) => write!(f, "non-zero reserved byte at offset {at}"),
            DecodeError::Field(name) => write!(f, "field {name} holds no defined value"),
        }
    }
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let EncodeError::BufferTooSmall { needed } = self;
        write!(f, "buffer too small: {needed} bytes needed")
    }
}

impl core::error::Error for DecodeError {}
impl core::error::Error for EncodeError {}

/// CRC-32 (ISO-HDLC: reflected polynomial 0xEDB88320, initial value and final XOR all ones;
/// the CRC of zlib and Ethernet) of `bytes`, with the four bytes at [`CHECKSUM_AT`] taken
/// as zero. Bitwise: a snapshot is under a kilobyte and taken rarely.
fn checksum(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for (at, &byte) in bytes.iter().enumerate() {
        let byte = if (CHECKSUM_AT..CHECKSUM_AT + 4).contains(&at) {
            0
        } else {
            byte
        };
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Recomputes the checksum of an encoded snapshot in place (for tools and tests that edit
/// the bytes on purpose: the validators, not the checksum, are what stands between a
/// crafted snapshot and the vPMU). Does nothing to fewer bytes than the header.
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < REGISTERS_AT {
        return;
    }
    let crc = checksum(bytes);
    if let Some(field) = bytes.get_mut(CHECKSUM_AT..CHECKSUM_AT + 4) {
        field.copy_from_slice(&crc.to_le_bytes());
    }
}

/// Little-endian writes at fixed offsets into a buffer known to be long enough.
struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        if let Some(field) = self.0.get_mut(at..at + bytes.len()) {
            field.copy_from_slice(bytes);
        }
    }
    fn u8(&mut self, at: usize, value: u8) {
        self.put(at, &[value]);
    }
    fn u16(&mut self, at: usize, value: u16) {
        self.put(at, &value.to_le_bytes());
    }
    fn u32(&mut self, at: usize, value: u32) {
        self.put(at, &value.to_le_bytes());
    }
    fn u64(&mut self, at: usize, value: u64) {
        self.put(at, &value.to_le_bytes());
    }
}

/// Little-endian reads at fixed offsets of bytes known to be long enough (a short read gives
/// zeros, never a panic).
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        self.0
            .get(at..at + N)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; N])
    }
    fn u8(&self, at: usize) -> u8 {
        self.array::<1>(at)[0]
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_le_bytes(self.array(at))
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.array(at))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.array(at))
    }
    /// Refuses unless every byte of `at..at + len` is zero.
    fn zero(&self, at: usize, len: usize) -> Result<(), DecodeError> {
        let bytes = self.0.get(at..at + len).unwrap_or(&[]);
        match bytes.iter().position(|&b| b != 0) {
            Some(i) => Err(DecodeError::Reserved(at + i)),
            None => Ok(()),
        }
    }
    /// `value` of the field at `at`, which must have no bit outside `defined`.
    fn flags(&self, at: usize, defined: u32) -> Result<u32, DecodeError> {
        let value = self.u32(at);
        if value & !defined != 0 {
            return Err(DecodeError::Reserved(at));
        }
        Ok(value)
    }
}

/// `bit` if `on`, else 0.
fn flag(on: bool, bit: u32) -> u32 {
    if on { bit } else { 0 }
}

fn state_code(state: SnapshotState) -> u32 {
    match state {
        SnapshotState::Unused => 0,
        SnapshotState::Saved => 1,
        SnapshotState::SampleCached => 2,
    }
}

impl VcpuSnapshot {
    /// The largest encoding: [`MAX_REGISTERS`] registers.
    pub const MAX_ENCODED_LEN: usize = REGISTERS_AT + MAX_REGISTERS * REGISTER_BYTES;

    /// Bytes [`VcpuSnapshot::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        REGISTERS_AT + self.registers.len() * REGISTER_BYTES
    }

    /// Writes the snapshot into `out` (docs/snapshot.md); returns the bytes written. Nothing
    /// is allocated.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let len = self.encoded_len();
        let out = out
            .get_mut(..len)
            .ok_or(EncodeError::BufferTooSmall { needed: len })?;
        out.fill(0);
        let mut w = Writer(out);
        w.put(0, &MAGIC);
        w.u16(8, FORMAT_MAJOR);
        w.u16(10, FORMAT_MINOR);
        w.u32(12, len as u32);
        w.u32(20, self.registers.len() as u32);

        let shape = &self.shape;
        w.u8(
            SHAPE_AT,
            match shape.vendor {
                Vendor::Intel => VENDOR_INTEL,
                Vendor::Amd => VENDOR_AMD,
            },
        );
        w.u8(SHAPE_AT + 1, shape.version);
        w.u8(SHAPE_AT + 2, shape.gp_counters);
        w.u8(SHAPE_AT + 3, shape.gp_width);
        w.u32(SHAPE_AT + 4, shape.fixed_counters);
        w.u8(SHAPE_AT + 8, shape.fixed_width);
        let flags = if shape.global_ctrl {
            SHAPE_GLOBAL_CTRL
        } else {
            0
        } | if shape.full_width_writes {
            SHAPE_FULL_WIDTH
        } else {
            0
        };
        w.u8(SHAPE_AT + 9, flags);

        w.u64(POLICY_AT, self.mode.to_abi());
        w.u64(POLICY_AT + 8, self.features);

        let flags = flag(self.page.is_some(), VCPU_PAGE)
            | flag(self.ring.is_some(), VCPU_RING)
            | flag(self.pending_pmi.is_some(), VCPU_PENDING_PMI)
            | flag(self.page_lvtpc_masked, VCPU_LVTPC_MASKED);
        w.u32(VCPU_AT, state_code(self.state));
        w.u32(VCPU_AT + 4, flags);
        w.u64(VCPU_AT + 8, self.pending_pmi.map_or(0, |set| set.0));

        if let Some(page) = self.page {
            w.u64(PAGE_AT, page.gfn);
            w.u64(PAGE_AT + 8, page.samples);
            w.u32(PAGE_AT + 16, page.chain_written);
        }
        if let Some(ring) = &self.ring {
            encode_ring(&mut w, ring);
        }
        for (i, register) in self.registers.as_slice().iter().enumerate() {
            let at = REGISTERS_AT + i * REGISTER_BYTES;
            w.u32(at, register.number);
            w.u16(at + 4, register.kind.to_u16());
            w.u64(at + 8, register.value);
        }
        let crc = checksum(w.0);
        w.u32(CHECKSUM_AT, crc);
        Ok(len)
    }

    /// Reads a snapshot from `bytes` (exactly one encoding, no trailing bytes), checking the
    /// format only: what the values mean is verified by the restore.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < REGISTERS_AT {
            return Err(DecodeError::Truncated {
                needed: REGISTERS_AT,
                got: bytes.len(),
            });
        }
        let r = Reader(bytes);
        if r.array::<8>(0) != MAGIC {
            return Err(DecodeError::Magic);
        }
        let (major, minor) = (r.u16(8), r.u16(10));
        if major != FORMAT_MAJOR || minor > FORMAT_MINOR {
            return Err(DecodeError::Version { major, minor });
        }
        let declared = r.u32(12);
        let count = r.u32(20);
        if count as usize > MAX_REGISTERS {
            return Err(DecodeError::TooManyRegisters(count));
        }
        let needed = REGISTERS_AT + count as usize * REGISTER_BYTES;
        if bytes.len() < needed {
            return Err(DecodeError::Truncated {
                needed,
                got: bytes.len(),
            });
        }
        if declared as usize != bytes.len() || needed != bytes.len() {
            return Err(DecodeError::Length {
                declared,
                got: bytes.len(),
            });
        }
        let stored = r.u32(CHECKSUM_AT);
        let computed = checksum(bytes);
        if stored != computed {
            return Err(DecodeError::Checksum { stored, computed });
        }

        let shape = decode_shape(&r)?;
        let mode = Mode::from_abi(r.u64(POLICY_AT)).ok_or(DecodeError::Field("mode"))?;
        let features = r.u64(POLICY_AT + 8);

        let state = match r.u32(VCPU_AT) {
            0 => SnapshotState::Unused,
            1 => SnapshotState::Saved,
            2 => SnapshotState::SampleCached,
            _ => return Err(DecodeError::Field("state")),
        };
        let flags = r.flags(
            VCPU_AT + 4,
            VCPU_PAGE | VCPU_RING | VCPU_PENDING_PMI | VCPU_LVTPC_MASKED,
        )?;
        let pending_pmi = if flags & VCPU_PENDING_PMI != 0 {
            Some(CounterSet(r.u64(VCPU_AT + 8)))
        } else {
            r.zero(VCPU_AT + 8, 8)?;
            None
        };
        let page = if flags & VCPU_PAGE != 0 {
            r.zero(PAGE_AT + 20, 4)?;
            Some(PageRegistration {
                gfn: r.u64(PAGE_AT),
                samples: r.u64(PAGE_AT + 8),
                chain_written: r.u32(PAGE_AT + 16),
            })
        } else {
            r.zero(PAGE_AT, RING_AT - PAGE_AT)?;
            None
        };
        let ring = if flags & VCPU_RING != 0 {
            Some(decode_ring(&r)?)
        } else {
            r.zero(RING_AT, REGISTERS_AT - RING_AT)?;
            None
        };

        let mut registers = Registers::new();
        for i in 0..count as usize {
            let at = REGISTERS_AT + i * REGISTER_BYTES;
            r.zero(at + 6, 2)?;
            let kind =
                RegisterKind::from_u16(r.u16(at + 4)).ok_or(DecodeError::Field("register kind"))?;
            let register = SnapshotRegister {
                kind,
                number: r.u32(at),
                value: r.u64(at + 8),
            };
            registers
                .push(register)
                .map_err(|_| DecodeError::TooManyRegisters(count))?;
        }
        Ok(VcpuSnapshot {
            shape,
            mode,
            features,
            state,
            registers,
            pending_pmi,
            page_lvtpc_masked: flags & VCPU_LVTPC_MASKED != 0,
            page,
            ring,
        })
    }
}

fn decode_shape(r: &Reader<'_>) -> Result<PmuCapabilities, DecodeError> {
    let vendor = match r.u8(SHAPE_AT) {
        VENDOR_INTEL => Vendor::Intel,
        VENDOR_AMD => Vendor::Amd,
        _ => return Err(DecodeError::Field("vendor")),
    };
    let flags = r.u8(SHAPE_AT + 9);
    if flags & !(SHAPE_GLOBAL_CTRL | SHAPE_FULL_WIDTH) != 0 {
        return Err(DecodeError::Reserved(SHAPE_AT + 9));
    }
    r.zero(SHAPE_AT + 10, POLICY_AT - (SHAPE_AT + 10))?;
    Ok(PmuCapabilities {
        vendor,
        version: r.u8(SHAPE_AT + 1),
        gp_counters: r.u8(SHAPE_AT + 2),
        gp_width: r.u8(SHAPE_AT + 3),
        fixed_counters: r.u32(SHAPE_AT + 4),
        fixed_width: r.u8(SHAPE_AT + 8),
        global_ctrl: flags & SHAPE_GLOBAL_CTRL != 0,
        full_width_writes: flags & SHAPE_FULL_WIDTH != 0,
    })
}

// The ring part: gfn at +0, data_pages +8, wakeup_bytes +12, max_latency_us +16, flags +20,
// period_gp +24 (8 words), period_fixed +88 (4 words), head +120, the five producer counters
// +128, the pending lost record +168 (count, sequence, tsc), unsignalled_bytes +192,
// unsignalled_since +200; 208 bytes.
const _: () = assert!(XENPMU_RING_GP_PERIODS == 8 && XENPMU_RING_FIXED_PERIODS == 4);
const _: () = assert!(RING_AT + 208 == REGISTERS_AT);

fn encode_ring(w: &mut Writer<'_>, ring: &RingRegistration) {
    w.u64(RING_AT, ring.gfn);
    w.u32(RING_AT + 8, ring.data_pages);
    w.u32(RING_AT + 12, ring.wakeup_bytes);
    w.u32(RING_AT + 16, ring.max_latency_us);
    let flags = flag(ring.loss_signalled, RING_LOSS_SIGNALLED)
        | flag(ring.pending_lost.is_some(), RING_PENDING_LOST)
        | flag(ring.unsignalled_since.is_some(), RING_UNSIGNALLED);
    w.u32(RING_AT + 20, flags);
    for (i, &period) in ring.period_gp.iter().enumerate() {
        w.u64(RING_AT + 24 + 8 * i, period);
    }
    for (i, &period) in ring.period_fixed.iter().enumerate() {
        w.u64(RING_AT + 88 + 8 * i, period);
    }
    w.u64(RING_AT + 120, ring.head);
    let c = &ring.counters;
    for (i, value) in [c.records, c.lost, c.withheld, c.wakeups, c.bad_tail]
        .into_iter()
        .enumerate()
    {
        w.u64(RING_AT + 128 + 8 * i, value);
    }
    if let Some(lost) = ring.pending_lost {
        w.u64(RING_AT + 168, lost.count);
        w.u64(RING_AT + 176, lost.sequence);
        w.u64(RING_AT + 184, lost.tsc);
    }
    w.u64(RING_AT + 192, ring.unsignalled_bytes);
    w.u64(RING_AT + 200, ring.unsignalled_since.unwrap_or(0));
}

fn decode_ring(r: &Reader<'_>) -> Result<RingRegistration, DecodeError> {
    let flags = r.flags(
        RING_AT + 20,
        RING_LOSS_SIGNALLED | RING_PENDING_LOST | RING_UNSIGNALLED,
    )?;
    let pending_lost = if flags & RING_PENDING_LOST != 0 {
        Some(RingLostRecord {
            count: r.u64(RING_AT + 168),
            sequence: r.u64(RING_AT + 176),
            tsc: r.u64(RING_AT + 184),
        })
    } else {
        r.zero(RING_AT + 168, 24)?;
        None
    };
    let unsignalled_since = if flags & RING_UNSIGNALLED != 0 {
        Some(r.u64(RING_AT + 200))
    } else {
        r.zero(RING_AT + 200, 8)?;
        None
    };
    let word = |i: usize| r.u64(RING_AT + 128 + 8 * i);
    Ok(RingRegistration {
        gfn: r.u64(RING_AT),
        data_pages: r.u32(RING_AT + 8),
        wakeup_bytes: r.u32(RING_AT + 12),
        max_latency_us: r.u32(RING_AT + 16),
        period_gp: core::array::from_fn(|i| r.u64(RING_AT + 24 + 8 * i)),
        period_fixed: core::array::from_fn(|i| r.u64(RING_AT + 88 + 8 * i)),
        head: r.u64(RING_AT + 120),
        counters: ProducerCounters {
            records: word(0),
            lost: word(1),
            withheld: word(2),
            wakeups: word(3),
            bad_tail: word(4),
        },
        pending_lost,
        unsignalled_bytes: r.u64(RING_AT + 192),
        unsignalled_since,
        loss_signalled: flags & RING_LOSS_SIGNALLED != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32_iso_hdlc() {
        // The check value of CRC-32/ISO-HDLC (shorter than the checksum's offset).
        assert_eq!(checksum(b"123456789"), 0xcbf4_3926);
        // The checksum field counts as zero whatever it holds.
        let mut bytes = [7u8; 32];
        let before = checksum(&bytes);
        bytes[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(checksum(&bytes), before);
    }
}
