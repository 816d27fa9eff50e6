//! All mode: which system-wide PMIs stop the counters. A PMI is published into the profiler's
//! page only after its save stopped the counters and read the overflow status once (stop →
//! status → counters); every other PMI must leave them counting: one the profiler cannot take
//! (here, a sample still cached) only collects the overflow, and one whose save finds nothing
//! due restarts them where they stopped. Every vendor shape, K7 (no status register) included.

use vpmu::{PmiOutcome, SystemContext, VcpuId, VcpuState};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::{Machine, SimVendor};

use vpmu::abi::XENPMU_MODE_ALL;

const P: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

use vpmu_tests::{for_each_vendor, hw_counter};

/// The core's PMI handler on `pcpu`, called as an interrupt that found nothing (another
/// source shares the vector, or the overflow was already collected).
fn pmi<V: SimVendor>(m: &mut Machine<V>, pcpu: u32) -> PmiOutcome {
    m.platform.calling_pcpu = Some(pcpu);
    let outcome = m
        .vpmu
        .handle_pmi(&mut m.platform, &mut m.pcpus[pcpu as usize], &m.vcpus)
        .expect("the model never faults");
    m.platform.calling_pcpu = None;
    outcome
}

/// A PMI that finds no overflow while the profiler could take a sample: nothing is
/// published, nothing counted as generated, and the counters count on from where they were.
fn nothing_due_restarts_the_counters<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_ALL);
    m.register_page(P);
    m.program(P, &[sampling(0, 1000), counting(1, 0)]);
    m.schedule(0, Some(A));
    assert!(m.run(0, 10).is_empty());
    let before = hw_counter(&mut m, 0, 1);
    assert_eq!(pmi(&mut m, 0), PmiOutcome::Spurious);
    assert_eq!(
        *m.pcpus[0].system(),
        SystemContext::Loaded { profiler: P },
        "the system-wide context stays loaded"
    );
    assert_ne!(
        m.vcpu(P).state(),
        VcpuState::Cached {
            from: vpmu::SampleSource::System { pcpu: 0 }
        }
    );
    assert!(!m.platform.physical_masked[0]);
    assert_eq!(m.vcpu(P).stats().pmis_generated, 0);
    assert!(
        !V::nothing_can_count(m.pcpus[0].hw()),
        "the counters run again"
    );
    assert!(m.run(0, 5).is_empty());
    assert_eq!(hw_counter(&mut m, 0, 1), before + 5, "no instruction lost");
    // The sampling counter still interrupts at its period, and that PMI is published.
    let records = m.run(0, 1000);
    assert_eq!(records.len(), 1);
    assert!(matches!(
        records[0].outcome,
        Some(PmiOutcome::Delivered { to: P, .. })
    ));
    m.assert_conservation();
}

/// One profiler for two pCPUs: pCPU 1's overflow while pCPU 0's sample is cached is dropped,
/// and pCPU 1's counters are never stopped for it (at most the status acknowledgement is
/// written), so they count on.
fn dropped_sample_leaves_the_counters_running<V: SimVendor>(vendor: V) {
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_ALL);
    m.register_page(P);
    m.program(P, &[sampling(0, 3), counting(1, 0)]);
    m.schedule(0, Some(A));
    m.schedule(1, Some(B));
    let records = m.run(0, 3);
    assert!(matches!(
        records[..],
        [vpmu_sim::PmiRecord {
            outcome: Some(PmiOutcome::Delivered { to: P, .. }),
            ..
        }]
    ));
    let before = m.hw_stats()[1];
    let records = m.run(1, 3);
    assert!(matches!(
        records[..],
        [vpmu_sim::PmiRecord {
            outcome: Some(PmiOutcome::Dropped { to: P, .. }),
            ..
        }]
    ));
    let after = m.hw_stats()[1];
    assert!(
        after.writes - before.writes <= 1,
        "{}: a dropped PMI writes at most the acknowledgement ({} writes)",
        m.vendor.name(),
        after.writes - before.writes
    );
    assert_eq!(*m.pcpus[1].system(), SystemContext::Loaded { profiler: P });
    let counted = hw_counter(&mut m, 1, 1);
    assert_eq!(counted, 3, "pCPU 1 counted every instruction so far");
    m.run(1, 2);
    assert_eq!(hw_counter(&mut m, 1, 1), 5, "and counts on");
    m.assert_conservation();
}

#[test]
fn a_pmi_with_nothing_due_restarts_the_counters() {
    for_each_vendor!(nothing_due_restarts_the_counters);
}

#[test]
fn a_dropped_sample_leaves_the_counters_running() {
    for_each_vendor!(dropped_sample_leaves_the_counters_running);
}
