//! The guest programs, built from `guest/` by `build.rs` into static ELF executables (linked at
//! 1 MiB by `guest/link.ld`), and a loader for them.

use crate::kvm::GuestMem;

/// The PMU conformance cases (`guest/pmu.c`): entry argument = case index.
pub static PMU: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pmu.elf"));

/// The compat32 case (`guest/compat64.c` + the `-m32` consumer `guest/compat32.c` at
/// 0x200000); empty if the 32-bit consumer could not be built (see `build.rs`).
pub static COMPAT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/compat.elf"));

/// The profiling domain of `vpmu profile` (`guest/profiler.c`).
pub static PROFILER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/profiler.elf"));

/// The built-in workload domains of `vpmu profile` (`guest/work.c`, `guest/work_loops.S`).
pub static WORK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/work.elf"));

/// The guest side of `vpmu coverage` (`guest/coverage.c`).
pub static COVERAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/coverage.elf"));

/// The MSR-exit cost benchmark (`guest/bench.c`).
pub static BENCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bench.elf"));

/// Guest I/O ports (CPL0 only on this host's KVM; see the runtime in `guest/rt.h`).
pub mod port {
    /// Console: one byte per `outb`.
    pub const CONSOLE: u16 = 0xE9;
    /// Exit status: `outl` ends the run with that status.
    pub const EXIT: u16 = 0x10;
    /// Control-operation hypercall: `inl` with EDI = op, RSI = parameter block GPA; EAX = result.
    pub const HYPERCALL: u16 = 0x11;
    /// VMM control (benchmark): `outl` 1 = answer PMU MSRs with the null handler, 0 = the vpmu.
    pub const CONTROL: u16 = 0x12;
    /// Migration (SMP cases): `inl` waits for every vCPU, moves each to the next pCPU, and
    /// returns the new pCPU index.
    pub const MIGRATE: u16 = 0x13;
    /// Slices: `inl` returns how many times this vCPU has been scheduled in (on a shared pCPU,
    /// one per time slice; 1 on its own thread).
    pub const SLICES: u16 = 0x14;
    /// PMI context: `inl` returns the interrupted context the VMM recorded for the last PMI
    /// it delivered to this vCPU (`Platform::interrupted`, from sync regs): RIP bits 0..29 |
    /// CPL << 30; `u32::MAX` before any.
    pub const PMI_CONTEXT: u16 = 0x15;
    /// Sample batch (`vpmu profile`): `outl` with the guest-physical address of a
    /// `struct sample_batch` (`guest/profile.h`); the VMM copies it out.
    pub const BATCH: u16 = 0x16;
    /// Yield: `outl` gives the pCPU up until the vCPU's next turn (on a shared pCPU the slice
    /// ends; on its own thread nothing happens). A hypervisor's "block until an event".
    pub const YIELD: u16 = 0x17;
}

const PT_LOAD: u32 = 1;

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

/// Loads the `PT_LOAD` segments of the ELF64 x86-64 executable `elf` at their physical
/// addresses (zero-filling `.bss`) and returns the entry point.
pub fn load_elf(elf: &[u8], mem: &GuestMem) -> Result<u64, String> {
    let bad = || "not a static ELF64 x86-64 executable".to_string();
    if elf.get(..4) != Some(b"\x7fELF".as_slice())
        || elf.get(4) != Some(&2)
        || elf.get(5) != Some(&1)
    {
        return Err(bad());
    }
    if u16_at(elf, 18) != Some(62) {
        return Err(bad());
    }
    let entry = u64_at(elf, 24).ok_or_else(bad)?;
    let phoff = u64_at(elf, 32).ok_or_else(bad)? as usize;
    let phentsize = usize::from(u16_at(elf, 54).ok_or_else(bad)?);
    let phnum = usize::from(u16_at(elf, 56).ok_or_else(bad)?);
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(elf, ph).ok_or_else(bad)? != PT_LOAD {
            continue;
        }
        let offset = u64_at(elf, ph + 8).ok_or_else(bad)? as usize;
        let paddr = u64_at(elf, ph + 24).ok_or_else(bad)?;
        let filesz = u64_at(elf, ph + 32).ok_or_else(bad)? as usize;
        let memsz = u64_at(elf, ph + 40).ok_or_else(bad)? as usize;
        let data = elf
            .get(offset..offset.checked_add(filesz).ok_or_else(bad)?)
            .ok_or_else(bad)?;
        let dst = mem
            .slice_mut(paddr, memsz.max(filesz))
            .ok_or_else(|| format!("segment at {paddr:#x} does not fit guest memory"))?;
        dst[..filesz].copy_from_slice(data);
        dst[filesz..].fill(0);
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_images_load_at_one_mib() {
        let mem = GuestMem::new(4 << 20).expect("memory");
        for image in [PMU, BENCH] {
            assert_eq!(load_elf(image, &mem), Ok(0x10_0000));
        }
        if !COMPAT.is_empty() {
            assert_eq!(load_elf(COMPAT, &mem), Ok(0x10_0000));
            // The flat 32-bit consumer starts with `push %esi` (56).
            assert_eq!(mem.slice_mut(0x20_0000, 1).expect("in RAM")[0], 0x56);
        }
        // _start begins with `call main` (e8).
        assert_eq!(mem.slice_mut(0x10_0000, 1).expect("in RAM")[0], 0xe8);
    }

    #[test]
    fn garbage_is_refused() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        assert!(load_elf(b"not an elf", &mem).is_err());
        assert!(load_elf(&PMU[..64], &mem).is_err());
    }
}
