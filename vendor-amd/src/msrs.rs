//! The AMD core-PMU MSR numbers, the PERF_CTL bit layout, and the decoding of an MSR number
//! into the register it names.
//!
//! Decoding here is architectural only ("which register would this be"); whether the enumerated
//! PMU has it is [`crate::AmdCaps::lookup`]'s business.

use vpmu::{Msr, RawEvent};

/// Legacy K7 PERF_CTL0 (`0xC001_0000`); PERF_CTL0–3 are consecutive.
pub const K7_PERF_CTL0: u32 = 0xC001_0000;
/// Legacy K7 PERF_CTR0 (`0xC001_0004`); PERF_CTR0–3 are consecutive.
pub const K7_PERF_CTR0: u32 = 0xC001_0004;
/// PerfCtrExtCore PERF_CTL0 (`0xC001_0200`): PERF_CTLn = base + 2n, PERF_CTRn = base + 2n + 1.
pub const EXT_PERF_CTL0: u32 = 0xC001_0200;
/// PerfMonV2 PerfCntrGlobalStatus (read-only).
pub const GLOBAL_STATUS: u32 = 0xC000_0300;
/// PerfMonV2 PerfCntrGlobalCtl.
pub const GLOBAL_CTL: u32 = 0xC000_0301;
/// PerfMonV2 PerfCntrGlobalStatusClr (write 1s to clear status bits).
pub const GLOBAL_STATUS_CLR: u32 = 0xC000_0302;
/// PerfMonV2 PerfCntrGlobalStatusSet (write 1s to set status bits).
pub const GLOBAL_STATUS_SET: u32 = 0xC000_0303;

/// Counters the legacy K7 MSRs reach.
pub const K7_COUNTERS: u32 = 4;
/// Counters the PerfCtrExtCore MSR block reaches (`0xC001_0200`–`0xC001_020B`). PerfMonV2 may
/// enumerate up to 15, but this backend exposes at most this many: the interleaved block has no
/// room for more, and KVM clips to the same number.
pub const MAX_COUNTERS: u32 = 6;

/// Every MSR of the AMD core-PMU architecture, present or not, as inclusive ranges.
pub const MSR_RANGES: &[(u32, u32)] = &[
    (GLOBAL_STATUS, GLOBAL_STATUS_SET),
    (K7_PERF_CTL0, K7_PERF_CTR0 + K7_COUNTERS - 1),
    (EXT_PERF_CTL0, EXT_PERF_CTL0 + 2 * MAX_COUNTERS - 1),
];

/// Counter width in bits on every AMD core PMU.
pub const COUNTER_WIDTH: u32 = 48;
/// The bits a counter holds.
pub const COUNTER_MASK: u64 = (1 << COUNTER_WIDTH) - 1;
/// The counter's top bit. Linux presets counters negative, so this bit stays set until the
/// counter wraps; pre-PerfMonV2 overflow detection relies on it.
pub const COUNTER_TOP_BIT: u64 = 1 << (COUNTER_WIDTH - 1);

/// PERF_CTL bit layout.
pub mod ctl {
    /// EventSelect bits 7:0.
    pub const EVENT_LO: u64 = 0xff;
    /// UnitMask.
    pub const UMASK: u64 = 0xff << 8;
    /// Count at CPL > 0.
    pub const USR: u64 = 1 << 16;
    /// Count at CPL 0.
    pub const OS: u64 = 1 << 17;
    /// Edge detect.
    pub const EDGE: u64 = 1 << 18;
    /// APIC interrupt on overflow.
    pub const INT: u64 = 1 << 20;
    /// Counter enable.
    pub const EN: u64 = 1 << 22;
    /// Invert the counter-mask comparison.
    pub const INV: u64 = 1 << 23;
    /// Counter mask.
    pub const CMASK: u64 = 0xff << 24;
    /// EventSelect bits 11:8.
    pub const EVENT_HI: u64 = 0xf << 32;
    /// Count only in guest context (SVM).
    pub const GUEST_ONLY: u64 = 1 << 40;
    /// Count only in host context (SVM).
    pub const HOST_ONLY: u64 = 1 << 41;
    /// Reserved: bits 63:42, 39:36, 21 and 19 (19 is the legacy pin-control bit). The same set
    /// as Xen's `CTRL_RSVD_MASK`; KVM's mask additionally reserves 41:40 and 35:32 because it
    /// implements neither Host/Guest-only nor, before Zen, the high event-select bits.
    pub const RESERVED: u64 = 0xffff_fc00_0000_0000 | (0xf << 36) | (1 << 21) | (1 << 19);

    /// The event a control selects, as the event filter sees it: 12-bit event select and unit
    /// mask.
    pub const fn event(control: u64) -> super::RawEvent {
        super::RawEvent {
            select: ((control & EVENT_LO) | ((control & EVENT_HI) >> 24)) as u16,
            umask: ((control & UMASK) >> 8) as u8,
        }
    }
}

/// A register of the AMD core PMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Register {
    /// PERF_CTLn (through either alias).
    Control(u32),
    /// PERF_CTRn (through either alias).
    Counter(u32),
    /// PerfCntrGlobalStatus.
    GlobalStatus,
    /// PerfCntrGlobalCtl.
    GlobalCtl,
    /// PerfCntrGlobalStatusClr.
    GlobalStatusClr,
    /// PerfCntrGlobalStatusSet.
    GlobalStatusSet,
}

/// Which block of MSRs an access came through; presence depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    /// The legacy K7 MSRs (present on every AMD64 PMU, for counters 0–3).
    Legacy,
    /// The interleaved PerfCtrExtCore MSRs.
    Extended,
    /// The PerfMonV2 global MSRs.
    Global,
}

/// The register an MSR number names architecturally, and the block it belongs to; `None` for an
/// MSR outside the AMD core PMU.
#[inline]
pub fn decode(msr: Msr) -> Option<(Register, Block)> {
    let n = msr.0;
    match n {
        K7_PERF_CTL0..=0xC001_0003 => Some((Register::Control(n - K7_PERF_CTL0), Block::Legacy)),
        K7_PERF_CTR0..=0xC001_0007 => Some((Register::Counter(n - K7_PERF_CTR0), Block::Legacy)),
        EXT_PERF_CTL0..=0xC001_020B => {
            let offset = n - EXT_PERF_CTL0;
            let index = offset / 2;
            let register = if offset % 2 == 0 {
                Register::Control(index)
            } else {
                Register::Counter(index)
            };
            Some((register, Block::Extended))
        }
        GLOBAL_STATUS => Some((Register::GlobalStatus, Block::Global)),
        GLOBAL_CTL => Some((Register::GlobalCtl, Block::Global)),
        GLOBAL_STATUS_CLR => Some((Register::GlobalStatusClr, Block::Global)),
        GLOBAL_STATUS_SET => Some((Register::GlobalStatusSet, Block::Global)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k7_and_extended_blocks_name_the_same_registers() {
        for i in 0..K7_COUNTERS {
            assert_eq!(
                decode(Msr(K7_PERF_CTL0 + i)),
                Some((Register::Control(i), Block::Legacy))
            );
            assert_eq!(
                decode(Msr(K7_PERF_CTR0 + i)),
                Some((Register::Counter(i), Block::Legacy))
            );
        }
        for i in 0..MAX_COUNTERS {
            assert_eq!(
                decode(Msr(EXT_PERF_CTL0 + 2 * i)),
                Some((Register::Control(i), Block::Extended))
            );
            assert_eq!(
                decode(Msr(EXT_PERF_CTL0 + 2 * i + 1)),
                Some((Register::Counter(i), Block::Extended))
            );
        }
    }

    #[test]
    fn every_decoded_msr_is_inside_the_ranges_and_nothing_else_decodes() {
        let inside = |n: u32| MSR_RANGES.iter().any(|&(a, b)| (a..=b).contains(&n));
        for n in (0xC000_0000..0xC000_0400).chain(0xC001_0000..0xC001_0300) {
            assert_eq!(decode(Msr(n)).is_some(), inside(n), "msr {n:#x}");
        }
        assert_eq!(decode(Msr(0xC1)), None);
        assert_eq!(decode(Msr(0xC001_0008)), None);
        assert_eq!(decode(Msr(0xC001_020C)), None);
        assert_eq!(decode(Msr(0xC000_0304)), None);
    }

    #[test]
    fn reserved_mask_matches_the_documented_bits() {
        for bit in 0..64u32 {
            let expected = bit >= 42 || (36..=39).contains(&bit) || bit == 21 || bit == 19;
            assert_eq!(ctl::RESERVED & (1 << bit) != 0, expected, "bit {bit}");
        }
        // Guest/Host-only and the high event select are not reserved.
        assert_eq!(
            ctl::RESERVED & (ctl::GUEST_ONLY | ctl::HOST_ONLY | ctl::EVENT_HI),
            0
        );
    }

    #[test]
    fn event_select_is_twelve_bits() {
        let e = ctl::event(0x0000_0001_0043_81c2);
        assert_eq!(
            e,
            RawEvent {
                select: 0x1c2,
                umask: 0x81
            }
        );
        assert_eq!(ctl::event(0x0043_00c0).select, 0xc0);
    }
}
