//! The architectural PMU MSR map: numbers, classification of an MSR number into a register of
//! the map, and which registers the enumerated PMU has.

use vpmu::Msr;

use crate::caps::IntelCaps;

/// IA32_PMC0: legacy general-purpose counter alias (writes sign-extend from bit 31).
pub const IA32_PMC0: u32 = 0xc1;
/// IA32_PERFEVTSEL0.
pub const IA32_PERFEVTSEL0: u32 = 0x186;
/// IA32_FIXED_CTR0 (instructions retired).
pub const IA32_FIXED_CTR0: u32 = 0x309;
/// IA32_PERF_CAPABILITIES.
pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
/// IA32_FIXED_CTR_CTRL.
pub const IA32_FIXED_CTR_CTRL: u32 = 0x38d;
/// IA32_PERF_GLOBAL_STATUS.
pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38e;
/// IA32_PERF_GLOBAL_CTRL.
pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38f;
/// IA32_PERF_GLOBAL_OVF_CTRL (IA32_PERF_GLOBAL_STATUS_RESET from v4).
pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
/// IA32_PERF_GLOBAL_STATUS_SET (v4+).
pub const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
/// IA32_PERF_GLOBAL_INUSE (v4+): not modelled, always #GP.
pub const IA32_PERF_GLOBAL_INUSE: u32 = 0x392;
/// IA32_PERF_METRICS (topdown metrics, PERF_CAPABILITIES bit 15): not modelled, always #GP.
pub const IA32_PERF_METRICS: u32 = 0x329;
/// IA32_PEBS_ENABLE.
pub const IA32_PEBS_ENABLE: u32 = 0x3f1;
/// IA32_A_PMC0: full-width general-purpose counter alias (with PERF_CAPABILITIES.FW_WRITE).
pub const IA32_A_PMC0: u32 = 0x4c1;
/// IA32_DS_AREA.
pub const IA32_DS_AREA: u32 = 0x600;

/// RDPMC: ECX bits 31:16 select the type of counter, bits 15:0 its index within the type.
pub const RDPMC_TYPE_SHIFT: u32 = 16;
/// RDPMC type 0: the general-purpose counters.
pub const RDPMC_TYPE_GP: u32 = 0;
/// RDPMC type with ECX bit 30: the fixed-function counters. Every other type (bit 31, the
/// "fast read" of processors before the architectural PMU, bit 29 for PERF_METRICS) names
/// nothing here and raises #GP, as in Linux KVM's `intel_rdpmc_ecx_to_pmc`.
pub const RDPMC_TYPE_FIXED: u32 = 1 << 14;

/// The counter MSR a guest RDPMC with ECX = `selector` reads: the IA32_PMCx alias (its reads
/// return the full width) or IA32_FIXED_CTRx; `None` for any other type or an index beyond
/// the architectural banks. Whether the counter is present is the read's to check.
pub fn rdpmc_counter(selector: u32) -> Option<Msr> {
    let index = selector & 0xffff;
    match selector >> RDPMC_TYPE_SHIFT {
        RDPMC_TYPE_GP if index < 8 => Some(legacy_counter(index)),
        RDPMC_TYPE_FIXED if index < 4 => Some(fixed_counter(index)),
        _ => None,
    }
}

/// PERFEVTSELx.USR: count at CPL > 0.
pub const EVTSEL_USR: u64 = 1 << 16;
/// PERFEVTSELx.OS: count at CPL 0.
pub const EVTSEL_OS: u64 = 1 << 17;
/// PERFEVTSELx.E: edge detect.
pub const EVTSEL_EDGE: u64 = 1 << 18;
/// PERFEVTSELx.PC: pin control (toggles a pin on overflow; undefined on recent parts).
pub const EVTSEL_PIN_CONTROL: u64 = 1 << 19;
/// PERFEVTSELx.INT: raise a PMI on overflow.
pub const EVTSEL_INT: u64 = 1 << 20;
/// PERFEVTSELx.ANY: count events of every thread of the core.
pub const EVTSEL_ANY_THREAD: u64 = 1 << 21;
/// PERFEVTSELx.EN: counter enabled.
pub const EVTSEL_EN: u64 = 1 << 22;
/// PERFEVTSELx.INV: invert the counter-mask comparison.
pub const EVTSEL_INV: u64 = 1 << 23;
/// PERFEVTSELx.CMASK: counter mask (bits 31:24).
pub const EVTSEL_CMASK: u64 = 0xff << 24;

/// FIXED_CTR_CTRL nibble bit: count at CPL 0.
pub const FIXED_OS: u64 = 1 << 0;
/// FIXED_CTR_CTRL nibble bit: count at CPL > 0.
pub const FIXED_USR: u64 = 1 << 1;
/// FIXED_CTR_CTRL nibble bit: AnyThread.
pub const FIXED_ANY_THREAD: u64 = 1 << 2;
/// FIXED_CTR_CTRL nibble bit: raise a PMI on overflow.
pub const FIXED_PMI: u64 = 1 << 3;
/// Bits of FIXED_CTR_CTRL per fixed counter.
pub const FIXED_NIBBLE_BITS: u32 = 4;

/// The FIXED_CTR_CTRL nibble of fixed counter `index`.
pub const fn fixed_nibble(fixed_ctrl: u64, index: u32) -> u64 {
    (fixed_ctrl >> ((index & 15) * FIXED_NIBBLE_BITS)) & 0xf
}

/// `nibble` placed at fixed counter `index`'s position in FIXED_CTR_CTRL.
pub const fn at_fixed_nibble(nibble: u64, index: u32) -> u64 {
    (nibble & 0xf) << ((index & 15) * FIXED_NIBBLE_BITS)
}

/// GLOBAL_STATUS.OvfBuffer: the DS buffer (PEBS/BTS) crossed its interrupt threshold.
pub const STATUS_OVF_BUFFER: u64 = 1 << 62;
/// GLOBAL_STATUS.CondChgd: the PMU configuration changed.
pub const STATUS_COND_CHANGED: u64 = 1 << 63;

/// Every MSR of the architectural PMU, present or not. DEBUGCTL (0x1D9) is deliberately absent:
/// it has one validating owner outside the vPMU (XSA-269).
pub const MSR_RANGES: &[(u32, u32)] = &[
    (IA32_PMC0, IA32_PMC0 + 7),
    (IA32_PERFEVTSEL0, IA32_PERFEVTSEL0 + 7),
    (IA32_FIXED_CTR0, IA32_FIXED_CTR0 + 3),
    (IA32_PERF_CAPABILITIES, IA32_PERF_CAPABILITIES),
    (IA32_PERF_METRICS, IA32_PERF_METRICS),
    (IA32_FIXED_CTR_CTRL, IA32_PERF_GLOBAL_INUSE),
    (IA32_PEBS_ENABLE, IA32_PEBS_ENABLE),
    (IA32_A_PMC0, IA32_A_PMC0 + 7),
    (IA32_DS_AREA, IA32_DS_AREA),
];

/// Which alias of a general-purpose counter an access used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterAlias {
    /// IA32_PMCx: writes take bits 31:0 and sign-extend them.
    Legacy,
    /// IA32_A_PMCx: writes take the full width; bits above it fault.
    FullWidth,
}

/// A register of the architectural PMU map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntelMsr {
    /// General-purpose counter `index` through `alias`.
    Counter {
        /// Counter index (0..8).
        index: u32,
        /// The alias used.
        alias: CounterAlias,
    },
    /// IA32_PERFEVTSELx.
    EventSelect(u32),
    /// IA32_FIXED_CTRx.
    FixedCounter(u32),
    /// IA32_PERF_CAPABILITIES.
    PerfCapabilities,
    /// IA32_FIXED_CTR_CTRL.
    FixedCtrCtrl,
    /// IA32_PERF_GLOBAL_STATUS.
    GlobalStatus,
    /// IA32_PERF_GLOBAL_CTRL.
    GlobalCtrl,
    /// IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET.
    GlobalOvfCtrl,
    /// IA32_PERF_GLOBAL_STATUS_SET.
    GlobalStatusSet,
    /// IA32_PEBS_ENABLE.
    PebsEnable,
    /// IA32_DS_AREA.
    DsArea,
    /// An architectural PMU register this backend does not model (IA32_PERF_METRICS,
    /// IA32_PERF_GLOBAL_INUSE): owned so that it faults rather than being answered by someone
    /// else, never present.
    Unmodelled(u32),
}

// The last MSR of each bank `classify` decodes: 8 general-purpose counters (indices 0..8 in
// every alias), 4 fixed counters.
const IA32_PMC_LAST: u32 = IA32_PMC0 + 7;
const IA32_A_PMC_LAST: u32 = IA32_A_PMC0 + 7;
const IA32_PERFEVTSEL_LAST: u32 = IA32_PERFEVTSEL0 + 7;
const IA32_FIXED_CTR_LAST: u32 = IA32_FIXED_CTR0 + 3;

/// IA32_FIXED_CTR_CTRL..=IA32_PERF_GLOBAL_INUSE, the registers [`IntelMsr::classify`] finds
/// by one table lookup.
const CONTROL_BLOCK: [IntelMsr; (IA32_PERF_GLOBAL_INUSE - IA32_FIXED_CTR_CTRL + 1) as usize] = [
    IntelMsr::FixedCtrCtrl,
    IntelMsr::GlobalStatus,
    IntelMsr::GlobalCtrl,
    IntelMsr::GlobalOvfCtrl,
    IntelMsr::GlobalStatusSet,
    IntelMsr::Unmodelled(IA32_PERF_GLOBAL_INUSE),
];

impl IntelMsr {
    /// The register `msr` names in the architectural map, or `None` if it is not a PMU MSR.
    #[inline]
    pub fn classify(msr: Msr) -> Option<IntelMsr> {
        let n = msr.0;
        // The registers a guest writes most, each bank one compare, in this order: counter
        // values through either alias, event selects, then the control block
        // (FIXED_CTR_CTRL..=GLOBAL_INUSE) as one table.
        let offset = |base: u32| n.wrapping_sub(base);
        if offset(IA32_PMC0) <= IA32_PMC_LAST - IA32_PMC0 {
            return Some(IntelMsr::Counter {
                index: offset(IA32_PMC0),
                alias: CounterAlias::Legacy,
            });
        }
        if offset(IA32_A_PMC0) <= IA32_A_PMC_LAST - IA32_A_PMC0 {
            return Some(IntelMsr::Counter {
                index: offset(IA32_A_PMC0),
                alias: CounterAlias::FullWidth,
            });
        }
        if offset(IA32_PERFEVTSEL0) <= IA32_PERFEVTSEL_LAST - IA32_PERFEVTSEL0 {
            return Some(IntelMsr::EventSelect(offset(IA32_PERFEVTSEL0)));
        }
        if let Some(&register) = CONTROL_BLOCK.get(offset(IA32_FIXED_CTR_CTRL) as usize) {
            return Some(register);
        }
        // The rest: one range match, compiled to a decision tree over the MSR number.
        Some(match n {
            IA32_PMC0..=IA32_PMC_LAST => IntelMsr::Counter {
                index: n - IA32_PMC0,
                alias: CounterAlias::Legacy,
            },
            IA32_A_PMC0..=IA32_A_PMC_LAST => IntelMsr::Counter {
                index: n - IA32_A_PMC0,
                alias: CounterAlias::FullWidth,
            },
            IA32_PERFEVTSEL0..=IA32_PERFEVTSEL_LAST => IntelMsr::EventSelect(n - IA32_PERFEVTSEL0),
            IA32_FIXED_CTR0..=IA32_FIXED_CTR_LAST => IntelMsr::FixedCounter(n - IA32_FIXED_CTR0),
            IA32_PERF_CAPABILITIES => IntelMsr::PerfCapabilities,
            IA32_FIXED_CTR_CTRL => IntelMsr::FixedCtrCtrl,
            IA32_PERF_GLOBAL_STATUS => IntelMsr::GlobalStatus,
            IA32_PERF_GLOBAL_CTRL => IntelMsr::GlobalCtrl,
            IA32_PERF_GLOBAL_OVF_CTRL => IntelMsr::GlobalOvfCtrl,
            IA32_PERF_GLOBAL_STATUS_SET => IntelMsr::GlobalStatusSet,
            IA32_PEBS_ENABLE => IntelMsr::PebsEnable,
            IA32_DS_AREA => IntelMsr::DsArea,
            IA32_PERF_METRICS | IA32_PERF_GLOBAL_INUSE => IntelMsr::Unmodelled(n),
            _ => return None,
        })
    }

    /// The MSR number of this register. Indices are taken within their bank (8 general-purpose,
    /// 4 fixed), as [`IntelMsr::classify`] produces them.
    pub fn msr(self) -> Msr {
        match self {
            IntelMsr::Counter {
                index,
                alias: CounterAlias::Legacy,
            } => legacy_counter(index),
            IntelMsr::Counter {
                index,
                alias: CounterAlias::FullWidth,
            } => full_width_counter(index),
            IntelMsr::EventSelect(index) => event_select(index),
            IntelMsr::FixedCounter(index) => fixed_counter(index),
            IntelMsr::PerfCapabilities => Msr(IA32_PERF_CAPABILITIES),
            IntelMsr::FixedCtrCtrl => Msr(IA32_FIXED_CTR_CTRL),
            IntelMsr::GlobalStatus => Msr(IA32_PERF_GLOBAL_STATUS),
            IntelMsr::GlobalCtrl => Msr(IA32_PERF_GLOBAL_CTRL),
            IntelMsr::GlobalOvfCtrl => Msr(IA32_PERF_GLOBAL_OVF_CTRL),
            IntelMsr::GlobalStatusSet => Msr(IA32_PERF_GLOBAL_STATUS_SET),
            IntelMsr::PebsEnable => Msr(IA32_PEBS_ENABLE),
            IntelMsr::DsArea => Msr(IA32_DS_AREA),
            IntelMsr::Unmodelled(n) => Msr(n),
        }
    }

    /// Whether the guest-visible PMU described by `caps` has this register. Absent registers
    /// fault on any access. DS_AREA and PEBS_ENABLE are always present: they read as 0 and
    /// their writes are judged by the policy, so the guest sees one consistent rule.
    #[inline]
    pub fn is_present(self, caps: &IntelCaps) -> bool {
        match self {
            IntelMsr::Counter { index, alias } => {
                caps.has_gp(index) && (alias == CounterAlias::Legacy || caps.full_width_writes())
            }
            IntelMsr::EventSelect(index) => caps.has_gp(index),
            IntelMsr::FixedCounter(index) => caps.has_fixed(index),
            IntelMsr::PerfCapabilities => caps.has_perf_capabilities(),
            IntelMsr::GlobalStatusSet => caps.version() >= 4,
            IntelMsr::FixedCtrCtrl
            | IntelMsr::GlobalStatus
            | IntelMsr::GlobalCtrl
            | IntelMsr::GlobalOvfCtrl
            | IntelMsr::PebsEnable
            | IntelMsr::DsArea => true,
            IntelMsr::Unmodelled(_) => false,
        }
    }
}

/// The legacy alias of general-purpose counter `index`, which reads the full width on every CPU.
pub(crate) fn legacy_counter(index: u32) -> Msr {
    Msr(IA32_PMC0 + (index & 7))
}

/// The full-width alias of general-purpose counter `index`.
pub(crate) fn full_width_counter(index: u32) -> Msr {
    Msr(IA32_A_PMC0 + (index & 7))
}

/// IA32_PERFEVTSEL`index`.
pub(crate) fn event_select(index: u32) -> Msr {
    Msr(IA32_PERFEVTSEL0 + (index & 7))
}

/// IA32_FIXED_CTR`index`.
pub(crate) fn fixed_counter(index: u32) -> Msr {
    Msr(IA32_FIXED_CTR0 + (index & 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_and_msr_are_inverse_over_the_ranges() {
        for &(first, last) in MSR_RANGES {
            for n in first..=last {
                let reg = IntelMsr::classify(Msr(n)).expect("in range");
                assert_eq!(reg.msr(), Msr(n));
            }
        }
    }

    #[test]
    fn nothing_outside_the_ranges_is_classified() {
        for n in 0..0x1000u32 {
            let inside = MSR_RANGES
                .iter()
                .any(|&(first, last)| (first..=last).contains(&n));
            assert_eq!(IntelMsr::classify(Msr(n)).is_some(), inside, "msr {n:#x}");
        }
        assert_eq!(IntelMsr::classify(Msr(0x1d9)), None, "DEBUGCTL is not ours");
    }

    #[test]
    fn aliases_of_the_same_counter() {
        assert_eq!(
            IntelMsr::classify(Msr(0xc3)),
            Some(IntelMsr::Counter {
                index: 2,
                alias: CounterAlias::Legacy
            })
        );
        assert_eq!(
            IntelMsr::classify(Msr(0x4c3)),
            Some(IntelMsr::Counter {
                index: 2,
                alias: CounterAlias::FullWidth
            })
        );
    }

    #[test]
    fn rdpmc_selectors() {
        assert_eq!(rdpmc_counter(0), Some(Msr(IA32_PMC0)));
        assert_eq!(rdpmc_counter(7), Some(Msr(IA32_PMC0 + 7)));
        assert_eq!(rdpmc_counter(8), None);
        assert_eq!(rdpmc_counter(1 << 30), Some(Msr(IA32_FIXED_CTR0)));
        assert_eq!(rdpmc_counter((1 << 30) | 3), Some(Msr(IA32_FIXED_CTR0 + 3)));
        assert_eq!(rdpmc_counter((1 << 30) | 4), None);
        // The fast-read flag, the metrics type and any other type name nothing.
        for selector in [
            1 << 31,
            (1 << 31) | (1 << 30),
            1 << 29,
            1 << 16,
            0xffff_ffff,
        ] {
            assert_eq!(rdpmc_counter(selector), None, "{selector:#x}");
        }
    }
}
