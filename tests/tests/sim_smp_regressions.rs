//! Regressions for the defects issue 11 found in the single-lock core, each driven through the
//! simulator on every vendor shape it applies to:
//!
//! * a PMI due when its vCPU is switched out (the overflow happened, the interrupt was not yet
//!   taken) is kept with the context and delivered exactly once when the vCPU next runs;
//! * a policy change re-validates what is already programmed: a domain's new event filter
//!   stops a counter already counting a now-denied event, on the pCPU that made the change, on
//!   another pCPU only once that one took its request, and in a saved context at its next
//!   load; leaving hv mode removes a privileged host-only qualifier from the hardware;
//!   clearing the BTS feature unloads DS_AREA, and a sample cached across that change still
//!   flushes unedited;
//! * one guest frame cannot be the shared page of two vCPUs (`-EADDRINUSE`);
//! * a system-wide sample taken by a pCPU that has not caught up with the end of all mode yet
//!   never reaches a profiler already brought in line with the new mode (it would mark the
//!   profiler's own context cached while that context is loaded on another pCPU, orphaning
//!   it on the hardware);
//! * an all-mode sample of a vCPU whose domain id lies in the reserved range (which would read
//!   as `XENPMU_DOMID_SELF` or `_HYPERVISOR`) is dropped, not published (issue 12).

use std::cell::RefCell;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    PageView, XENPMU_FEATURE_INTEL_BTS, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF,
    XENPMU_OP_FEATURE_SET, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_MODE_SET,
};
use vpmu::{Completion, CrossCpuRequest, PmiOutcome, VcpuId, VcpuPmu, VcpuState, VcpuTable};
use vpmu_models::intel::SyntheticCpuid;
use vpmu_models::{HwEvent, SoftwarePmu};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::{
    IntelShape, Machine, SimFilter, SimPlatform, SimVcpus, SimVendor, amd_legacy, amd_v2,
    guest_frame, intel_v2, intel_v5,
};

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

/// The event select of `SimEvent::Instructions` on both vendors.
const INSTRUCTIONS_SELECT: u16 = 0xc0;

fn counter(m: &mut Machine<impl SimVendor>, id: VcpuId, ctr: u32) -> u64 {
    let msr = m.vendor.driver().read_counter(ctr);
    m.read(id, msr)
}

/// Counts `n` kernel instructions on `pcpu`'s model without taking the PMI they may raise:
/// the window between an overflow and its interrupt.
fn count_silently(m: &mut Machine<impl SimVendor>, pcpu: u32, n: u64) {
    let mode = vpmu_models::ExecMode {
        cpl: 0,
        host: false,
    };
    m.pcpus[pcpu as usize]
        .hw_mut()
        .count(HwEvent::Instructions, n, mode);
}

fn pmi_due_at_switch_out_is_kept<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 1, &[1, 2], XENPMU_MODE_SELF);
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.program(A, &[sampling(0, 4)]);
    count_silently(&mut m, 0, 4);
    // The interrupt is in flight when the scheduler switches A out.
    m.schedule(0, Some(B));
    assert!(
        m.platform.lvtpc_deliveries.is_empty(),
        "{name}: nothing delivered to A while it is out"
    );
    let pending = m.vcpu(A).pending_pmi();
    assert!(pending.is_some(), "{name}: the overflow is kept with A");
    // The PMI the hardware raised arrives now, on B's watch: it finds nothing of B's.
    let late = m.run(0, 1);
    assert!(
        late.iter()
            .all(|r| r.outcome.is_none() || matches!(r.outcome, Some(PmiOutcome::Spurious))),
        "{name}: the late interrupt is not B's: {late:?}"
    );
    m.schedule(0, Some(A));
    assert_eq!(
        m.platform.lvtpc_deliveries.iter().collect::<Vec<_>>(),
        vec![&A],
        "{name}: delivered once when A runs again"
    );
    assert_eq!(m.vcpu(A).pending_pmi(), None, "{name}");
    assert_eq!(m.vcpu(A).stats().pmis_kept_pending, 1, "{name}");
    // Running on and switching again delivers nothing more.
    m.platform.set_lvtpc_masked(A, false);
    m.run(0, 2);
    m.schedule(0, Some(B));
    m.schedule(0, Some(A));
    assert_eq!(m.platform.lvtpc_deliveries.len(), 1, "{name}: exactly once");
    let stats = *m.vcpu(A).stats();
    assert_eq!(
        (stats.pmis_generated, stats.pmis_delivered),
        (1, 1),
        "{name}"
    );
    m.assert_conservation();
}

#[test]
fn a_pmi_due_at_switch_out_is_delivered_when_the_vcpu_next_runs() {
    pmi_due_at_switch_out_is_kept(intel_v5());
    pmi_due_at_switch_out_is_kept(intel_v2());
    pmi_due_at_switch_out_is_kept(amd_v2());
    pmi_due_at_switch_out_is_kept(amd_legacy());
}

/// Installs `filter` for `domain` and tells the core, on `pcpu`.
fn install_filter<V: SimVendor>(
    m: &mut Machine<V>,
    pcpu: u32,
    domain: u32,
    filter: SimFilter,
) -> Completion {
    m.platform.filters[domain as usize] = filter;
    m.complete_requests(pcpu);
    m.platform.calling_pcpu = Some(pcpu);
    let completion = m
        .vpmu
        .event_filter_changed(&mut m.platform, &mut m.pcpus[pcpu as usize], &m.vcpus)
        .expect("no other change in progress");
    m.platform.calling_pcpu = None;
    m.deliver_requests();
    completion
}

fn new_filter_stops_running_counters<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 2, &[1, 3], XENPMU_MODE_SELF);
    let c = VcpuId { domain: 1, vcpu: 2 };
    // A counts on pCPU 0, B on pCPU 1, C counted and is switched out (saved).
    for (pcpu, id) in [(0, c), (0, A), (1, B)] {
        m.schedule(pcpu, Some(id));
        m.program(id, &[counting(0, 0)]);
        m.run(pcpu, 5);
    }
    assert_eq!(
        counter(&mut m, A, 0),
        5,
        "{name}: A counts before the filter"
    );

    m.hold_requests = true;
    let completion = install_filter(&mut m, 0, 1, SimFilter::Deny(INSTRUCTIONS_SELECT));
    assert_eq!(
        completion,
        Completion::Pending,
        "{name}: pCPU 1 has not caught up yet"
    );
    assert!(m.vpmu.change_in_progress(), "{name}");
    // On the pCPU of the change the denied counter stopped at once.
    m.run(0, 7);
    assert_eq!(counter(&mut m, A, 0), 5, "{name}: A's counter stopped");
    // pCPU 1 still counts for B until it takes its request (before its next guest entry).
    let before = V::raw(m.pcpus[1].hw());
    m.hold_requests = false;
    m.complete_requests(1);
    assert!(!m.vpmu.change_in_progress(), "{name}: every pCPU caught up");
    m.run(1, 7);
    assert_eq!(counter(&mut m, B, 0), 5, "{name}: B's counter stopped");
    assert_ne!(
        before,
        V::raw(m.pcpus[1].hw()),
        "{name}: pCPU 1 was restricted"
    );
    // C's saved control is restricted when it next loads.
    m.schedule(0, Some(c));
    m.run(0, 7);
    assert_eq!(
        counter(&mut m, c, 0),
        5,
        "{name}: C's counter stays stopped"
    );
    assert!(m.vcpu(c).stats().restrictions >= 1, "{name}");
    // Re-allowing the event does not re-enable what was restricted (the guest reprograms).
    install_filter(&mut m, 0, 1, SimFilter::AllowAll);
    assert!(!m.vpmu.change_in_progress(), "{name}");
    m.program(c, &[counting(0, 0)]);
    m.run(0, 3);
    assert_eq!(
        counter(&mut m, c, 0),
        3,
        "{name}: a new program counts again"
    );
    m.assert_conservation();
}

#[test]
fn a_new_event_filter_stops_counters_already_counting_the_denied_event() {
    new_filter_stops_running_counters(intel_v5());
    new_filter_stops_running_counters(intel_v2());
    new_filter_stops_running_counters(amd_v2());
    new_filter_stops_running_counters(amd_legacy());
}

#[test]
fn leaving_hv_mode_removes_a_host_only_qualifier_from_the_hardware() {
    const HOST_ONLY: u64 = 1 << 41;
    for vendor in [amd_v2(), amd_legacy()] {
        let name = vendor.name();
        let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_HV);
        m.schedule(0, Some(P));
        let setup = counting(0, 0);
        let (msr, control) = m.vendor.driver().control(&setup);
        m.write(P, m.vendor.driver().write_counter(0, 0));
        m.write(P, (msr, control | HOST_ONLY));
        if let Some(enable) = m.vendor.driver().global_enable(setup.bit()) {
            m.write(P, enable);
        }
        assert_ne!(
            amd_control0(&m) & HOST_ONLY,
            0,
            "{name}: hv mode lets the privileged domain count the host"
        );
        let set = m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_SELF, 0));
        assert!(set.is_ok(), "{name}: {set:?}");
        assert_eq!(
            amd_control0(&m) & HOST_ONLY,
            0,
            "{name}: self mode leaves no host-only control on the hardware"
        );
        // The guest-visible value stays as written; only the hardware image loses the bit.
        assert_eq!(m.read(P, msr), control | HOST_ONLY, "{name}");
        assert!(m.vcpu(P).stats().restrictions >= 1, "{name}");
    }
}

#[allow(non_snake_case)]
fn amd_control0(m: &Machine<vpmu_sim::AmdShape>) -> u64 {
    <vpmu_sim::AmdShape as SimVendor>::raw(m.pcpus[0].hw()).controls[0]
}

#[test]
fn clearing_bts_unloads_ds_area_and_a_cached_sample_still_flushes() {
    const DS_AREA: u32 = 0x600;
    // BTS needs a CPU that enumerates the debug store.
    let with_ds = |setup: IntelShape| IntelShape {
        cpuid: SyntheticCpuid {
            debug_store: true,
            ..setup.cpuid
        },
        ..setup
    };
    for vendor in [with_ds(intel_v5()), with_ds(intel_v2())] {
        let name = vendor.name();
        let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
        let bts = m.op(
            P,
            XENPMU_OP_FEATURE_SET,
            &Params::new(XENPMU_FEATURE_INTEL_BTS, 0),
        );
        assert!(bts.is_ok(), "{name}: {bts:?}");
        m.schedule(0, Some(P));
        m.register_page(P);
        m.write(P, (DS_AREA, 0x10_0000));
        m.program(P, &[sampling(0, 3)]);
        assert_eq!(
            <IntelShape as SimVendor>::raw(m.pcpus[0].hw()).ds_area,
            0x10_0000,
            "{name}: the DS area is loaded with the context"
        );
        let pmis = m.run(0, 3);
        assert!(
            matches!(
                pmis.as_slice(),
                [r] if matches!(r.outcome, Some(PmiOutcome::Delivered { to: P, .. }))
            ),
            "{name}: one sample in P's page: {pmis:?}"
        );
        // The feature goes while the sample is cached.
        let clear = m.op(P, XENPMU_OP_FEATURE_SET, &Params::new(0, 0));
        assert!(clear.is_ok(), "{name}: {clear:?}");
        assert_eq!(
            <IntelShape as SimVendor>::raw(m.pcpus[0].hw()).ds_area,
            0,
            "{name}: DS_AREA is not left on the hardware"
        );
        // The page was not edited: its flush must pass the rules now in force.
        let flush = m.op(P, XENPMU_OP_FLUSH, &Params::new(0, 0));
        assert!(
            flush.is_ok(),
            "{name}: the unedited page flushes: {flush:?}"
        );
        assert_eq!(
            <IntelShape as SimVendor>::raw(m.pcpus[0].hw()).ds_area,
            0,
            "{name}: nor does the flush bring it back"
        );
        assert_eq!(m.read(P, DS_AREA), 0, "{name}");
        m.assert_conservation();
    }
}

#[test]
fn one_frame_is_the_page_of_one_vcpu_at_most() {
    let mut m = Machine::new(intel_v5(), 2, &[1, 2], XENPMU_MODE_SELF);
    let frame = guest_frame(1, 0);
    assert!(m.op(A, XENPMU_OP_INIT, &Params::new(frame, 0)).is_ok());
    assert_eq!(
        m.op(B, XENPMU_OP_INIT, &Params::new(frame, 1)),
        Err(OpError::FrameInUse)
    );
    assert_eq!(
        m.vcpu(B).page(),
        None,
        "the refused init left B without a page"
    );
    assert!(
        m.op(B, XENPMU_OP_INIT, &Params::new(guest_frame(1, 1), 1))
            .is_ok(),
        "another frame is fine"
    );
}

/// What another pCPU does in between.
type Meanwhile<'a, C> = Box<dyn FnOnce(&SimVcpus<C>) + 'a>;

/// The vCPU table one pCPU's core call sees while another pCPU acts in between its steps (as
/// threads do): `before` runs once, just before `victim` is first visited.
struct Interleaved<'a, C> {
    inner: &'a SimVcpus<C>,
    victim: VcpuId,
    before: RefCell<Option<Meanwhile<'a, C>>>,
}

impl<C> VcpuTable<C> for Interleaved<'_, C> {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) -> bool {
        if id == self.victim {
            let before = self.before.borrow_mut().take();
            if let Some(before) = before {
                before(self.inner);
            }
        }
        self.inner.with_vcpu(id, visit)
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<C>)) {
        self.inner.for_each_in_domain(domain, visit);
    }
}

/// Two pCPUs: P (with its page) on pCPU 0 and A on pCPU 1; P programs `own` in self mode,
/// enters all mode and samples every pCPU; pCPU 1's instance has overflowed and raised its
/// PMI, not yet taken. Returns the machine and P's page frame.
fn profiler_overflowed_on_pcpu1<V: SimVendor>(
    vendor: V,
    own: &[vpmu_sim::CounterSetup],
) -> (Machine<V>, u64) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_SELF);
    let gfn = m.register_page(P);
    m.schedule(0, Some(P));
    m.schedule(1, Some(A));
    if !own.is_empty() {
        m.program(P, own);
    }
    assert!(
        m.op(P, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_ALL, 0))
            .is_ok()
    );
    // P profiles both pCPUs: the program reaches pCPU 1's instance too.
    m.program(P, &[sampling(0, 4)]);
    count_silently(&mut m, 1, 4);
    assert!(
        m.pcpus[1].hw_mut().take_pmi(),
        "{name}: pCPU 1's instance overflowed"
    );
    (m, gfn)
}

fn stale_system_sample<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    // P's own counter, programmed in self mode, stays with its context through all mode.
    let (mut m, gfn) = profiler_overflowed_on_pcpu1(vendor, &[counting(1, 0)]);
    // pCPU 1 takes the interrupt under all mode; between its catch-up check and its visit of
    // the profiler, P leaves all mode on pCPU 0, which catches up at once and loads P's own
    // context (pCPU 1's catch-up is still on its way).
    let mut elsewhere = SimPlatform::new(2, &[1, 1], 0);
    elsewhere.calling_pcpu = Some(0);
    let (first, rest) = m.pcpus.split_at_mut(1);
    let pcpu0 = &mut first[0];
    let vpmu = &m.vpmu;
    let table = Interleaved {
        inner: &m.vcpus,
        victim: P,
        before: RefCell::new(Some(Box::new(move |vcpus: &SimVcpus<_>| {
            let set = vpmu.control_op(
                &mut elsewhere,
                pcpu0,
                vcpus,
                P,
                XENPMU_OP_MODE_SET,
                &Params::new(XENPMU_MODE_SELF, 0),
            );
            assert_eq!(set, Err(OpError::Again), "pCPU 1 lags");
        }))),
    };
    m.platform.calling_pcpu = Some(1);
    let outcome = vpmu
        .handle_pmi(&mut m.platform, &mut rest[0], &table)
        .expect("the backend never makes the model fault");
    m.platform.calling_pcpu = None;
    drop(table);
    assert!(
        matches!(outcome, PmiOutcome::Dropped { to: P, .. }),
        "{name}: the sample of the ended all mode is discarded: {outcome:?}"
    );
    assert_eq!(
        m.vcpu(P).state(),
        VcpuState::Loaded { pcpu: 0 },
        "{name}: P's own context stays loaded where it runs"
    );
    let page = m.platform.frame(P.domain, gfn).clone();
    assert!(
        !PageView::new(&page).expect("page").is_cached(),
        "{name}: no sample published"
    );
    m.complete_request(1, CrossCpuRequest::CatchUp);
    m.schedule(0, None);
    for pcpu in 0..2 {
        assert!(
            V::nothing_can_count(m.pcpus[pcpu].hw()),
            "{name}: pCPU {pcpu} is clean with nothing loaded: {:?}",
            V::raw(m.pcpus[pcpu].hw())
        );
    }
    let stats = *m.vcpu(P).stats();
    assert_eq!(
        stats.pmis_generated,
        stats.pmis_delivered + stats.pmis_dropped,
        "{name}"
    );
}

#[test]
fn a_system_wide_sample_of_an_ended_all_mode_does_not_reach_the_profiler() {
    stale_system_sample(intel_v5());
    stale_system_sample(intel_v2());
    stale_system_sample(amd_v2());
    stale_system_sample(amd_legacy());
}

/// All mode: a sample interrupting a vCPU whose (integrator-chosen) domain id lies in the
/// reserved range would read as `XENPMU_DOMID_SELF`/`_HYPERVISOR`; the core drops it instead
/// (domain 1 shows the same set-up publishing).
fn reserved_domain_sample<V: SimVendor>(vendor: V, domain: u32) {
    let name = vendor.name();
    let (mut m, gfn) = profiler_overflowed_on_pcpu1(vendor, &[]);
    m.platform.interrupted[1] = vpmu::Interrupted::Guest {
        vcpu: VcpuId { domain, vcpu: 0 },
        regs: vpmu::abi::Regs::default(),
    };
    m.platform.calling_pcpu = Some(1);
    let outcome = m
        .vpmu
        .handle_pmi(&mut m.platform, &mut m.pcpus[1], &m.vcpus)
        .expect("the backend never makes the model fault");
    m.platform.calling_pcpu = None;
    let published = PageView::new(m.platform.frame(P.domain, gfn))
        .expect("page")
        .is_cached();
    if domain < vpmu::abi::XENPMU_DOMID_FIRST_RESERVED {
        assert!(
            matches!(outcome, PmiOutcome::Delivered { to: P, .. }) && published,
            "{name}: domain {domain:#x}: {outcome:?}"
        );
    } else {
        assert!(
            matches!(outcome, PmiOutcome::Dropped { to: P, .. }) && !published,
            "{name}: domain {domain:#x}: {outcome:?}, published {published}"
        );
    }
    let stats = *m.vcpu(P).stats();
    assert_eq!(
        stats.pmis_generated,
        stats.pmis_delivered + stats.pmis_dropped,
        "{name}"
    );
}

#[test]
fn an_all_mode_sample_of_a_reserved_domain_id_is_dropped_not_misattributed() {
    for domain in [
        1,
        vpmu::abi::XENPMU_DOMID_FIRST_RESERVED,
        vpmu::abi::XENPMU_DOMID_SELF,
        vpmu::abi::XENPMU_DOMID_HYPERVISOR,
    ] {
        reserved_domain_sample(intel_v5(), domain);
        reserved_domain_sample(intel_v2(), domain);
        reserved_domain_sample(amd_v2(), domain);
        reserved_domain_sample(amd_legacy(), domain);
    }
}
