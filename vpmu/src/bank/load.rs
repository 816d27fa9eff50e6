//! Loading a context's banks: compare with the pCPU's record first, write only what differs.

use super::{BankMap, Controls, CounterBanks, HwRecord, MsrSeries, slots};
use crate::backend::CounterSet;
use crate::msr::{MsrBus, MsrFault};

/// Loads the counters of `set` from `ctx` onto hardware `record` describes, on which nothing
/// counts (the global control is 0, or every control is): every value the hardware is not
/// known to hold first, then every control that differs from the record — the context's
/// image for the counters of `set`, 0 for every other counter of `present` whose control is
/// not known to be 0 (a stale control of another context must never count when this one
/// enables that counter globally). Afterwards the values of `set` are unknown (they move)
/// and the controls known. The vendor writes its global control last. A fault leaves
/// `record` knowing nothing.
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
    // The common case first (a vCPU switched back in where it was saved, with nothing in
    // between): the record holds every value and control, and no control another context
    // left needs clearing. One pass per bank compares values and controls together; nothing
    // is written but the record's note that the values will move.
    if held_everywhere(banks, ctx, set, present, record) {
        for map in banks {
            record.values_known &= !map.set(map.indices(set).0).0;
        }
        return Ok(());
    }
    let result = load_recorded(banks, ctx, set, present, hw, record);
    if result.is_err() {
        record.forget();
    }
    result
}

/// Whether loading the counters of `set` would write nothing: [`bank_held`] for every bank.
/// The first two banks are written out (every vendor has one or two), so that each copy is
/// specialised to its map.
#[inline(always)]
fn held_everywhere<C: CounterBanks + ?Sized, const N: usize>(
    banks: &[BankMap; N],
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    record: &HwRecord,
) -> bool {
    if let Some(map) = banks.first() {
        if !bank_held(map, 0, ctx, set, present, record) {
            return false;
        }
    }
    if let Some(map) = banks.get(1) {
        if !bank_held(map, 1, ctx, set, present, record) {
            return false;
        }
    }
    // Any further banks (no vendor has them), behind a test of the constant N.
    N <= 2 || (2..N).all(|bank| bank_held(&banks[bank], bank, ctx, set, present, record))
}

/// Whether the record knows bank `bank` to hold what loading the counters of `set` would
/// write: every value of a counter of `set` with a slot, every control of a counter of `set`
/// (its image, 0 without a slot), and 0 in every other control of `present` (what
/// [`load_recorded`] decides counter by counter, decided here without a write).
#[inline(always)]
fn bank_held<C: CounterBanks + ?Sized>(
    map: &BankMap,
    bank: usize,
    ctx: &C,
    set: CounterSet,
    present: CounterSet,
    record: &HwRecord,
) -> bool {
    let own = map.indices(set).0;
    let first = map.first_bit;
    if let (Controls::Shared(_), 0) = (map.controls, own) {
        // A shared-control bank the context does not use (Intel's fixed bank, mostly):
        // nothing to compare, only whether the control must be cleared, which the record's
        // known-zero controls answer at once (known and 0 is exactly a bit there).
        return record.zero_controls().0 >> (first & 63) & 1 != 0;
    }
    let (Some(recorded_values), Some(recorded_controls)) = (
        window(&record.values, first),
        window(&record.controls, first),
    ) else {
        return false;
    };
    let values = ctx.values(bank);
    let with_value = own & slots(values.len());
    if with_value & !map.indices(CounterSet(record.values_known)).0 != 0 {
        return false;
    }
    match map.controls {
        Controls::PerCounter(_) => {
            let stale = map.indices(present).0 & !map.indices(record.zero_controls()).0;
            if stale & !own != 0 || own & !map.indices(CounterSet(record.controls_known)).0 != 0 {
                return false;
            }
            let images = ctx.hardware_controls(bank);
            let with_image = own & slots(images.len());
            let mut differ = 0u64;
            // Values and controls in one pass where both have slots (every vendor's case), by
            // an index the masks keep in range.
            let mut bits = with_value & with_image;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                let position = (index & 31) as usize;
                differ |= values[index as usize] ^ recorded_values[position];
                differ |= images[index as usize] ^ recorded_controls[position];
            }
            let mut bits = with_value & !with_image;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                differ |= values[index as usize] ^ recorded_values[(index & 31) as usize];
            }
            // A counter without an image slot has the image 0.
            let mut bits = own & !with_image;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                differ |= recorded_controls[(index & 31) as usize];
            }
            differ == 0
        }
        Controls::Shared(_) => {
            let mut differ = 0u64;
            let mut bits = with_value;
            while bits != 0 {
                let index = bits.trailing_zeros();
                bits &= bits - 1;
                differ |= values[index as usize] ^ recorded_values[(index & 31) as usize];
            }
            let target = if own != 0 {
                ctx.hardware_controls(bank).first().map_or(0, |&c| c)
            } else {
                0
            };
            differ == 0 && record.knows_control(first, target)
        }
    }
}

// Always inlined: a vendor that hands in a constant map gets it folded into the loops.
#[inline(always)]
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
        if !held(
            &record.values,
            first,
            own & slots(values.len()),
            known,
            values,
        ) {
            write_values(*map, values, own, hw, record)?;
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
                if stale & !own != 0 || !held_or_zero(&record.controls, first, own, known, images) {
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
/// the load's compare loops stay free of bus calls). The map is taken by value so that a
/// caller with a constant map does not build it in memory on the path that never gets here.
#[cold]
#[inline(never)]
fn write_values<B: MsrBus>(
    map: BankMap,
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

/// The 32 record positions of a bank whose counter 0 is at `first` (`None` if they do not fit,
/// which no vendor's map has: the caller then takes the counter-by-counter path).
#[inline]
fn window(recorded: &[u64; 64], first: u32) -> Option<&[u64; 32]> {
    recorded.get(first as usize..)?.get(..32)?.try_into().ok()
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
        differ |= values
            .get(index as usize)
            .map_or(0, |&v| v ^ window[(index & 31) as usize]);
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
    // The counters with a slot first, by an index the mask keeps in range (with a vendor's
    // constant slot count the compiler sees that and checks no bound in the loop).
    let slotted = own & slots(images.len());
    let mut differ = 0u64;
    let mut bits = slotted;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        differ |= images[index as usize] ^ window[(index & 31) as usize];
    }
    let mut bits = own & !slotted;
    while bits != 0 {
        let index = bits.trailing_zeros();
        bits &= bits - 1;
        differ |= window[(index & 31) as usize];
    }
    differ == 0
}
