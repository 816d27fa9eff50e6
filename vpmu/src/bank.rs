//! Counter banks: the loops that move a context's counters between memory and the hardware,
//! written once for every vendor.
//!
//! A *bank* is a run of counters with one MSR layout and one width: Intel's general-purpose
//! counters (PMCx with PERFEVTSELx), Intel's fixed counters (FIXED_CTRx under the one
//! FIXED_CTR_CTRL), AMD's core counters (the K7 block or the interleaved PerfCtrExtCore
//! block). A vendor describes each of its banks with a [`BankMap`] — MSR numbers, value width,
//! which alias writes a counter, whether the controls are per counter or shared — and exposes
//! its context's per-bank registers through [`CounterBanks`]; [`save`], [`load`],
//! [`write_counters`] and [`overflow`] then do the same work for both vendors. KVM's shared
//! `pmc` loops in `arch/x86/kvm/pmu.c`, which vendor code parametrises with its MSR bases and
//! stride, are the model.
//!
//! Only the counters of a [`CounterSet`] are touched, lowest index first, and a control that is
//! 0 is never written (the hardware holds 0 between contexts), so a switch costs exactly the
//! accesses of the counters a context uses.
//!
//! The global registers (GLOBAL_CTRL, PerfCntrGlobalCtl) stay with the vendor: when they are
//! written depends on rules that differ (Intel writes GLOBAL_CTRL whenever something is in use,
//! AMD only with PerfMonV2 and a non-zero value). The overflow status register's
//! read-record-acknowledge step is shared ([`StatusMsrs::fold`]).

use crate::backend::{CounterSet, Indices, Overflow};
use crate::msr::{Msr, MsrBus, MsrFault};

/// MSRs at `base + index * stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MsrSeries {
    /// The MSR of index 0.
    pub base: u32,
    /// The distance between two consecutive indices (2 where counter and control interleave).
    pub stride: u32,
}

impl MsrSeries {
    /// The series `base + index * stride`.
    pub const fn new(base: u32, stride: u32) -> Self {
        MsrSeries { base, stride }
    }

    /// The MSR of `index`.
    pub const fn at(self, index: u32) -> Msr {
        Msr(self.base + index * self.stride)
    }
}

/// Where a bank's counters are controlled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Controls {
    /// One control MSR per counter (PERFEVTSELx, PERF_CTLx).
    PerCounter(MsrSeries),
    /// One MSR controls every counter of the bank (Intel's FIXED_CTR_CTRL): the context holds
    /// one hardware value for it, written when any counter of the bank is touched.
    Shared(Msr),
}

/// One bank of counters as the vendor's MSR map lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BankMap {
    /// The [`CounterSet`] bit of the bank's counter 0 (0 for general-purpose counters,
    /// [`CounterSet::FIXED_BASE`] for Intel's fixed counters).
    pub first_bit: u32,
    /// The counter MSRs as read.
    pub counters: MsrSeries,
    /// The counter MSRs as written. Differs from `counters` where another alias stores a value
    /// exactly (Intel's full-width IA32_A_PMCx when FW_WRITE is enumerated, as the legacy
    /// alias sign-extends from bit 31).
    pub counter_writes: MsrSeries,
    /// The control MSRs.
    pub controls: Controls,
    /// The bits a counter holds; a read is masked to them. Where the hardware already reads
    /// its undefined bits as 0 (AMD) this is `u64::MAX`, which saves nothing but an AND.
    pub value_mask: u64,
}

impl BankMap {
    /// The bank's counters in `set`, lowest index first.
    pub const fn indices(&self, set: CounterSet) -> Indices {
        Indices((set.0 >> self.first_bit) as u32)
    }

    /// Counter `index` of this bank as a [`CounterSet`].
    pub const fn counter(&self, index: u32) -> CounterSet {
        CounterSet(1 << ((self.first_bit + index) & 63))
    }

    /// The counters of this bank among `0..32` whose bit is set in `bits`.
    pub const fn set(&self, bits: u32) -> CounterSet {
        CounterSet((bits as u64) << self.first_bit)
    }

    /// The control MSR of counter `index` (the shared one for a shared control).
    pub const fn control_msr(&self, index: u32) -> Msr {
        match self.controls {
            Controls::PerCounter(series) => series.at(index),
            Controls::Shared(msr) => msr,
        }
    }

    /// Reads counter `index` from the hardware, masked to the counter's bits.
    pub fn read_counter<B: MsrBus>(&self, hw: &mut B, index: u32) -> Result<u64, MsrFault> {
        Ok(hw.read(self.counters.at(index))? & self.value_mask)
    }

    /// Writes counter `index` on the hardware through the alias that stores it exactly.
    pub fn write_counter<B: MsrBus>(
        &self,
        hw: &mut B,
        index: u32,
        value: u64,
    ) -> Result<(), MsrFault> {
        hw.write(self.counter_writes.at(index), value)
    }
}

/// A vendor context's registers, bank by bank, as the loops of this module see them. `bank` is
/// the position of the bank in the `&[BankMap]` the vendor passes alongside the context.
pub trait CounterBanks {
    /// The saved counter values of `bank`, by index.
    fn values(&self, bank: usize) -> &[u64];
    /// The same, to store values read back from the hardware.
    fn values_mut(&mut self, bank: usize) -> &mut [u64];
    /// The control values of `bank` as programmed on the hardware: one per counter, or the one
    /// value of a [`Controls::Shared`] control.
    fn hardware_controls(&self, bank: usize) -> &[u64];
    /// Whether counter `index` of `bank` has its overflow interrupt enabled as the guest
    /// programmed it (not as the hardware image, which a filter may have disabled).
    fn interrupt_enabled(&self, bank: usize, index: u32) -> bool;
}

/// Whether [`save`] reads the counters before or after it clears their controls. Either is
/// exact once the global enable is off; each vendor keeps the order its traffic tests pin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaveOrder {
    /// Read every counter, then clear the controls (Intel: GLOBAL_CTRL already stopped all).
    CountersFirst,
    /// Clear the controls, then read the counters (AMD: without PerfMonV2 clearing a control is
    /// what stops its counter).
    ControlsFirst,
}

/// Saves the counters of `set` from the hardware into `ctx` and leaves their controls 0 on the
/// hardware, bank after bank in `order`.
pub fn save<C: CounterBanks + ?Sized, B: MsrBus>(
    banks: &[BankMap],
    ctx: &mut C,
    set: CounterSet,
    order: SaveOrder,
    hw: &mut B,
) -> Result<(), MsrFault> {
    match order {
        SaveOrder::CountersFirst => {
            read_counters(banks, ctx, set, hw)?;
            write_controls(banks, ctx, set, hw, false)
        }
        SaveOrder::ControlsFirst => {
            write_controls(banks, ctx, set, hw, false)?;
            read_counters(banks, ctx, set, hw)
        }
    }
}

/// Loads the counters of `set` from `ctx`: every value first (the hardware may hold another
/// context's counts), then every non-zero control.
pub fn load<C: CounterBanks + ?Sized, B: MsrBus>(
    banks: &[BankMap],
    ctx: &C,
    set: CounterSet,
    hw: &mut B,
) -> Result<(), MsrFault> {
    write_counters(banks, ctx, set, hw)?;
    write_controls(banks, ctx, set, hw, true)
}

/// Writes the saved values of the counters of `set` to the hardware, without their controls:
/// what putting a counter in use while the context is loaded starts with.
pub fn write_counters<C: CounterBanks + ?Sized, B: MsrBus>(
    banks: &[BankMap],
    ctx: &C,
    set: CounterSet,
    hw: &mut B,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        let values = ctx.values(bank);
        for index in map.indices(set) {
            if let Some(&value) = values.get(index as usize) {
                map.write_counter(hw, index, value)?;
            }
        }
    }
    Ok(())
}

/// The counters `counters` as an [`Overflow`]: a PMI is due if any of them has its interrupt
/// enabled.
pub fn overflow<C: CounterBanks + ?Sized>(
    banks: &[BankMap],
    ctx: &C,
    counters: CounterSet,
) -> Overflow {
    let interrupt = banks.iter().enumerate().any(|(bank, map)| {
        map.indices(counters)
            .any(|index| ctx.interrupt_enabled(bank, index))
    });
    Overflow {
        counters,
        interrupt,
    }
}

fn read_counters<C: CounterBanks + ?Sized, B: MsrBus>(
    banks: &[BankMap],
    ctx: &mut C,
    set: CounterSet,
    hw: &mut B,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        for index in map.indices(set) {
            let value = map.read_counter(hw, index)?;
            if let Some(slot) = ctx.values_mut(bank).get_mut(index as usize) {
                *slot = value;
            }
        }
    }
    Ok(())
}

/// Writes the non-zero hardware controls of the counters of `set`: their values (`load`), or 0
/// (`!load`, stopping them). A shared control is written once, if any counter of its bank is in
/// `set`.
fn write_controls<C: CounterBanks + ?Sized, B: MsrBus>(
    banks: &[BankMap],
    ctx: &C,
    set: CounterSet,
    hw: &mut B,
    load: bool,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        let controls = ctx.hardware_controls(bank);
        let mut write = |msr, control: u64| match control {
            0 => Ok(()),
            control => hw.write(msr, if load { control } else { 0 }),
        };
        match map.controls {
            Controls::PerCounter(series) => {
                for index in map.indices(set) {
                    write(
                        series.at(index),
                        controls.get(index as usize).map_or(0, |&c| c),
                    )?;
                }
            }
            Controls::Shared(msr) => {
                if map.indices(set).0 != 0 {
                    write(msr, controls.first().map_or(0, |&c| c))?;
                }
            }
        }
    }
    Ok(())
}

/// An overflow status register and the register that acknowledges its bits (Intel
/// GLOBAL_STATUS / GLOBAL_OVF_CTRL, AMD PerfCntrGlobalStatus / PerfCntrGlobalStatusClr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StatusMsrs {
    /// The status register (read-only).
    pub status: Msr,
    /// The register whose set bits clear the same status bits.
    pub acknowledge: Msr,
}

impl StatusMsrs {
    /// Reads the status, records its bits within `record` in `virtual_status`, and clears the
    /// ones within `acknowledge` on the hardware (no write when none is set). Returns the bits
    /// recorded. `acknowledge` may exceed `record`: status another owner left must not survive
    /// into the next context.
    pub fn fold<B: MsrBus>(
        &self,
        hw: &mut B,
        record: u64,
        acknowledge: u64,
        virtual_status: &mut u64,
    ) -> Result<u64, MsrFault> {
        let status = hw.read(self.status)?;
        let recorded = status & record;
        *virtual_status |= recorded;
        let acknowledged = status & acknowledge;
        if acknowledged != 0 {
            hw.write(self.acknowledge, acknowledged)?;
        }
        Ok(recorded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every access; reads answer `value_of(msr)`.
    #[derive(Default)]
    struct Trace {
        accesses: [(bool, u32, u64); 32],
        len: usize,
    }

    impl Trace {
        fn log(&self) -> &[(bool, u32, u64)] {
            &self.accesses[..self.len]
        }
    }

    impl MsrBus for Trace {
        fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
            let value = u64::from(msr.0) << 32 | 0xffff_ffff;
            self.accesses[self.len] = (false, msr.0, value);
            self.len += 1;
            Ok(value)
        }

        fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
            self.accesses[self.len] = (true, msr.0, value);
            self.len += 1;
            Ok(())
        }
    }

    struct Ctx {
        gp: [u64; 4],
        gp_ctl: [u64; 4],
        fixed: [u64; 3],
        fixed_ctl: u64,
    }

    impl CounterBanks for Ctx {
        fn values(&self, bank: usize) -> &[u64] {
            if bank == 0 { &self.gp } else { &self.fixed }
        }
        fn values_mut(&mut self, bank: usize) -> &mut [u64] {
            if bank == 0 {
                &mut self.gp
            } else {
                &mut self.fixed
            }
        }
        fn hardware_controls(&self, bank: usize) -> &[u64] {
            if bank == 0 {
                &self.gp_ctl
            } else {
                core::slice::from_ref(&self.fixed_ctl)
            }
        }
        fn interrupt_enabled(&self, bank: usize, index: u32) -> bool {
            bank == 0 && self.gp_ctl[index as usize] & 1 != 0
        }
    }

    const BANKS: [BankMap; 2] = [
        BankMap {
            first_bit: 0,
            counters: MsrSeries::new(0x201, 2),
            counter_writes: MsrSeries::new(0x201, 2),
            controls: Controls::PerCounter(MsrSeries::new(0x200, 2)),
            value_mask: 0xffff_ffff_ffff,
        },
        BankMap {
            first_bit: CounterSet::FIXED_BASE,
            counters: MsrSeries::new(0x309, 1),
            counter_writes: MsrSeries::new(0x309, 1),
            controls: Controls::Shared(Msr(0x38d)),
            value_mask: u64::MAX,
        },
    ];

    fn ctx() -> Ctx {
        Ctx {
            gp: [1, 2, 3, 4],
            gp_ctl: [0x11, 0, 0x13, 0x14],
            fixed: [5, 6, 7],
            fixed_ctl: 0xb0,
        }
    }

    #[test]
    fn indices_run_by_trailing_zeros() {
        let set = CounterSet(0b1010_0101 | 0b110 << 32);
        let mut gp = [0; 4];
        set.gp_indices().zip(&mut gp).for_each(|(i, s)| *s = i);
        assert_eq!(gp, [0, 2, 5, 7]);
        assert_eq!(BANKS[1].indices(set).len(), 2);
        assert_eq!(BANKS[1].set(0b110), CounterSet(0b110 << 32));
        assert_eq!(BANKS[1].counter(2), CounterSet::fixed(2));
    }

    #[test]
    fn load_writes_values_then_non_zero_controls() {
        let mut hw = Trace::default();
        let set = CounterSet(0b0011 | 1 << 33);
        load(&BANKS, &ctx(), set, &mut hw).unwrap();
        assert_eq!(
            hw.log(),
            [
                (true, 0x201, 1),
                (true, 0x203, 2),
                (true, 0x30a, 6),
                (true, 0x200, 0x11),
                (true, 0x38d, 0xb0)
            ]
        );
    }

    #[test]
    fn save_orders_and_masks() {
        let set = CounterSet(0b0101);
        let read = |msr: u32| u64::from(msr) << 32 | 0xffff_ffff;
        let mut first = ctx();
        let mut hw = Trace::default();
        save(&BANKS, &mut first, set, SaveOrder::CountersFirst, &mut hw).unwrap();
        let reads = [(false, 0x201, read(0x201)), (false, 0x205, read(0x205))];
        let clears = [(true, 0x200, 0), (true, 0x204, 0)];
        assert_eq!(hw.log()[..2], reads);
        assert_eq!(hw.log()[2..], clears);
        assert_eq!(first.gp[2], read(0x205) & 0xffff_ffff_ffff);
        let mut hw = Trace::default();
        save(&BANKS, &mut ctx(), set, SaveOrder::ControlsFirst, &mut hw).unwrap();
        assert_eq!(hw.log()[..2], clears);
        assert_eq!(hw.log()[2..], reads);
    }

    #[test]
    fn overflow_asks_the_context_for_interrupts() {
        let c = ctx();
        assert!(overflow(&BANKS, &c, CounterSet::gp(0)).interrupt);
        assert!(!overflow(&BANKS, &c, CounterSet::gp(1).union(CounterSet::fixed(0))).interrupt);
    }

    #[test]
    fn fold_records_and_acknowledges_separately() {
        let status = StatusMsrs {
            status: Msr(0x38e),
            acknowledge: Msr(0x390),
        };
        let mut hw = Trace::default();
        let mut virtual_status = 0;
        let recorded = status
            .fold(&mut hw, 0b1, 0b11, &mut virtual_status)
            .unwrap();
        assert_eq!((recorded, virtual_status), (1, 1));
        assert_eq!(hw.log()[1], (true, 0x390, 0b11));
    }
}
