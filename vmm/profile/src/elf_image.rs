//! The ELF files the outputs point at: each domain's image with a GNU build id (perf.data's
//! `HEADER_BUILD_ID` names images by it, and perf loads a file's symbols only when the file
//! carries the id the header gives it), and the hypervisor's symbol image (the VMM's
//! activities at their reserved addresses as functions, so that perf and pprof name hypervisor
//! samples as they name a domain's).

/// `NT_GNU_BUILD_ID`.
const NT_GNU_BUILD_ID: u32 = 3;
/// The name of the section that holds the build id (what perf and `readelf -n` look for).
const NOTE_SECTION: &str = ".note.gnu.build-id";
const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOTE: u32 = 7;
const SHF_ALLOC: u64 = 2;
const SHF_EXECINSTR: u64 = 4;
const SH_SIZE: usize = 64;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A 20-byte build id derived from `bytes` (the length of a SHA-1 one, which is what GNU ld's
/// `--build-id` writes): four FNV-1a hashes with distinct offsets, enough to tell images apart.
pub fn derive_build_id(bytes: &[u8]) -> [u8; 20] {
    let mut id = [0u8; 20];
    for (lane, chunk) in id.chunks_mut(8).enumerate() {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ (lane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        chunk.copy_from_slice(&h.to_le_bytes()[..chunk.len()]);
    }
    id
}

/// A GNU build-id note.
fn note(id: &[u8; 20]) -> Vec<u8> {
    let mut n = Vec::with_capacity(36);
    n.extend_from_slice(&4u32.to_le_bytes());
    n.extend_from_slice(&20u32.to_le_bytes());
    n.extend_from_slice(&NT_GNU_BUILD_ID.to_le_bytes());
    n.extend_from_slice(b"GNU\0");
    n.extend_from_slice(id);
    n
}

/// One `Elf64_Shdr`.
#[allow(clippy::too_many_arguments)]
fn section_header(
    out: &mut Vec<u8>,
    name: u32,
    kind: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
) {
    out.extend_from_slice(&name.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&addr.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&link.to_le_bytes());
    out.extend_from_slice(&info.to_le_bytes());
    out.extend_from_slice(&align.to_le_bytes());
    out.extend_from_slice(&entsize.to_le_bytes());
}

/// The build id of an ELF64 little-endian image's `.note.gnu.build-id`, if it has one.
pub fn build_id(elf: &[u8]) -> Option<[u8; 20]> {
    let sections = Sections::of(elf)?;
    let (offset, size) = sections.find(NOTE_SECTION)?;
    let (start, end) = (usize::try_from(offset).ok()?, usize::try_from(size).ok()?);
    let n = elf.get(start..start.checked_add(end)?)?;
    (u32_at(n, 0)? == 4 && u32_at(n, 4)? == 20 && u32_at(n, 8)? == NT_GNU_BUILD_ID)
        .then(|| n.get(16..36)?.try_into().ok())
        .flatten()
}

/// The section headers of an ELF64 little-endian image.
struct Sections<'a> {
    elf: &'a [u8],
    shoff: usize,
    count: usize,
    strndx: usize,
}

impl<'a> Sections<'a> {
    fn of(elf: &'a [u8]) -> Option<Self> {
        if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
            return None;
        }
        let shoff = usize::try_from(u64_at(elf, 0x28)?).ok()?;
        let (entsize, count, strndx) = (u16_at(elf, 0x3a)?, u16_at(elf, 0x3c)?, u16_at(elf, 0x3e)?);
        if usize::from(entsize) != SH_SIZE || count == 0 || strndx >= count {
            return None;
        }
        let count = usize::from(count);
        elf.get(shoff..shoff.checked_add(count * SH_SIZE)?)?;
        Some(Sections {
            elf,
            shoff,
            count,
            strndx: usize::from(strndx),
        })
    }

    fn header(&self, i: usize) -> &'a [u8] {
        let at = self.shoff + i * SH_SIZE;
        &self.elf[at..at + SH_SIZE]
    }

    /// The section-name string table: offset and size.
    fn strtab(&self) -> Option<(usize, usize)> {
        let h = self.header(self.strndx);
        let (off, size) = (u64_at(h, 24)?, u64_at(h, 32)?);
        let (off, size) = (usize::try_from(off).ok()?, usize::try_from(size).ok()?);
        self.elf.get(off..off.checked_add(size)?)?;
        Some((off, size))
    }

    /// Offset and size of the section named `name`.
    fn find(&self, name: &str) -> Option<(u64, u64)> {
        let (str_off, str_size) = self.strtab()?;
        let names = &self.elf[str_off..str_off + str_size];
        (0..self.count).find_map(|i| {
            let h = self.header(i);
            let at = usize::try_from(u32_at(h, 0)?).ok()?;
            let rest = names.get(at..)?;
            let end = rest.iter().position(|&b| b == 0)?;
            (&rest[..end] == name.as_bytes()).then(|| Some((u64_at(h, 24)?, u64_at(h, 32)?)))?
        })
    }
}

/// `elf` as the tools read it: with a GNU build id and that id, and with no segment whose file
/// offsets overlap the code's. The id is the image's own if it has one; otherwise one derived
/// from its bytes, in a `.note.gnu.build-id` section appended after everything else. A
/// `PT_LOAD` that reads nothing from the file (`p_filesz` 0: the guests' `.bss`) gets a file
/// offset past the end of the file: the linker leaves it at 0, which overlaps `.text`, and perf
/// (which places a symbol by its segment's `p_vaddr - p_offset`) then credits code addresses
/// to `.bss` variables. The loaded bytes, addresses and code offsets stay as they were. None
/// if `elf` is not an ELF64 little-endian image with section headers.
pub fn for_tools(elf: &[u8]) -> Option<(Vec<u8>, [u8; 20])> {
    let (mut out, id) = with_build_id(elf)?;
    let phoff = usize::try_from(u64_at(&out, 0x20)?).ok()?;
    let (entsize, count) = (usize::from(u16_at(&out, 0x36)?), u16_at(&out, 0x38)?);
    let end = out.len() as u64;
    for i in 0..usize::from(count) {
        let at = phoff.checked_add(i.checked_mul(entsize)?)?;
        let (kind, vaddr, filesz, align) = (
            u32_at(&out, at)?,
            u64_at(&out, at + 16)?,
            u64_at(&out, at + 32)?,
            u64_at(&out, at + 48)?.max(1),
        );
        const PT_LOAD: u32 = 1;
        if kind == PT_LOAD && filesz == 0 {
            let offset = end.next_multiple_of(align) + vaddr % align;
            out[at + 8..at + 16].copy_from_slice(&offset.to_le_bytes());
        }
    }
    Some((out, id))
}

/// `elf` with a GNU build id and that id (see `for_tools`).
fn with_build_id(elf: &[u8]) -> Option<(Vec<u8>, [u8; 20])> {
    if let Some(id) = build_id(elf) {
        return Some((elf.to_vec(), id));
    }
    let sections = Sections::of(elf)?;
    let (str_off, str_size) = sections.strtab()?;
    let id = derive_build_id(elf);
    let mut out = elf.to_vec();
    let align8 = |v: &mut Vec<u8>| v.resize(v.len().next_multiple_of(8), 0);
    align8(&mut out);
    let note_at = out.len();
    out.extend_from_slice(&note(&id));
    // A new section-name table: the old one and the note's name.
    let names_at = out.len();
    out.extend_from_slice(&elf[str_off..str_off + str_size]);
    let note_name = u32::try_from(str_size).ok()?;
    out.extend_from_slice(NOTE_SECTION.as_bytes());
    out.push(0);
    let names_size = out.len() - names_at;
    align8(&mut out);
    let shoff = out.len();
    for i in 0..sections.count {
        let mut h = sections.header(i).to_vec();
        if i == sections.strndx {
            h[24..32].copy_from_slice(&(names_at as u64).to_le_bytes());
            h[32..40].copy_from_slice(&(names_size as u64).to_le_bytes());
        }
        out.extend_from_slice(&h);
    }
    section_header(
        &mut out,
        note_name,
        SHT_NOTE,
        0,
        0,
        note_at as u64,
        36,
        0,
        0,
        4,
        0,
    );
    let count = u16::try_from(sections.count + 1).ok()?;
    out[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    out[0x3c..0x3e].copy_from_slice(&count.to_le_bytes());
    Some((out, id))
}

/// Where the symbol image's `.text` starts in the file (a page, as a linker lays it out, so
/// that a map's file offset is page-aligned).
pub const SYMBOL_IMAGE_TEXT_OFFSET: u64 = 0x1000;

/// An ELF64 x86-64 executable whose `.text` covers `[start, start + len)` (filled with `int3`)
/// and whose symbol table names `symbols` (address, size, name) in it as functions, with a GNU
/// build id: the hypervisor's symbol image, which perf and pprof look its samples up in.
pub fn symbol_image(start: u64, len: u64, symbols: &[(u64, u64, String)]) -> Vec<u8> {
    let text_off = SYMBOL_IMAGE_TEXT_OFFSET as usize;
    let mut out = vec![0u8; text_off];
    out.resize(text_off + len as usize, 0xcc);
    // .symtab: the null symbol, then every function (STB_GLOBAL, STT_FUNC, section 1).
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    for (address, size, name) in symbols {
        let at = strtab.len() as u32;
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        symtab.extend_from_slice(&at.to_le_bytes());
        symtab.push(0x12); // STB_GLOBAL << 4 | STT_FUNC
        symtab.push(0); // default visibility
        symtab.extend_from_slice(&1u16.to_le_bytes());
        symtab.extend_from_slice(&address.to_le_bytes());
        symtab.extend_from_slice(&size.to_le_bytes());
    }
    let mut shstrtab = vec![0u8];
    let mut name = |n: &str| {
        let at = shstrtab.len() as u32;
        shstrtab.extend_from_slice(n.as_bytes());
        shstrtab.push(0);
        at
    };
    let names = [
        name(".text"),
        name(NOTE_SECTION),
        name(".symtab"),
        name(".strtab"),
        name(".shstrtab"),
    ];
    let place = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.resize(out.len().next_multiple_of(8), 0);
        let at = out.len() as u64;
        out.extend_from_slice(bytes);
        at
    };
    // The id covers the text and the symbols, which is what tells two images apart.
    let mut identity = symtab.clone();
    identity.extend_from_slice(&strtab);
    identity.extend_from_slice(&start.to_le_bytes());
    identity.extend_from_slice(&len.to_le_bytes());
    let note_at = place(&mut out, &note(&derive_build_id(&identity)));
    let symtab_at = place(&mut out, &symtab);
    let strtab_at = place(&mut out, &strtab);
    let shstrtab_at = place(&mut out, &shstrtab);
    out.resize(out.len().next_multiple_of(8), 0);
    let shoff = out.len() as u64;
    section_header(&mut out, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    section_header(
        &mut out,
        names[0],
        SHT_PROGBITS,
        SHF_ALLOC | SHF_EXECINSTR,
        start,
        SYMBOL_IMAGE_TEXT_OFFSET,
        len,
        0,
        0,
        16,
        0,
    );
    section_header(
        &mut out, names[1], SHT_NOTE, SHF_ALLOC, 0, note_at, 36, 0, 0, 4, 0,
    );
    section_header(
        &mut out,
        names[2],
        SHT_SYMTAB,
        0,
        0,
        symtab_at,
        symtab.len() as u64,
        4,
        1, // one local symbol: the null one
        8,
        24,
    );
    section_header(
        &mut out,
        names[3],
        SHT_STRTAB,
        0,
        0,
        strtab_at,
        strtab.len() as u64,
        0,
        0,
        1,
        0,
    );
    section_header(
        &mut out,
        names[4],
        SHT_STRTAB,
        0,
        0,
        shstrtab_at,
        shstrtab.len() as u64,
        0,
        0,
        1,
        0,
    );
    // The ELF header and one PT_LOAD (R+X) of the text.
    let mut h = Vec::with_capacity(64 + 56);
    h.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    h.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&start.to_le_bytes()); // e_entry
    h.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
    h.extend_from_slice(&shoff.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    h.extend_from_slice(&64u16.to_le_bytes());
    h.extend_from_slice(&56u16.to_le_bytes());
    h.extend_from_slice(&1u16.to_le_bytes());
    h.extend_from_slice(&(SH_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&6u16.to_le_bytes());
    h.extend_from_slice(&5u16.to_le_bytes()); // e_shstrndx
    h.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    h.extend_from_slice(&5u32.to_le_bytes()); // PF_R | PF_X
    h.extend_from_slice(&SYMBOL_IMAGE_TEXT_OFFSET.to_le_bytes());
    h.extend_from_slice(&start.to_le_bytes());
    h.extend_from_slice(&start.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&0x1000u64.to_le_bytes());
    out[..h.len()].copy_from_slice(&h);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu_machine::symbols::Symbols;

    #[test]
    fn a_build_id_is_added_and_the_image_stays_what_it_was() {
        let elf = vpmu_guests::WORK;
        assert_eq!(build_id(elf), None, "the guests are linked without one");
        let (with, id) = with_build_id(elf).expect("an ELF");
        assert_eq!(build_id(&with), Some(id));
        assert_eq!(
            &with[..0x28],
            &elf[..0x28],
            "header up to e_shoff unchanged"
        );
        assert_eq!(
            crate::outputs::exec_segments(&with),
            crate::outputs::exec_segments(elf)
        );
        let (a, b) = (
            Symbols::from_elf(elf).unwrap(),
            Symbols::from_elf(&with).unwrap(),
        );
        assert_eq!(a.lookup(0x100fa0), b.lookup(0x100fa0));
        assert!(b.lookup(0x100fa0).is_some());
        // Idempotent, and distinct images get distinct ids.
        assert_eq!(with_build_id(&with).map(|(_, i)| i), Some(id));
        let (_, other) = with_build_id(vpmu_guests::PROFILER).expect("an ELF");
        assert_ne!(other, id);
        assert!(with_build_id(b"not an elf").is_none());
    }

    #[test]
    fn no_segment_of_the_copy_overlaps_the_code_in_the_file() {
        for elf in [
            vpmu_guests::WORK,
            vpmu_guests::PROFILER,
            vpmu_guests::EXAMPLE,
        ] {
            let (copy, _) = for_tools(elf).expect("an ELF");
            let phoff = u64_at(&copy, 0x20).unwrap() as usize;
            let text = crate::outputs::exec_segments(&copy)[0];
            let mut moved = 0;
            for i in 0..usize::from(u16_at(&copy, 0x38).unwrap()) {
                let at = phoff + i * 56;
                let (offset, vaddr, filesz) = (
                    u64_at(&copy, at + 8).unwrap(),
                    u64_at(&copy, at + 16).unwrap(),
                    u64_at(&copy, at + 32).unwrap(),
                );
                if u32_at(&copy, at) == Some(1) && filesz == 0 {
                    assert!(offset >= copy.len() as u64, "past the end");
                    assert_eq!(offset % 0x1000, vaddr % 0x1000);
                    moved += 1;
                } else if vaddr != text.address {
                    assert_eq!(&copy[at..at + 56], &elf[at..at + 56]);
                }
            }
            assert!(moved > 0, "the guests have a .bss segment");
            assert_eq!(crate::outputs::exec_segments(&copy)[0], text);
        }
    }

    #[test]
    fn the_symbol_image_names_its_functions() {
        let base = 0xffff_ff00_0000_0000;
        let table = vec![
            (base, 0x1000, "vmm_a".to_string()),
            (base + 0x1000, 0x1000, "vmm_b".to_string()),
        ];
        let elf = symbol_image(base, 0x2000, &table);
        let symbols = Symbols::from_elf(&elf).expect("symbols");
        assert_eq!(symbols.lookup(base + 0x10), Some("vmm_a"));
        assert_eq!(symbols.lookup(base + 0x1fff), Some("vmm_b"));
        assert_eq!(symbols.lookup(base + 0x2000), None);
        assert!(build_id(&elf).is_some());
        let segs = crate::outputs::exec_segments(&elf);
        assert_eq!(segs.len(), 1);
        assert_eq!(
            (segs[0].address, segs[0].size, segs[0].offset),
            (base, 0x2000, SYMBOL_IMAGE_TEXT_OFFSET)
        );
    }
}
