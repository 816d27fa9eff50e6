//! The intercepts' fast path (`FastIntercepts` in the core) is the full entry with its answers
//! known: it must never be taken where the full entry would have done something. Each case
//! calls the core's entry points directly, as a hypervisor's exit handler does, without the
//! simulator's habit of completing the pCPU's requests first, on every vendor shape:
//!
//! * an intercept on a pCPU that has not caught up with a policy change (its request still
//!   queued) catches it up before emulating, even right after intercepts that took the fast
//!   path: the denied event stops counting at that WRMSR or RDMSR;
//! * an intercept made on a pCPU other than the one holding the vCPU's context is refused
//!   (`CoreError::WrongPcpu`), however many fast intercepts it made where it runs;
//! * a WRMSR after a mode change is judged by the new mode's rules: the privileged vCPU's
//!   AMD HostOnly qualifier, allowed in hv mode, faults once self mode is in force.

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_HV, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu::{CoreError, Msr, MsrOutcome, VcpuId, VcpuState};
use vpmu_sim::helpers::counting;
use vpmu_sim::{Machine, SimFilter, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

/// The event select of `SimEvent::Instructions` on both vendors.
const INSTRUCTIONS_SELECT: u16 = 0xc0;

/// Which access the lagging pCPU's vCPU makes.
#[derive(Clone, Copy, Debug)]
enum Access {
    Read,
    Write,
}

/// `id`'s access of its counter 0 on `pcpu`, straight into the core.
fn access<V: SimVendor>(
    m: &mut Machine<V>,
    pcpu: u32,
    id: VcpuId,
    kind: Access,
) -> Result<bool, CoreError> {
    let driver = m.vendor.driver();
    let cell = &m.vcpus.domains[id.domain as usize][id.vcpu as usize];
    let mut vcpu = cell.borrow_mut();
    m.platform.calling_pcpu = Some(pcpu);
    let pcpu = &mut m.pcpus[pcpu as usize];
    let handled = match kind {
        Access::Read => matches!(
            m.vpmu.rdmsr(
                &mut m.platform,
                pcpu,
                &mut vcpu,
                Msr(driver.read_counter(0))
            )?,
            MsrOutcome::Handled(_)
        ),
        Access::Write => {
            let (msr, value) = driver.write_counter(0, 100);
            m.vpmu
                .wrmsr(&mut m.platform, pcpu, &mut vcpu, Msr(msr), value)?
                == MsrOutcome::Handled(())
        }
    };
    m.platform.calling_pcpu = None;
    Ok(handled)
}

fn lagging_pcpu_catches_up<V: SimVendor>(vendor: V, kind: Access) {
    let name = format!("{} {kind:?}", vendor.name());
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.schedule(1, Some(B));
    for (pcpu, id) in [(0, A), (1, B)] {
        m.program(id, &[counting(0, 0)]);
        m.run(pcpu, 5);
    }
    // B's intercepts take the fast path now.
    for _ in 0..3 {
        assert_eq!(access(&mut m, 1, B, kind), Ok(true), "{name}");
    }
    // A new filter for B's domain, made on pCPU 0; pCPU 1's request stays queued.
    m.hold_requests = true;
    m.platform.filters[1] = SimFilter::Deny(INSTRUCTIONS_SELECT);
    m.platform.calling_pcpu = Some(0);
    m.vpmu
        .event_filter_changed(&mut m.platform, &mut m.pcpus[0], &m.vcpus)
        .expect("no other change in progress");
    m.platform.calling_pcpu = None;
    assert!(m.vpmu.change_in_progress(), "{name}: pCPU 1 is behind");

    assert_eq!(access(&mut m, 1, B, kind), Ok(true), "{name}");
    assert!(
        !m.vpmu.change_in_progress(),
        "{name}: B's intercept caught pCPU 1 up with the filter"
    );
    let before = m.read(B, m.vendor.driver().read_counter(0));
    m.hold_requests = false;
    m.run(1, 7);
    assert_eq!(
        m.read(B, m.vendor.driver().read_counter(0)),
        before,
        "{name}: B's denied event stopped counting"
    );
    m.assert_conservation();
}

#[test]
fn an_intercept_on_a_lagging_pcpu_catches_it_up_first() {
    for kind in [Access::Read, Access::Write] {
        lagging_pcpu_catches_up(intel_v5(), kind);
        lagging_pcpu_catches_up(intel_v2(), kind);
        lagging_pcpu_catches_up(amd_v2(), kind);
        lagging_pcpu_catches_up(amd_legacy(), kind);
    }
}

fn wrong_pcpu_is_refused<V: SimVendor>(vendor: V, kind: Access) {
    let name = format!("{} {kind:?}", vendor.name());
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(1, Some(A));
    m.program(A, &[counting(0, 0)]);
    for _ in 0..3 {
        assert_eq!(access(&mut m, 1, A, kind), Ok(true), "{name}");
    }
    assert_eq!(
        access(&mut m, 0, A, kind),
        Err(CoreError::WrongPcpu {
            here: 0,
            loaded_on: 1
        }),
        "{name}"
    );
    // Where it runs, the vCPU's intercepts go on as before.
    assert_eq!(access(&mut m, 1, A, kind), Ok(true), "{name}");
}

#[test]
fn an_intercept_on_another_pcpu_than_the_context_is_refused() {
    for kind in [Access::Read, Access::Write] {
        wrong_pcpu_is_refused(intel_v5(), kind);
        wrong_pcpu_is_refused(intel_v2(), kind);
        wrong_pcpu_is_refused(amd_v2(), kind);
        wrong_pcpu_is_refused(amd_legacy(), kind);
    }
}

#[test]
fn a_write_after_leaving_hv_mode_is_judged_by_self_mode() {
    const HOST_ONLY: u64 = 1 << 41;
    for vendor in [amd_v2(), amd_legacy()] {
        let name = vendor.name();
        let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_HV);
        m.schedule(0, Some(P));
        let setup = counting(0, 0);
        let (msr, control) = m.vendor.driver().control(&setup);
        // P counts without HostOnly (nothing to restrict: its context stays loaded across
        // the change) after host-only writes that took the fast path.
        m.write(P, m.vendor.driver().write_counter(0, 0));
        for _ in 0..3 {
            m.write(P, (msr, control | HOST_ONLY));
        }
        m.write(P, (msr, control));
        if let Some(enable) = m.vendor.driver().global_enable(setup.bit()) {
            m.write(P, enable);
        }
        let set = m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_SELF, 0));
        assert!(set.is_ok(), "{name}: {set:?}");
        assert_eq!(m.vcpu(P).state(), VcpuState::Loaded { pcpu: 0 }, "{name}");
        assert_eq!(
            m.wrmsr(P, msr, control | HOST_ONLY),
            MsrOutcome::GeneralProtection,
            "{name}: self mode refuses HostOnly"
        );
        assert_eq!(m.wrmsr(P, msr, control), MsrOutcome::Handled(()), "{name}");
    }
}
