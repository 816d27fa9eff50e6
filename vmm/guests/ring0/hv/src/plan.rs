//! The guest-style "driver" of an inner vCPU: which MSRs program counter i, from CPUID.

use vpmu::Vendor;

pub(crate) const EN: u64 = 1 << 22;
pub(crate) const INT: u64 = 1 << 20;
pub(crate) const OS: u64 = 1 << 17;
/// Retired instructions on both vendors (Intel 0xC0/0, AMD 0xC0).
pub(crate) const INSTRUCTIONS: u64 = 0xc0;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) intel: bool,
    /// AMD PerfCtrExtCore (the Fam15h MSRs) rather than the K7 ones.
    pub(crate) ext: bool,
    pub(crate) global: Option<u32>,
    /// Where a guest clears an overflow status bit.
    pub(crate) status_clear: Option<u32>,
    pub(crate) counters: u32,
    /// A reserved bit of an event select (#GP).
    pub(crate) reserved: u64,
    /// A bit the vendor's rules refuse (Intel AnyThread, AMD bit 21).
    pub(crate) refused: u64,
}

impl Plan {
    pub(crate) fn ctl(&self, i: u32) -> u32 {
        if self.intel {
            0x186 + i
        } else if self.ext {
            0xc001_0200 + 2 * i
        } else {
            0xc001_0000 + i
        }
    }

    pub(crate) fn ctr(&self, i: u32) -> u32 {
        if self.intel {
            0xc1 + i
        } else if self.ext {
            0xc001_0201 + 2 * i
        } else {
            0xc001_0004 + i
        }
    }

    /// A counter value `k` events before overflow (legacy Intel writes: 32 bits,
    /// sign-extended; AMD: 48 bits).
    pub(crate) fn preset(&self, k: u64) -> u64 {
        let mask = if self.intel {
            0xffff_ffff
        } else {
            (1 << 48) - 1
        };
        k.wrapping_neg() & mask
    }
}

/// The plan of a guest driver for the PMU `caps` describes (and CPUID says).
pub(crate) fn plan_of(caps: &vpmu::PmuCapabilities) -> Plan {
    let intel = caps.vendor == Vendor::Intel;
    // CPUID 0x8000_0001 ECX bit 23: PerfCtrExtCore (raw-cpuid has no accessor for it).
    let ext = !intel && core::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 23) != 0;
    Plan {
        intel,
        ext,
        global: caps
            .global_ctrl
            .then_some(if intel { 0x38f } else { 0xc000_0301 }),
        status_clear: caps
            .global_ctrl
            .then_some(if intel { 0x390 } else { 0xc000_0302 }),
        counters: u32::from(caps.gp_counters),
        reserved: if intel { 1 << 63 } else { 1 << 42 },
        refused: 1 << 21,
    }
}
