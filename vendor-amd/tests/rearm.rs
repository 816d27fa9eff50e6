//! Ring mode's re-arm (`PmuBackend::rearm_overflowed`) against the software model, on every
//! AMD shape: after an overflow found by `handle_overflow`, a counter with a period is
//! re-armed on the hardware to carry what it counted past its wrap, counts to its next
//! overflow after exactly the rest of the period, is detected again (before PerfMonV2 by the
//! top-bit rule, which the re-arm arms again), and leaves nothing in the virtual status; a
//! counter without a period is left alone.

mod common;

use common::*;
use vpmu::{CounterSet, PmuBackend, RearmPeriods};
use vpmu_models::HwEvent;

fn sampling(v: &mut Vcpu, shape: vpmu_amd::PmuShape, i: u32, period: u64) {
    v.set(ctr_msr(shape, i), period.wrapping_neg() & MASK48);
    v.set(ctl_msr(shape, i), INSTRUCTIONS | OS | USR | INT | EN);
}

#[test]
fn overflowed_counters_are_re_armed_with_their_overshoot() {
    for shape in SHAPES {
        let counters = v_counters(shape);
        let mut v = Vcpu::new(shape);
        let (period, idle) = (1000u64, 6000u64);
        sampling(&mut v, shape, 0, period);
        if counters > 1 {
            sampling(&mut v, shape, 1, idle);
        }
        let mut periods = RearmPeriods::default();
        periods.gp[0] = period;
        for round in 1..=5u64 {
            // Overflow, then 7 more events before the PMI is handled.
            v.run(
                HwEvent::Instructions,
                if round == 1 { period + 7 } else { period },
                KERNEL,
            );
            let overflow = v
                .backend
                .handle_overflow(&mut v.ctx, &mut v.hw)
                .expect("the model never faults");
            assert_eq!(
                overflow.counters,
                CounterSet::gp(0),
                "{shape:?} round {round}"
            );
            assert!(overflow.interrupt);
            v.backend
                .rearm_overflowed(&mut v.ctx, &mut v.hw, overflow.counters, &periods)
                .expect("the model never faults");
            assert_eq!(
                v.value(ctr_msr(shape, 0)),
                7u64.wrapping_sub(period) & MASK48,
                "{shape:?} round {round}: the overshoot carried"
            );
            if v.backend.caps().has_perfmon_v2() {
                assert_eq!(
                    v.value(GLOBAL_STATUS) & 1,
                    0,
                    "{shape:?}: not in the status"
                );
            }
        }
        // Not overflowed again one event short of the period's rest.
        v.run(HwEvent::Instructions, period - 8, KERNEL);
        let overflow = v
            .backend
            .handle_overflow(&mut v.ctx, &mut v.hw)
            .expect("no fault");
        assert!(overflow.counters.is_empty(), "{shape:?}");
        if counters > 1 {
            // 6000 events in all: counter 1 (no period) overflows with counter 0.
            v.run(HwEvent::Instructions, 1, KERNEL);
            let overflow = v
                .backend
                .handle_overflow(&mut v.ctx, &mut v.hw)
                .expect("no fault");
            assert!(
                overflow.counters.contains(CounterSet::gp(1)),
                "{shape:?}: {overflow:?}"
            );
            let before = v.value(ctr_msr(shape, 1));
            v.backend
                .rearm_overflowed(&mut v.ctx, &mut v.hw, overflow.counters, &periods)
                .expect("no fault");
            assert_eq!(
                v.value(ctr_msr(shape, 1)),
                before,
                "{shape:?}: period 0 left alone"
            );
        }
    }
}

fn v_counters(shape: vpmu_amd::PmuShape) -> u32 {
    pmu(shape).gp_counters()
}
