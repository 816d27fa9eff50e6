//! Loading guest programs: static ELF64 x86-64 executables (the project's guests, and
//! kvm-unit-tests' `.elf`) or ELF32 i386 ones (kvm-unit-tests' `.flat`, for `vpmu boot`),
//! placed by their `PT_LOAD` program headers at their physical addresses (read with the
//! `object` crate); and the multiboot header a `vpmu boot` image must carry.

use object::elf::{ELFCLASS32, ELFCLASS64, EM_386, EM_X86_64, PT_LOAD};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{
    Endianness,
    elf::{FileHeader32, FileHeader64},
};

use crate::kvm::GuestMem;
use crate::symbols::AlignedElf;

/// Why a guest program could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// Not a static ELF64 x86-64 executable (what the parser said).
    NotElf64X86(String),
    /// A segment's file range lies outside the file.
    SegmentOutsideFile {
        /// The segment's physical address.
        paddr: u64,
    },
    /// A segment does not fit the guest's memory.
    SegmentOutsideMemory {
        /// The segment's physical address.
        paddr: u64,
        /// Its size in memory.
        memsz: u64,
        /// The guest memory's size.
        limit: u64,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotElf64X86(why) => {
                write!(
                    f,
                    "not a static ELF64 x86-64 (or, for vpmu boot, ELF32 i386) executable ({why})"
                )
            }
            LoadError::SegmentOutsideFile { paddr } => {
                write!(
                    f,
                    "the segment at {paddr:#x} extends past the end of the file"
                )
            }
            LoadError::SegmentOutsideMemory {
                paddr,
                memsz,
                limit,
            } => write!(
                f,
                "the segment at {paddr:#x} ({memsz:#x} bytes) does not fit the guest's {limit:#x} \
                 bytes of memory"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// Loads the `PT_LOAD` segments of the ELF64 x86-64 executable `elf` at their physical
/// addresses (zero-filling `.bss`) and returns the entry point.
pub fn load_elf(elf: &[u8], mem: &GuestMem) -> Result<u64, LoadError> {
    let not_elf = |e: object::Error| LoadError::NotElf64X86(e.to_string());
    let aligned = AlignedElf::new(elf).map_err(|e| LoadError::NotElf64X86(e.to_string()))?;
    let elf = aligned.bytes();
    let header = FileHeader64::<Endianness>::parse(elf).map_err(not_elf)?;
    load_segments(header, EM_X86_64, elf, mem)
}

/// `load_elf` for an ELF64 x86-64 or an ELF32 i386 executable (what a multiboot loader
/// accepts): the entry point.
pub fn load_elf_any_class(elf: &[u8], mem: &GuestMem) -> Result<u64, LoadError> {
    let not_elf = |e: object::Error| LoadError::NotElf64X86(e.to_string());
    let aligned = AlignedElf::new(elf).map_err(|e| LoadError::NotElf64X86(e.to_string()))?;
    let bytes = aligned.bytes();
    if bytes.get(4) == Some(&ELFCLASS32) {
        let header = FileHeader32::<Endianness>::parse(bytes).map_err(not_elf)?;
        return load_segments(header, EM_386, bytes, mem);
    }
    load_elf(elf, mem)
}

/// The multiboot (version 1) header magic, in the first 8 KiB of the image, 4-byte aligned.
pub const MULTIBOOT_HEADER_MAGIC: u32 = 0x1BAD_B002;

/// Whether `image` carries a multiboot header: the magic at a 4-byte aligned offset in its first
/// 8 KiB, followed by flags and a checksum that sum with it to 0. Returns its flags.
pub fn multiboot_header(image: &[u8]) -> Option<u32> {
    let words: Vec<u32> = image[..image.len().min(8192)]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    words.windows(3).find_map(|w| {
        (w[0] == MULTIBOOT_HEADER_MAGIC && w[0].wrapping_add(w[1]).wrapping_add(w[2]) == 0)
            .then_some(w[1])
    })
}

fn load_segments<H: FileHeader<Endian = Endianness>>(
    header: &H,
    machine: u16,
    elf: &[u8],
    mem: &GuestMem,
) -> Result<u64, LoadError> {
    let not_elf = |e: object::Error| LoadError::NotElf64X86(e.to_string());
    let endian = header.endian().map_err(not_elf)?;
    let class = if machine == EM_X86_64 {
        ELFCLASS64
    } else {
        ELFCLASS32
    };
    if header.e_ident().class != class || header.e_machine(endian) != machine {
        return Err(LoadError::NotElf64X86(format!(
            "class {}, machine {}",
            header.e_ident().class,
            header.e_machine(endian)
        )));
    }
    for segment in header.program_headers(endian, elf).map_err(not_elf)? {
        if segment.p_type(endian) != PT_LOAD {
            continue;
        }
        let paddr: u64 = segment.p_paddr(endian).into();
        let memsz: u64 = segment.p_memsz(endian).into();
        let data = segment
            .data(endian, elf)
            .map_err(|()| LoadError::SegmentOutsideFile { paddr })?;
        let outside = LoadError::SegmentOutsideMemory {
            paddr,
            memsz,
            limit: mem.len() as u64,
        };
        let len = usize::try_from(memsz.max(data.len() as u64)).map_err(|_| outside.clone())?;
        if !mem.contains(paddr, len) {
            return Err(outside);
        }
        // The file's bytes, then `.bss` zero-filled, copied in (the vCPUs do not run yet).
        let bss = paddr + data.len() as u64;
        mem.write(paddr, data)
            .and_then(|()| mem.write(bss, &vec![0; len - data.len()]))
            .map_err(|_| outside)?;
    }
    Ok(header.e_entry(endian).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu_guests::{BENCH, COMPAT, PMU};

    #[test]
    fn guest_images_load_at_one_mib() {
        let mem = GuestMem::new(4 << 20).expect("memory");
        for image in [PMU, BENCH] {
            assert_eq!(load_elf(image, &mem), Ok(0x10_0000));
        }
        if !COMPAT.is_empty() {
            assert_eq!(load_elf(COMPAT, &mem), Ok(0x10_0000));
            // The flat 32-bit consumer starts with `push %esi` (56).
            assert_eq!(mem.to_vec(0x20_0000, 1), Some(vec![0x56]));
        }
        // _start begins with `call main` (e8).
        assert_eq!(mem.to_vec(0x10_0000, 1), Some(vec![0xe8]));
    }

    #[test]
    fn multiboot_headers_are_found_by_magic_and_checksum() {
        let mut image = vec![0u8; 64];
        assert_eq!(multiboot_header(&image), None);
        let flags = 0x0001_0003u32;
        let sum = 0u32.wrapping_sub(MULTIBOOT_HEADER_MAGIC.wrapping_add(flags));
        for (i, w) in [MULTIBOOT_HEADER_MAGIC, flags, sum].iter().enumerate() {
            image[16 + 4 * i..20 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(multiboot_header(&image), Some(flags));
        image[24] ^= 1;
        assert_eq!(multiboot_header(&image), None, "bad checksum");
        // The project's own guests are not multiboot images.
        assert_eq!(multiboot_header(PMU), None);
    }

    #[test]
    fn garbage_is_refused() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        assert!(load_elf(b"not an elf", &mem).is_err());
        assert!(load_elf(&PMU[..64], &mem).is_err());
    }
}
