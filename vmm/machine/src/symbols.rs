//! Function symbols of one guest program, for turning sampled instruction pointers into names.

use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SectionKind, SymbolKind};

/// Why a guest program's symbols could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SymbolError {
    /// The image does not start with the ELF magic.
    #[error("not an ELF file (bad magic)")]
    NotElf,
    /// The ELF parser refused the image (what it said).
    #[error("malformed ELF: {0}")]
    Malformed(String),
    /// The image has no symbol table.
    #[error("ELF has no symbol table (stripped? build with symbols)")]
    NoSymbolTable,
    /// The symbol table has no function symbols.
    #[error("ELF symbol table has no function symbols")]
    NoFunctions,
}

fn malformed(e: object::Error) -> SymbolError {
    SymbolError::Malformed(e.to_string())
}

/// One function: the half-open address range `[start, end)` and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: String,
}

/// A sorted table of function address ranges of one guest program.
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    /// Sorted by `start`, one entry per start address.
    entries: Vec<Entry>,
    /// `max_end[i]` = the largest `end` among `entries[..=i]`: lets a lookup that lands on a
    /// nested label walk back to its enclosing function without scanning the whole table.
    max_end: Vec<u64>,
}

/// A symbol taken from the ELF, before zero sizes are resolved.
struct Candidate {
    start: u64,
    size: u64,
    /// End of the symbol's section, if known: a zero-size symbol never extends past it.
    section_end: Option<u64>,
    name: String,
    /// Higher wins when several symbols share a start address.
    rank: u8,
}

impl Symbols {
    /// Reads the function symbols of the ELF image `elf`: `STT_FUNC` symbols, and untyped
    /// (`STT_NOTYPE`) labels in executable sections, since hand-written assembly often omits
    /// `.type`. Untyped labels named `*_end` are taken as end markers (they bound the preceding
    /// label) rather than functions. A zero-size symbol extends to the next symbol or end
    /// marker, or to the end of its section.
    pub fn from_elf(elf: &[u8]) -> Result<Symbols, SymbolError> {
        let aligned = AlignedElf::new(elf)?;
        let elf = aligned.bytes();
        let file = object::File::parse(elf).map_err(malformed)?;
        let table = file.symbol_table().ok_or(SymbolError::NoSymbolTable)?;

        let mut candidates = Vec::new();
        // Addresses where something ends even though no function starts there.
        let mut boundaries = Vec::new();
        for sym in table.symbols() {
            let kind = sym.kind();
            let is_func = kind == SymbolKind::Text;
            let is_label = kind == SymbolKind::Unknown;
            if !is_func && !is_label {
                continue;
            }
            let Some(index) = sym.section_index() else {
                continue;
            };
            let Ok(section) = file.section_by_index(index) else {
                continue;
            };
            // Untyped symbols outside code are data labels or linker-script markers.
            if is_label && section.kind() != SectionKind::Text {
                continue;
            }
            let Ok(name) = sym.name() else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let start = sym.address();
            if is_label && name.ends_with("_end") {
                boundaries.push(start);
                continue;
            }
            let section_end = Some(section.address().saturating_add(section.size()));
            let rank =
                u8::from(is_func) * 4 + u8::from(sym.is_global()) * 2 + u8::from(sym.size() != 0);
            candidates.push(Candidate {
                start,
                size: sym.size(),
                section_end,
                name: name.to_string(),
                rank,
            });
        }
        if candidates.is_empty() {
            return Err(SymbolError::NoFunctions);
        }
        Ok(Self::resolve(candidates, boundaries))
    }

    /// The address and size of the symbol `name` (of any kind: a guest's configuration
    /// variable, say) in `elf`, or None if it has none.
    pub fn address_of(elf: &[u8], name: &str) -> Result<Option<(u64, u64)>, SymbolError> {
        let aligned = AlignedElf::new(elf)?;
        let file = object::File::parse(aligned.bytes()).map_err(malformed)?;
        Ok(file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| (s.address(), s.size())))
    }

    /// Builds a table from `(start, len, name)` entries in any order. A zero `len` extends the
    /// entry to the next entry's start; a trailing zero-length entry covers just its start
    /// address.
    pub fn from_table(entries: Vec<(u64, u64, String)>) -> Symbols {
        let candidates = entries
            .into_iter()
            .map(|(start, size, name)| Candidate {
                start,
                size,
                section_end: None,
                name,
                rank: 0,
            })
            .collect();
        Self::resolve(candidates, Vec::new())
    }

    /// Sorts, deduplicates by start address and gives zero-size symbols an extent.
    fn resolve(mut candidates: Vec<Candidate>, mut boundaries: Vec<u64>) -> Symbols {
        // Best-ranked first within a start address, so the dedup below keeps it.
        candidates.sort_by(|a, b| {
            a.start
                .cmp(&b.start)
                .then(b.rank.cmp(&a.rank))
                .then(b.size.cmp(&a.size))
                .then_with(|| a.name.cmp(&b.name))
        });
        candidates.dedup_by_key(|c| c.start);

        boundaries.extend(candidates.iter().map(|c| c.start));
        boundaries.extend(
            candidates
                .iter()
                .filter(|c| c.size != 0)
                .map(|c| c.start.saturating_add(c.size)),
        );
        boundaries.sort_unstable();
        boundaries.dedup();

        let entries: Vec<Entry> = candidates
            .into_iter()
            .map(|c| {
                let end = if c.size != 0 {
                    c.start.saturating_add(c.size)
                } else {
                    let next = boundaries.partition_point(|&b| b <= c.start);
                    let end = match (boundaries.get(next).copied(), c.section_end) {
                        (Some(n), Some(s)) => n.min(s),
                        (Some(e), None) | (None, Some(e)) => e,
                        (None, None) => c.start,
                    };
                    // A label at its section's very end still covers its own address.
                    end.max(c.start.saturating_add(1))
                };
                Entry {
                    start: c.start,
                    end,
                    name: c.name,
                }
            })
            .collect();
        let max_end = entries
            .iter()
            .scan(0u64, |m, e| {
                *m = (*m).max(e.end);
                Some(*m)
            })
            .collect();
        Symbols { entries, max_end }
    }

    /// The name of the function containing `ip`, innermost first when ranges nest.
    pub fn lookup(&self, ip: u64) -> Option<&str> {
        let mut i = self.entries.partition_point(|e| e.start <= ip);
        while i > 0 {
            i -= 1;
            if self.max_end[i] <= ip {
                return None;
            }
            let e = &self.entries[i];
            if ip < e.end {
                return Some(&e.name);
            }
        }
        None
    }

    /// How many functions the table holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds no functions.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// An ELF image `object` can parse in place: it reads headers where they lie and refuses
/// misaligned ones, which an `include_bytes!` image or a sub-slice may well be, so a
/// misaligned image is copied to an aligned buffer.
#[derive(Debug)]
pub enum AlignedElf<'a> {
    /// Already 8-byte aligned: parsed where it lies.
    InPlace(&'a [u8]),
    /// Copied into 8-byte words (the words, the image's length in bytes).
    Copied(Vec<u64>, usize),
}

impl<'a> AlignedElf<'a> {
    /// `elf`, aligned (copied if it is not); an error if it does not start like an ELF file.
    pub fn new(elf: &'a [u8]) -> Result<Self, SymbolError> {
        if !elf.starts_with(b"\x7fELF") {
            return Err(SymbolError::NotElf);
        }
        if elf.as_ptr().align_offset(8) == 0 {
            return Ok(Self::InPlace(elf));
        }
        let words = elf
            .chunks(8)
            .map(|c| {
                let mut word = [0u8; 8];
                word[..c.len()].copy_from_slice(c);
                u64::from_ne_bytes(word)
            })
            .collect();
        Ok(Self::Copied(words, elf.len()))
    }

    /// The image's bytes, 8-byte aligned.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::InPlace(b) => b,
            Self::Copied(words, len) => &zerocopy::IntoBytes::as_bytes(words.as_slice())[..*len],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pmu() -> Symbols {
        Symbols::from_elf(vpmu_guests::PMU).expect("guest image has symbols")
    }

    fn start_of(syms: &Symbols, name: &str) -> u64 {
        syms.entries
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .start
    }

    #[test]
    fn guest_image_functions_and_asm_labels() {
        let syms = pmu();
        assert!(!syms.is_empty());
        for name in [
            "rt_init",
            "puts",
            "user_call",
            "hot_a",
            "hot_b",
            "work_loop",
        ] {
            let start = start_of(&syms, name);
            assert_eq!(syms.lookup(start), Some(name), "{name}");
        }
        let hot_a = start_of(&syms, "hot_a");
        assert_eq!(syms.lookup(hot_a + 3), Some("hot_a"));
        let puts = start_of(&syms, "puts");
        assert_eq!(syms.lookup(puts + 1), Some("puts"));
    }

    #[test]
    fn misaligned_input_is_parsed() {
        let mut buf = vec![0u8; vpmu_guests::PMU.len() + 1];
        buf[1..].copy_from_slice(vpmu_guests::PMU);
        let syms = Symbols::from_elf(&buf[1..]).expect("misaligned copy parses");
        assert_eq!(syms.len(), pmu().len());
    }

    #[test]
    fn end_markers_are_never_names() {
        let syms = pmu();
        assert!(syms.entries.iter().all(|e| !e.name.ends_with("_end")));
        let first = syms.entries[0].start;
        let last = syms.entries[syms.len() - 1].end;
        for ip in first..last.min(first + 0x10_0000) {
            if let Some(name) = syms.lookup(ip) {
                assert!(!name.ends_with("_end"), "{ip:#x} -> {name}");
            }
        }
    }

    #[test]
    fn zero_size_label_stops_at_its_end_marker() {
        let syms = pmu();
        let hot_a = start_of(&syms, "hot_a");
        let hot_b = start_of(&syms, "hot_b");
        let e = syms.entries.iter().find(|e| e.name == "hot_a").unwrap();
        assert!(e.end > hot_a && e.end <= hot_b);
    }

    #[test]
    fn outside_any_function_is_none() {
        let syms = pmu();
        assert_eq!(syms.lookup(0), None);
        assert_eq!(syms.lookup(u64::MAX), None);
    }

    #[test]
    fn garbage_is_refused() {
        assert_eq!(Symbols::from_elf(b"").unwrap_err(), SymbolError::NotElf);
        assert!(Symbols::from_elf(b"hello world, not an elf").is_err());
        let mut truncated = vpmu_guests::PMU[..64].to_vec();
        assert!(Symbols::from_elf(&truncated).is_err());
        truncated.truncate(20);
        assert!(Symbols::from_elf(&truncated).is_err());
    }

    #[test]
    fn stripped_image_is_refused() {
        // An ELF header claiming no sections at all: parses, but has no symbol table.
        let mut elf = vpmu_guests::PMU[..64].to_vec();
        elf[0x20..0x28].fill(0); // e_phoff
        elf[0x28..0x30].fill(0); // e_shoff
        elf[0x38..0x3a].fill(0); // e_phnum
        elf[0x3c..0x40].fill(0); // e_shnum, e_shstrndx
        let err = Symbols::from_elf(&elf).unwrap_err();
        assert_eq!(err, SymbolError::NoSymbolTable);
        assert!(err.to_string().contains("stripped"), "{err}");
    }

    #[test]
    fn data_symbols_by_name() {
        let (addr, size) = Symbols::address_of(vpmu_guests::WORK, "profile_config")
            .expect("an ELF")
            .expect("the work guest has profile_config");
        assert!(
            addr >= 0x10_0000 && size == vpmu_guest_protocol::profile::PROFILE_CONFIG_SIZE as u64,
            "{addr:#x} {size}"
        );
        assert_eq!(
            Symbols::address_of(vpmu_guests::WORK, "no_such_symbol"),
            Ok(None)
        );
    }

    #[test]
    fn table_lookup() {
        let syms = Symbols::from_table(vec![
            (0x300, 0, "c".into()),
            (0x100, 0x10, "a".into()),
            (0x200, 0, "b".into()),
            (0x108, 4, "a_inner".into()),
        ]);
        assert_eq!(syms.len(), 4);
        assert_eq!(syms.lookup(0xff), None);
        assert_eq!(syms.lookup(0x100), Some("a"));
        assert_eq!(syms.lookup(0x109), Some("a_inner"));
        assert_eq!(syms.lookup(0x10c), Some("a"));
        assert_eq!(syms.lookup(0x110), None);
        assert_eq!(syms.lookup(0x2ff), Some("b"));
        assert_eq!(syms.lookup(0x300), Some("c"));
        assert_eq!(syms.lookup(0x301), None);
        assert!(Symbols::from_table(Vec::new()).is_empty());
    }
}
