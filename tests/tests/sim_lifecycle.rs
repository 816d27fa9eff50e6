//! Lifecycle with live state, for every vendor shape: `finish` and domain teardown with a
//! sample cached, re-registration, and mode changes while contexts are loaded and samples
//! pending. After each transition the hardware must hold exactly what the new state needs
//! (clean where nothing may count), no physical LVTPC may stay masked for a sample nobody
//! will flush, counters must resume where they stopped, and PMIs must be conserved.

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    PageView, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_FINISH,
    XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_MODE_SET,
};
use vpmu::{MsrOutcome, PmiOutcome, VcpuId, VcpuState};
use vpmu_models::SoftwarePmu;
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::{Machine, SimVendor, guest_frame};

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

use vpmu_tests::for_each_vendor;

fn op(m: &mut Machine<impl SimVendor>, caller: VcpuId, op: u32, val: u64) -> Result<(), OpError> {
    m.op(caller, op, &Params::new(val, caller.vcpu)).map(|_| ())
}

fn counter(m: &mut Machine<impl SimVendor>, id: VcpuId, ctr: u32) -> u64 {
    let msr = m.vendor.driver().read_counter(ctr);
    m.read(id, msr)
}

fn all_clean<V: SimVendor>(m: &Machine<V>) -> bool {
    m.pcpus.iter().all(|cpu| V::nothing_can_count(cpu.hw()))
}

fn delivered_to(records: &[vpmu_sim::PmiRecord], to: VcpuId) -> usize {
    records
        .iter()
        .filter(|r| matches!(r.outcome, Some(PmiOutcome::Delivered { to: t, .. }) if t == to))
        .count()
}

/// All mode, one profiler for two pCPUs: finish with a sample cached from pCPU 0 (and one
/// from pCPU 1 dropped) stops its system-wide counters on both pCPUs — "finish stops the
/// vCPU's counters" — and releases the masked LVTPC.
fn finish_stops_system_wide_counters<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_ALL);
    m.register_page(P);
    m.program(P, &[sampling(0, 3), counting(1, 0)]);
    m.schedule(0, Some(A));
    m.schedule(1, Some(B));
    assert_eq!(delivered_to(&m.run(0, 3), P), 1);
    assert_eq!(m.run(1, 10).len(), 1, "pCPU 1's overflow is dropped");
    assert!(m.platform.physical_masked[0]);
    assert_eq!(op(&mut m, P, XENPMU_OP_FINISH, 0), Ok(()));
    assert_eq!(
        (m.vcpu(P).page(), m.vcpu(P).state()),
        (None, VcpuState::Allocated)
    );
    assert!(m.platform.mappings.is_empty());
    assert_eq!(m.platform.physical_masked, vec![false, false]);
    assert!(all_clean(&m), "no counter of the profiler left programmed");
    assert!(
        m.run(0, 50).is_empty() && m.run(1, 50).is_empty(),
        "no PMI after finish"
    );
    assert_eq!(
        counter(&mut m, P, 1),
        0,
        "the profiler's counters start from reset"
    );
    m.assert_conservation();
}

#[test]
fn finish_in_all_mode_stops_the_profilers_system_wide_counters() {
    for_each_vendor!(finish_stops_system_wide_counters);
}

/// Self mode: a running vCPU with a sample cached is torn down (its domain is destroyed).
fn teardown_with_cached_sample<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    let gfn = m.register_page(A);
    m.schedule(0, Some(A));
    m.program(A, &[sampling(0, 2), counting(1, 0)]);
    assert_eq!(delivered_to(&m.run(0, 2), A), 1);
    assert!(matches!(m.vcpu(A).state(), VcpuState::Cached { .. }));
    assert!(m.platform.physical_masked[0]);
    assert_eq!(m.vpmu.unprivileged_in_use(), 1);
    m.teardown(A);
    assert_eq!(
        (m.vcpu(A).page(), m.vcpu(A).state()),
        (None, VcpuState::Allocated)
    );
    assert!(m.platform.mappings.is_empty(), "page unmapped");
    assert!(
        !PageView::new(m.platform.frame(1, gfn))
            .expect("page")
            .is_cached()
    );
    assert!(!m.platform.physical_masked[0]);
    assert!(all_clean(&m));
    assert!(m.run(0, 20).is_empty());
    assert_eq!(m.vpmu.unprivileged_in_use(), 0);
    assert_eq!(
        op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_ALL),
        Ok(()),
        "nothing in use"
    );
    m.assert_conservation();
}

#[test]
fn teardown_of_a_running_vcpu_with_a_cached_sample() {
    for_each_vendor!(teardown_with_cached_sample);
}

/// finish resets the vPMU; init on another frame starts over, and the old frame is left alone.
fn finish_then_init<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    let old = m.register_page(A);
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    m.run(0, 10);
    assert_eq!(counter(&mut m, A, 0), 10);
    assert_eq!(op(&mut m, A, XENPMU_OP_FINISH, 0), Ok(()));
    assert_eq!(counter(&mut m, A, 0), 0, "finish resets the counters");
    assert!(all_clean(&m));
    let old_bytes = m.platform.frame(1, old).clone();
    let new = guest_frame(1, 2);
    assert_eq!(op(&mut m, A, XENPMU_OP_INIT, new), Ok(()));
    m.program(A, &[sampling(0, 4)]);
    let records = m.run(0, 4);
    let dropped = records
        .iter()
        .filter(|r| matches!(r.outcome, Some(PmiOutcome::Dropped { to, .. }) if to == A))
        .count();
    assert_eq!(
        (records.len(), dropped),
        (1, 1),
        "a fresh page's LVTPC is masked"
    );
    assert!(
        !PageView::new(m.platform.frame(1, new))
            .expect("page")
            .is_cached()
    );
    assert_eq!(
        *m.platform.frame(1, old),
        old_bytes,
        "the old frame is never written again"
    );
    m.assert_conservation();
}

#[test]
fn finish_then_init_again_starts_from_reset() {
    for_each_vendor!(finish_then_init);
}

/// self → all → self → off → self with the privileged vCPU's own counter live throughout.
fn mode_round_trip<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(P));
    m.program(P, &[counting(0, 0)]);
    m.run(0, 10);
    assert_eq!(counter(&mut m, P, 0), 10);

    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_ALL), Ok(()));
    assert!(
        all_clean(&m),
        "entering all mode takes every context off the hardware"
    );
    m.program(P, &[counting(1, 5)]);
    m.schedule(1, Some(A));
    m.run(0, 4);
    m.run(1, 7);
    assert_eq!(counter(&mut m, P, 1), 9, "pCPU 0's system-wide counter");

    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_SELF), Ok(()));
    assert!(
        V::nothing_can_count(m.pcpus[1].hw()),
        "system-wide counters are gone"
    );
    m.run(0, 5);
    m.run(1, 5);
    assert_eq!(
        counter(&mut m, P, 0),
        15,
        "P's own counter resumes where it stopped"
    );
    assert_eq!(
        counter(&mut m, P, 1),
        0,
        "and the system-wide one was never P's own"
    );

    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_OFF), Ok(()));
    assert!(all_clean(&m));
    let msr = m.vendor.driver().read_counter(0);
    assert_eq!(m.rdmsr(P, msr), MsrOutcome::GeneralProtection);
    m.run(0, 5);

    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_SELF), Ok(()));
    m.run(0, 3);
    assert_eq!(counter(&mut m, P, 0), 18);
    m.assert_conservation();
}

#[test]
fn mode_changes_carry_the_privileged_context_and_leave_clean_hardware() {
    for_each_vendor!(mode_round_trip);
}

/// Leaving all mode with a sample cached discards it and releases the pCPU.
fn leave_all_with_cached_sample<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_ALL);
    let gfn = m.register_page(P);
    m.program(P, &[sampling(0, 2)]);
    m.schedule(0, Some(A));
    assert_eq!(delivered_to(&m.run(0, 2), P), 1);
    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_OFF), Ok(()));
    assert!(
        !PageView::new(m.platform.frame(0, gfn))
            .expect("page")
            .is_cached()
    );
    assert!(!m.platform.physical_masked[0]);
    assert!(all_clean(&m));
    assert_eq!(
        op(&mut m, P, XENPMU_OP_FLUSH, 0),
        Err(OpError::InvalidArgument),
        "nothing pending"
    );
    assert!(m.run(0, 10).is_empty());
    m.assert_conservation();
}

#[test]
fn leaving_all_mode_discards_a_cached_sample() {
    for_each_vendor!(leave_all_with_cached_sample);
}

/// self ⇄ hv is allowed while a guest uses its PMU, and touches nothing.
fn self_hv_swap<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    m.run(0, 6);
    let accesses = m.pcpus[0].hw().access_stats();
    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_HV), Ok(()));
    assert_eq!(
        op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_ALL),
        Err(OpError::Busy)
    );
    assert_eq!(op(&mut m, P, XENPMU_OP_MODE_SET, XENPMU_MODE_SELF), Ok(()));
    assert_eq!(
        m.pcpus[0].hw().access_stats(),
        accesses,
        "no hardware access"
    );
    m.run(0, 4);
    assert_eq!(counter(&mut m, A, 0), 10);
}

#[test]
fn self_hv_swaps_while_busy_leave_counters_running() {
    for_each_vendor!(self_hv_swap);
}

/// A threaded platform cannot touch another thread's local APIC, so it queues the LVTPC
/// delivery and reports the outcome later: the PMI is in flight until then, and conservation
/// counts it there.
fn queued_lvtpc_delivery<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.platform.queue_lvtpc = true;
    m.schedule(0, Some(A));
    m.program(A, &[sampling(0, 4)]);
    let records = m.run(0, 4);
    let queued = records
        .iter()
        .filter(|r| matches!(r.outcome, Some(PmiOutcome::Queued { to, .. }) if to == A))
        .count();
    assert_eq!((records.len(), queued), (1, 1), "one PMI, queued");
    assert_eq!(m.platform.queued_lvtpc.len(), 1);
    assert_eq!(m.vcpu(A).stats().pmis_in_flight, 1);
    m.assert_conservation();

    let vcpu = m.vcpus.get_mut(A);
    assert!(
        m.vpmu.lvtpc_delivery_done(vcpu, true),
        "the queued delivery completes"
    );
    assert!(
        !m.vpmu.lvtpc_delivery_done(vcpu, false),
        "nothing else was in flight"
    );
    let stats = *m.vcpu(A).stats();
    assert_eq!(
        (
            stats.pmis_generated,
            stats.pmis_delivered,
            stats.pmis_dropped,
            stats.pmis_in_flight
        ),
        (1, 1, 0, 0)
    );
}

#[test]
fn queued_lvtpc_deliveries_stay_in_flight_until_reported() {
    for_each_vendor!(queued_lvtpc_delivery);
}
