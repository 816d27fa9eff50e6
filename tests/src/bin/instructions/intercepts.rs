//! The intercept rows (an intercepted WRMSR or RDMSR of a vCPU running on pCPU 0) and the
//! calibration runs. `reference.rs` works out each row's must-change minimum.

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_HV, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu::{
    Mode, Msr, MsrBus, MsrOutcome, PcpuPmu, Platform, VcpuId, VcpuPmu, VcpuState, VcpuTable, Vpmu,
};
use vpmu_models::{HwEvent, SoftwarePmu};
use vpmu_sim::helpers::counting;
use vpmu_sim::machine::Ctx;
use vpmu_sim::vendor::FIXED0;
use vpmu_sim::{CounterSetup, Machine, SimEvent, SimVendor};

use crate::harness::{Excluded, ExcludedBus, ExcludedPlatform, ExcludedTable, unmeasured};
use crate::{A, KERNEL, M, Mark, Measured, P, Pass, Scenario, check, handled};

/// A pCPU of a scenario's machine.
pub(crate) type Pcpu<V> = PcpuPmu<Ctx<V>, ExcludedBus<<V as SimVendor>::Model>>;

/// One call by `id`, running on its pCPU, into the core (an intercept), measured on the
/// measured pass: its result and (MSR accesses, allocations).
pub(crate) fn intercept<V: SimVendor, R>(
    m: &mut M<V>,
    id: VcpuId,
    pass: Pass,
    call: impl FnOnce(
        &Vpmu<V::Backend>,
        &mut ExcludedPlatform<'_>,
        &mut Pcpu<V>,
        &mut VcpuPmu<Ctx<V>>,
    ) -> R,
) -> (R, (u64, u64))
where
    V::Model: Clone,
{
    let p = m.pcpu_of(id) as usize;
    m.platform.calling_pcpu = Some(p as u32);
    let mark = Mark::of(m);
    let result = {
        let cell = &m.vcpus.domains[id.domain as usize][id.vcpu as usize];
        let (vpmu, pcpu) = (&m.vpmu, &mut m.pcpus[p]);
        let platform = &mut ExcludedPlatform(&mut m.platform);
        let mut vcpu = cell.borrow_mut();
        pass.run(|| call(vpmu, platform, pcpu, &mut vcpu))
    };
    let cost = mark.since(m);
    m.platform.calling_pcpu = None;
    (result, cost)
}

/// A guest WRMSR by `id` (on the pCPU it runs on), measured on the measured pass; fails the
/// run unless the core handled it.
fn measured_write<V: SimVendor>(
    m: &mut M<V>,
    id: VcpuId,
    pass: Pass,
    (msr, value): (u32, u64),
) -> Result<(u64, u64), String>
where
    V::Model: Clone,
{
    let (outcome, cost) = intercept(m, id, pass, |vpmu, platform, pcpu, vcpu| {
        vpmu.wrmsr(platform, pcpu, vcpu, Msr(msr), value)
    });
    check(handled(&outcome), || {
        format!("WRMSR {msr:#x} <- {value:#x}: {outcome:?}")
    })?;
    Ok(cost)
}

/// What pCPU `p`'s hardware holds in `msr` (read outside the measured window).
fn hw<V: SimVendor>(m: &mut M<V>, p: usize, msr: u32) -> Result<u64, String>
where
    V::Model: Clone,
{
    m.pcpus[p]
        .hw_mut()
        .read(Msr(msr))
        .map_err(|e| format!("hardware read {msr:#x}: {e:?}"))
}

fn measured((msr_accesses, allocations): (u64, u64), counters_used: u32) -> Measured {
    Measured {
        msr_accesses,
        allocations,
        counters_used,
    }
}

/// Nothing but the harness: an empty measurement, one excluded bus access, platform call,
/// vCPU visit or unmeasured step.
pub(crate) fn calibrate<V: SimVendor>(
    excluded: Excluded<V>,
    scenario: Scenario,
) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    let counter = Msr(driver.read_counter(0));
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        let mark = Mark::of(&m);
        let ok = {
            let (hw, platform, vcpus) = (
                m.pcpus[0].hw_mut(),
                &mut ExcludedPlatform(&mut m.platform),
                &ExcludedTable(&m.vcpus),
            );
            pass.run(|| match scenario {
                Scenario::CalibrateAccess => hw.read(counter).is_ok(),
                Scenario::CalibratePlatformCall => platform.privileged_domain() == 0,
                Scenario::CalibrateCallback => vcpus.with_vcpu(A, &mut |_| {}),
                Scenario::CalibrateUnmeasured => unmeasured(|| std::hint::black_box(true)),
                _ => true,
            })
        };
        check(ok, || format!("calibration {scenario:?} failed"))?;
        cost = mark.since(&m);
    }
    Ok(measured(cost, 0))
}

/// `wrmsr`, `rdmsr`: A's counter 0, loaded and counting, written (its value) or read.
pub(crate) fn counter_access<V: SimVendor>(
    excluded: Excluded<V>,
    scenario: Scenario,
) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    let counter = driver.read_counter(0);
    let mut cost = (0, 0);
    for (round, pass) in Pass::BOTH.into_iter().enumerate() {
        let value = 0x1234 + round as u64;
        cost = if scenario == Scenario::Wrmsr {
            let c = measured_write(&mut m, A, pass, driver.write_counter(0, value))?;
            let now = hw(&mut m, 0, counter)?;
            check(now == driver.stored(0, value), || {
                format!("the write did not reach the loaded counter: {now:#x}")
            })?;
            c
        } else {
            let expected = hw(&mut m, 0, counter)?;
            let (outcome, c) = intercept(&mut m, A, pass, |vpmu, platform, pcpu, vcpu| {
                vpmu.rdmsr(platform, pcpu, vcpu, Msr(counter))
            });
            check(outcome == Ok(MsrOutcome::Handled(expected)), || {
                format!("RDMSR of the loaded counter: {outcome:?}, hardware {expected:#x}")
            })?;
            c
        };
    }
    Ok(measured(cost, 1))
}

/// `wrmsr-evtsel`: A's counter 0, loaded and counting instructions, gets a new event select
/// (branches, then instructions again): the loaded control must change on the hardware.
pub(crate) fn evtsel<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let instructions = counting(0, 0);
    let branches = CounterSetup {
        event: SimEvent::Branches,
        ..instructions
    };
    m.program(A, &[instructions]);
    let control = driver.control_msr(0);
    let mut cost = (0, 0);
    for (pass, setup) in Pass::BOTH.into_iter().zip([branches, instructions]) {
        let before = hw(&mut m, 0, control)?;
        cost = measured_write(&mut m, A, pass, driver.control(&setup))?;
        let after = hw(&mut m, 0, control)?;
        check(before != after, || {
            format!("the loaded event select did not change ({before:#x})")
        })?;
        check(m.read(A, control) == driver.control_value(&setup), || {
            "the guest does not read back its event select".into()
        })?;
    }
    Ok(measured(cost, 1))
}

/// `wrmsr-global-enable`, `wrmsr-global-disable`: A has 4 counters programmed and loaded;
/// its global control goes from nothing to all 4 enabled, or back.
pub(crate) fn global<V: SimVendor>(excluded: Excluded<V>, enable: bool) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let setups: Vec<_> = (0..4).map(|c| counting(c, 0)).collect();
    m.program(A, &setups);
    let mask = 0b1111;
    let (on, off) = match (driver.global_enable(mask), driver.global_enable(0)) {
        (Some(on), Some(off)) => (on, off),
        _ => return Err("the shape has no global control".into()),
    };
    let counter = driver.read_counter(0);
    let mut cost = (0, 0);
    for pass in Pass::BOTH {
        // The state the write changes, set outside the measured window.
        m.write(A, if enable { off } else { on });
        let write = if enable { on } else { off };
        cost = measured_write(&mut m, A, pass, write)?;
        let global = hw(&mut m, 0, on.0)?;
        check((global & mask == mask) == enable, || {
            format!(
                "hardware global control {global:#x} after writing {:#x}",
                write.1
            )
        })?;
        let before = m.read(A, counter);
        m.pcpus[0].hw_mut().count(HwEvent::Instructions, 10, KERNEL);
        let moved = m.read(A, counter) != before;
        check(moved == enable, || {
            format!("A's counter 0 moved: {moved}, enabled: {enable}")
        })?;
    }
    Ok(measured(cost, 4))
}

/// `wrmsr-fixed-ctrl` (Intel): A's fixed counter 0, loaded and counting in both rings, is
/// restricted to ring 0 and back through FIXED_CTR_CTRL.
pub(crate) fn fixed_ctrl<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    check(driver.is_intel(), || "fixed counters are Intel's".into())?;
    let mut m = Machine::new(excluded, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let both = counting(FIXED0, 0);
    let kernel_only = CounterSetup { usr: false, ..both };
    m.program(A, &[both]);
    let control = driver.control_msr(FIXED0);
    let mut cost = (0, 0);
    for (pass, setup) in Pass::BOTH.into_iter().zip([kernel_only, both]) {
        let before = hw(&mut m, 0, control)?;
        cost = measured_write(&mut m, A, pass, driver.control(&setup))?;
        let after = hw(&mut m, 0, control)?;
        check(before != after, || {
            format!("the loaded FIXED_CTR_CTRL did not change ({before:#x})")
        })?;
        check(m.read(A, control) == driver.control_value(&setup), || {
            "the guest does not read back its FIXED_CTR_CTRL".into()
        })?;
    }
    Ok(measured(cost, 1))
}

/// `wrmsr-first-use`: a vCPU that never touched the PMU (its vPMU `Allocated`, not in use)
/// makes its first PMU write, the counter write of Linux's `check_hw_exists` (0xabcd into a
/// counter whose control is clear). Another vCPU of its domain already uses the PMU, as after
/// the guest's boot vCPU; each pass uses a fresh vCPU (1.2, then 1.3).
pub(crate) fn first_use<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 1, &[1, 4], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    let mut cost = (0, 0);
    for (round, pass) in Pass::BOTH.into_iter().enumerate() {
        let fresh = VcpuId {
            domain: 1,
            vcpu: 2 + round as u32,
        };
        m.schedule(0, Some(fresh));
        let unused = {
            let v = m.vcpu(fresh);
            v.state() == VcpuState::Allocated && !v.in_use()
        };
        check(unused, || format!("{fresh:?} has used its vPMU already"))?;
        cost = measured_write(&mut m, fresh, pass, driver.write_counter(0, 0xabcd))?;
        let in_use = {
            let v = m.vcpu(fresh);
            v.state() != VcpuState::Allocated && v.in_use()
        };
        check(in_use, || {
            format!("{fresh:?}'s first write did not put its vPMU in use")
        })?;
        let back = m.read(fresh, driver.read_counter(0));
        check(back == driver.stored(0, 0xabcd), || {
            format!("{fresh:?} reads {back:#x} back")
        })?;
    }
    Ok(measured(cost, 1))
}

/// `wrmsr-catch-up`: A runs on pCPU 0 with counter 0 loaded; P, on pCPU 1, switches the mode
/// between self and hv (allowed while guests use the vPMU), and pCPU 0 has not taken its
/// `CatchUp` request yet when A writes its counter: the intercept brings pCPU 0 up to the new
/// policy epoch first.
pub(crate) fn catch_up<V: SimVendor>(excluded: Excluded<V>) -> Result<Measured, String>
where
    V::Model: Clone,
{
    let driver = excluded.driver();
    let mut m = Machine::new(excluded, 2, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(1, Some(P));
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    let counter = driver.read_counter(0);
    let mut cost = (0, 0);
    for (round, pass) in Pass::BOTH.into_iter().enumerate() {
        let to = if m.vpmu.mode() == Mode::SelfProfiling {
            XENPMU_MODE_HV
        } else {
            XENPMU_MODE_SELF
        };
        m.hold_requests = true;
        let change = m.op_once(P, XENPMU_OP_MODE_SET, &Params::new(to, 0));
        let lagging = m.pcpus[0].mode_seen() != m.vpmu.mode();
        check(lagging && Some(m.vpmu.mode()) == Mode::from_abi(to), || {
            format!("the mode change to {to:#x} ({change:?}) left pCPU 0 nothing to catch up")
        })?;
        let value = 0x1234 + round as u64;
        cost = measured_write(&mut m, A, pass, driver.write_counter(0, value))?;
        check(m.pcpus[0].mode_seen() == m.vpmu.mode(), || {
            "the intercept did not catch pCPU 0 up".into()
        })?;
        check(hw(&mut m, 0, counter)? == driver.stored(0, value), || {
            "the write did not reach the loaded counter".into()
        })?;
        m.hold_requests = false;
        m.deliver_requests();
        let done = m.op(P, XENPMU_OP_MODE_SET, &Params::new(to, 0));
        check(done.is_ok(), || {
            format!("the mode change did not complete: {done:?}")
        })?;
    }
    Ok(measured(cost, 1))
}
