//! Re-arm periods of the sample ring (ABI 1.4): which counter a period is for, the periods a
//! ring was registered with, and the value an overflowed counter is re-armed with. The
//! vendor backends decide which periods are valid (`PmuBackend::rearm_period_max`, by their
//! WRMSR rule) and write the values (`PmuBackend::rearm_overflowed`).

use crate::backend::CounterSet;

/// One counter of the PMU, by bank and index: what a re-arm period (ring, ABI 1.4) is given
/// for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CounterIndex {
    /// General-purpose counter `i` (Intel IA32_PMCi, AMD PERF_CTRi).
    General(u32),
    /// Intel fixed counter `i` (IA32_FIXED_CTRi).
    Fixed(u32),
}

impl CounterIndex {
    /// The counter as a one-element [`CounterSet`].
    pub const fn set(self) -> CounterSet {
        match self {
            CounterIndex::General(index) => CounterSet::gp(index),
            CounterIndex::Fixed(index) => CounterSet::fixed(index),
        }
    }
}

/// The re-arm periods of a ring (ABI 1.4, `xenpmu_ring_config`'s `period_gp` and
/// `period_fixed`), as the ring's registration verified them: 0 means "not re-armed".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RearmPeriods {
    /// General-purpose counter `i`'s period.
    pub gp: [u64; vpmu_abi::XENPMU_RING_GP_PERIODS],
    /// Fixed counter `i`'s period.
    pub fixed: [u64; vpmu_abi::XENPMU_RING_FIXED_PERIODS],
}

impl RearmPeriods {
    /// The period of the counter at [`CounterSet`] bit `bit` (0: none, or no such slot).
    #[inline]
    pub fn at_bit(&self, bit: u32) -> u64 {
        if bit < CounterSet::FIXED_BASE {
            self.gp.get(bit as usize).copied().unwrap_or(0)
        } else {
            self.fixed
                .get((bit - CounterSet::FIXED_BASE) as usize)
                .copied()
                .unwrap_or(0)
        }
    }

    /// The counters with a non-zero period.
    pub fn armed(&self) -> CounterSet {
        let gp = (0u32..)
            .zip(&self.gp)
            .filter(|&(_, &p)| p != 0)
            .fold(0u64, |bits, (i, _)| bits | CounterSet::gp(i).0);
        let fixed = (0u32..)
            .zip(&self.fixed)
            .filter(|&(_, &p)| p != 0)
            .fold(0u64, |bits, (i, _)| bits | CounterSet::fixed(i).0);
        CounterSet(gp | fixed)
    }
}

/// The value a counter of width `width` bits is re-armed with after it overflowed with a
/// re-arm `period` and counted `since_wrap` events past its wrap (Linux's
/// `x86_perf_event_set_period`): `since_wrap - period` modulo 2^`width`, so that the events
/// between the overflow and the PMI are carried into the next period. A counter that counted a
/// whole period or more past its wrap (a skid longer than the period) keeps the phase:
/// `since_wrap mod period - period`; the whole periods it skipped were never samples. A
/// `period` of 0 leaves the value as it is. The one computation both vendors share; `period`
/// is below 2^(`width` − 1).
#[inline]
pub const fn rearm_value(since_wrap: u64, period: u64, width: u8) -> u64 {
    let mask = if width >= 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    if period == 0 {
        // Not re-armed: the counter keeps counting from its wrapped value.
        return since_wrap & mask;
    }
    let carried = if since_wrap < period {
        since_wrap
    } else {
        since_wrap % period
    };
    carried.wrapping_sub(period) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overshoot_is_carried_into_the_next_period() {
        // Wrapped 3 events ago with period 100: 97 more to the next overflow.
        assert_eq!(rearm_value(3, 100, 48), (1 << 48) - 97);
        assert_eq!(rearm_value(0, 100, 48), (1 << 48) - 100);
        assert_eq!(rearm_value(99, 100, 32), (1 << 32) - 1);
        assert_eq!(rearm_value(5, 1, 64), u64::MAX);
    }

    #[test]
    fn a_skid_past_a_whole_period_keeps_the_phase() {
        assert_eq!(rearm_value(250, 100, 48), (1 << 48) - 50);
        assert_eq!(rearm_value(200, 100, 48), (1 << 48) - 100);
    }

    #[test]
    fn period_zero_leaves_the_value() {
        assert_eq!(rearm_value(7, 0, 48), 7);
        assert_eq!(rearm_value(u64::MAX, 0, 48), (1 << 48) - 1);
    }

    #[test]
    fn periods_by_counter_set_bit() {
        let mut periods = RearmPeriods::default();
        periods.gp[2] = 10;
        periods.fixed[1] = 20;
        assert_eq!(periods.at_bit(2), 10);
        assert_eq!(periods.at_bit(CounterSet::FIXED_BASE + 1), 20);
        assert_eq!(periods.at_bit(CounterSet::FIXED_BASE + 9), 0);
        assert_eq!(periods.at_bit(9), 0);
        assert_eq!(
            periods.armed(),
            CounterSet::gp(2).union(CounterSet::fixed(1))
        );
        assert_eq!(CounterIndex::Fixed(1).set(), CounterSet::fixed(1));
    }
}
