//! Parser and validator for LLVM raw profiles ("profraw"), raw format version 10.
//!
//! The vPMU crates, built with `-C instrument-coverage` and the `minicov` runtime, hand their
//! raw profile to a privileged guest, which passes it to the VMM through hypercalls. The bytes
//! therefore crossed a guest: every size and offset in them is checked before it is used, and
//! a malformed profile is an `Err` with a message, never a panic. Checking the file here, rather
//! than leaving it to `llvm-profdata`, gives a precise error even where LLVM's tools are not
//! installed, and catches a transfer that lost or added bytes.
//!
//! Layout of version 10 (what LLVM 22's runtime writes, and what rustc 1.95 emits with minicov
//! 0.3.8), all little-endian:
//!
//! | section | size |
//! | --- | --- |
//! | header | 16 × u64 |
//! | binary ids | `BinaryIdsSize` (a multiple of 8) |
//! | data records | `NumData` × 64 |
//! | padding | `PaddingBytesBeforeCounters` |
//! | counters | `NumCounters` × u64 |
//! | padding | `PaddingBytesAfterCounters` |
//! | MC/DC bitmaps | `NumBitmapBytes` |
//! | padding | `PaddingBytesAfterBitmapBytes` |
//! | names | `NamesSize`, then zero padding to a multiple of 8 |
//! | vtables, vtable names | `NumVTables` × 24, `VNamesSize` (both zero for Rust) |
//!
//! A data record's `CounterPtr` is relative to the record's own address and the header's
//! `CountersDelta` is (counters begin − data begin), so record `i`'s first counter lies at byte
//! `CounterPtr + 64·i − CountersDelta` of the counters section (verified on a real minicov
//! profile, see `tests/data/minicov-v10.profraw`). `BitmapPtr`/`BitmapDelta` work the same way.

use std::collections::HashMap;
use std::fmt::Write as _;

use md5::{Digest, Md5};
use object::{Object, ObjectSection};

/// `\xffprofr\x81` read as a little-endian u64: the 64-bit raw profile magic.
const MAGIC: u64 = 0xff6c_7072_6f66_7281;
/// The only raw format version this parser knows the layout of.
const VERSION: u64 = 10;
/// LLVM keeps variant flags (IR-level, byte coverage, temporal profile, …) in the top half of
/// the version word; the format number is the low half.
const VARIANT_MASK: u64 = 0xffff_ffff_0000_0000;
/// `IPVK_Last` in version 10 (indirect call targets, memory op sizes, vtable targets): it fixes
/// the number of `NumValueSites` entries, and so the size of a data record.
const VALUE_KIND_LAST: u64 = 2;
const HEADER_WORDS: usize = 16;
const HEADER_SIZE: usize = HEADER_WORDS * 8;
const DATA_RECORD_SIZE: usize = 64;
const COUNTER_SIZE: usize = 8;
/// Separates the names inside one (possibly compressed) chunk of the names section.
const NAME_SEPARATOR: u8 = 0x01;
/// A bound on one decompressed names chunk, so that a hostile chunk header cannot make the
/// VMM inflate without limit (the real ones are a few KiB).
const MAX_NAMES_CHUNK: u64 = 64 << 20;

/// The 16 header words of a version-10 raw profile, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    /// Must be the 64-bit little-endian raw profile magic.
    magic: u64,
    /// Format version (low 32 bits) and variant flags (high 32 bits).
    version: u64,
    /// Size in bytes of the binary ids that follow the header.
    binary_ids_size: u64,
    /// Number of 64-byte per-function data records.
    num_data: u64,
    /// Zero bytes between the data records and the counters.
    padding_before_counters: u64,
    /// Number of 8-byte counters.
    num_counters: u64,
    /// Zero bytes between the counters and the bitmap bytes.
    padding_after_counters: u64,
    /// Number of MC/DC bitmap bytes.
    num_bitmap_bytes: u64,
    /// Zero bytes between the bitmap bytes and the names.
    padding_after_bitmap: u64,
    /// Size in bytes of the names section, without its padding.
    names_size: u64,
    /// Counters begin minus data begin, in the address space of the profiled program.
    counters_delta: u64,
    /// Bitmap begin minus data begin, in the address space of the profiled program.
    bitmap_delta: u64,
    /// Address of the names in the profiled program (unused for reading).
    names_delta: u64,
    /// Number of vtable records (value profiling; zero for Rust).
    num_vtables: u64,
    /// Size of the vtable names (value profiling; zero for Rust).
    vnames_size: u64,
    /// Last value-profiling kind the writer knew: 2 in version 10.
    value_kind_last: u64,
}

impl Header {
    fn read(bytes: &[u8]) -> Option<Header> {
        let w = |i: usize| read_u64(bytes, i * 8);
        Some(Header {
            magic: w(0)?,
            version: w(1)?,
            binary_ids_size: w(2)?,
            num_data: w(3)?,
            padding_before_counters: w(4)?,
            num_counters: w(5)?,
            padding_after_counters: w(6)?,
            num_bitmap_bytes: w(7)?,
            padding_after_bitmap: w(8)?,
            names_size: w(9)?,
            counters_delta: w(10)?,
            bitmap_delta: w(11)?,
            names_delta: w(12)?,
            num_vtables: w(13)?,
            vnames_size: w(14)?,
            value_kind_last: w(15)?,
        })
    }
}

/// The counters of one instrumented function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCounters {
    /// The function's PGO name (for Rust, its mangled symbol name).
    pub name: String,
    /// The function's structural hash (`FuncHash`), which ties the counters to the coverage
    /// mapping in the binary.
    pub hash: u64,
    /// The function's counters; the first is the function's entry count.
    pub counters: Vec<u64>,
}

/// Why a raw profile was refused: which part of it is wrong, with the precise problem (the
/// offsets, sizes and names involved).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProfrawError {
    /// Shorter than a header.
    #[error("truncated raw profile: {len} bytes, the header alone is {HEADER_SIZE}")]
    Truncated {
        /// The file's length.
        len: usize,
    },
    /// The header itself (magic, version, value kinds, paddings).
    #[error("{0}")]
    Header(String),
    /// The sections do not add up to the file (missing or trailing bytes, offsets).
    #[error("{0}")]
    Layout(String),
    /// The names section (chunks, compression, hash collisions).
    #[error("{0}")]
    Names(String),
    /// A data record (its counters, bitmap or name).
    #[error("{0}")]
    Record(String),
    /// The ELF cannot be read.
    #[error("{0}")]
    Elf(String),
    /// The profile's sizes disagree with the ELF's profile sections.
    #[error("the profile does not match this ELF: {}", .0.join("; "))]
    ElfMismatch(Vec<String>),
}

/// A validated raw profile.
#[derive(Debug, Clone)]
pub struct RawProfile {
    header: Header,
    functions: Vec<FunctionCounters>,
    names_compressed: bool,
    num_names: usize,
}

impl RawProfile {
    /// Parses and validates a version-10 raw profile.
    ///
    /// Checks the magic, the version, `ValueKindLast`, that every section is 8-aligned with
    /// paddings below 8, that the file is exactly as long as its sections (missing or trailing
    /// bytes are both errors), that each function's counters lie inside the counters section
    /// without overlapping another's, that the names decode (inflating compressed chunks), and
    /// that each function's `NameRef` is the MD5 hash of exactly one name.
    pub fn parse(bytes: &[u8]) -> Result<RawProfile, ProfrawError> {
        let header = Header::read(bytes).ok_or(ProfrawError::Truncated { len: bytes.len() })?;
        check_header(&header).map_err(ProfrawError::Header)?;
        let layout = Layout::new(&header, bytes.len()).map_err(ProfrawError::Layout)?;

        // In bounds: Layout::new checked that the sections add up to the file's length.
        let names_bytes = bytes
            .get(layout.names..layout.names + layout.names_size)
            .ok_or_else(|| {
                ProfrawError::Layout("the names section lies outside the file".into())
            })?;
        let (names, names_compressed) = decode_names(names_bytes).map_err(ProfrawError::Names)?;
        let mut by_hash: HashMap<u64, &[u8]> = HashMap::with_capacity(names.len());
        for name in &names {
            let hash = name_hash(name);
            let previous = by_hash.insert(hash, name);
            if let Some(other) = previous.filter(|other| other != name) {
                return Err(ProfrawError::Names(format!(
                    "names {:?} and {:?} have the same MD5-based hash {hash:#018x}: the \
                     functions' NameRef is ambiguous",
                    String::from_utf8_lossy(other),
                    String::from_utf8_lossy(name)
                )));
            }
        }

        let mut functions = Vec::with_capacity(layout.num_data);
        let mut ranges = Vec::with_capacity(layout.num_data);
        for i in 0..layout.num_data {
            let record = Record::read(bytes, layout.data + i * DATA_RECORD_SIZE)
                .ok_or_else(|| ProfrawError::Record(format!("data record {i} is truncated")))?;
            let name = by_hash.get(&record.name_ref).ok_or_else(|| {
                ProfrawError::Record(format!(
                    "data record {i} (NameRef {:#018x}, FuncHash {:#018x}) has no name in the \
                     names section",
                    record.name_ref, record.func_hash
                ))
            })?;
            let first = record
                .first_counter(i, &header)
                .map_err(ProfrawError::Record)?;
            let count = record.num_counters as usize;
            ranges.push((first, first + count, i));
            if record.num_bitmap_bytes != 0 {
                record
                    .check_bitmap(i, &header)
                    .map_err(ProfrawError::Record)?;
            }
            let counters = (first..first + count)
                .map(|c| read_u64(bytes, layout.counters + c * COUNTER_SIZE))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    ProfrawError::Record(format!("data record {i}: counters lie outside the file"))
                })?;
            functions.push(FunctionCounters {
                name: String::from_utf8_lossy(name).into_owned(),
                hash: record.func_hash,
                counters,
            });
        }
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            let ((_, end_a, a), (start_b, _, b)) = (pair[0], pair[1]);
            if start_b < end_a {
                return Err(ProfrawError::Record(format!(
                    "data records {a} and {b} share counters (indexes {start_b}..{end_a})"
                )));
            }
        }
        Ok(RawProfile {
            header,
            functions,
            names_compressed,
            num_names: names.len(),
        })
    }

    /// Every function with its counters, in the order of the data records.
    pub fn functions(&self) -> &[FunctionCounters] {
        &self.functions
    }

    /// Number of functions (data records).
    pub fn num_functions(&self) -> usize {
        self.functions.len()
    }

    /// Number of counters in the counters section.
    pub fn num_counters(&self) -> u64 {
        self.header.num_counters
    }

    /// Number of names in the names section; it may exceed the number of functions, since
    /// the linker keeps the names of functions whose records were discarded.
    pub fn num_names(&self) -> usize {
        self.num_names
    }

    /// Whether at least one chunk of the names section was zlib-compressed.
    pub fn names_compressed(&self) -> bool {
        self.names_compressed
    }

    /// Sum of all counters of all functions (a u128, so that it cannot overflow).
    pub fn total_count(&self) -> u128 {
        self.functions
            .iter()
            .flat_map(|f| f.counters.iter())
            .map(|&c| u128::from(c))
            .sum()
    }

    /// Number of functions with at least one non-zero counter.
    pub fn covered_functions(&self) -> usize {
        self.functions
            .iter()
            .filter(|f| f.counters.iter().any(|&c| c != 0))
            .count()
    }

    /// A one-line description, for logs and the command's output.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "raw profile v{VERSION}: {} functions ({} executed), {} counters, total count {}",
            self.num_functions(),
            self.covered_functions(),
            self.num_counters(),
            self.total_count()
        );
        if self.header.num_bitmap_bytes != 0 {
            let _ = write!(s, ", {} bitmap bytes", self.header.num_bitmap_bytes);
        }
        let _ = write!(
            s,
            ", {} names ({})",
            self.num_names(),
            if self.names_compressed() {
                "zlib-compressed"
            } else {
                "uncompressed"
            }
        );
        s
    }

    /// Checks that the profile comes from the instrumented ELF `elf`: the sizes of its
    /// `__llvm_prf_data`, `__llvm_prf_cnts` and `__llvm_prf_names` sections must equal
    /// 64·NumData, 8·NumCounters and NamesSize. A profile of another build has different sizes
    /// (or, rarely, the same ones: this check is necessary, not sufficient).
    pub fn check_against_elf(&self, elf: &[u8]) -> Result<(), ProfrawError> {
        let aligned = vpmu_machine::symbols::AlignedElf::new(elf)
            .map_err(|e| ProfrawError::Elf(e.to_string()))?;
        let aligned = aligned.bytes();
        let file = object::File::parse(aligned)
            .map_err(|e| ProfrawError::Elf(format!("malformed ELF: {e}")))?;
        let expected = [
            (
                "__llvm_prf_data",
                self.header.num_data.checked_mul(DATA_RECORD_SIZE as u64),
                "64 × NumData",
            ),
            (
                "__llvm_prf_cnts",
                self.header.num_counters.checked_mul(COUNTER_SIZE as u64),
                "8 × NumCounters",
            ),
            (
                "__llvm_prf_names",
                Some(self.header.names_size),
                "NamesSize",
            ),
        ];
        let mut problems = Vec::new();
        for (section, want, what) in expected {
            match file.section_by_name(section) {
                None => problems.push(format!(
                    "the ELF has no {section} section (was it built with -C instrument-coverage?)"
                )),
                Some(s) if Some(s.size()) != want => problems.push(format!(
                    "{section} is {} bytes in the ELF but the profile's {what} is {}",
                    s.size(),
                    want.map_or_else(|| "too large".to_string(), |w| w.to_string())
                )),
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ProfrawError::ElfMismatch(problems))
        }
    }
}

/// Header checks that need no knowledge of the file's length.
fn check_header(h: &Header) -> Result<(), String> {
    if h.magic != MAGIC {
        let hint = if h.magic == MAGIC.swap_bytes() {
            " (a big-endian profile, not supported)"
        } else if h.magic == 0xff6c_7072_6f66_5281 {
            " (a 32-bit raw profile, not supported)"
        } else {
            ""
        };
        return Err(format!(
            "not an LLVM raw profile: magic {:#018x}, expected {MAGIC:#018x}{hint}",
            h.magic
        ));
    }
    let version = h.version & !VARIANT_MASK;
    if version != VERSION {
        return Err(format!(
            "unsupported raw profile version {version} (this parser reads version {VERSION}, \
             which LLVM 22 and minicov 0.3.6-0.3.8 write)"
        ));
    }
    let variants = h.version & VARIANT_MASK;
    if variants != 0 {
        // Flags such as byte coverage change the counter size; rustc's front-end coverage sets
        // none, so refuse rather than misread.
        return Err(format!(
            "unsupported raw profile variant flags {variants:#018x} (coverage from rustc has none)"
        ));
    }
    if h.value_kind_last != VALUE_KIND_LAST {
        return Err(format!(
            "ValueKindLast is {}, expected {VALUE_KIND_LAST}: the data records would not be \
             64 bytes",
            h.value_kind_last
        ));
    }
    if h.binary_ids_size % 8 != 0 {
        return Err(format!(
            "BinaryIdsSize {} is not a multiple of 8",
            h.binary_ids_size
        ));
    }
    for (what, padding) in [
        ("PaddingBytesBeforeCounters", h.padding_before_counters),
        ("PaddingBytesAfterCounters", h.padding_after_counters),
        ("PaddingBytesAfterBitmapBytes", h.padding_after_bitmap),
    ] {
        if padding >= 8 {
            return Err(format!("{what} is {padding}, expected less than 8"));
        }
    }
    if h.num_vtables != 0 || h.vnames_size != 0 {
        return Err(format!(
            "the profile has vtable value-profiling data (NumVTables {}, VNamesSize {}), which \
             coverage builds do not produce",
            h.num_vtables, h.vnames_size
        ));
    }
    Ok(())
}

/// Byte offsets of the sections, checked against the file's length.
#[derive(Debug)]
struct Layout {
    data: usize,
    num_data: usize,
    counters: usize,
    names: usize,
    names_size: usize,
}

impl Layout {
    fn new(h: &Header, len: usize) -> Result<Layout, String> {
        // u128 arithmetic: u64 fields times small factors cannot overflow it, so a hostile
        // header gives a size mismatch rather than a wrapped, plausible offset.
        let data = HEADER_SIZE as u128 + u128::from(h.binary_ids_size);
        let counters = data
            + u128::from(h.num_data) * DATA_RECORD_SIZE as u128
            + u128::from(h.padding_before_counters);
        let bitmap = counters
            + u128::from(h.num_counters) * COUNTER_SIZE as u128
            + u128::from(h.padding_after_counters);
        let names = bitmap + u128::from(h.num_bitmap_bytes) + u128::from(h.padding_after_bitmap);
        let names_size = u128::from(h.names_size);
        let end = names + names_size.next_multiple_of(8);
        for (what, offset) in [
            ("counters", counters),
            ("bitmap bytes", bitmap),
            ("names", names),
        ] {
            if offset % 8 != 0 {
                return Err(format!(
                    "the {what} section would start at offset {offset}, not 8-aligned: the \
                     header's paddings are wrong"
                ));
            }
        }
        let len128 = len as u128;
        if len128 < end {
            return Err(format!(
                "truncated raw profile: the header describes {end} bytes, the file has {len}"
            ));
        }
        if len128 > end {
            return Err(format!(
                "{} trailing bytes after the raw profile's last section (the header describes \
                 {end} bytes, the file has {len})",
                len128 - end
            ));
        }
        // Every offset is at most `end` == `len`, so each fits in usize.
        let to_usize = |v: u128| usize::try_from(v).map_err(|_| "offset overflow".to_string());
        Ok(Layout {
            data: to_usize(data)?,
            num_data: to_usize(u128::from(h.num_data))?,
            counters: to_usize(counters)?,
            names: to_usize(names)?,
            names_size: to_usize(names_size)?,
        })
    }
}

/// The fields of a 64-byte data record that the parser uses.
#[derive(Debug)]
struct Record {
    name_ref: u64,
    func_hash: u64,
    counter_ptr: u64,
    bitmap_ptr: u64,
    num_counters: u32,
    num_bitmap_bytes: u32,
}

impl Record {
    fn read(bytes: &[u8], at: usize) -> Option<Record> {
        // `__llvm_profile_data` as C lays it out (InstrProfData.inc): NameRef, FuncHash,
        // CounterPtr, BitmapPtr, FunctionPointer, Values (8 bytes each), NumCounters u32 at 48,
        // NumValueSites [u16; 3] at 52, 2 bytes of alignment padding, NumBitmapBytes u32 at 60.
        Some(Record {
            name_ref: read_u64(bytes, at)?,
            func_hash: read_u64(bytes, at + 8)?,
            counter_ptr: read_u64(bytes, at + 16)?,
            bitmap_ptr: read_u64(bytes, at + 24)?,
            num_counters: read_u32(bytes, at + 48)?,
            num_bitmap_bytes: read_u32(bytes, at + 60)?,
        })
    }

    /// Index of the record's first counter, after checking that its counters lie inside the
    /// counters section.
    fn first_counter(&self, index: usize, h: &Header) -> Result<usize, String> {
        if self.num_counters == 0 {
            // LLVM's reader refuses this too: every instrumented function has an entry counter.
            return Err(format!("data record {index} has no counters"));
        }
        let offset = relative_offset(self.counter_ptr, index, h.counters_delta);
        let first = offset / COUNTER_SIZE as i128;
        let end = first + i128::from(self.num_counters);
        if offset < 0 || offset % COUNTER_SIZE as i128 != 0 || end > i128::from(h.num_counters) {
            return Err(format!(
                "data record {index}: its {} counters at byte offset {offset} of the counters \
                 section lie outside the {} counters (or are misaligned)",
                self.num_counters, h.num_counters
            ));
        }
        usize::try_from(first).map_err(|_| format!("data record {index}: counter index overflow"))
    }

    /// Checks that the record's MC/DC bitmap bytes lie inside the bitmap section.
    fn check_bitmap(&self, index: usize, h: &Header) -> Result<(), String> {
        let offset = relative_offset(self.bitmap_ptr, index, h.bitmap_delta);
        if offset < 0 || offset + i128::from(self.num_bitmap_bytes) > i128::from(h.num_bitmap_bytes)
        {
            return Err(format!(
                "data record {index}: its {} bitmap bytes at offset {offset} lie outside the {} \
                 bitmap bytes",
                self.num_bitmap_bytes, h.num_bitmap_bytes
            ));
        }
        Ok(())
    }
}

/// Offset into a section of what a record's relative pointer designates: the pointer is
/// relative to the record itself (at data begin + 64·index) and `delta` is the section's begin
/// minus data begin. Computed in i128 so no input can overflow it.
fn relative_offset(ptr: u64, index: usize, delta: u64) -> i128 {
    i128::from(ptr as i64) + (index as i128) * DATA_RECORD_SIZE as i128 - i128::from(delta as i64)
}

/// The low 64 bits of MD5(name), as LLVM's `MD5Hash` computes a function's `NameRef`.
fn name_hash(name: &[u8]) -> u64 {
    let digest = Md5::digest(name);
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(low)
}

/// Decodes the names section: a sequence of chunks `[ULEB128 uncompressed size][ULEB128
/// compressed size, 0 if stored][bytes]`, each holding names separated by 0x01. Returns the
/// names and whether any chunk was compressed.
fn decode_names(mut section: &[u8]) -> Result<(Vec<Vec<u8>>, bool), String> {
    let mut names = Vec::new();
    let mut compressed = false;
    while !section.is_empty() {
        let size = read_uleb128(&mut section)?;
        let compressed_size = read_uleb128(&mut section)?;
        let chunk = if compressed_size == 0 {
            take(&mut section, size)?.to_vec()
        } else {
            compressed = true;
            if size > MAX_NAMES_CHUNK {
                return Err(format!(
                    "a names chunk claims {size} uncompressed bytes (limit {MAX_NAMES_CHUNK})"
                ));
            }
            let input = take(&mut section, compressed_size)?;
            // `size` is at most MAX_NAMES_CHUNK, so it fits in usize.
            let limit = usize::try_from(size).unwrap_or(usize::MAX);
            let out = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(input, limit)
                .map_err(|e| format!("a compressed names chunk does not inflate: {e:?}"))?;
            if out.len() as u64 != size {
                return Err(format!(
                    "a compressed names chunk inflates to {} bytes, its header says {size}",
                    out.len()
                ));
            }
            out
        };
        names.extend(
            chunk
                .split(|&b| b == NAME_SEPARATOR)
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec),
        );
    }
    Ok((names, compressed))
}

/// Reads an unsigned LEB128 value of at most 64 bits, advancing `input`.
fn read_uleb128(input: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input
            .split_first()
            .ok_or("the names section ends inside a chunk header")?;
        *input = rest;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            break;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a names chunk header has a LEB128 size above 64 bits".to_string())
}

/// Takes `n` bytes off the front of `input`.
fn take<'a>(input: &mut &'a [u8], n: u64) -> Result<&'a [u8], String> {
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= input.len())
        .ok_or_else(|| {
            format!(
                "a names chunk claims {n} bytes, only {} remain in the names section",
                input.len()
            )
        })?;
    let (head, tail) = input.split_at(n);
    *input = tail;
    Ok(head)
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

#[cfg(test)]
#[path = "profraw_tests.rs"]
mod tests;
