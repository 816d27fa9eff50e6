//! A software model of an Intel architectural PMU ([`IntelPmuModel`]): the hardware of
//! simulators, reference VMMs and MSR-emulation tests; and [`SyntheticCpuid`], any Intel PMU
//! shape described as a CPUID.
//!
//! It follows the hardware's rules, not the backend's policy, and computes its own masks from
//! the enumeration, so that a backend bug is not hidden by sharing code with it. In particular
//! it accepts what pre-v5 hardware accepts and the backend forbids — AnyThread (PERFEVTSELx
//! bit 21, FIXED_CTR_CTRL nibble bit 2) and Pin Control (bit 19), a non-zero PEBS_ENABLE — and
//! exposes its raw registers, so tests can prove those never reach it. It returns the full
//! IA32_PERF_CAPABILITIES it was given, PEBS and LBR formats included.
//!
//! Counting: `count` feeds a batch of events. A general-purpose counter counts them when
//! PERFEVTSELx.EN, its GLOBAL_CTRL bit, the OS (CPL 0) or USR (CPL > 0) bit for the CPL all
//! hold, its `umask:event` is the event's architectural encoding, and CPUID enumerates the event
//! as available. Selectors with EDGE, INV or a CMASK do not count: a batch carries no per-cycle
//! distribution to apply them to. Fixed counters 0–2 count instructions, core cycles and
//! reference cycles; fixed counter 3 (topdown slots) has no event to be fed and never counts.
//! There are no host/guest qualifiers on Intel, so `ExecMode::host` gates nothing.

use vpmu::{CounterSet, Msr, MsrAccessStats, MsrBus, MsrFault};
use vpmu_intel::IntelCaps;
use vpmu_intel::events::{ARCH_EVENTS, ArchEvent, umask_event};
use vpmu_intel::msrs::{
    CounterAlias, EVTSEL_CMASK, EVTSEL_EDGE, EVTSEL_EN, EVTSEL_INT, EVTSEL_INV, EVTSEL_OS,
    EVTSEL_USR, FIXED_OS, FIXED_PMI, FIXED_USR, IntelMsr, fixed_nibble,
};

use crate::{ExecMode, HwEvent, SoftwarePmu};

mod synthetic;

pub use synthetic::SyntheticCpuid;

/// The architectural event (its encoding and its CPUID.0AH:EBX availability bit) that `event`
/// is.
pub fn arch_event(event: HwEvent) -> ArchEvent {
    let bit = match event {
        HwEvent::CoreCycles => 0,
        HwEvent::Instructions => 1,
        HwEvent::RefCycles => 2,
        HwEvent::LlcReferences => 3,
        HwEvent::LlcMisses => 4,
        HwEvent::Branches => 5,
        HwEvent::BranchMisses => 6,
    };
    ARCH_EVENTS[bit]
}

/// The model's registers, as raw as the hardware holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelRegisters {
    /// IA32_PMC0–7 (entries beyond the enumerated count stay 0).
    pub gp_counters: [u64; 8],
    /// IA32_PERFEVTSEL0–7.
    pub event_selects: [u64; 8],
    /// IA32_FIXED_CTR0–3.
    pub fixed_counters: [u64; 4],
    /// IA32_FIXED_CTR_CTRL.
    pub fixed_ctrl: u64,
    /// IA32_PERF_GLOBAL_CTRL.
    pub global_ctrl: u64,
    /// IA32_PERF_GLOBAL_STATUS.
    pub global_status: u64,
    /// IA32_DS_AREA.
    pub ds_area: u64,
    /// IA32_PEBS_ENABLE.
    pub pebs_enable: u64,
}

/// A software Intel PMU with a PMI line.
#[derive(Clone, Debug)]
pub struct IntelPmuModel {
    caps: IntelCaps,
    registers: ModelRegisters,
    pmi: bool,
    stats: MsrAccessStats,
}

/// GLOBAL_STATUS.Uncore (v3+), LBR_Frz and CTR_Frz (v4+), OvfBuffer, CondChgd.
const STATUS_UNCORE: u64 = 1 << 61;
const STATUS_FREEZE: u64 = (1 << 58) | (1 << 59);
const STATUS_BUFFER: u64 = 1 << 62;
const STATUS_CHANGED: u64 = 1 << 63;

fn privilege_matches(os: bool, usr: bool, mode: ExecMode) -> bool {
    if mode.cpl == 0 { os } else { usr }
}

/// The longest run `cycles_until_pmi` looks ahead.
const PMI_HORIZON: u64 = 1 << 48;

/// The fixed counter that counts `event`, if any: 0 instructions, 1 core cycles, 2 reference
/// cycles.
fn fixed_counter_of(event: HwEvent) -> Option<u32> {
    match event {
        HwEvent::Instructions => Some(0),
        HwEvent::CoreCycles => Some(1),
        HwEvent::RefCycles => Some(2),
        _ => None,
    }
}

/// Events until a counter of `mask` width holding `value` wraps (`advance` reports the wrap
/// once `n` exceeds the room left); `None` beyond `u64` (a 64-bit counter at 0).
fn distance_to_wrap(value: u64, mask: u64) -> Option<u64> {
    (mask - (value & mask)).checked_add(1)
}

/// Adds `n` to a counter of `mask` width; whether it wrapped past the top.
fn advance(counter: &mut u64, mask: u64, n: u64) -> bool {
    let room = mask - (*counter & mask);
    *counter = counter.wrapping_add(n) & mask;
    n > room
}

impl IntelPmuModel {
    /// A model of the PMU `caps` describes, in its power-on state: everything 0 except
    /// GLOBAL_CTRL, whose general-purpose enable bits are set (SDM).
    pub fn new(caps: IntelCaps) -> Self {
        let registers = ModelRegisters {
            global_ctrl: CounterSet::first_gp(caps.gp_counters()).0,
            ..ModelRegisters::default()
        };
        IntelPmuModel {
            caps,
            registers,
            pmi: false,
            stats: MsrAccessStats::default(),
        }
    }

    /// The raw register state.
    pub fn registers(&self) -> &ModelRegisters {
        &self.registers
    }

    /// The enumeration the model was built from.
    pub fn caps(&self) -> &IntelCaps {
        &self.caps
    }

    fn counter_bits(&self) -> u64 {
        self.caps.all_counters().0
    }

    fn read_register(&self, msr: Msr) -> Option<u64> {
        let caps = &self.caps;
        let r = &self.registers;
        match IntelMsr::classify(msr)? {
            IntelMsr::Counter { index, alias } => {
                let present = caps.has_gp(index)
                    && (alias == CounterAlias::Legacy || caps.full_width_writes());
                present.then(|| r.gp_counters.get(index as usize).copied())?
            }
            IntelMsr::EventSelect(index) if caps.has_gp(index) => {
                r.event_selects.get(index as usize).copied()
            }
            IntelMsr::FixedCounter(index) if caps.has_fixed(index) => {
                r.fixed_counters.get(index as usize).copied()
            }
            IntelMsr::FixedCtrCtrl => Some(r.fixed_ctrl),
            IntelMsr::GlobalCtrl => Some(r.global_ctrl),
            IntelMsr::GlobalStatus => Some(r.global_status),
            IntelMsr::GlobalOvfCtrl => Some(0),
            IntelMsr::GlobalStatusSet if caps.version() >= 4 => Some(0),
            IntelMsr::PerfCapabilities if caps.has_perf_capabilities() => {
                Some(caps.perf_capabilities())
            }
            IntelMsr::PebsEnable if caps.debug_store() => Some(r.pebs_enable),
            IntelMsr::DsArea if caps.debug_store() => Some(r.ds_area),
            _ => None,
        }
    }

    fn write_register(&mut self, msr: Msr, value: u64) -> Option<()> {
        let caps = self.caps;
        let counters = self.counter_bits();
        let gp_mask = caps.gp_value_mask();
        let fixed_mask = caps.fixed_value_mask();
        let r = &mut self.registers;
        let fits = |allowed: u64| (value & !allowed == 0).then_some(value);
        match IntelMsr::classify(msr)? {
            IntelMsr::Counter {
                index,
                alias: CounterAlias::Legacy,
            } if caps.has_gp(index) => {
                *r.gp_counters.get_mut(index as usize)? =
                    (value as u32 as i32 as i64 as u64) & gp_mask;
            }
            IntelMsr::Counter {
                index,
                alias: CounterAlias::FullWidth,
            } if caps.has_gp(index) && caps.full_width_writes() => {
                *r.gp_counters.get_mut(index as usize)? = fits(gp_mask)?;
            }
            IntelMsr::EventSelect(index) if caps.has_gp(index) => {
                *r.event_selects.get_mut(index as usize)? = fits(0xffff_ffff)?;
            }
            IntelMsr::FixedCounter(index) if caps.has_fixed(index) => {
                *r.fixed_counters.get_mut(index as usize)? = fits(fixed_mask)?;
            }
            IntelMsr::FixedCtrCtrl => {
                let allowed = (0..4u32)
                    .filter(|&i| caps.has_fixed(i))
                    .fold(0, |bits, i| bits | 0xf << (4 * i));
                r.fixed_ctrl = fits(allowed)?;
            }
            IntelMsr::GlobalCtrl => r.global_ctrl = fits(counters)?,
            IntelMsr::GlobalOvfCtrl => {
                let mut allowed = counters | STATUS_BUFFER | STATUS_CHANGED;
                if caps.version() >= 3 {
                    allowed |= STATUS_UNCORE;
                }
                if caps.version() >= 4 {
                    allowed |= STATUS_FREEZE;
                }
                r.global_status &= !fits(allowed)?;
            }
            IntelMsr::GlobalStatusSet if caps.version() >= 4 => {
                r.global_status |= fits(counters | STATUS_BUFFER | STATUS_FREEZE)?;
            }
            IntelMsr::PebsEnable if caps.debug_store() => {
                r.pebs_enable = fits(CounterSet::first_gp(caps.gp_counters()).0)?;
            }
            IntelMsr::DsArea if caps.debug_store() => {
                let canonical = (((value << 16) as i64) >> 16) as u64 == value;
                r.ds_area = canonical.then_some(value)?;
            }
            _ => return None,
        }
        Some(())
    }

    /// Whether general-purpose counter `index` counts `event` in `mode` (enabled locally and
    /// globally, a plain selector of the event, available, privilege matching): `Some` with
    /// whether its overflow interrupts, `None` if it does not count.
    fn gp_counts(&self, index: u32, event: HwEvent, mode: ExecMode) -> Option<bool> {
        let sel = *self.registers.event_selects.get(index as usize)?;
        let enabled = sel & EVTSEL_EN != 0 && self.registers.global_ctrl & (1 << index) != 0;
        let plain = sel & (EVTSEL_EDGE | EVTSEL_INV | EVTSEL_CMASK) == 0;
        let selected = self.caps.event_available(arch_event(event))
            && umask_event(sel) == arch_event(event).encoding;
        let privileged = privilege_matches(sel & EVTSEL_OS != 0, sel & EVTSEL_USR != 0, mode);
        (enabled && plain && selected && privileged).then_some(sel & EVTSEL_INT != 0)
    }

    /// Whether fixed counter `index` counts in `mode` (present, enabled globally, privilege
    /// matching its nibble): `Some` with whether its overflow interrupts, `None` if not.
    fn fixed_counts(&self, index: u32, mode: ExecMode) -> Option<bool> {
        let nibble = fixed_nibble(self.registers.fixed_ctrl, index);
        let counts = self.caps.has_fixed(index)
            && self.registers.global_ctrl & (1 << (32 + index)) != 0
            && privilege_matches(nibble & FIXED_OS != 0, nibble & FIXED_USR != 0, mode);
        counts.then_some(nibble & FIXED_PMI != 0)
    }

    fn overflowed(&mut self, bit: u64, interrupt: bool) {
        self.registers.global_status |= bit;
        self.pmi |= interrupt;
    }
}

impl MsrBus for IntelPmuModel {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.stats.reads += 1;
        let value = self.read_register(msr);
        self.stats.faults += u64::from(value.is_none());
        value.ok_or(MsrFault { msr })
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.stats.writes += 1;
        let done = self.write_register(msr, value);
        self.stats.faults += u64::from(done.is_none());
        done.ok_or(MsrFault { msr })
    }
}

impl SoftwarePmu for IntelPmuModel {
    fn count(&mut self, event: HwEvent, n: u64, mode: ExecMode) {
        let gp_mask = self.caps.gp_value_mask();
        let fixed_mask = self.caps.fixed_value_mask();
        for index in 0..self.caps.gp_counters() {
            let Some(interrupt) = self.gp_counts(index, event, mode) else {
                continue;
            };
            let Some(counter) = self.registers.gp_counters.get_mut(index as usize) else {
                continue;
            };
            if advance(counter, gp_mask, n) {
                self.overflowed(1 << index, interrupt);
            }
        }
        let Some(fixed_index) = fixed_counter_of(event) else {
            return;
        };
        let Some(interrupt) = self.fixed_counts(fixed_index, mode) else {
            return;
        };
        let Some(counter) = self.registers.fixed_counters.get_mut(fixed_index as usize) else {
            return;
        };
        if advance(counter, fixed_mask, n) {
            self.overflowed(1 << (32 + fixed_index), interrupt);
        }
    }

    /// Every counter that counts core or reference cycles in `mode` with its interrupt enabled
    /// (the same gating as `count`) wraps after `mask + 1 - value` of them; an overflow always
    /// asserts the line here (the model has no freeze or LVTPC), so the nearest wrap is the
    /// answer. A GP counter selects one of the two events; fixed counters 1 and 2 count one
    /// each.
    fn cycles_until_pmi(&self, mode: ExecMode) -> Option<u64> {
        let gp_mask = self.caps.gp_value_mask();
        let fixed_mask = self.caps.fixed_value_mask();
        let cycles = [HwEvent::CoreCycles, HwEvent::RefCycles];
        let gp = (0..self.caps.gp_counters()).filter_map(|index| {
            let interrupting = cycles
                .iter()
                .any(|&event| self.gp_counts(index, event, mode) == Some(true));
            let value = self.registers.gp_counters.get(index as usize)?;
            interrupting.then(|| distance_to_wrap(*value, gp_mask))?
        });
        let fixed = cycles.iter().filter_map(|&event| {
            let index = fixed_counter_of(event)?;
            let value = self.registers.fixed_counters.get(index as usize)?;
            self.fixed_counts(index, mode)?
                .then(|| distance_to_wrap(*value, fixed_mask))?
        });
        gp.chain(fixed).min().filter(|&n| n <= PMI_HORIZON)
    }

    fn pmi_pending(&self) -> bool {
        self.pmi
    }

    fn take_pmi(&mut self) -> bool {
        core::mem::take(&mut self.pmi)
    }

    fn access_stats(&self) -> MsrAccessStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: ExecMode = ExecMode {
        cpl: 0,
        host: false,
    };

    fn model(shape: SyntheticCpuid) -> IntelPmuModel {
        IntelPmuModel::new(IntelCaps::from_cpuid(shape, None).expect("valid shape"))
    }

    #[test]
    fn advance_reports_wrap_exactly_at_the_crossing() {
        let mask = (1 << 48) - 1;
        let mut c = mask - 4;
        assert!(!advance(&mut c, mask, 4));
        assert_eq!(c, mask);
        assert!(advance(&mut c, mask, 1));
        assert_eq!(c, 0);
        let mut full = u64::MAX - 1;
        assert!(advance(&mut full, u64::MAX, 3));
        assert_eq!(full, 1);
    }

    #[test]
    fn power_on_enables_gp_counters_globally() {
        let m = model(SyntheticCpuid::v2(4, 3));
        assert_eq!(m.registers().global_ctrl, 0xf);
    }

    #[test]
    fn unavailable_event_does_not_count() {
        let mut m = model(SyntheticCpuid {
            unavailable_events: 1 << 5,
            ..SyntheticCpuid::v2(2, 3)
        });
        m.write(Msr(0x186), 0x0043_00c4).expect("branches selector");
        m.write(Msr(0x187), 0x0043_00c0)
            .expect("instructions selector");
        m.count(HwEvent::Branches, 7, KERNEL);
        m.count(HwEvent::Instructions, 9, KERNEL);
        assert_eq!(m.registers().gp_counters[..2], [0, 9]);
    }

    #[test]
    fn arch_events_are_the_sdm_encodings() {
        let encodings = HwEvent::ALL.map(|event| arch_event(event).encoding);
        assert_eq!(
            encodings,
            [0x00c0, 0x00c4, 0x003c, 0x013c, 0x4f2e, 0x412e, 0x00c5]
        );
    }
}
