//! Loading a context's banks: compare with the pCPU's record, write only what differs.

use super::{BankMap, Controls, CounterBanks, HwRecord, MsrSeries, slots, window_mut};
use crate::backend::CounterSet;
use crate::msr::{MsrBus, MsrFault};

/// Loads the counters of `set` from `ctx` onto hardware `record` describes, on which nothing
/// counts (the global control is 0, or every control is): per counter of `set`, lowest index
/// first, its value unless the hardware is known to hold it, then its control (the context's
/// image) unless known; then 0 in every other control of `present` not known to be 0 (a stale
/// control of another context must never count when this one enables that counter
/// globally); a shared control (Intel's FIXED_CTR_CTRL) after its bank's values. Afterwards
/// the values of `set` are unknown (they move) and the controls known. The vendor writes its
/// global control last. A fault leaves `record` knowing nothing.
///
/// One pass per bank compares each counter's value and control with the record and writes
/// at once what differs: a vCPU switched back in where it was saved, with nothing in
/// between, writes nothing; after another busy context, the pass writes as it compares.
///
/// Always inlined, so that a vendor's constant map is folded into it (AMD calls it from two
/// places, one per map, which the compiler's heuristics would otherwise keep out of line).
#[inline(always)]
pub fn load<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    let result = load_banks(banks, ctx, set, present, hw, record);
    if result.is_err() {
        record.forget();
    }
    result
}

/// [`load_bank`] for every bank. The first two banks are written out (every vendor has one
/// or two), so that each copy is specialised to its map; any further banks behind a test of
/// the constant N.
#[inline(always)]
fn load_banks<C: CounterBanks + ?Sized, B: MsrBus, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    if let Some(map) = banks.first() {
        load_bank(map, 0, ctx, set, present, hw, record)?;
    }
    if let Some(map) = banks.get(1) {
        load_bank(map, 1, ctx, set, present, hw, record)?;
    }
    if N > 2 {
        for (bank, map) in banks.iter().enumerate().skip(2) {
            load_bank(map, bank, ctx, set, present, hw, record)?;
        }
    }
    Ok(())
}

/// Loads bank `bank` (whose map is `map`) as [`load`] describes.
#[inline(always)]
fn load_bank<C: CounterBanks + ?Sized, B: MsrBus>(
    map: &BankMap,
    bank: usize,
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    let own = map.indices(set).0;
    let first = map.first_bit;
    let series = match map.controls {
        Controls::PerCounter(series) => series,
        Controls::Shared(msr) => {
            // A shared-control bank the context does not use (Intel's fixed bank, mostly):
            // only its control, cleared unless known 0 (one bit of the record).
            let target = if own != 0 {
                load_values(map, ctx.values(bank), own, hw, record)?;
                record.values_known &= !map.set(own).0;
                ctx.hardware_controls(bank).first().map_or(0, |&c| c)
            } else {
                0
            };
            if !record.knows_control(first, target) {
                hw.write(msr, target)?;
                record.set_control(first, Some(target));
            }
            return Ok(());
        }
    };
    // A control another context left on a counter this one does not use must be 0: not
    // known 0 means a write.
    let zero = map.indices(record.zero_controls()).0;
    let stale = map.indices(present).0 & !zero & !own;
    if own | stale == 0 {
        return Ok(());
    }
    let values = ctx.values(bank);
    let images = ctx.hardware_controls(bank);
    let known_values = map.indices(CounterSet(record.values_known)).0;
    let known_controls = map.indices(CounterSet(record.controls_known)).0;
    let both = own & slots(values.len()) & slots(images.len());
    let (Some(recorded_values), Some(recorded_controls), 0) = (
        window_mut(&mut record.values, first),
        window_mut(&mut record.controls, first),
        own & !both,
    ) else {
        // A counter without a slot, or a record window that does not fit (no vendor's).
        let writes = map.counter_writes;
        return load_bank_by_record(
            first, writes, series, values, images, own, stale, hw, record,
        );
    };
    // A position the record does not know gets the complement of what is to be loaded, so
    // that the pass below tells "differs" by one compare: its content means nothing while
    // unknown, and the values of `own` are unknown after the load anyway. Rarely any: the
    // save before recorded every counter it read.
    // One test for both kinds in the usual case.
    if own & !(known_values & known_controls) != 0 {
        let mut bits = own & !known_values;
        while bits != 0 {
            let index = bits.trailing_zeros();
            bits &= bits - 1;
            recorded_values[(index & 31) as usize] = !values[index as usize];
        }
        let mut bits = own & !known_controls;
        while bits != 0 {
            let index = bits.trailing_zeros();
            bits &= bits - 1;
            recorded_controls[(index & 31) as usize] = !images[index as usize];
        }
    }
    // By an index the masks keep in range: with a vendor's constant slot counts the compiler
    // checks no bound in the loop.
    let mut bits = own;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        let position = (index & 31) as usize;
        let value = values[index as usize];
        if recorded_values[position] != value {
            map.write_counter(hw, index, value)?;
        }
        let image = images[index as usize];
        if recorded_controls[position] != image {
            hw.write(series.at(index), image)?;
            recorded_controls[position] = image;
        }
    }
    // Not known 0 by the mask may still be known 0 by the record (the mask is a subset: see
    // `HwRecord::zero_controls`): only a control the record does not know to be 0 is written.
    let mut bits = stale;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        let position = (index & 31) as usize;
        if known_controls >> index & 1 == 0 || recorded_controls[position] != 0 {
            hw.write(series.at(index), 0)?;
            recorded_controls[position] = 0;
        }
    }
    // Every control of `own` now holds its image (written, or known to hold it already) and
    // every stale one 0. The controls of `own` leave the known-0 mask (an image of 0 is rare:
    // the mask may miss it, and leaving it is allowed to one already there), the stale ones
    // join it. Unconditionally: a flag for "a control was written" cost a store per control
    // written, more than these few masks when a context with other events comes in.
    let (own, stale) = (map.set(own).0, map.set(stale).0);
    record.values_known &= !own;
    record.controls_known |= own | stale;
    record.controls_zero = record.controls_zero & !own | stale;
    Ok(())
}

/// The values of `own` the record does not know the hardware holds, written (the record is
/// not updated: the caller marks them unknown).
#[inline(always)]
fn load_values<B: MsrBus>(
    map: &BankMap,
    values: &[u64],
    own: u32,
    hw: &mut B,
    record: &HwRecord,
) -> Result<(), MsrFault> {
    let known = map.indices(CounterSet(record.values_known)).0;
    let Some(recorded) = window(&record.values, map.first_bit) else {
        return write_values(map.first_bit, map.counter_writes, values, own, hw, record);
    };
    // A counter without a slot in the context is never written.
    let mut bits = own & slots(values.len());
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        let value = values[index as usize];
        if known >> index & 1 == 0 || recorded[(index & 31) as usize] != value {
            map.write_counter(hw, index, value)?;
        }
    }
    Ok(())
}

/// [`load_bank`] for a per-counter-control bank with a counter of `own` that has no slot in
/// the context, or whose record window does not fit (no vendor's): counter by counter
/// through the record's accessors, values first.
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn load_bank_by_record<B: MsrBus>(
    first: u32,
    writes: MsrSeries,
    series: MsrSeries,
    values: &[u64],
    images: &[u64],
    own: u32,
    stale: u32,
    hw: &mut B,
    record: &mut HwRecord,
) -> Result<(), MsrFault> {
    write_values(first, writes, values, own, hw, record)?;
    record.values_known &= !(u64::from(own) << first);
    write_controls(first, series, images, own, stale, hw, record)
}

/// The values of `own` the record does not know the hardware holds, written through `writes`
/// (where the record's window does not fit, which no vendor's map has). Only the two fields
/// of the map it needs are passed, in registers, so that a caller with a constant map does
/// not build the map in memory for the path that never gets here.
#[cold]
#[inline(never)]
fn write_values<B: MsrBus>(
    first: u32,
    writes: MsrSeries,
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
            if !record.knows_value(first + index, value) {
                hw.write(writes.at(index), value)?;
            }
        }
    }
    Ok(())
}

/// The controls of `own` (their images, 0 without a slot) and of `stale` (0) that the record
/// does not know the hardware holds, written and recorded, lowest index first.
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

/// The 32 record positions of a bank whose counter 0 is at `first` (`None` if they do not fit,
/// which no vendor's map has: the caller then goes counter by counter).
#[inline]
fn window(recorded: &[u64; 64], first: u32) -> Option<&[u64; 32]> {
    recorded.get(first as usize..)?.get(..32)?.try_into().ok()
}
