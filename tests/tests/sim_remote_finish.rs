//! A FINISH (or a domain teardown) of a vCPU that runs on another pCPU, on every vendor shape
//! (issue 26, item 4): the target keeps counting until its teardown really happens, and that
//! happens whole, on the pCPU holding its context, when that pCPU takes the request. It is
//! never left running with its counters stopped and its page still registered until the
//! caller's retry; the retry answers 0.

use vpmu::abi::XENPMU_MODE_SELF;
use vpmu::abi::XENPMU_OP_FINISH;
use vpmu::abi::ops::{OpError, Params};
use vpmu::{Completion, CrossCpuRequest, VcpuId, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::helpers::counting;
use vpmu_sim::{Machine, SimVendor};

const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

use vpmu_tests::{for_each_vendor, hw_counter};

/// `n` user instructions retire on `pcpu` before it takes the requests sent to it.
fn retire_before_requests<V: SimVendor>(m: &mut Machine<V>, pcpu: u32, n: u64) {
    let user = ExecMode {
        cpl: 3,
        host: false,
    };
    m.pcpus[pcpu as usize]
        .hw_mut()
        .count(HwEvent::Instructions, n, user);
}

/// B counts on pCPU 1 (5 instructions so far) with its page registered; A runs on pCPU 0.
fn b_counting_on_pcpu_1<V: SimVendor>(vendor: V) -> Machine<V> {
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_SELF);
    m.register_page(B);
    m.schedule(0, Some(A));
    m.schedule(1, Some(B));
    m.program(B, &[counting(0, 0)]);
    m.run(1, 5);
    assert_eq!(hw_counter(&mut m, 1, 0), 5);
    m.hold_requests = true;
    m
}

/// B's vPMU is gone, all at once: no page, reset state, nothing left counting on pCPU 1.
fn assert_torn_down<V: SimVendor>(m: &Machine<V>, what: &str) {
    assert_eq!(
        (m.vcpu(B).page(), m.vcpu(B).state()),
        (None, VcpuState::Allocated),
        "{what}: the teardown happened with the stop of B's counters"
    );
    assert!(m.platform.mappings.is_empty(), "{what}: B's page unmapped");
    assert!(
        V::nothing_can_count(m.pcpus[1].hw()),
        "{what}: nothing left programmed on pCPU 1"
    );
}

fn remote_finish<V: SimVendor>(vendor: V) {
    let name = format!("{vendor:?}");
    let mut m = b_counting_on_pcpu_1(vendor);
    let finish = Params::new(0, B.vcpu);
    assert_eq!(
        m.op_once(A, XENPMU_OP_FINISH, &finish),
        Err(OpError::Again),
        "{name}: B's context is on pCPU 1"
    );
    assert_eq!(
        m.platform.requests[1].front(),
        Some(&CrossCpuRequest::Teardown { vcpu: B })
    );
    // Until pCPU 1 takes the request, B is as it was: it counts.
    retire_before_requests(&mut m, 1, 10);
    assert_eq!(
        hw_counter(&mut m, 1, 0),
        15,
        "{name}: B counts until its teardown"
    );
    assert_eq!(m.vcpu(B).state(), VcpuState::Loaded { pcpu: 1 });
    assert!(m.vcpu(B).page().is_some());
    // pCPU 1 takes it before its next guest instruction: the teardown happens there and then.
    m.complete_requests(1);
    assert_torn_down(&m, &name);
    m.run(1, 10);
    assert_torn_down(&m, &name);
    // The caller's retry answers 0: its finish is done. Another finish finds no page.
    m.hold_requests = false;
    assert_eq!(m.op(A, XENPMU_OP_FINISH, &finish), Ok(finish), "{name}");
    assert_eq!(
        m.op(A, XENPMU_OP_FINISH, &finish),
        Err(OpError::NoVpmu),
        "{name}"
    );
    // B's counters read as a fresh vPMU's.
    let msr = m.vendor.driver().read_counter(0);
    assert_eq!(m.read(B, msr), 0, "{name}: finish resets the counters");
    m.assert_conservation();
}

#[test]
fn a_remote_finish_keeps_the_target_counting_until_its_teardown_happens() {
    for_each_vendor!(remote_finish);
}

fn remote_teardown<V: SimVendor>(vendor: V) {
    let name = format!("{vendor:?}");
    let mut m = b_counting_on_pcpu_1(vendor);
    let teardown = |m: &mut Machine<V>| {
        m.platform.calling_pcpu = Some(0);
        let done = m
            .vpmu
            .teardown_vcpu(&mut m.platform, &mut m.pcpus[0], &m.vcpus, B)
            .expect("no fault");
        m.platform.calling_pcpu = None;
        done
    };
    assert_eq!(teardown(&mut m), Completion::Pending, "{name}");
    retire_before_requests(&mut m, 1, 10);
    assert_eq!(hw_counter(&mut m, 1, 0), 15, "{name}: B counts meanwhile");
    m.complete_requests(1);
    assert_torn_down(&m, &name);
    assert_eq!(teardown(&mut m), Completion::Done, "{name}");
    assert_torn_down(&m, &name);
}

#[test]
fn a_remote_teardown_happens_whole_on_the_pcpu_holding_the_context() {
    for_each_vendor!(remote_teardown);
}

/// The target moved to another pCPU before the first one took the request: nothing happens
/// there, and the retry tears it down where it is now (or asks that pCPU).
fn target_moved<V: SimVendor>(vendor: V) {
    let name = format!("{vendor:?}");
    let mut m = b_counting_on_pcpu_1(vendor);
    let finish = Params::new(0, B.vcpu);
    assert_eq!(m.op_once(A, XENPMU_OP_FINISH, &finish), Err(OpError::Again));
    // pCPU 1 switches B out (its queue is still held), B goes idle, then pCPU 1 takes the
    // request: B is no longer loaded there.
    let request = m.platform.requests[1].pop_front().expect("the teardown");
    m.switch(1, None);
    m.complete_request(1, request);
    assert_eq!(m.vcpu(B).state(), VcpuState::Saved, "{name}");
    assert!(m.vcpu(B).page().is_some(), "{name}");
    m.hold_requests = false;
    assert_eq!(m.op(A, XENPMU_OP_FINISH, &finish), Ok(finish), "{name}");
    assert_torn_down(&m, &name);
}

#[test]
fn a_finish_whose_target_moved_is_completed_by_its_retry() {
    for_each_vendor!(target_moved);
}
