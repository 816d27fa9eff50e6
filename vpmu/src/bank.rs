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
//! the hardware already holds, so a switch costs the accesses of what must change. A load
//! (`bank/load.rs`) makes one pass per bank, comparing each counter's value and control with
//! the record and writing at once what differs: a vCPU switched back in where it was saved,
//! with nothing in between, writes nothing but its global control; after another busy
//! context the same pass writes the values (and the controls that differ) as it goes, with no
//! second comparison. The record itself is in `bank/record.rs`.
//!
//! The loops are generic over the map but meant to be inlined into a vendor's save and load
//! with the map as a constant (every field the enumeration does not decide: Intel's MSR
//! numbers and bank positions, AMD's whole map, one of two): the compiler then folds the
//! MSR arithmetic, the bank positions and the kind of control into each bank's copy, and,
//! with the context's slot count constant too, proves every masked index in range. The
//! save's first two banks are written out rather than left to a loop, so that each copy is
//! specialised whatever the compiler's unrolling heuristics decide. `scripts/instructions.sh`
//! measures the result (the switch rows).
//!
//! The global registers (GLOBAL_CTRL, PerfCntrGlobalCtl) stay with the vendor: when they are
//! written depends on rules that differ (Intel writes GLOBAL_CTRL whenever something is in use,
//! AMD only with PerfMonV2 and a non-zero value). The overflow status register's
//! read-record-acknowledge step is shared ([`StatusMsrs::fold`]).

use crate::backend::{CounterSet, Indices, Overflow};
use crate::msr::{Msr, MsrBus, MsrFault};

mod load;
mod record;
#[cfg(test)]
mod tests;

pub use load::load;
pub use record::HwRecord;

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
    #[inline]
    pub fn read_counter<B: MsrBus>(&self, hw: &mut B, index: u32) -> Result<u64, MsrFault> {
        Ok(hw.read(self.counters.at(index))? & self.value_mask)
    }

    /// Writes counter `index` on the hardware through the alias that stores it exactly.
    #[inline]
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
/// read and the controls left on the hardware. Returns the counters of `set` with a slot in
/// the context whose value read 0 (a vendor that drops idle counters after a save asks only
/// about those). A fault leaves `record` knowing nothing.
///
/// Always inlined, as [`load`] is, so that a vendor's constant map is folded into it (AMD
/// calls it from two places, one per map; an unrelated change elsewhere in a vendor crate
/// once tipped the compiler's heuristics into an out-of-line copy that cost a switch pair
/// 150 instructions).
#[inline(always)]
pub fn save<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &mut C,
    set: CounterSet,
    controls: SaveControls,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<CounterSet, MsrFault> {
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

/// [`SaveControls::Keep`]: per bank, one pass reads the counters and records the values read
/// and, for per-counter controls, the controls left programmed (a shared control is recorded
/// once after it); the record's masks are updated once per bank.
#[inline(always)]
fn save_keeping_controls<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &mut C,
    set: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<CounterSet, MsrFault> {
    // The first two banks written out (every vendor has one or two): each copy is then
    // specialised to its bank, whose map a vendor may hand in as a constant, whatever the
    // compiler's unrolling heuristics make of a loop over them.
    let mut read_zero = 0u64;
    if let Some(map) = banks.first() {
        read_zero |= save_bank_keeping_controls(map, 0, ctx, set, hw, record)?;
    }
    if let Some(map) = banks.get(1) {
        read_zero |= save_bank_keeping_controls(map, 1, ctx, set, hw, record)?;
    }
    // Any further banks (no vendor has them), behind a test of the constant N.
    if N > 2 {
        for (bank, map) in banks.iter().enumerate().skip(2) {
            read_zero |= save_bank_keeping_controls(map, bank, ctx, set, hw, record)?;
        }
    }
    Ok(CounterSet(read_zero))
}

/// [`save_keeping_controls`] for bank `bank`, whose map is `map`; the counters with a slot
/// that read 0, as [`CounterSet`] bits.
#[inline(always)]
fn save_bank_keeping_controls<C: CounterBanks + ?Sized, B: MsrBus>(
    map: &BankMap,
    bank: usize,
    ctx: &mut C,
    set: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<u64, MsrFault> {
    let own = map.indices(set).0;
    if own == 0 {
        return Ok(0);
    }
    let first = map.first_bit;
    let (values, images) = ctx.saved_mut(bank);
    // Every counter of `own` is read; the ones with a slot in the context are recorded.
    let saved = own & slots(values.len());
    if let (Controls::PerCounter(_), Some(recorded_values), Some(recorded_controls)) = (
        map.controls,
        window_mut(&mut record.values, first),
        window_mut(&mut record.controls, first),
    ) {
        // Per-counter controls (every vendor's general-purpose bank): one pass reads each
        // counter and records its value and control together, which a pass per kind would
        // pay the loop's bookkeeping for twice. The counters with both slots first (the lower
        // indices, so the order of the reads is unchanged), by an index the mask keeps in
        // range: with a vendor's constant slot counts the compiler checks no bound.
        let both = saved & slots(images.len());
        let mut read_zero = 0u32;
        let mut bits = both;
        while bits != 0 {
            let index = bits.trailing_zeros();
            bits &= bits - 1;
            let value = map.read_counter(hw, index)?;
            let position = (index & 31) as usize;
            values[index as usize] = value;
            recorded_values[position] = value;
            let image = images[index as usize];
            recorded_controls[position] = image;
            // A branch to an out-of-line update: a counter in use almost never reads 0.
            if value == 0 {
                read_zero = with_bit(read_zero, index);
            }
        }
        // The others (no vendor's): read, the value kept only with a slot, the image 0
        // without one. Only these mark their zero controls in the record's known-0 mask: the
        // mask may miss a zero image (see `HwRecord::zero_controls`), which costs the loop
        // above a test per counter it never needs.
        let mut zero = 0u32;
        let mut bits = own & !both;
        while bits != 0 {
            let index = bits.trailing_zeros();
            bits &= bits - 1;
            let value = map.read_counter(hw, index)?;
            let position = (index & 31) as usize;
            if let Some(slot) = values.get_mut(index as usize) {
                *slot = value;
                recorded_values[position] = value;
                if value == 0 {
                    read_zero = with_bit(read_zero, index);
                }
            }
            let image = images.get(index as usize).map_or(0, |&c| c);
            recorded_controls[position] = image;
            zero |= u32::from(image == 0) << index;
        }
        let recorded = map.set(own).0;
        record.values_known |= map.set(saved).0;
        record.controls_known |= recorded;
        record.controls_zero = record.controls_zero & !recorded | map.set(zero).0;
        return Ok(map.set(read_zero).0);
    }
    let mut read_zero = 0u32;
    let mut bits = own;
    match record.values.get_mut(first as usize..) {
        Some(window) if window.len() >= 32 => {
            // The counters with a slot first (the lower indices, so the order of the
            // reads is unchanged), by an index the mask keeps in range: with a vendor's
            // constant slot count the compiler checks no bound in the loop.
            let mut bits = saved;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                let value = map.read_counter(hw, index)?;
                values[index as usize] = value;
                if let Some(recorded) = window.get_mut((index & 31) as usize) {
                    *recorded = value;
                }
                if value == 0 {
                    read_zero |= 1 << index;
                }
            }
            let mut bits = own & !saved;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                map.read_counter(hw, index)?;
            }
        }
        _ => {
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                let value = map.read_counter(hw, index)?;
                if let Some(slot) = values.get_mut(index as usize) {
                    *slot = value;
                    record.values[((first + index) & 63) as usize] = value;
                    if value == 0 {
                        read_zero |= 1 << index;
                    }
                }
            }
        }
    }
    record.values_known |= map.set(saved).0;
    let (recorded, zero) = match map.controls {
        Controls::PerCounter(_) => {
            let mut zero = 0u32;
            let mut bits = own;
            match record.controls.get_mut(first as usize..) {
                Some(window) if window.len() >= 32 => {
                    // As for the values: the counters with a slot by a masked index, then
                    // the others (image 0).
                    let slotted = own & slots(images.len());
                    let mut bits = slotted;
                    while bits != 0 {
                        let index = bits.trailing_zeros();
                        bits &= bits - 1;
                        let image = images[index as usize];
                        if let Some(slot) = window.get_mut((index & 31) as usize) {
                            *slot = image;
                        }
                        zero |= u32::from(image == 0) << index;
                    }
                    let mut bits = own & !slotted;
                    while bits != 0 {
                        let index = bits.trailing_zeros();
                        bits &= bits - 1;
                        if let Some(slot) = window.get_mut((index & 31) as usize) {
                            *slot = 0;
                        }
                        zero |= 1 << index;
                    }
                }
                _ => {
                    while bits != 0 {
                        let index = bits.trailing_zeros();
                        bits &= bits - 1;
                        let image = images.get(index as usize).map_or(0, |&c| c);
                        record.controls[((first + index) & 63) as usize] = image;
                        zero |= u32::from(image == 0) << index;
                    }
                }
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
    Ok(map.set(read_zero).0)
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
    // Every save asks, and almost every save found nothing.
    if counters.is_empty() {
        return Overflow::default();
    }
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
) -> Result<CounterSet, MsrFault> {
    let mut read_zero = CounterSet::EMPTY;
    for (bank, map) in banks.iter().enumerate() {
        for index in map.indices(set) {
            let value = map.read_counter(hw, index)?;
            if let Some(slot) = ctx.saved_mut(bank).0.get_mut(index as usize) {
                *slot = value;
                record.set_value(map.first_bit + index, Some(value));
                if value == 0 {
                    read_zero = read_zero.union(map.counter(index));
                }
            }
        }
    }
    Ok(read_zero)
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

/// The 32 record positions of a bank whose counter 0 is at `first`, to write (`None` if they
/// do not fit, which no vendor's map has).
#[inline]
fn window_mut(recorded: &mut [u64; 64], first: u32) -> Option<&mut [u64; 32]> {
    recorded
        .get_mut(first as usize..)?
        .get_mut(..32)?
        .try_into()
        .ok()
}

/// `set` with bit `index` added, out of line: called where a counter in use has a zero
/// control, which almost never happens, so that the loop keeps a branch not taken instead of
/// the flag arithmetic (setcc, shift, or) the compiler makes of an inline update.
#[cold]
#[inline(never)]
fn with_bit(set: u32, index: u32) -> u32 {
    set | 1 << (index & 31)
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
