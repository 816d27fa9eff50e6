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
//! Only the counters of a [`CounterSet`] are touched, lowest index first, and a [`HwRecord`] of
//! what the pCPU's hardware holds between contexts lets a load skip every value and control
//! the hardware already holds, so a switch costs the accesses of what must change.
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
    /// The same, to store values read back from the hardware, with the bank's hardware
    /// controls alongside (what [`CounterBanks::hardware_controls`] returns).
    fn saved_mut(&mut self, bank: usize) -> (&mut [u64], &[u64]);
    /// The control values of `bank` as programmed on the hardware: one per counter, or the one
    /// value of a [`Controls::Shared`] control.
    fn hardware_controls(&self, bank: usize) -> &[u64];
    /// Whether counter `index` of `bank` has its overflow interrupt enabled as the guest
    /// programmed it (not as the hardware image, which a filter may have disabled).
    fn interrupt_enabled(&self, bank: usize, index: u32) -> bool;
}

/// What a pCPU's PMU hardware is known to hold while no context is loaded on it, so that a
/// load writes only what must change. Owned by the core's per-pCPU state and handed to the
/// backend's `save` and `load`; nothing else reads it.
///
/// Per [`CounterSet`] bit: a counter value and a control value, each known or not. A bank
/// with a [`Controls::Shared`] control keeps it at the position of the bank's counter 0
/// (`first_bit`). And the global control (Intel GLOBAL_CTRL, AMD PerfCntrGlobalCtl), known or
/// not. Comparing values rather than owners makes a vCPU that returns to its pCPU with
/// nothing in between cost only what changed, and a context of another vCPU that happens to
/// hold the same values cost nothing for them.
///
/// Between a load and the next save the record is not maintained (the loaded context's
/// hardware images are the authority then, and guest writes go through to the hardware);
/// `save` brings it up to date from the context. Any hardware write that neither `save` nor
/// `load` makes while nothing is loaded must be followed by [`HwRecord::forget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwRecord {
    values: [u64; 64],
    values_known: u64,
    controls: [u64; 64],
    controls_known: u64,
    /// Controls known to be 0 (a subset of `controls_known`).
    controls_zero: u64,
    global: Option<u64>,
}

impl Default for HwRecord {
    fn default() -> Self {
        Self::unknown()
    }
}

impl HwRecord {
    /// Nothing known: the next load writes everything it needs.
    pub const fn unknown() -> Self {
        HwRecord {
            values: [0; 64],
            values_known: 0,
            controls: [0; 64],
            controls_known: 0,
            controls_zero: 0,
            global: None,
        }
    }

    /// Forgets everything (someone wrote the PMU behind the record's back).
    pub fn forget(&mut self) {
        self.values_known = 0;
        self.controls_known = 0;
        self.controls_zero = 0;
        self.global = None;
    }

    /// After a clean-up that wrote every control 0 (`PmuBackend::init_hardware`): every
    /// control known 0, values and the global control unknown.
    pub fn controls_cleared(&mut self) {
        self.forget();
        self.controls = [0; 64];
        self.controls_known = u64::MAX;
        self.controls_zero = u64::MAX;
    }

    /// The global control, if known.
    pub fn global(&self) -> Option<u64> {
        self.global
    }

    /// Records the global control (`None`: unknown).
    pub fn set_global(&mut self, value: Option<u64>) {
        self.global = value;
    }

    /// Whether counter `bit` is known to hold `value`.
    pub fn knows_value(&self, bit: u32, value: u64) -> bool {
        self.values_known >> (bit & 63) & 1 != 0 && self.values[(bit & 63) as usize] == value
    }

    /// Whether control `bit` is known to hold `value`.
    pub fn knows_control(&self, bit: u32, value: u64) -> bool {
        self.controls_known >> (bit & 63) & 1 != 0 && self.controls[(bit & 63) as usize] == value
    }

    /// The controls known to be 0, as a set of positions.
    pub fn zero_controls(&self) -> CounterSet {
        CounterSet(self.controls_zero)
    }

    /// Records counter `bit` (`None`: unknown).
    pub fn set_value(&mut self, bit: u32, value: Option<u64>) {
        let mask = 1u64 << (bit & 63);
        match value {
            Some(value) => {
                self.values[(bit & 63) as usize] = value;
                self.values_known |= mask;
            }
            None => self.values_known &= !mask,
        }
    }

    /// Records control `bit` (`None`: unknown).
    pub fn set_control(&mut self, bit: u32, value: Option<u64>) {
        let mask = 1u64 << (bit & 63);
        match value {
            Some(value) => {
                self.controls[(bit & 63) as usize] = value;
                self.controls_known |= mask;
                if value == 0 {
                    self.controls_zero |= mask;
                } else {
                    self.controls_zero &= !mask;
                }
            }
            None => {
                self.controls_known &= !mask;
                self.controls_zero &= !mask;
            }
        }
    }
}

/// What [`save`] does with the controls of the counters it saves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaveControls {
    /// Leave them programmed: the vendor has already stopped everything with its global
    /// control (Intel v2+, AMD PerfMonV2). The counters are read; the controls are recorded
    /// as the context's hardware images, which the hardware holds while a context is loaded.
    Keep,
    /// Clear them first, then read the counters (AMD without PerfMonV2: clearing a control is
    /// what stops its counter). Only non-zero controls are written.
    Clear,
}

/// Saves the counters of `set` from the hardware into `ctx`, recording in `record` the values
/// read and the controls left on the hardware. A fault leaves `record` knowing nothing.
pub fn save<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &mut C,
    set: CounterSet,
    controls: SaveControls,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    let result = match controls {
        SaveControls::Keep => save_keeping_controls(banks, ctx, set, hw, record),
        SaveControls::Clear => clear_controls(banks, ctx, set, hw, record)
            .and_then(|()| read_counters(banks, ctx, set, hw, record)),
    };
    if result.is_err() {
        record.forget();
    }
    result
}

/// [`SaveControls::Keep`]: per bank, one pass reads the counters (the only loop with bus
/// calls in it) and one records the controls left programmed; the record's masks are updated
/// once per bank.
fn save_keeping_controls<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &mut C,
    set: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        let own = map.indices(set).0;
        if own == 0 {
            continue;
        }
        let first = map.first_bit;
        let (values, images) = ctx.saved_mut(bank);
        // Every counter of `own` is read; the ones with a slot in the context are recorded.
        let saved = own & slots(values.len());
        let mut bits = own;
        while bits != 0 {
            let index = bits.trailing_zeros();
            bits &= bits - 1;
            let value = map.read_counter(hw, index)?;
            if let Some(slot) = values.get_mut(index as usize) {
                *slot = value;
                record.values[((first + index) & 63) as usize] = value;
            }
        }
        record.values_known |= map.set(saved).0;
        let (recorded, zero) = match map.controls {
            Controls::PerCounter(_) => {
                let mut zero = 0u32;
                let mut bits = own;
                while bits != 0 {
                    let index = bits.trailing_zeros();
                    bits &= bits - 1;
                    let image = images.get(index as usize).map_or(0, |&c| c);
                    record.controls[((first + index) & 63) as usize] = image;
                    zero |= u32::from(image == 0) << index;
                }
                (map.set(own).0, map.set(zero).0)
            }
            Controls::Shared(_) => {
                // The shared control, at the bank's first position.
                let image = images.first().map_or(0, |&c| c);
                let position = first & 63;
                record.controls[position as usize] = image;
                (1 << position, u64::from(image == 0) << position)
            }
        };
        record.controls_known |= recorded;
        record.controls_zero = record.controls_zero & !recorded | zero;
    }
    Ok(())
}

/// Loads the counters of `set` from `ctx` onto hardware `record` describes, on which nothing
/// counts (the global control is 0, or every control is): every value the hardware is not
/// known to hold first, then every control that differs from the record — the context's
/// image for the counters of `set`, 0 for every other counter of `present` whose control is
/// not known to be 0 (a stale control of another context must never count when this one
/// enables that counter globally). Afterwards the values of `set` are unknown (they move)
/// and the controls known. The vendor writes its global control last. A fault leaves
/// `record` knowing nothing.
pub fn load<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    let result = load_recorded(banks, ctx, set, present, hw, record);
    if result.is_err() {
        record.forget();
    }
    result
}

fn load_recorded<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    // Each pass first asks whether the record already holds everything (a vCPU switched back
    // in where it was saved, with nothing in between, writes nothing): one compare per
    // counter without a bus call in the loop. Only otherwise does it go counter by counter.
    for (bank, map) in banks.iter().enumerate() {
        let own = map.indices(set).0;
        if own == 0 {
            continue;
        }
        let first = map.first_bit;
        let values = ctx.values(bank);
        // A counter without a slot in the context is never written.
        let known = map.indices(CounterSet(record.values_known)).0;
        if !held(&record.values, first, own & slots(values.len()), known, values) {
            write_values(map, values, own, hw, record)?;
        }
        record.values_known &= !map.set(own).0;
    }
    for (bank, map) in banks.iter().enumerate() {
        let own = map.indices(set).0;
        let first = map.first_bit;
        match map.controls {
            Controls::PerCounter(series) => {
                // A control another context left on a counter this one does not use must be
                // 0: not known 0 means a write.
                let stale = map.indices(present).0 & !map.indices(record.zero_controls()).0;
                if own | stale == 0 {
                    continue;
                }
                let images = ctx.hardware_controls(bank);
                let known = map.indices(CounterSet(record.controls_known)).0;
                // A counter without a slot in the context has the image 0.
                if stale & !own != 0
                    || !held_or_zero(&record.controls, first, own, known, images)
                {
                    write_controls(first, series, images, own, stale, hw, record)?;
                }
            }
            Controls::Shared(msr) => {
                let target = if own != 0 {
                    ctx.hardware_controls(bank).first().map_or(0, |&c| c)
                } else {
                    0
                };
                if !record.knows_control(first, target) {
                    hw.write(msr, target)?;
                    record.set_control(first, Some(target));
                }
            }
        }
    }
    Ok(())
}

/// The values of `own` the record does not know the hardware holds, written (out of line:
/// the load's compare loops stay free of bus calls).
#[cold]
#[inline(never)]
fn write_values<B: MsrBus>(
    map: &BankMap,
    values: &[u64],
    own: u32,
    hw: &mut B,
    record: &HwRecord,
) -> Result<(), MsrFault> {
    let mut bits = own;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        if let Some(&value) = values.get(index as usize) {
            if !record.knows_value(map.first_bit + index, value) {
                map.write_counter(hw, index, value)?;
            }
        }
    }
    Ok(())
}

/// The controls of `own` (their images) and of `stale` (0) that the record does not know the
/// hardware holds, written and recorded, lowest index first.
#[cold]
#[inline(never)]
fn write_controls<B: MsrBus>(
    first: u32,
    series: MsrSeries,
    images: &[u64],
    own: u32,
    stale: u32,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    let mut bits = own | stale;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        let target = if own >> index & 1 != 0 {
            images.get(index as usize).map_or(0, |&c| c)
        } else {
            0
        };
        let bit = first + index;
        if !record.knows_control(bit, target) {
            hw.write(series.at(index), target)?;
            record.set_control(bit, Some(target));
        }
    }
    Ok(())
}

/// The indices `0..len` as a bitmap.
#[inline]
fn slots(len: usize) -> u32 {
    if len >= 32 {
        u32::MAX
    } else {
        (1u32 << len) - 1
    }
}

/// The 32 record positions of a bank whose counter 0 is at `first` (`None` if they do not fit,
/// which no vendor's map has: the caller then takes the counter-by-counter path).
#[inline]
fn window(recorded: &[u64; 64], first: u32) -> Option<&[u64; 32]> {
    recorded
        .get(first as usize..)?
        .get(..32)?
        .try_into()
        .ok()
}

/// Whether every counter of `own` (each with a slot in `values`) is known (`known`, by index) to
/// hold its value in `values` on the hardware.
#[inline]
fn held(recorded: &[u64; 64], first: u32, own: u32, known: u32, values: &[u64]) -> bool {
    if own & !known != 0 {
        return false;
    }
    let Some(window) = window(recorded, first) else {
        return false;
    };
    let mut differ = 0u64;
    let mut bits = own;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        differ |= values.get(index as usize).map_or(0, |&v| v ^ window[(index & 31) as usize]);
    }
    differ == 0
}

/// As [`held`], for controls: a counter without a slot in `images` has the image 0.
#[inline]
fn held_or_zero(recorded: &[u64; 64], first: u32, own: u32, known: u32, images: &[u64]) -> bool {
    if own & !known != 0 {
        return false;
    }
    let Some(window) = window(recorded, first) else {
        return false;
    };
    let mut differ = 0u64;
    let mut bits = own;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        differ |= images.get(index as usize).map_or(0, |&c| c) ^ window[(index & 31) as usize];
    }
    differ == 0
}

/// Writes the saved values of the counters of `set` to the hardware, without their controls:
/// what putting a counter in use while the context is loaded starts with.
pub fn write_counters<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
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
pub fn overflow<C: CounterBanks + ?Sized, const N: usize>(
    banks: &[BankMap; N],
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

fn read_counters<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &mut C,
    set: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        for index in map.indices(set) {
            let value = map.read_counter(hw, index)?;
            if let Some(slot) = ctx.saved_mut(bank).0.get_mut(index as usize) {
                *slot = value;
                record.set_value(map.first_bit + index, Some(value));
            }
        }
    }
    Ok(())
}

/// Writes 0 to the non-zero hardware controls of the counters of `set` (stopping them) and
/// records them 0. A shared control is written once, if any counter of its bank is in `set`.
fn clear_controls<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    for (bank, map) in banks.iter().enumerate() {
        let controls = ctx.hardware_controls(bank);
        let mut clear = |msr, bit, control: u64| {
            if control != 0 {
                hw.write(msr, 0)?;
            }
            record.set_control(bit, Some(0));
            Ok(())
        };
        match map.controls {
            Controls::PerCounter(series) => {
                for index in map.indices(set) {
                    let control = controls.get(index as usize).map_or(0, |&c| c);
                    clear(series.at(index), map.first_bit + index, control)?;
                }
            }
            Controls::Shared(msr) => {
                if map.indices(set).0 != 0 {
                    clear(msr, map.first_bit, controls.first().map_or(0, |&c| c))?;
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
    #[inline]
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
        fn saved_mut(&mut self, bank: usize) -> (&mut [u64], &[u64]) {
            if bank == 0 {
                (&mut self.gp, &self.gp_ctl)
            } else {
                (&mut self.fixed, core::slice::from_ref(&self.fixed_ctl))
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
    fn load_writes_what_the_record_does_not_know() {
        let mut hw = Trace::default();
        let set = CounterSet(0b0011 | 1 << 33);
        let present = CounterSet(0b1111 | 0b111 << 32);
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        load(&BANKS, &ctx(), set, present, &mut hw, &mut record).unwrap();
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
        // Saved and loaded again with nothing in between: the counters are read, nothing is
        // written.
        let mut c = ctx();
        let mut hw = Trace::default();
        save(
            &BANKS,
            &mut c,
            set,
            SaveControls::Keep,
            &mut hw,
            &mut record,
        )
        .unwrap();
        assert!(hw.log().iter().all(|&(write, ..)| !write));
        let mut hw = Trace::default();
        load(&BANKS, &c, set, present, &mut hw, &mut record).unwrap();
        assert_eq!(hw.log(), []);
        // Another context on counter 2 only: its value and control, and the stale controls
        // of counter 0 and of the fixed bank cleared.
        let mut other = ctx();
        other.gp_ctl = [0, 0, 0x13, 0];
        let mut hw = Trace::default();
        load(
            &BANKS,
            &other,
            CounterSet::gp(2),
            present,
            &mut hw,
            &mut record,
        )
        .unwrap();
        assert_eq!(
            hw.log(),
            [
                (true, 0x205, 3),
                (true, 0x200, 0),
                (true, 0x204, 0x13),
                (true, 0x38d, 0)
            ]
        );
    }

    #[test]
    fn save_keeps_or_clears_controls() {
        let set = CounterSet(0b0101);
        let read = |msr: u32| u64::from(msr) << 32 | 0xffff_ffff;
        let mut first = ctx();
        let mut hw = Trace::default();
        let mut record = HwRecord::unknown();
        save(
            &BANKS,
            &mut first,
            set,
            SaveControls::Keep,
            &mut hw,
            &mut record,
        )
        .unwrap();
        let reads = [(false, 0x201, read(0x201)), (false, 0x205, read(0x205))];
        let clears = [(true, 0x200, 0), (true, 0x204, 0)];
        assert_eq!(hw.log(), reads);
        assert_eq!(first.gp[2], read(0x205) & 0xffff_ffff_ffff);
        assert!(record.knows_control(0, 0x11) && record.knows_value(2, first.gp[2]));
        let mut hw = Trace::default();
        save(
            &BANKS,
            &mut ctx(),
            set,
            SaveControls::Clear,
            &mut hw,
            &mut record,
        )
        .unwrap();
        assert_eq!(hw.log()[..2], clears);
        assert_eq!(hw.log()[2..], reads);
        assert!(record.knows_control(0, 0) && record.knows_control(2, 0));
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
