//! Loading guest programs: static ELF64 x86-64 executables, placed by their `PT_LOAD` program
//! headers at their physical addresses (read with the `object` crate).

use object::elf::{ELFCLASS64, EM_X86_64, PT_LOAD};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, elf::FileHeader64};

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
                write!(f, "not a static ELF64 x86-64 executable ({why})")
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
    let endian = header.endian().map_err(not_elf)?;
    if header.e_ident().class != ELFCLASS64 || header.e_machine(endian) != EM_X86_64 {
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
        let paddr = segment.p_paddr(endian);
        let memsz = segment.p_memsz(endian);
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
    Ok(header.e_entry(endian))
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
    fn garbage_is_refused() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        assert!(load_elf(b"not an elf", &mem).is_err());
        assert!(load_elf(&PMU[..64], &mem).is_err());
    }
}
