//! Ring mode (ABI 1.4): the largest re-arm period of each counter, and the re-arm at a PMI.
//!
//! Periods follow the WRMSR rule: a period *p* is valid for a counter exactly when a guest's
//! `wrmsr(counter, -p)` would arm it to overflow after *p* events. A general-purpose counter
//! written through IA32_A_PMCx (full-width writes) takes any value within its width, so
//! *p* ≤ 2^(*w*−1) − 1; without full-width writes the only alias is IA32_PMCx, which
//! sign-extends bit 31, so *p* ≤ 2^31 − 1 as well. Fixed counters take any value within their
//! width: *p* ≤ 2^(*wf*−1) − 1.
//!
//! The re-arm itself reads each overflowed counter with a period (what it counted since it
//! wrapped) and writes `v - p` through the alias the context switch writes with (the
//! full-width one when enumerated, else the legacy one, which is exact for these values: they
//! lie within 2^31 below the wrap, bits 31 up to the width all set). The counters keep
//! counting meanwhile: the events between the read and the write are the re-arm's own skid.

use vpmu::bank::BankMap;
use vpmu::{CounterIndex, CounterSet, MsrBus, MsrFault, RearmPeriods, rearm_value};

use crate::backend::IntelPmu;
use crate::context::{FIXED_BANK, GP_BANK, IntelContext};

/// The largest period `wrmsr(counter, -p)` re-arms exactly on a counter of `width` bits.
const fn half_range(width: u8) -> u64 {
    (1u64 << (width - 1)) - 1
}

/// The largest period of the legacy IA32_PMCx alias, which sign-extends bit 31.
const LEGACY_PERIOD_MAX: u64 = (1 << 31) - 1;

impl IntelPmu {
    /// See `PmuBackend::rearm_period_max`.
    pub(crate) fn period_max(&self, counter: CounterIndex) -> Option<u64> {
        match counter {
            CounterIndex::General(index) if self.caps.has_gp(index) => {
                let exact = half_range(self.caps.gp_width());
                Some(if self.caps.full_width_writes() {
                    exact
                } else {
                    exact.min(LEGACY_PERIOD_MAX)
                })
            }
            CounterIndex::Fixed(index) if self.caps.has_fixed(index) => {
                Some(half_range(self.caps.fixed_width()))
            }
            _ => None,
        }
    }

    /// See `PmuBackend::rearm_overflowed`: per re-armed counter one read and one write; the
    /// overflow (read and acknowledged by `collect_overflow`) leaves the virtual status.
    pub(crate) fn rearm(
        &self,
        ctx: &mut IntelContext,
        hw: &mut impl MsrBus,
        overflowed: CounterSet,
        periods: &RearmPeriods,
    ) -> Result<(), MsrFault> {
        // Only counters in use are on the hardware (and only they can have overflowed there).
        let due = overflowed
            .intersection(periods.armed())
            .intersection(ctx.in_use);
        if !due.is_empty() {
            let (gp_width, fixed_width) = (self.caps.gp_width(), self.caps.fixed_width());
            rearm_bank(&self.msr_banks[GP_BANK], hw, due, periods, gp_width)?;
            rearm_bank(&self.msr_banks[FIXED_BANK], hw, due, periods, fixed_width)?;
        }
        ctx.global_status &= !overflowed.0;
        Ok(())
    }
}

/// Re-arms the counters of `due` in `bank`.
fn rearm_bank(
    bank: &BankMap,
    hw: &mut impl MsrBus,
    due: CounterSet,
    periods: &RearmPeriods,
    width: u8,
) -> Result<(), MsrFault> {
    for index in bank.indices(due) {
        let since_wrap = bank.read_counter(hw, index)?;
        let period = periods.at_bit(bank.first_bit + index);
        bank.write_counter(hw, index, rearm_value(since_wrap, period, width))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::IntelCaps;
    use raw_cpuid::CpuIdResult;

    /// A v5 PMU with `gp` general-purpose counters of `gp_width` bits and 3 fixed counters of
    /// `fixed_width` bits, with or without full-width writes.
    fn pmu(gp_width: u8, fixed_width: u8, full_width: bool) -> IntelPmu {
        let eax = 5 | 4 << 8 | u32::from(gp_width) << 16 | 7 << 24;
        let edx = 3 | u32::from(fixed_width) << 5;
        let reader = move |leaf: u32, _: u32| match leaf {
            0 => CpuIdResult {
                eax: 0xa,
                ebx: 0x756e_6547,
                ecx: 0x6c65_746e,
                edx: 0x4965_6e69,
            },
            // PDCM, so that PERF_CAPABILITIES is consulted.
            1 => CpuIdResult {
                eax: 0,
                ebx: 0,
                ecx: 1 << 15,
                edx: 0,
            },
            0xa => CpuIdResult {
                eax,
                ebx: 0,
                ecx: 0,
                edx,
            },
            _ => CpuIdResult {
                eax: 0,
                ebx: 0,
                ecx: 0,
                edx: 0,
            },
        };
        let capabilities = if full_width { 1 << 13 } else { 0 };
        let caps = IntelCaps::from_cpuid(reader, Some(capabilities)).expect("a v5 PMU");
        assert_eq!(caps.full_width_writes(), full_width);
        IntelPmu::new(caps).expect("fits the page")
    }

    #[test]
    fn general_purpose_periods_follow_the_write_alias() {
        let with = pmu(48, 48, true);
        assert_eq!(
            with.period_max(CounterIndex::General(0)),
            Some((1 << 47) - 1)
        );
        let without = pmu(48, 48, false);
        assert_eq!(
            without.period_max(CounterIndex::General(3)),
            Some((1 << 31) - 1)
        );
        // A 32-bit counter's own half range is the bound either way.
        assert_eq!(
            pmu(32, 48, true).period_max(CounterIndex::General(0)),
            Some((1 << 31) - 1)
        );
        assert_eq!(
            pmu(40, 48, true).period_max(CounterIndex::General(0)),
            Some((1 << 39) - 1)
        );
    }

    #[test]
    fn fixed_periods_follow_the_fixed_width() {
        for full_width in [false, true] {
            let p = pmu(48, 40, full_width);
            assert_eq!(p.period_max(CounterIndex::Fixed(2)), Some((1 << 39) - 1));
        }
    }

    #[test]
    fn absent_counters_have_no_period() {
        let p = pmu(48, 48, true);
        assert_eq!(p.period_max(CounterIndex::General(4)), None);
        assert_eq!(p.period_max(CounterIndex::General(31)), None);
        assert_eq!(p.period_max(CounterIndex::Fixed(3)), None);
        assert_eq!(p.period_max(CounterIndex::Fixed(u32::MAX)), None);
    }
}
