//! The switch pairs: A switched out for B and back in on one pCPU (B idle or counting too),
//! and A and B swapping pCPUs (migration). `reference.rs` works out each row's minimum.

use vpmu::abi::XENPMU_MODE_SELF;
use vpmu::{VcpuId, VcpuState};
use vpmu_models::{HwEvent, SoftwarePmu};
use vpmu_sim::helpers::counting;
use vpmu_sim::vendor::FIXED0;
use vpmu_sim::{CounterSetup, Driver, Machine, SimEvent, SimVendor};

use crate::harness::{Excluded, ExcludedPlatform, ExcludedTable, unmeasured};
use crate::{A, B, KERNEL, M, Mark, Measured, Pass, check};

/// Instructions (and branches) each side counts per pass.
const STEP: u64 = 10;
/// Where B's counters start: far from A's, so that no load finds the other context's values
/// equal to its own by chance (the minimum counts a write of each).
const B_START: u64 = 1 << 20;

/// The first `n` counters that can count instructions (`None`: all of them).
pub(crate) fn counters(driver: &Driver, n: Option<u32>) -> Result<Vec<u32>, String> {
    let all = driver.counters();
    match n {
        None => Ok(all),
        Some(n) if all.len() >= n as usize => Ok(all[..n as usize].to_vec()),
        Some(_) => Err(format!("the PMU has only {} counters", all.len())),
    }
}

/// What `id`'s counters hold, as the guest reads them (outside the measured window).
fn values<V: SimVendor>(m: &mut M<V>, driver: &Driver, id: VcpuId, ctrs: &[u32]) -> Vec<u64>
where
    V::Model: Clone,
{
    ctrs.iter()
        .map(|&c| m.read(id, driver.read_counter(c)))
        .collect()
}

/// Whether every counter moved by exactly `by` from `before` to `after`.
fn moved(before: &[u64], after: &[u64], by: u64) -> bool {
    before.len() == after.len()
        && before
            .iter()
            .zip(after)
            .all(|(b, a)| a.wrapping_sub(*b) == by)
}

/// One context switch pair on pCPU 0 (A → B → A), measured on the measured pass; between
/// the two switches B's hardware counts `STEP` instructions and branches (not measured).
fn pair<V: SimVendor>(m: &mut M<V>, pass: Pass) -> Result<(u64, u64), String>
where
    V::Model: Clone,
{
    m.platform.calling_pcpu = Some(0);
    let mark = Mark::of(m);
    let ok = {
        let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[0]);
        let (platform, vcpus) = (
            &mut ExcludedPlatform(&mut m.platform),
            &ExcludedTable(&m.vcpus),
        );
        pass.run(|| {
            vpmu.context_switch(platform, pcpu, vcpus, Some(B)).is_ok()
                && unmeasured(|| {
                    let hw = pcpu.hw_mut();
                    hw.count(HwEvent::Instructions, STEP, KERNEL);
                    hw.count(HwEvent::Branches, STEP, KERNEL);
                    true
                })
                && vpmu.context_switch(platform, pcpu, vcpus, Some(A)).is_ok()
        })
    };
    let cost = mark.since(m);
    m.platform.calling_pcpu = None;
    check(ok, || "a switch failed".into())?;
    Ok(cost)
}

/// `switch-1`, `switch-4`, `switch-all`: A with `n` counters counting; B never used the PMU.
pub(crate) fn idle_pair<V: SimVendor>(
    excluded: Excluded<V>,
    n: Option<u32>,
) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let ctrs = counters(&driver, n)?;
    let setups: Vec<_> = ctrs.iter().map(|&c| counting(c, 0)).collect();
    m.program(A, &setups);
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        // Let A's counters move, so that a save has something new to read.
        m.pcpus[0]
            .hw_mut()
            .count(HwEvent::Instructions, STEP, KERNEL);
        let before = values(&mut m, &driver, A, &ctrs);
        cost = pair(&mut m, pass)?;
        check(m.vcpu(B).state() == VcpuState::Allocated, || {
            "B used the PMU".into()
        })?;
        let after = values(&mut m, &driver, A, &ctrs);
        check(moved(&before, &after, 0), || {
            "A's counters counted while B ran".into()
        })?;
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}

/// B's set-up of counter `c` beside A's instructions: branches on general-purpose counters
/// when `other_events` (fixed counter 0 counts instructions only, so it keeps its control).
fn b_setup(c: u32, other_events: bool) -> CounterSetup {
    let setup = counting(c, B_START);
    if other_events && c < FIXED0 {
        CounterSetup {
            event: SimEvent::Branches,
            ..setup
        }
    } else {
        setup
    }
}

/// `switch-4-same`, `switch-4-other`, `switch-all-both`: A and B each with `n` counters
/// counting (B's on other events if `other_events`); the pair is A → B → A on pCPU 0. Fails
/// unless B's counters counted while it ran and A's did not.
pub(crate) fn busy_pair<V: SimVendor>(
    excluded: Excluded<V>,
    n: Option<u32>,
    other_events: bool,
) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    let ctrs = counters(&driver, n)?;
    let a: Vec<_> = ctrs.iter().map(|&c| counting(c, 0)).collect();
    let b: Vec<_> = ctrs.iter().map(|&c| b_setup(c, other_events)).collect();
    check(
        !other_events || a.iter().zip(&b).any(|(a, b)| a != b),
        || "B's events are A's".into(),
    )?;
    m.schedule(0, Some(A));
    m.program(A, &a);
    m.schedule(0, Some(B));
    m.program(B, &b);
    m.schedule(0, Some(A));
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        m.pcpus[0]
            .hw_mut()
            .count(HwEvent::Instructions, STEP, KERNEL);
        let (a_before, b_before) = (
            values(&mut m, &driver, A, &ctrs),
            values(&mut m, &driver, B, &ctrs),
        );
        cost = pair(&mut m, pass)?;
        let (a_after, b_after) = (
            values(&mut m, &driver, A, &ctrs),
            values(&mut m, &driver, B, &ctrs),
        );
        check(moved(&b_before, &b_after, STEP), || {
            format!("B's counters did not count while it ran: {b_before:x?} -> {b_after:x?}")
        })?;
        check(moved(&a_before, &a_after, 0), || {
            "A's counters counted while B ran".into()
        })?;
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}

/// `switch-4-migrated`: A and B, 4 counters each, same events, run on different pCPUs and
/// swap: A is switched out on its pCPU, switched in on B's (in place of B), and B is switched
/// in on the pCPU A left. Each load is of a context last saved on the other pCPU. Fails
/// unless both really moved and count where they arrived.
pub(crate) fn migrated<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 2, &[1, 2], XENPMU_MODE_SELF);
    let ctrs = counters(&driver, Some(4))?;
    let setups: Vec<_> = ctrs.iter().map(|&c| counting(c, 0)).collect();
    m.schedule(1, Some(A));
    m.program(A, &setups);
    m.schedule(0, Some(B));
    let b: Vec<_> = ctrs.iter().map(|&c| b_setup(c, false)).collect();
    m.program(B, &b);
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        let (Some(a_on), Some(b_on)) = (m.running_on(A), m.running_on(B)) else {
            return Err("A or B is not running".into());
        };
        for p in [a_on, b_on] {
            m.pcpus[p as usize]
                .hw_mut()
                .count(HwEvent::Instructions, STEP, KERNEL);
        }
        let (a_before, b_before) = (
            values(&mut m, &driver, A, &ctrs),
            values(&mut m, &driver, B, &ctrs),
        );
        let mark = Mark::of(&m);
        let ok = {
            let [p0, p1] = m.pcpus.as_mut_slice() else {
                return Err("two pCPUs".into());
            };
            // `left`: the pCPU A leaves (B goes there); `arrived`: B's, where A goes.
            let (left, arrived) = if a_on == 0 { (p0, p1) } else { (p1, p0) };
            let (vpmu, platform, vcpus) = (
                &m.vpmu,
                &mut ExcludedPlatform(&mut m.platform),
                &ExcludedTable(&m.vcpus),
            );
            pass.run(|| {
                platform.0.calling_pcpu = Some(a_on);
                let out = vpmu.context_switch(platform, left, vcpus, None).is_ok();
                platform.0.calling_pcpu = Some(b_on);
                let swap = vpmu
                    .context_switch(platform, arrived, vcpus, Some(A))
                    .is_ok();
                platform.0.calling_pcpu = Some(a_on);
                let back = vpmu.context_switch(platform, left, vcpus, Some(B)).is_ok();
                out && swap && back
            })
        };
        cost = mark.since(&m);
        m.platform.calling_pcpu = None;
        check(ok, || "a switch failed".into())?;
        check(
            m.vcpu(A).state() == (VcpuState::Loaded { pcpu: b_on })
                && m.vcpu(B).state() == (VcpuState::Loaded { pcpu: a_on }),
            || "A and B did not swap pCPUs".into(),
        )?;
        let (a_after, b_after) = (
            values(&mut m, &driver, A, &ctrs),
            values(&mut m, &driver, B, &ctrs),
        );
        check(
            moved(&a_before, &a_after, 0) && moved(&b_before, &b_after, 0),
            || "a context changed on the way".into(),
        )?;
        for p in [a_on, b_on] {
            m.pcpus[p as usize]
                .hw_mut()
                .count(HwEvent::Instructions, STEP, KERNEL);
        }
        let (a_now, b_now) = (
            values(&mut m, &driver, A, &ctrs),
            values(&mut m, &driver, B, &ctrs),
        );
        check(
            moved(&a_after, &a_now, STEP) && moved(&b_after, &b_now, STEP),
            || "A or B does not count on the pCPU it arrived on".into(),
        )?;
    }
    Ok(Measured {
        msr_accesses: cost.0,
        allocations: cost.1,
        counters_used: ctrs.len() as u32,
    })
}
