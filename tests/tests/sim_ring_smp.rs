//! The sample ring (ABI 1.4) across physical CPUs, on the four test shapes: all mode with one
//! profiling vCPU (and ring) per pCPU, and with one profiler whose ring takes both pCPUs'
//! records interleaved; hv mode's hypervisor samples in the privileged ring; RING_FINISH by a
//! sibling while the owner produces on another pCPU (no request, no `-EAGAIN`: the producer
//! runs under the owner's lock, never on another pCPU's hardware); and an overflow kept
//! pending across a switch, re-armed and recorded when the vCPU runs again.

use vpmu::abi::ops::Params;
use vpmu::abi::{
    XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF,
    XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT,
};
use vpmu::{PmiOutcome, VcpuId, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::{Machine, SimVendor, guest_frame};
use vpmu_tests::for_each_vendor;

const PERIOD: u64 = 13;

/// `id` registers its page and a ring of 8 pages at frame index `0x100 + 0x10 * vcpu`
/// re-arming counter 0 every `PERIOD`.
fn with_ring<V: SimVendor>(m: &mut Machine<V>, id: VcpuId) -> RingGuest {
    m.register_page(id);
    let gfn = guest_frame(id.domain, 0x100 + 0x10 * u64::from(id.vcpu));
    let ring = RingGuest::prepare(
        &mut m.platform,
        id.domain,
        gfn,
        &config(8, 0, 0, &[(false, 0, PERIOD)]),
    );
    let init = m.op(id, XENPMU_OP_RING_INIT, &Params::new(gfn, id.vcpu));
    assert!(init.is_ok(), "{id:?} ring_init: {init:?}");
    ring
}

/// The samples of `ring` since the last call (pCPU of each, in order); checks that the
/// sequences continue from `seen` samples, 1, 2, 3...
fn samples<V: SimVendor>(
    m: &mut Machine<V>,
    ring: &mut RingGuest,
    domain_id: u32,
    seen: usize,
) -> Vec<u32> {
    let records = ring.consume(&mut m.platform).expect("well formed");
    let samples: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s, _) => Some(s),
            Record::Pad(_) => None,
            other => panic!("{other:?}"),
        })
        .collect();
    for (k, s) in samples.iter().enumerate() {
        assert_eq!(s.sequence, (seen + k) as u64 + 1);
        assert_eq!(s.identity.domain_id, domain_id);
    }
    samples.iter().map(|s| s.identity.pcpu_id).collect()
}

fn all_mode<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    for profilers in [2u32, 1] {
        let mut m = Machine::new(vendor.clone(), 2, &[profilers, 2], XENPMU_MODE_ALL);
        let mut rings: Vec<RingGuest> = (0..profilers)
            .map(|vcpu| with_ring(&mut m, VcpuId { domain: 0, vcpu }))
            .collect();
        for vcpu in 0..profilers {
            let id = VcpuId { domain: 0, vcpu };
            m.schedule(vcpu, Some(id));
            m.program(id, &[sampling(0, PERIOD)]);
        }
        for pcpu in 0..2 {
            m.schedule(
                pcpu,
                Some(VcpuId {
                    domain: 1,
                    vcpu: pcpu,
                }),
            );
        }
        // Both pCPUs sample, interleaved in slices; the profilers read after each.
        let mut pmis = [0u64; 2];
        let mut from: Vec<Vec<u32>> = vec![Vec::new(); profilers as usize];
        for slice in 0..40 {
            let pcpu = slice % 2;
            for record in m.run(pcpu, 7 * PERIOD) {
                assert!(
                    matches!(record.outcome, Some(PmiOutcome::Delivered { to, .. }) if to.vcpu == pcpu % profilers),
                    "{name}: {record:?}"
                );
                pmis[pcpu as usize] += 1;
            }
            for (ring, from) in rings.iter_mut().zip(&mut from) {
                let seen = from.len();
                from.extend(samples(&mut m, ring, 1, seen));
            }
        }
        assert_eq!(pmis, [20 * 7; 2], "{name}: one PMI per period on each pCPU");
        if profilers == 2 {
            for (p, from) in from.iter().enumerate() {
                assert_eq!(*from, vec![p as u32; 140], "{name}: pCPU {p}'s ring");
            }
        } else {
            let from = &from[0];
            assert_eq!(from.len(), 280, "{name}");
            assert_eq!(from.iter().filter(|&&p| p == 1).count(), 140, "{name}");
            assert_eq!(
                &from[..14],
                &[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
                "{name}"
            );
        }
        m.assert_conservation();
    }
}

#[test]
fn all_mode_records_each_pcpus_samples() {
    for_each_vendor!(all_mode);
}

fn hypervisor_samples<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let privileged = VcpuId { domain: 0, vcpu: 0 };
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_HV);
    let mut ring = with_ring(&mut m, privileged);
    m.schedule(0, Some(privileged));
    m.program(privileged, &[sampling(0, PERIOD)]);
    let mut pmis = 0;
    for k in 0..(3 * PERIOD) {
        let record = if k % 2 == 0 {
            m.run(0, 1).pop()
        } else {
            m.retire_hypervisor(0, 0xffff_8000_0010_0000 + k)
        };
        if record.is_some() {
            pmis += 1;
        }
    }
    assert_eq!(pmis, 3, "{name}");
    let records = ring.consume(&mut m.platform).expect("well formed");
    let ids: Vec<u32> = records
        .iter()
        .filter_map(|r| match r {
            Record::Sample(s, chain) => {
                if s.identity.domain_id == XENPMU_DOMID_HYPERVISOR {
                    assert!(
                        chain.is_empty(),
                        "{name}: no chain read from the hypervisor"
                    );
                }
                Some(s.identity.domain_id)
            }
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 3, "{name}");
    assert!(
        ids.iter()
            .all(|&d| d == XENPMU_DOMID_SELF || d == XENPMU_DOMID_HYPERVISOR)
    );
    assert!(ids.contains(&XENPMU_DOMID_HYPERVISOR), "{name}: {ids:?}");
}

#[test]
fn hv_mode_puts_hypervisor_samples_in_the_privileged_ring() {
    for_each_vendor!(hypervisor_samples);
}

fn finish_while_producing<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let owner = VcpuId { domain: 1, vcpu: 0 };
    let sibling = VcpuId { domain: 1, vcpu: 1 };
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_SELF);
    let mut ring = with_ring(&mut m, owner);
    m.schedule(1, Some(owner));
    m.schedule(0, Some(sibling));
    m.program(owner, &[sampling(0, PERIOD)]);
    assert_eq!(m.run(1, 4 * PERIOD).len(), 4, "{name}");
    // The sibling, on pCPU 0, finishes the owner's ring while the owner runs on pCPU 1.
    m.hold_requests = true;
    let sent = m.platform.requests_sent;
    let finish = m.op(sibling, XENPMU_OP_RING_FINISH, &Params::new(0, 0));
    assert!(finish.is_ok(), "{name}: {finish:?}");
    assert_eq!(
        m.platform.requests_sent, sent,
        "{name}: no other pCPU involved"
    );
    m.hold_requests = false;
    assert_eq!(
        samples(&mut m, &mut ring, XENPMU_DOMID_SELF, 0).len(),
        4,
        "{name}"
    );
    // The owner's next sample goes to its page.
    let pmi = m.run(1, PERIOD).pop().expect("a PMI");
    assert!(matches!(pmi.outcome, Some(PmiOutcome::Delivered { to, .. }) if to == owner));
    assert!(
        matches!(m.vcpu(owner).state(), VcpuState::Cached { .. }),
        "{name}"
    );
    assert_eq!(ring.producer(&m.platform).records, 4, "{name}");
}

#[test]
fn ring_finish_by_a_sibling_while_the_owner_produces_elsewhere() {
    for_each_vendor!(finish_while_producing);
}

fn kept_pending<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let owner = VcpuId { domain: 1, vcpu: 0 };
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    let mut ring = with_ring(&mut m, owner);
    m.schedule(0, Some(owner));
    m.program(owner, &[sampling(0, PERIOD)]);
    assert!(m.run(0, 1).is_empty(), "{name}");
    // The overflow happens, and the vCPU is switched out before its PMI is handled.
    let kernel = ExecMode {
        cpl: 0,
        host: false,
    };
    let hw = m.pcpus[0].hw_mut();
    hw.count(HwEvent::Instructions, PERIOD + 2, kernel);
    assert!(hw.take_pmi(), "{name}: the PMI was raised");
    m.schedule(0, None);
    assert_eq!(
        m.vcpu(owner).pending_pmi().map(|p| p.interrupt),
        Some(true),
        "{name}"
    );
    m.schedule(0, Some(owner));
    assert_eq!(m.vcpu(owner).stats().pmis_kept_pending, 1, "{name}");
    assert_eq!(
        samples(&mut m, &mut ring, XENPMU_DOMID_SELF, 0).len(),
        1,
        "{name}"
    );
    // Re-armed with the overshoot carried: 3 counted since the wrap.
    let msr = m.vendor.driver().read_counter(0);
    assert_eq!(
        m.read(owner, msr),
        (3u64).wrapping_sub(PERIOD) & ((1 << 48) - 1),
        "{name}"
    );
    assert_eq!(
        m.run(0, PERIOD - 3).len(),
        1,
        "{name}: the next period is whole"
    );
    if let Some(status) = m.vendor.driver().status_msr() {
        assert_eq!(
            m.read(owner, status) & 1,
            0,
            "{name}: not in the virtual status"
        );
    }
    m.assert_conservation();
}

#[test]
fn an_overflow_kept_pending_across_a_switch_is_re_armed_and_recorded() {
    for_each_vendor!(kept_pending);
}
