//! A software AMD core PMU: an [`MsrBus`] that behaves the way the hardware does for an
//! enumerated shape, fed with events, with a PMI line.
//!
//! It is the hardware of simulators, of a reference VMM and of MSR-emulation tests, so its
//! rules are the hardware's, written independently of the backend's policy:
//!
//! * MSRs: the K7 block always (counters 0–3, aliasing the interleaved block), the interleaved
//!   block only with PerfCtrExtCore/PerfMonV2, the global block only with PerfMonV2; an index
//!   at or beyond the counter count, or any other MSR, faults (#GP).
//! * PERF_CTL keeps every bit written, reserved ones included, and accepts Host/Guest-only: the
//!   raw state ([`AmdPmuModel::registers`]) then shows exactly what a backend let through.
//! * PERF_CTR keeps the low 48 bits of a write and ignores the rest, as the hardware does (the
//!   backend's stricter #GP is tested against the backend, not against this).
//! * PerfCntrGlobalStatus is read-only (a write faults); STATUS_CLR/STATUS_SET act on the
//!   counter bits, ignore the others, and read as 0. GlobalCtl resets to all counters enabled.
//!
//! Counting ([`SoftwarePmu::count`]): a counter counts an event when EN is set, its GlobalCtl
//! bit is set (PerfMonV2), the privilege matches (OS at CPL 0, USR at CPL > 0; neither set counts
//! nothing — Linux relies on that to express "exclude both host and guest"), the Host/Guest-only
//! bits allow the context (GuestOnly alone: not in host; HostOnly alone: not in guest; both or
//! neither: both), and the control selects the event with unit mask 0 and no edge, invert or
//! counter-mask qualifier. Zen encodings: instructions `0x0C0`, branches `0x0C2`, core cycles
//! `0x076`, mispredicted branches `0x0C3`. Reference cycles and LLC events have no
//! architectural AMD encoding; they count nowhere, and a qualified event (CMASK, INV, EDGE)
//! counts nothing: the model does not simulate per-cycle thresholds.
//! The Host/Guest-only rule is the one for EFER.SVME = 1 (a hypervisor owns the CPU); the
//! model has no SVME = 0 mode, where the APM stops counters with either bit set.
//!
//! Wrap: counters are 48 bits. A batch of `n` events that carries a counter past
//! `0xffff_ffff_ffff` overflows once, at the crossing: the counter keeps the wrapped low bits,
//! the PerfMonV2 status bit is set, and the PMI line is asserted if INT is set. So a counter
//! preset to `-N` reads `0xffff_ffff_ffff` after `N − 1` events, `0` with the overflow after
//! `N`, and `1` after `N + 1` — kvm-unit-tests' "preset `1 − count`, run `count`" ends at 1, in
//! its accepted AMD range (`< 7`). Without PerfMonV2 the overflow is visible only as the
//! counter's top bit going from 1 to 0.

use vpmu::{Msr, MsrAccessStats, MsrBus, MsrFault};
use vpmu_amd::AmdCaps;
use vpmu_amd::msrs::{
    COUNTER_MASK, COUNTER_WIDTH, EXT_PERF_CTL0, GLOBAL_CTL, GLOBAL_STATUS, GLOBAL_STATUS_CLR,
    GLOBAL_STATUS_SET, K7_PERF_CTL0, K7_PERF_CTR0, MAX_COUNTERS, ctl,
};

use crate::{ExecMode, HwEvent, SoftwarePmu};

const N: usize = MAX_COUNTERS as usize;

/// The raw registers of an [`AmdPmuModel`], for tests. Entries at or beyond `counters` are
/// always 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelRegisters {
    /// Number of counters the model has.
    pub counters: u32,
    /// PERF_CTLn exactly as written.
    pub controls: [u64; N],
    /// PERF_CTRn.
    pub values: [u64; N],
    /// PerfCntrGlobalCtl as written (0 without PerfMonV2).
    pub global_ctl: u64,
    /// PerfCntrGlobalStatus (0 without PerfMonV2).
    pub global_status: u64,
}

#[derive(Clone, Copy)]
enum Reg {
    Control(usize),
    Counter(usize),
    Status,
    GlobalCtl,
    StatusClr,
    StatusSet,
}

/// A software AMD core PMU with hardware semantics (see the module documentation).
#[derive(Clone, Debug)]
pub struct AmdPmuModel {
    counters: usize,
    ext_core: bool,
    v2: bool,
    regs: ModelRegisters,
    pmi: bool,
    stats: MsrAccessStats,
}

impl AmdPmuModel {
    /// A model of the PMU `caps` describes, in its reset state.
    pub fn new(caps: AmdCaps) -> Self {
        let counters = (caps.gp_counters() as usize).min(N);
        let v2 = caps.has_perfmon_v2();
        Self {
            counters,
            ext_core: caps.has_ext_core(),
            v2,
            regs: ModelRegisters {
                counters: counters as u32,
                controls: [0; N],
                values: [0; N],
                global_ctl: if v2 { (1 << counters) - 1 } else { 0 },
                global_status: 0,
            },
            pmi: false,
            stats: MsrAccessStats::default(),
        }
    }

    /// A snapshot of the raw registers (not counted as accesses).
    pub fn registers(&self) -> ModelRegisters {
        self.regs
    }

    /// Whether no counter can count: none has EN set and (PerfMonV2) its GlobalCtl bit.
    pub fn nothing_can_count(&self) -> bool {
        let r = &self.regs;
        (0..r.counters as usize)
            .all(|i| r.controls[i] & (1 << 22) == 0 || (self.v2 && r.global_ctl & (1 << i) == 0))
    }

    /// Replaces counter `index`'s value without an MSR access, as another owner of the CPU
    /// would have left it (e.g. to plant a stale value a backend must not leak). Truncated to
    /// 48 bits; ignored beyond the counter count.
    pub fn plant_counter(&mut self, index: usize, value: u64) {
        if index < self.counters {
            if let Some(slot) = self.regs.values.get_mut(index) {
                *slot = value & COUNTER_MASK;
            }
        }
    }

    fn decode(&self, msr: Msr) -> Option<Reg> {
        let n = msr.0;
        let reg = match n {
            0xC001_0000..=0xC001_0003 => Reg::Control((n - K7_PERF_CTL0) as usize),
            0xC001_0004..=0xC001_0007 => Reg::Counter((n - K7_PERF_CTR0) as usize),
            0xC001_0200..=0xC001_020B if self.ext_core => {
                let offset = (n - EXT_PERF_CTL0) as usize;
                if offset % 2 == 0 {
                    Reg::Control(offset / 2)
                } else {
                    Reg::Counter(offset / 2)
                }
            }
            GLOBAL_STATUS if self.v2 => Reg::Status,
            GLOBAL_CTL if self.v2 => Reg::GlobalCtl,
            GLOBAL_STATUS_CLR if self.v2 => Reg::StatusClr,
            GLOBAL_STATUS_SET if self.v2 => Reg::StatusSet,
            _ => return None,
        };
        match reg {
            Reg::Control(i) | Reg::Counter(i) if i >= self.counters => None,
            reg => Some(reg),
        }
    }

    fn mask(&self) -> u64 {
        (1 << self.counters) - 1
    }

    fn fault(&mut self, msr: Msr) -> MsrFault {
        self.stats.faults += 1;
        MsrFault { msr }
    }

    fn counts(&self, control: u64, index: usize, event: HwEvent, mode: ExecMode) -> bool {
        if control & ctl::EN == 0 {
            return false;
        }
        if self.v2 && self.regs.global_ctl & (1 << index) == 0 {
            return false;
        }
        let privilege = if mode.cpl == 0 { ctl::OS } else { ctl::USR };
        if control & privilege == 0 {
            return false;
        }
        let guest_only = control & ctl::GUEST_ONLY != 0;
        let host_only = control & ctl::HOST_ONLY != 0;
        if (guest_only && !host_only && mode.host) || (host_only && !guest_only && !mode.host) {
            return false;
        }
        if control & (ctl::EDGE | ctl::INV | ctl::CMASK | ctl::UMASK) != 0 {
            return false;
        }
        let select = (control & ctl::EVENT_LO) | ((control & ctl::EVENT_HI) >> 24);
        let wanted = match event {
            HwEvent::Instructions => 0x0c0,
            HwEvent::Branches => 0x0c2,
            HwEvent::CoreCycles => 0x076,
            HwEvent::BranchMisses => 0x0c3,
            HwEvent::RefCycles | HwEvent::LlcReferences | HwEvent::LlcMisses => return false,
        };
        select == wanted
    }
}

impl MsrBus for AmdPmuModel {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.stats.reads += 1;
        let Some(reg) = self.decode(msr) else {
            return Err(self.fault(msr));
        };
        let value = match reg {
            Reg::Control(i) => self.regs.controls.get(i).copied(),
            Reg::Counter(i) => self.regs.values.get(i).copied(),
            Reg::Status => Some(self.regs.global_status),
            Reg::GlobalCtl => Some(self.regs.global_ctl),
            Reg::StatusClr | Reg::StatusSet => Some(0),
        };
        value.ok_or_else(|| self.fault(msr))
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.stats.writes += 1;
        let Some(reg) = self.decode(msr) else {
            return Err(self.fault(msr));
        };
        let mask = self.mask();
        let slot = match reg {
            Reg::Control(i) => self.regs.controls.get_mut(i).map(|s| (s, value)),
            Reg::Counter(i) => self
                .regs
                .values
                .get_mut(i)
                .map(|s| (s, value & COUNTER_MASK)),
            Reg::Status => None,
            Reg::GlobalCtl => Some((&mut self.regs.global_ctl, value)),
            Reg::StatusClr => {
                let status = self.regs.global_status & !(value & mask);
                Some((&mut self.regs.global_status, status))
            }
            Reg::StatusSet => {
                let status = self.regs.global_status | (value & mask);
                Some((&mut self.regs.global_status, status))
            }
        };
        match slot {
            Some((slot, value)) => {
                *slot = value;
                Ok(())
            }
            None => Err(self.fault(msr)),
        }
    }
}

impl SoftwarePmu for AmdPmuModel {
    fn count(&mut self, event: HwEvent, n: u64, mode: ExecMode) {
        if n == 0 {
            return;
        }
        for i in 0..self.counters {
            let (Some(&control), Some(&value)) =
                (self.regs.controls.get(i), self.regs.values.get(i))
            else {
                continue;
            };
            if !self.counts(control, i, event, mode) {
                continue;
            }
            let sum = u128::from(value) + u128::from(n);
            if let Some(slot) = self.regs.values.get_mut(i) {
                *slot = (sum & u128::from(COUNTER_MASK)) as u64;
            }
            if sum > u128::from(COUNTER_MASK) {
                if self.v2 {
                    self.regs.global_status |= 1 << i;
                }
                if control & ctl::INT != 0 {
                    self.pmi = true;
                }
            }
        }
    }

    /// Every counter that counts core or reference cycles in `mode` (the gating of `count`;
    /// only core cycles have an AMD encoding) with INT wraps after `2^48 - value` of them, and
    /// any such wrap asserts the line (PerfMonV2's status bit does not gate it), so the nearest
    /// wrap is the answer.
    fn cycles_until_pmi(&self, mode: ExecMode) -> Option<u64> {
        (0..self.counters)
            .filter_map(|i| {
                let control = *self.regs.controls.get(i)?;
                let value = *self.regs.values.get(i)?;
                let counts = [HwEvent::CoreCycles, HwEvent::RefCycles]
                    .into_iter()
                    .any(|event| self.counts(control, i, event, mode));
                (counts && control & ctl::INT != 0)
                    .then(|| COUNTER_MASK - (value & COUNTER_MASK) + 1)
            })
            .min()
            .filter(|&n| n <= 1 << COUNTER_WIDTH)
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
    use vpmu_amd::PmuShape;

    const KERNEL: ExecMode = ExecMode {
        cpl: 0,
        host: false,
    };

    fn model(shape: PmuShape) -> AmdPmuModel {
        AmdPmuModel::new(AmdCaps::from_shape(shape).unwrap())
    }

    #[test]
    fn reset_state() {
        let m = model(PmuShape::PerfMonV2 { counters: 5 });
        let regs = m.registers();
        assert_eq!(regs.counters, 5);
        assert_eq!(regs.global_ctl, 0b11111);
        assert_eq!((regs.controls, regs.values), ([0; N], [0; N]));
        assert_eq!(model(PmuShape::PerfCtrExtCore).registers().global_ctl, 0);
    }

    #[test]
    fn counts_only_its_own_accesses() {
        let mut m = model(PmuShape::PerfCtrExtCore);
        m.write(Msr(0xC001_0201), 5).unwrap();
        assert_eq!(m.read(Msr(0xC001_0004)), Ok(5));
        assert!(m.read(Msr(0xC000_0300)).is_err());
        assert!(m.write(Msr(0x186), 0).is_err());
        let _ = m.registers();
        assert_eq!(
            m.access_stats(),
            MsrAccessStats {
                reads: 2,
                writes: 2,
                faults: 2
            }
        );
    }

    #[test]
    fn a_batch_crossing_the_wrap_overflows_once() {
        let mut m = model(PmuShape::PerfMonV2 { counters: 2 });
        m.write(Msr(0xC001_0203), COUNTER_MASK - 9).unwrap();
        m.write(Msr(0xC001_0202), ctl::EN | ctl::OS | 0xc0).unwrap();
        m.count(HwEvent::Instructions, 1 << 50, KERNEL);
        assert_eq!(m.registers().values[1], ((1u64 << 50) - 10) & COUNTER_MASK);
        assert_eq!(m.registers().global_status, 0b10);
        assert!(!m.pmi_pending(), "INT clear: status only");
        m.count(HwEvent::Instructions, u64::MAX, KERNEL);
        assert_eq!(m.registers().global_status, 0b10);
    }
}
