//! Ring mode's re-arm (`PmuBackend::rearm_overflowed`) against the software model, with and
//! without full-width writes: after an overflow found by `handle_overflow`, a general-purpose
//! or fixed counter with a period is re-armed on the hardware to carry what it counted past
//! its wrap (through IA32_A_PMCx with full-width writes, IA32_PMCx without, whose sign
//! extension gives the same value for every period up to 2^31 − 1), counts to its next
//! overflow after exactly the rest of the period, and leaves nothing in the virtual
//! GLOBAL_STATUS; a counter without a period is left alone.

mod common;

use common::*;
use vpmu::{CounterSet, PmuBackend, RearmPeriods};
use vpmu_models::HwEvent;

const FIXED_CTR_CTRL_PMI_OS_USR: u64 = 0b1011;

#[test]
fn overflowed_counters_are_re_armed_with_their_overshoot() {
    for (name, mut m) in [("v5", Machine::v5()), ("v2", Machine::v2())] {
        let mut v = m.vcpu();
        m.load(&mut v);
        for period in [1000u64, (1 << 31) - 1] {
            let mask = (1u64 << 48) - 1;
            m.set(
                &mut v,
                EVTSEL0,
                INSTRUCTIONS | ENABLE_ALL_RINGS | EVTSEL_INT,
            );
            m.set(&mut v, PMC0, period.wrapping_neg() & 0xffff_ffff);
            m.set(&mut v, PMC0 + 1, 0);
            m.set(
                &mut v,
                EVTSEL0 + 1,
                INSTRUCTIONS | ENABLE_ALL_RINGS | EVTSEL_INT,
            );
            m.set(&mut v, FIXED_CTR0, period.wrapping_neg() & mask);
            m.set(&mut v, FIXED_CTR_CTRL, FIXED_CTR_CTRL_PMI_OS_USR);
            m.set(&mut v, GLOBAL_CTRL, 0b11 | 1 << 32);
            let mut periods = RearmPeriods::default();
            periods.gp[0] = period;
            periods.fixed[0] = period;
            for round in 1..=4u64 {
                let events = if round == 1 { period + 9 } else { period };
                m.run(HwEvent::Instructions, events, KERNEL);
                let overflow = m
                    .pmu
                    .handle_overflow(&mut v.ctx, &mut m.hw)
                    .expect("the model never faults");
                let both = CounterSet::gp(0).union(CounterSet::fixed(0));
                assert_eq!(overflow.counters, both, "{name} {period} round {round}");
                m.pmu
                    .rearm_overflowed(&mut v.ctx, &mut m.hw, overflow.counters, &periods)
                    .expect("the model never faults");
                let rearmed = 9u64.wrapping_sub(period) & mask;
                assert_eq!(
                    m.get(&mut v, PMC0),
                    rearmed,
                    "{name} {period} round {round}"
                );
                assert_eq!(m.get(&mut v, FIXED_CTR0), rearmed, "{name} {period}");
                assert_eq!(m.get(&mut v, GLOBAL_STATUS) & both.0, 0, "{name}: status");
            }
            // Counter 1 (no period) counted 4 periods and 9 from 0: left alone.
            let before = m.get(&mut v, PMC0 + 1);
            let overflow = CounterSet::gp(1);
            m.pmu
                .rearm_overflowed(&mut v.ctx, &mut m.hw, overflow, &periods)
                .expect("no fault");
            assert_eq!(
                m.get(&mut v, PMC0 + 1),
                before,
                "{name}: period 0 left alone"
            );
            m.run(HwEvent::Instructions, period - 10, KERNEL);
            let overflow = m
                .pmu
                .handle_overflow(&mut v.ctx, &mut m.hw)
                .expect("no fault");
            assert!(
                overflow.counters.is_empty(),
                "{name} {period}: one event short"
            );
        }
    }
}
