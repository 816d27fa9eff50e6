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
    pub fn parse(bytes: &[u8]) -> Result<RawProfile, String> {
        let header = Header::read(bytes).ok_or_else(|| {
            format!(
                "truncated raw profile: {} bytes, the header alone is {HEADER_SIZE}",
                bytes.len()
            )
        })?;
        check_header(&header)?;
        let layout = Layout::new(&header, bytes.len())?;

        // In bounds: Layout::new checked that the sections add up to the file's length.
        let names_bytes = bytes
            .get(layout.names..layout.names + layout.names_size)
            .ok_or("the names section lies outside the file")?;
        let (names, names_compressed) = decode_names(names_bytes)?;
        let mut by_hash: HashMap<u64, &[u8]> = HashMap::with_capacity(names.len());
        for name in &names {
            let hash = name_hash(name);
            let previous = by_hash.insert(hash, name);
            if let Some(other) = previous.filter(|other| other != name) {
                return Err(format!(
                    "names {:?} and {:?} have the same MD5-based hash {hash:#018x}: the \
                     functions' NameRef is ambiguous",
                    String::from_utf8_lossy(other),
                    String::from_utf8_lossy(name)
                ));
            }
        }

        let mut functions = Vec::with_capacity(layout.num_data);
        let mut ranges = Vec::with_capacity(layout.num_data);
        for i in 0..layout.num_data {
            let record = Record::read(bytes, layout.data + i * DATA_RECORD_SIZE)
                .ok_or_else(|| format!("data record {i} is truncated"))?;
            let name = by_hash.get(&record.name_ref).ok_or_else(|| {
                format!(
                    "data record {i} (NameRef {:#018x}, FuncHash {:#018x}) has no name in the \
                     names section",
                    record.name_ref, record.func_hash
                )
            })?;
            let first = record.first_counter(i, &header)?;
            let count = record.num_counters as usize;
            ranges.push((first, first + count, i));
            if record.num_bitmap_bytes != 0 {
                record.check_bitmap(i, &header)?;
            }
            let counters = (first..first + count)
                .map(|c| read_u64(bytes, layout.counters + c * COUNTER_SIZE))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| format!("data record {i}: counters lie outside the file"))?;
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
                return Err(format!(
                    "data records {a} and {b} share counters (indexes {start_b}..{end_a})"
                ));
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
    pub fn check_against_elf(&self, elf: &[u8]) -> Result<(), String> {
        let aligned = crate::profile::symbols::AlignedElf::new(elf)?;
        let aligned = aligned.bytes();
        let file = object::File::parse(aligned).map_err(|e| format!("malformed ELF: {e}"))?;
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
            Err(format!(
                "the profile does not match this ELF: {}",
                problems.join("; ")
            ))
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
mod tests {
    use super::*;

    /// A real profile: `covdemo`, a 40-line program whose own crate and minicov =0.3.8
    /// (default-features = false) were built with `-C instrument-coverage` (rustc 1.95.0,
    /// `RUSTC_WRAPPER` adding the flag for those two crate names only), ran with 1 argument
    /// and wrote `minicov::capture_coverage`'s output. `llvm-profdata-22 merge` accepts it.
    const FIXTURE: &[u8] = include_bytes!("../../tests/data/minicov-v10.profraw");

    /// Lays out a version-10 profile exactly as LLVM's runtime does, placing the counters
    /// before the data in the (imaginary) program's memory like the real linker layout.
    struct Synth {
        functions: Vec<(Vec<u8>, u64, Vec<u64>)>,
        extra_names: Vec<Vec<u8>>,
        compress: bool,
        /// MC/DC bitmap bytes per function (none when shorter than `functions`).
        bitmaps: Vec<u32>,
    }

    impl Synth {
        fn new(functions: &[(&str, u64, &[u64])]) -> Synth {
            Synth {
                functions: functions
                    .iter()
                    .map(|(n, h, c)| (n.as_bytes().to_vec(), *h, c.to_vec()))
                    .collect(),
                extra_names: Vec::new(),
                compress: false,
                bitmaps: Vec::new(),
            }
        }

        fn names_section(&self) -> Vec<u8> {
            let joined = self
                .functions
                .iter()
                .map(|f| f.0.clone())
                .chain(self.extra_names.iter().cloned())
                .collect::<Vec<_>>()
                .join(&NAME_SEPARATOR);
            let mut out = Vec::new();
            uleb(&mut out, joined.len() as u64);
            if self.compress {
                let z = miniz_oxide::deflate::compress_to_vec_zlib(&joined, 6);
                uleb(&mut out, z.len() as u64);
                out.extend_from_slice(&z);
            } else {
                uleb(&mut out, 0);
                out.extend_from_slice(&joined);
            }
            out
        }

        fn build(&self) -> Vec<u8> {
            let num_data = self.functions.len() as u64;
            let num_counters: u64 = self.functions.iter().map(|f| f.2.len() as u64).sum();
            let names = self.names_section();
            // Memory layout: counters, then data (as in the real ELF), so the delta is negative.
            let counters_delta = (num_counters * 8).wrapping_neg();
            // The bitmaps follow the data in memory, 16 bytes further on.
            let bitmap_delta = 64 * num_data + 16;
            let num_bitmap_bytes: u64 = self.bitmaps.iter().map(|&b| u64::from(b)).sum();
            let bitmap_padding = num_bitmap_bytes.next_multiple_of(8) - num_bitmap_bytes;
            let header = [
                MAGIC,
                VERSION,
                0,
                num_data,
                0,
                num_counters,
                0,
                num_bitmap_bytes,
                bitmap_padding,
                names.len() as u64,
                counters_delta,
                bitmap_delta,
                0x5555_0000,
                0,
                0,
                VALUE_KIND_LAST,
            ];
            let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
            let (mut first, mut first_bitmap) = (0u64, 0u64);
            for (i, (name, hash, counters)) in self.functions.iter().enumerate() {
                let own = 64 * i as u64;
                let counter_ptr = counters_delta.wrapping_add(first * 8).wrapping_sub(own);
                let bitmap_bytes = self.bitmaps.get(i).copied().unwrap_or(0);
                let bitmap_ptr = if bitmap_bytes == 0 {
                    0
                } else {
                    (bitmap_delta + first_bitmap).wrapping_sub(own)
                };
                let words = [
                    name_hash(name),
                    *hash,
                    counter_ptr,
                    bitmap_ptr,
                    0x1000 + own,
                    0,
                ];
                for w in words {
                    out.extend_from_slice(&w.to_le_bytes());
                }
                out.extend_from_slice(&(counters.len() as u32).to_le_bytes());
                out.extend_from_slice(&[0; 6 + 2]);
                out.extend_from_slice(&bitmap_bytes.to_le_bytes());
                first += counters.len() as u64;
                first_bitmap += u64::from(bitmap_bytes);
            }
            for (_, _, counters) in &self.functions {
                for c in counters {
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            let bitmap_len = usize::try_from(num_bitmap_bytes + bitmap_padding).unwrap();
            out.extend(std::iter::repeat_n(0xa5, bitmap_len));
            out.extend_from_slice(&names);
            out.resize(out.len().next_multiple_of(8), 0);
            out
        }
    }

    fn uleb(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }

    fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
        bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn sample() -> Synth {
        Synth::new(&[
            ("_RNvCs1_4demo4main", 0x11, &[1, 7, 0]),
            ("_RNvCs1_4demo6unused", 0x22, &[0, 0]),
            ("_RNvCs1_4demo3hot", 0x33, &[1000]),
        ])
    }

    fn parse_err(bytes: &[u8]) -> String {
        RawProfile::parse(bytes).expect_err("the profile should be rejected")
    }

    #[test]
    fn synthetic_profile_parses_with_each_functions_counters() {
        for compress in [false, true] {
            let mut synth = sample();
            synth.compress = compress;
            synth.extra_names.push(b"discarded_function".to_vec());
            let p = RawProfile::parse(&synth.build()).unwrap();
            let f = p.functions();
            assert_eq!(f.len(), 3);
            assert_eq!(f[0].name, "_RNvCs1_4demo4main");
            assert_eq!(
                (f[0].hash, f[0].counters.as_slice()),
                (0x11, &[1, 7, 0][..])
            );
            assert_eq!((f[1].hash, f[1].counters.as_slice()), (0x22, &[0, 0][..]));
            assert_eq!(f[2].name, "_RNvCs1_4demo3hot");
            assert_eq!(f[2].counters, [1000]);
            assert_eq!(p.num_functions(), 3);
            assert_eq!(p.num_counters(), 6);
            assert_eq!(p.num_names(), 4);
            assert_eq!(p.total_count(), 1008);
            assert_eq!(p.covered_functions(), 2);
            assert_eq!(p.names_compressed(), compress);
            assert!(p.summary().contains("3 functions (2 executed), 6 counters"));
        }
    }

    #[test]
    fn bitmap_ranges_are_checked() {
        let mut synth = sample();
        synth.bitmaps = vec![3, 0, 2];
        let b = synth.build();
        let p = RawProfile::parse(&b).unwrap();
        assert_eq!(p.functions()[2].counters, [1000]);
        assert!(p.summary().contains("5 bitmap bytes"));
        // Record 2's NumBitmapBytes (at offset 60 of the record): 3 overruns the 5 bytes.
        let mut b = b;
        b[HEADER_SIZE + 2 * 64 + 60] = 3;
        let e = parse_err(&b);
        assert!(e.contains("data record 2") && e.contains("bitmap"), "{e}");
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut b = sample().build();
        put_u64(&mut b, 0, 0x1234);
        assert!(parse_err(&b).contains("not an LLVM raw profile"));
        put_u64(&mut b, 0, MAGIC.swap_bytes());
        assert!(parse_err(&b).contains("big-endian"));
    }

    #[test]
    fn wrong_version_is_rejected_naming_it() {
        let mut b = sample().build();
        put_u64(&mut b, 8, 11);
        let e = parse_err(&b);
        assert!(e.contains("version 11"), "{e}");
        put_u64(&mut b, 8, VERSION | 1 << 60);
        assert!(parse_err(&b).contains("variant flags"));
    }

    #[test]
    fn wrong_value_kind_last_or_padding_is_rejected() {
        let mut b = sample().build();
        put_u64(&mut b, 15 * 8, 1);
        assert!(parse_err(&b).contains("ValueKindLast"));
        let mut b = sample().build();
        put_u64(&mut b, 4 * 8, 8);
        assert!(parse_err(&b).contains("PaddingBytesBeforeCounters"));
        let mut b = sample().build();
        put_u64(&mut b, 4 * 8, 4);
        assert!(parse_err(&b).contains("not 8-aligned"));
    }

    #[test]
    fn truncated_profile_is_rejected() {
        let b = sample().build();
        assert!(parse_err(&b[..100]).contains("truncated"));
        assert!(parse_err(&b[..b.len() - 8]).contains("truncated"));
        assert!(parse_err(&[]).contains("truncated"));
    }

    #[test]
    fn trailing_byte_is_rejected() {
        let mut b = sample().build();
        b.push(0);
        let e = parse_err(&b);
        assert!(e.contains("1 trailing bytes"), "{e}");
    }

    #[test]
    fn huge_header_counts_are_a_size_error_not_a_panic() {
        for word in [2, 3, 5, 7, 9] {
            let mut b = sample().build();
            put_u64(&mut b, word * 8, !7);
            assert!(RawProfile::parse(&b).is_err());
        }
    }

    #[test]
    fn counter_range_outside_is_rejected() {
        let mut b = sample().build();
        // Record 2's NumCounters (its counters end the section): one more overruns it.
        b[HEADER_SIZE + 2 * 64 + 48] = 2;
        let e = parse_err(&b);
        assert!(e.contains("data record 2") && e.contains("outside"), "{e}");
        // A CounterPtr before the counters section.
        let mut b = sample().build();
        let at = HEADER_SIZE + 16;
        let ptr = read_u64(&b, at).unwrap().wrapping_sub(8);
        put_u64(&mut b, at, ptr);
        assert!(parse_err(&b).contains("outside"));
        // A misaligned CounterPtr.
        let mut b = sample().build();
        let ptr = read_u64(&b, at).unwrap().wrapping_add(4);
        put_u64(&mut b, at, ptr);
        assert!(parse_err(&b).contains("misaligned"));
    }

    #[test]
    fn overlapping_counter_ranges_are_rejected() {
        let mut b = sample().build();
        // Point record 1 at record 0's counters: 64 bytes further from its own address.
        let at = HEADER_SIZE + 64 + 16;
        let ptr = read_u64(&b, at).unwrap().wrapping_sub(3 * 8);
        put_u64(&mut b, at, ptr);
        let e = parse_err(&b);
        assert!(e.contains("share counters"), "{e}");
    }

    #[test]
    fn name_ref_without_name_is_rejected() {
        let mut b = sample().build();
        put_u64(&mut b, HEADER_SIZE + 64, 0xdead_beef);
        let e = parse_err(&b);
        assert!(e.contains("data record 1") && e.contains("no name"), "{e}");
    }

    #[test]
    fn corrupt_names_are_rejected() {
        let synth = sample();
        let mut b = synth.build();
        let names_at = HEADER_SIZE + 3 * 64 + 6 * 8;
        b[names_at] = 0xff; // claims more bytes than the section holds
        assert!(parse_err(&b).contains("names"));
        let mut compressed = sample();
        compressed.compress = true;
        let mut b = compressed.build();
        b[names_at + 4] ^= 0xff; // inside the zlib stream
        assert!(parse_err(&b).contains("name"));
    }

    #[test]
    fn name_hash_is_llvm_md5_low_half() {
        // Taken from the fixture: `covdemo::main`'s NameRef.
        assert_eq!(
            name_hash(b"_RNvCs9595tYLkWsW_7covdemo4main"),
            0x24d4_6f37_2760_1426
        );
    }

    #[test]
    fn real_minicov_profile_parses() {
        let p = RawProfile::parse(FIXTURE).unwrap();
        assert_eq!(p.num_functions(), 8);
        assert_eq!(p.num_counters(), 22);
        assert_eq!(p.num_names(), 18);
        assert!(p.names_compressed());
        assert_eq!(p.total_count(), 59);
        assert_eq!(p.covered_functions(), 6);
        let find = |suffix: &str| {
            p.functions()
                .iter()
                .find(|f| f.name.ends_with(suffix))
                .unwrap_or_else(|| panic!("no function {suffix}"))
        };
        // classify() ran for i in 0..11 (argv had 2 entries): entry count 11, then its branches.
        let classify = find("7covdemo8classify");
        assert_eq!(classify.counters, [11, 4, 4]);
        assert_eq!(classify.hash, 0x1b8e_e52f_4ec9_8471);
        assert_eq!(find("7covdemo4main").counters, [1, 12, 4, 4, 0]);
        assert!(
            find("7covdemo12never_called")
                .counters
                .iter()
                .all(|&c| c == 0)
        );
        assert_eq!(
            p.functions()
                .iter()
                .map(|f| f.counters.len())
                .sum::<usize>(),
            22
        );
    }

    #[test]
    fn check_against_elf_rejects_non_elf_and_missing_sections() {
        let p = RawProfile::parse(FIXTURE).unwrap();
        assert!(p.check_against_elf(b"not an elf").is_err());
        // This test binary is not instrumented: it has none of the sections.
        if let Ok(exe) = std::env::current_exe().and_then(std::fs::read) {
            let e = p.check_against_elf(&exe).unwrap_err();
            assert!(e.contains("no __llvm_prf_data section"), "{e}");
        }
    }

    /// Checks the fixture against the ELF it came from, when the scratch build is around
    /// (`/tmp/covscratch/target/release/covdemo`); the ELF is too large to keep in the repo.
    #[test]
    fn check_against_elf_matches_scratch_binary_if_present() {
        let Ok(elf) = std::fs::read("/tmp/covscratch/target/release/covdemo") else {
            eprintln!("SKIPPED: /tmp/covscratch/target/release/covdemo is not present");
            return;
        };
        let Ok(profile) = std::fs::read("/tmp/covscratch/demo.profraw") else {
            eprintln!("SKIPPED: /tmp/covscratch/demo.profraw is not present");
            return;
        };
        let p = RawProfile::parse(&profile).unwrap();
        p.check_against_elf(&elf).unwrap();
        // A misaligned copy must work too.
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&elf);
        p.check_against_elf(&shifted[1..]).unwrap();
        // And a profile of different size must not.
        let other = RawProfile::parse(&sample().build()).unwrap();
        assert!(other.check_against_elf(&elf).is_err());
    }

    proptest::proptest! {
        /// The profile comes from a hypervisor through a guest's buffer: any bytes parse or
        /// fail cleanly, never panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..2048),
        ) {
            let _ = RawProfile::parse(&bytes);
        }

        /// The real profile with one byte changed, or cut short, parses or fails cleanly.
        #[test]
        fn damaged_real_profile_never_panics(
            at in 0usize..FIXTURE.len(),
            byte in proptest::arbitrary::any::<u8>(),
            cut in 0usize..FIXTURE.len(),
        ) {
            let mut bytes = FIXTURE.to_vec();
            bytes[at] = byte;
            if let Ok(p) = RawProfile::parse(&bytes) {
                let _ = (p.summary(), p.total_count(), p.covered_functions());
            }
            let _ = RawProfile::parse(&FIXTURE[..cut]);
        }
    }
}
