//! The rules the core documents for its integrator, enforced (issue 26, item 6): each breach
//! gets a typed error or a diagnostic, never a silent success, on every vendor shape.
//!
//! * `attach_pcpu` twice for one index: `CoreError::PcpuAlreadyAttached` (detach frees it);
//! * `detach_pcpu` of a pCPU still running a vCPU: `CoreError::PcpuRunsVcpu`, the state
//!   handed back (`DetachRefused`), the vCPU still counting there;
//! * `context_switch` to a vCPU the table does not hold: `CoreError::NoSuchVcpu`;
//! * `new_vcpu` in a reserved domain: `CoreError::ReservedDomain`;
//! * `handle_pmi` whose platform names another interrupted vCPU than the one loaded:
//!   `Diagnostic::PmiOfAnotherVcpu`, the PMI dropped and counted.

use vpmu::abi::{
    Regs, XENPMU_DOMID_FIRST_RESERVED, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF,
    XENPMU_MODE_SELF, XENPMU_REGS_MODE_64,
};
use vpmu::{CoreError, Diagnostic, Interrupted, Mode, PmiOutcome, VcpuId, VcpuState, Vpmu};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::{Machine, SimVendor};

const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

use vpmu_tests::for_each_vendor;

fn counter<V: SimVendor>(m: &mut Machine<V>, id: VcpuId, ctr: u32) -> u64 {
    let msr = m.vendor.driver().read_counter(ctr);
    m.read(id, msr)
}

fn attach_twice<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor.clone(), 2, &[1, 2], XENPMU_MODE_SELF);
    for index in [0, 1] {
        assert_eq!(
            m.vpmu.attach_pcpu(index, vendor.model()).err(),
            Some(CoreError::PcpuAlreadyAttached(index)),
            "{vendor:?}"
        );
    }
    // Detached, the index may be attached again.
    m.platform.calling_pcpu = Some(1);
    let pcpu = m.pcpus.pop().expect("pCPU 1");
    let detached = m.vpmu.detach_pcpu(&mut m.platform, pcpu, &m.vcpus);
    assert!(detached.is_ok(), "{vendor:?}: {:?}", detached.err());
    let again = m
        .vpmu
        .attach_pcpu(1, vendor.model())
        .expect("attached again");
    m.pcpus.push(again);
    m.platform.calling_pcpu = None;
    m.schedule(1, Some(A));
    m.program(A, &[counting(0, 0)]);
    m.run(1, 7);
    assert_eq!(counter(&mut m, A, 0), 7, "{vendor:?}");
    // Indices beyond the pCPU count, or beyond MAX_PCPUS, do not exist.
    assert_eq!(
        m.vpmu.attach_pcpu(2, vendor.model()).err(),
        Some(CoreError::NoSuchPcpu(2))
    );
    let big = Vpmu::new(
        vendor.backend(),
        Mode::Off,
        Vpmu::<V::Backend>::MAX_PCPUS + 1,
    );
    let last = Vpmu::<V::Backend>::MAX_PCPUS;
    assert_eq!(
        big.attach_pcpu(last, vendor.model()).err(),
        Some(CoreError::NoSuchPcpu(last))
    );
    assert!(big.attach_pcpu(last - 1, vendor.model()).is_ok());
}

#[test]
fn attaching_a_pcpu_twice_is_refused() {
    for_each_vendor!(attach_twice);
}

fn detach_running<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor.clone(), 2, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(1, Some(A));
    m.program(A, &[counting(0, 0)]);
    m.run(1, 5);
    m.platform.calling_pcpu = Some(1);
    let pcpu = m.pcpus.pop().expect("pCPU 1");
    let refused = m
        .vpmu
        .detach_pcpu(&mut m.platform, pcpu, &m.vcpus)
        .expect_err("A runs there");
    m.platform.calling_pcpu = None;
    assert_eq!(
        refused.error,
        CoreError::PcpuRunsVcpu { pcpu: 1, vcpu: A },
        "{vendor:?}"
    );
    // Handed back as it was: A's context is still there and counts on.
    m.pcpus.push(refused.pcpu);
    assert_eq!(m.vcpu(A).state(), VcpuState::Loaded { pcpu: 1 });
    m.run(1, 5);
    assert_eq!(counter(&mut m, A, 0), 10, "{vendor:?}");
    // Once idle, the detach goes through, and A's context is not left on it.
    m.schedule(1, None);
    m.platform.calling_pcpu = Some(1);
    let pcpu = m.pcpus.pop().expect("pCPU 1");
    let hw = m
        .vpmu
        .detach_pcpu(&mut m.platform, pcpu, &m.vcpus)
        .expect("idle pCPU");
    m.platform.calling_pcpu = None;
    assert!(V::nothing_can_count(&hw), "{vendor:?}");
    assert_eq!(m.vcpu(A).state(), VcpuState::Saved);
}

#[test]
fn detaching_a_pcpu_that_runs_a_vcpu_is_refused_and_hands_it_back() {
    for_each_vendor!(detach_running);
}

fn switch_to_unknown<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    m.program(A, &[counting(0, 0)]);
    m.run(0, 4);
    for stranger in [VcpuId { domain: 1, vcpu: 2 }, VcpuId { domain: 5, vcpu: 0 }] {
        let result =
            m.vpmu
                .context_switch(&mut m.platform, &mut m.pcpus[0], &m.vcpus, Some(stranger));
        assert_eq!(result, Err(CoreError::NoSuchVcpu(stranger)));
        assert_eq!(m.pcpus[0].current(), None, "the pCPU runs none");
        assert_eq!(m.vcpu(A).state(), VcpuState::Saved, "A was switched out");
        assert!(V::nothing_can_count(m.pcpus[0].hw()));
    }
    m.schedule(0, Some(A));
    m.run(0, 3);
    assert_eq!(counter(&mut m, A, 0), 7, "A resumes where it stopped");
}

#[test]
fn switching_to_a_vcpu_the_table_does_not_hold_is_an_error() {
    for_each_vendor!(switch_to_unknown);
}

fn reserved_domains<V: SimVendor>(vendor: V) {
    let m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    for domain in [
        XENPMU_DOMID_FIRST_RESERVED,
        XENPMU_DOMID_SELF,
        XENPMU_DOMID_HYPERVISOR,
        u32::MAX,
    ] {
        let id = VcpuId { domain, vcpu: 0 };
        assert_eq!(
            m.vpmu.new_vcpu(id).err(),
            Some(CoreError::ReservedDomain(domain))
        );
    }
    let last = VcpuId {
        domain: XENPMU_DOMID_FIRST_RESERVED - 1,
        vcpu: 3,
    };
    assert_eq!(m.vpmu.new_vcpu(last).map(|v| v.id()), Ok(last));
}

#[test]
fn a_vcpu_of_a_reserved_domain_id_cannot_be_made() {
    for_each_vendor!(reserved_domains);
}

fn pmi_of_another_vcpu<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor.clone(), 1, &[1, 2], XENPMU_MODE_SELF);
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.program(A, &[sampling(0, 3)]);
    // The overflow happens with A loaded, but the platform says B was interrupted.
    let mode = ExecMode {
        cpl: 3,
        host: false,
    };
    m.pcpus[0].hw_mut().count(HwEvent::Instructions, 3, mode);
    m.platform.interrupted[0] = Interrupted::Guest {
        vcpu: B,
        regs: Regs {
            rip: 0x40_1000,
            mode: XENPMU_REGS_MODE_64,
            ..Regs::default()
        },
    };
    let before = m.platform.diagnostics_total;
    let outcome = m
        .vpmu
        .handle_pmi(&mut m.platform, &mut m.pcpus[0], &m.vcpus)
        .expect("no fault");
    assert!(
        matches!(outcome, PmiOutcome::Dropped { to, .. } if to == A),
        "{vendor:?}: {outcome:?}"
    );
    assert_eq!(m.platform.diagnostics_total, before + 1, "{vendor:?}");
    assert_eq!(
        m.platform.diagnostics.last(),
        Some(&Diagnostic::PmiOfAnotherVcpu {
            loaded: A,
            interrupted: B,
        })
    );
    assert_eq!(m.vcpu(A).stats().pmis_dropped, 1);
    assert!(m.platform.lvtpc_deliveries.is_empty(), "nobody got it");
    // The same PMI with the platform agreeing is delivered, with no diagnostic.
    m.program(A, &[sampling(0, 3)]);
    m.pcpus[0].hw_mut().count(HwEvent::Instructions, 3, mode);
    m.platform.interrupted[0] = Interrupted::Guest {
        vcpu: A,
        regs: Regs::default(),
    };
    let outcome = m
        .vpmu
        .handle_pmi(&mut m.platform, &mut m.pcpus[0], &m.vcpus)
        .expect("no fault");
    assert!(
        matches!(outcome, PmiOutcome::Delivered { to, .. } if to == A),
        "{vendor:?}: {outcome:?}"
    );
    assert_eq!(m.platform.diagnostics_total, before + 1);
}

#[test]
fn a_pmi_the_platform_says_interrupted_another_vcpu_is_reported() {
    for_each_vendor!(pmi_of_another_vcpu);
}
