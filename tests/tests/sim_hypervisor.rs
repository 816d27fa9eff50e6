//! PMIs that interrupt the hypervisor: whose counters count hypervisor code, where the sample
//! goes and which registers it carries. Hypervisor registers reach only the privileged domain,
//! and only in hv and all mode (`XENPMU_DOMID_HYPERVISOR`); everyone else gets the registers of
//! its own guest context.
//!
//! Which counters count in host context is vendor policy: Intel counters have no host/guest
//! qualifiers (the backend documents it: an integrator that must not count hypervisor time
//! switches GLOBAL_CTRL at VM exit); AMD forces GuestOnly unless the guest may count host
//! time (the privileged profiler in hv and all mode).

use vpmu::abi::{
    PageView, Regs, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_MODE_HV,
    XENPMU_MODE_SELF, XENPMU_REGS_MODE_HYPERVISOR,
};
use vpmu::{Interrupted, PmiOutcome, VcpuId};
use vpmu_sim::helpers::sampling;
use vpmu_sim::{Machine, PmiRecord, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const HV_RIP: u64 = 0xffff_82d0_4020_1000;

fn counts_host(intel: bool, mode: u64, id: VcpuId) -> bool {
    intel || (id == P && (mode == XENPMU_MODE_HV || mode == XENPMU_MODE_ALL))
}

fn last_guest_regs<V: SimVendor>(m: &Machine<V>) -> Regs {
    match m.platform.interrupted[0] {
        Interrupted::Guest { regs, .. } => regs,
        Interrupted::Hypervisor { .. } => panic!("a guest ran last"),
    }
}

fn delivered(record: Option<PmiRecord>, to: VcpuId) -> bool {
    matches!(record.and_then(|r| r.outcome), Some(PmiOutcome::Delivered { to: t, .. }) if t == to)
}

/// `subject` samples instructions every 4; it (or, in all mode, `A` for the profiler `P`)
/// retires 2 guest instructions, then the hypervisor runs on its behalf.
fn check<V: SimVendor>(vendor: V, mode: u64, subject: VcpuId) {
    let intel = vendor.driver().is_intel();
    let mut m = Machine::new(vendor, 1, &[1, 1], mode);
    let gfn = m.register_page(subject);
    let runner = if mode == XENPMU_MODE_ALL { A } else { subject };
    m.schedule(0, Some(runner));
    m.program(subject, &[sampling(0, 4)]);
    assert!(m.run(0, 2).is_empty());
    let guest = last_guest_regs(&m);
    let host = counts_host(intel, mode, subject);
    let mut sample_at_hypervisor = false;
    for k in 0..6 {
        let record = m.retire_hypervisor(0, HV_RIP + 4 * k);
        if k == 1 && host {
            assert!(
                delivered(record, subject),
                "{mode}: the PMI at hypervisor code: {record:?}"
            );
            sample_at_hypervisor = true;
        } else {
            assert_eq!(
                record, None,
                "{mode} {subject:?}: hypervisor instruction {k}"
            );
        }
    }
    if !host {
        let records = m.run(0, 2);
        assert!(records.len() == 1 && delivered(Some(records[0]), subject));
    }
    let page = m.platform.frame(subject.domain, gfn).clone();
    let view = PageView::new(&page).expect("page");
    assert!(view.is_cached());
    let (identity, regs) = (view.identity(), view.regs());
    let privileged = subject == P;
    let pcpu_id = if privileged { 0 } else { runner.vcpu };
    if sample_at_hypervisor && mode != XENPMU_MODE_SELF && privileged {
        // Hypervisor samples: only for the privileged profiler, only in hv/all mode.
        assert_eq!(
            (identity.domain_id, identity.vcpu_id, identity.pcpu_id),
            (XENPMU_DOMID_HYPERVISOR, runner.vcpu, 0)
        );
        assert_eq!(regs.rip, HV_RIP + 4);
        assert_ne!(regs.mode & XENPMU_REGS_MODE_HYPERVISOR, 0);
    } else {
        assert_eq!(
            regs.mode & XENPMU_REGS_MODE_HYPERVISOR,
            0,
            "{mode} {subject:?}: no hypervisor registers"
        );
        let domain_id = if runner == subject {
            XENPMU_DOMID_SELF
        } else {
            runner.domain
        };
        assert_eq!(
            (identity.domain_id, identity.vcpu_id, identity.pcpu_id),
            (domain_id, runner.vcpu, pcpu_id)
        );
        if sample_at_hypervisor {
            assert_eq!(
                regs, guest,
                "the registers of the guest context it acts for"
            );
        } else {
            assert_eq!(
                regs,
                last_guest_regs(&m),
                "the guest instruction retiring at the overflow"
            );
        }
    }
    m.assert_conservation();
}

fn every_mode<V: SimVendor>(vendor: V) {
    for mode in [XENPMU_MODE_SELF, XENPMU_MODE_HV] {
        check(vendor.clone(), mode, P);
        check(vendor.clone(), mode, A);
    }
    check(vendor, XENPMU_MODE_ALL, P);
}

#[test]
fn hypervisor_registers_reach_only_the_privileged_profiler_in_hv_and_all_mode() {
    every_mode(intel_v5());
    every_mode(intel_v2());
    every_mode(amd_v2());
    every_mode(amd_legacy());
}
