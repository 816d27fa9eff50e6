//! Reading a guest's memory through its own page tables, as the hypervisor does for a sample's
//! call chain: linear address → guest-physical, by the paging mode of the vCPU's control
//! registers at the exit, over the domain's `GuestMem`. Read-only: no accessed or dirty bit
//! is set, nothing outside RAM is touched, and any entry that is not present, a reserved
//! configuration or outside RAM ends the read with `None`.
//!
//! Modes: paging off (linear = physical, 32 bits), 4-level and 5-level long-mode paging with
//! 4 KiB, 2 MiB and 1 GiB pages. Legacy 32-bit and PAE paging are not translated (kvm_pvm
//! runs no guest in them): those reads fail, and the sample gets no call chain past that.

use crate::kvm::GuestMem;

/// The paging state of a vCPU at an exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paging {
    /// CR0.
    pub cr0: u64,
    /// CR3.
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// IA32_EFER.
    pub efer: u64,
}

const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;
const PRESENT: u64 = 1 << 0;
const PAGE_SIZE_BIT: u64 = 1 << 7;
/// Physical-address bits 51:12 of a paging-structure entry.
const ADDRESS: u64 = 0x000f_ffff_ffff_f000;

impl Paging {
    /// The guest-physical address of linear address `linear`, or `None`.
    pub fn translate(&self, mem: &GuestMem, linear: u64) -> Option<u64> {
        if self.cr0 & CR0_PG == 0 {
            return (linear <= u64::from(u32::MAX)).then_some(linear);
        }
        if self.efer & EFER_LMA == 0 || self.cr4 & CR4_PAE == 0 {
            return None;
        }
        let levels = if self.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
        let mut table = self.cr3 & ADDRESS;
        for level in (1..=levels).rev() {
            let shift = 12 + 9 * (level - 1);
            let index = (linear >> shift) & 0x1ff;
            let entry = mem.read_u64(table + 8 * index)?;
            if entry & PRESENT == 0 {
                return None;
            }
            // A large page at the PDPT (1 GiB) or page-directory (2 MiB) level.
            if (level == 2 || level == 3) && entry & PAGE_SIZE_BIT != 0 {
                let page_mask = (1u64 << shift) - 1;
                return Some((entry & ADDRESS & !page_mask) | (linear & page_mask));
            }
            table = entry & ADDRESS;
        }
        Some(table | (linear & 0xfff))
    }

    /// Fills `out` from linear address `linear`, page by page; false if any byte is not
    /// mapped to RAM.
    pub fn read(&self, mem: &GuestMem, linear: u64, out: &mut [u8]) -> bool {
        let mut done = 0;
        while done < out.len() {
            let Some(at) = linear.checked_add(done as u64) else {
                return false;
            };
            let in_page = (0x1000 - (at & 0xfff)) as usize;
            let take = in_page.min(out.len() - done);
            let Some(physical) = self.translate(mem, at) else {
                return false;
            };
            if mem.read(physical, &mut out[done..done + take]).is_err() {
                return false;
            }
            done += take;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Paging = Paging {
        cr0: CR0_PG | 1,
        cr3: 0x1000,
        cr4: CR4_PAE,
        efer: EFER_LMA | (1 << 8),
    };

    /// PML4 at 0x1000 → PDPT at 0x2000 → PD at 0x3000 → PT at 0x4000; 0x40_0000 is mapped by
    /// a 4 KiB page to 0x9000, 0x20_0000 by a 2 MiB page at 0x60_0000.
    fn memory() -> GuestMem {
        let mem = GuestMem::new(0x100_0000).expect("16 MiB");
        mem.write_u64(0x1000, 0x2000 | PRESENT).unwrap();
        mem.write_u64(0x2000, 0x3000 | PRESENT).unwrap();
        mem.write_u64(0x3000 + 8 * 2, 0x4000 | PRESENT).unwrap(); // 0x40_0000: PD index 2
        mem.write_u64(0x4000, 0x9000 | PRESENT).unwrap();
        mem.write_u64(0x3000 + 8, 0x60_0000 | PRESENT | PAGE_SIZE_BIT)
            .unwrap(); // 0x20_0000
        mem
    }

    #[test]
    fn four_kib_and_two_mib_pages_translate() {
        let mem = memory();
        assert_eq!(LONG.translate(&mem, 0x40_0123), Some(0x9123));
        assert_eq!(LONG.translate(&mem, 0x20_1234), Some(0x60_1234));
        assert_eq!(
            LONG.translate(&mem, 0x40_1000),
            None,
            "PT entry 1 not present"
        );
        assert_eq!(
            LONG.translate(&mem, 0x8000_0000),
            None,
            "PDPT entry 2 not present"
        );
    }

    #[test]
    fn reads_cross_pages_and_fail_on_holes() {
        let mem = memory();
        mem.write(0x9ff8, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let mut out = [0u8; 8];
        assert!(LONG.read(&mem, 0x40_0ff8, &mut out));
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut across = [0u8; 16];
        assert!(
            !LONG.read(&mem, 0x40_0ff8, &mut across),
            "next page unmapped"
        );
    }

    #[test]
    fn paging_off_is_physical_and_other_modes_are_not_translated() {
        let mem = memory();
        let off = Paging::default();
        assert_eq!(off.translate(&mem, 0x1234), Some(0x1234));
        let pae32 = Paging { efer: 0, ..LONG };
        assert_eq!(pae32.translate(&mem, 0x40_0000), None);
    }
}
