//! Ring mode (ABI 1.4): the largest re-arm period of each counter, and the re-arm at a PMI.
//!
//! Every AMD core counter is 48 bits wide and takes any value within its width by WRMSR, so a
//! period *p* is valid for a present counter exactly when 1 ≤ *p* ≤ 2^47 − 1: the value
//! `-p` then has the top bit set, which is also what overflow detection before PerfMonV2
//! relies on. There are no fixed counters.
//!
//! The re-arm reads each overflowed counter with a period (what it counted since it wrapped)
//! and writes `v - p`; before PerfMonV2 the counter is armed again for the top-bit rule. With
//! PerfMonV2 the overflow was read and acknowledged by `handle_overflow` (GlobalStatus,
//! GlobalStatusClr); before it, `handle_overflow` read the candidate counters themselves.

use vpmu::{CounterIndex, CounterSet, MsrBus, MsrFault, RearmPeriods, rearm_value};

use crate::backend::AmdPmu;
use crate::context::AmdContext;
use crate::msrs::{COUNTER_TOP_BIT, COUNTER_WIDTH};

/// The largest period `wrmsr(PERF_CTRi, -p)` re-arms exactly.
const PERIOD_MAX: u64 = (1 << (COUNTER_WIDTH - 1)) - 1;

impl AmdPmu {
    /// See `PmuBackend::rearm_period_max`.
    pub(crate) fn period_max(&self, counter: CounterIndex) -> Option<u64> {
        match counter {
            CounterIndex::General(index) if index < self.caps().gp_counters() => Some(PERIOD_MAX),
            _ => None,
        }
    }

    /// See `PmuBackend::rearm_overflowed`: per re-armed counter one read and one write.
    pub(crate) fn rearm(
        &self,
        ctx: &mut AmdContext,
        hw: &mut impl MsrBus,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault> {
        // Only counters in use are on the hardware (and only they can have overflowed there).
        let due = overflowed
            .intersection(periods.armed())
            .intersection(ctx.in_use);
        let bank = self.bank();
        for index in due.gp_indices() {
            let since_wrap = bank.read_counter(hw, index)?;
            let value = rearm_value(since_wrap, periods.at_bit(index), COUNTER_WIDTH as u8);
            bank.write_counter(hw, index, value)?;
            // The context's value is stale while loaded (the hardware holds it); only the
            // top-bit rule's record of armed counters follows the write.
            if value & COUNTER_TOP_BIT != 0 {
                ctx.armed = ctx.armed.union(CounterSet::gp(index));
            }
        }
        ctx.global_status &= !overflowed.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::{AmdCaps, PmuShape};

    fn pmu(shape: PmuShape) -> AmdPmu {
        AmdPmu::new(AmdCaps::from_shape(shape).expect("a shape")).expect("fits the page")
    }

    #[test]
    fn every_present_counter_takes_periods_up_to_half_its_range() {
        for (shape, counters) in [
            (PmuShape::LegacyK7, 4),
            (PmuShape::PerfCtrExtCore, 6),
            (PmuShape::PerfMonV2 { counters: 5 }, 5),
        ] {
            let p = pmu(shape);
            for index in 0..counters {
                assert_eq!(
                    p.period_max(CounterIndex::General(index)),
                    Some((1 << 47) - 1),
                    "{shape:?} counter {index}"
                );
            }
            assert_eq!(p.period_max(CounterIndex::General(counters)), None);
        }
    }

    #[test]
    fn there_are_no_fixed_counters() {
        let p = pmu(PmuShape::PerfMonV2 { counters: 6 });
        for index in [0, 1, 3, 31] {
            assert_eq!(p.period_max(CounterIndex::Fixed(index)), None);
        }
    }

    #[test]
    fn a_re_armed_value_has_the_top_bit_set() {
        for period in [1, 1000, PERIOD_MAX] {
            for since_wrap in [0, period / 2, period - 1] {
                let value = rearm_value(since_wrap, period, COUNTER_WIDTH as u8);
                assert_ne!(value & COUNTER_TOP_BIT, 0, "{since_wrap} past {period}");
                assert_eq!(value.wrapping_add(period - since_wrap) & ((1 << 48) - 1), 0);
            }
        }
    }
}
