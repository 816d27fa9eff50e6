//! Guest control writes as the intercept emulates them: the hardware accesses each makes (a
//! write that changes nothing on the hardware makes none), the counters a FIXED_CTR_CTRL value
//! puts in use, and the in-use set of a saved context kept write by write.

mod common;

use common::*;
use vpmu::{CounterSet, PmuBackend};

/// A loaded v5 vCPU counting instructions on GP counter 0, enabled globally.
fn loaded_counting() -> (Machine, Vcpu) {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    m.load(&mut vcpu);
    m.set(&mut vcpu, EVTSEL0, ENABLE_ALL_RINGS | INSTRUCTIONS);
    m.set(&mut vcpu, GLOBAL_CTRL, 1);
    (m, vcpu)
}

#[test]
fn a_global_ctrl_write_of_the_value_the_hardware_holds_makes_no_access() {
    let (mut m, mut vcpu) = loaded_counting();
    assert_eq!(m.hw.registers().global_ctrl, 1);
    let before = m.stats();
    m.set(&mut vcpu, GLOBAL_CTRL, 1);
    assert_eq!(m.stats() - before, Default::default(), "same value again");
    m.set(&mut vcpu, GLOBAL_CTRL, 0);
    assert_eq!((m.stats() - before).writes, 1, "a change is written");
    assert_eq!(m.hw.registers().global_ctrl, 0);
    assert_eq!(m.get(&mut vcpu, GLOBAL_CTRL), 0);
    m.set(&mut vcpu, GLOBAL_CTRL, 1);
    assert_eq!(m.hw.registers().global_ctrl, 1);
    assert_eq!((m.stats() - before).writes, 2);
}

#[test]
fn a_fixed_ctrl_write_puts_exactly_the_counters_of_its_nibbles_in_use() {
    let (mut m, mut vcpu) = loaded_counting();
    m.set(&mut vcpu, FIXED_CTR0 + 1, 0x11);
    m.set(&mut vcpu, FIXED_CTR0 + 3, 0x33);
    // Counter 1: OS only; counter 3: USR with PMI; counters 0 and 2 untouched.
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0xa010);
    let fixed = |i| CounterSet::fixed(i);
    assert_eq!(
        vcpu.ctx.in_use(),
        CounterSet::gp(0).union(fixed(1)).union(fixed(3))
    );
    let r = m.hw.registers();
    assert_eq!(r.fixed_ctrl, 0xa010);
    assert_eq!((r.fixed_counters[1], r.fixed_counters[3]), (0x11, 0x33));
    // Only a nibble that was 0 puts its counter in use; counter 1's PMI bit alone adds none.
    m.set(&mut vcpu, FIXED_CTR_CTRL, 0xa090);
    assert_eq!(
        vcpu.ctx.in_use(),
        CounterSet::gp(0).union(fixed(1)).union(fixed(3))
    );
    assert_eq!(m.hw.registers().fixed_ctrl, 0xa090);
}

#[test]
fn a_saved_context_is_in_use_exactly_where_a_value_or_control_is_non_zero() {
    let mut m = Machine::v5();
    let mut vcpu = m.vcpu();
    let before = m.stats();
    let steps: [(u32, u64, CounterSet); 8] = [
        (PMC0 + 2, 5, CounterSet::gp(2)),
        (EVTSEL0 + 2, ENABLE_ALL_RINGS | BRANCHES, CounterSet::gp(2)),
        (PMC0 + 2, 0, CounterSet::gp(2)),
        (EVTSEL0 + 2, 0, CounterSet::EMPTY),
        (FIXED_CTR0 + 2, 7, CounterSet::fixed(2)),
        (FIXED_CTR_CTRL, 0x300, CounterSet::fixed(2)),
        (FIXED_CTR0 + 2, 0, CounterSet::fixed(2)),
        (FIXED_CTR_CTRL, 0, CounterSet::EMPTY),
    ];
    for (msr, value, in_use) in steps {
        m.set(&mut vcpu, msr, value);
        assert_eq!(vcpu.ctx.in_use(), in_use, "after {msr:#x} <- {value:#x}");
    }
    assert!(!m.pmu.is_active(&vcpu.ctx));
    assert_eq!(
        (m.stats() - before).total(),
        0,
        "a saved context touches no hardware"
    );
}
