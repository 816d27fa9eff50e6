use std::time::{Duration, Instant};

use super::*;
use crate::personality::{Intel, Source};

#[test]
fn watchdog_ends_a_spinning_guest() {
    let Ok(kvm) = crate::kvm::usable() else {
        eprintln!("SKIPPED: /dev/kvm not available (watchdog test)");
        println!("SKIPPED: /dev/kvm not available (watchdog test)");
        return;
    };
    let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
    let machine = Machine::new(
        &kvm,
        Intel::v5(Source::Precise),
        &cpuid,
        vpmu_guests::PMU,
        999,
        1,
    )
    .expect("VM");
    let start = Instant::now();
    let results = machine.run(Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(5));
    let error = results[0].error.as_deref().unwrap_or("");
    assert!(error.contains("timeout"), "{results:?}");
    assert!(results[0].kicks >= 1);
}

#[test]
fn both_vendor_ranges_fit_one_filter() {
    let ranges = all_pmu_msr_ranges();
    // KVM_MSR_FILTER_MAX_RANGES, and each bitmap within KVM_MSR_FILTER_MAX_BITMAP_SIZE.
    assert!(ranges.len() <= 16);
    assert!(
        ranges
            .iter()
            .all(|&(a, b)| (b - a + 1).div_ceil(8) <= 0x600)
    );
    for msr in [0xc1, 0x186, 0x309, 0x345, 0x38d, 0x392, 0x3f1, 0x4c8, 0x600] {
        assert!(
            ranges.iter().any(|&(a, b)| (a..=b).contains(&msr)),
            "{msr:#x}"
        );
    }
    for msr in [0xC000_0300, 0xC001_0007, 0xC001_020B] {
        assert!(
            ranges.iter().any(|&(a, b)| (a..=b).contains(&msr)),
            "{msr:#x}"
        );
    }
}

/// The SMP design's claim: from a PMU MSR exit to the next entry the VMM takes no shared lock,
/// only the exiting vCPU's own (and a second per-vCPU lock when a PMI raised at that exit is
/// handled), whatever the layout.
#[test]
fn msr_exits_take_no_shared_lock() {
    let Ok(kvm) = crate::kvm::usable() else {
        eprintln!("SKIPPED: /dev/kvm not available (lock count test)");
        println!("SKIPPED: /dev/kvm not available (lock count test)");
        return;
    };
    let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
    let runs: [(Source, &[u8], u64, Layout); 4] = [
        (
            Source::Precise,
            vpmu_guests::BENCH,
            0,
            Layout::ThreadPerVcpu(1),
        ),
        // Two vCPU threads, each its own pCPU, with a migration.
        (
            Source::Precise,
            vpmu_guests::PMU,
            100,
            Layout::ThreadPerVcpu(2),
        ),
        // Two domains switched on one pCPU.
        (
            Source::Precise,
            vpmu_guests::PMU,
            300,
            Layout::SharedPcpu(2),
        ),
        // All mode: the profiler's WRMSRs program the pCPU's system-wide context.
        (Source::Timed, vpmu_guests::PMU, 400, Layout::SharedPcpu(3)),
    ];
    for (source, image, case, layout) in runs {
        let machine =
            Machine::with_layout(&kvm, Intel::v5(source), &cpuid, image, case, layout).expect("VM");
        let results = machine.run(Duration::from_secs(60));
        let exits: u64 = results.iter().map(|r| r.msr_exit_ns[0].0).sum();
        assert!(exits > 0, "case {case}: no MSR exit answered by the vpmu");
        for r in &results {
            assert_eq!(r.error, None, "case {case}: {}", r.console);
            let (n, locks) = (r.msr_exit_ns[0].0, r.msr_exit_locks);
            assert_eq!(locks.shared, 0, "case {case}, {:?}: {locks:?}", r.vcpu);
            assert!(
                (n..=2 * n).contains(&locks.vcpu),
                "case {case}, {:?}: {n} exits, {locks:?}",
                r.vcpu
            );
        }
    }
}

#[test]
fn reserved_domain_ids_are_refused() {
    let first = vpmu::abi::XENPMU_DOMID_FIRST_RESERVED;
    // Domains 0..0x7FEF are real domain ids; one more would be XENPMU_DOMID_SELF.
    assert!(Layout::SharedPcpu(first).check_domains().is_ok());
    let refused = Layout::SharedPcpu(first + 1).check_domains();
    assert!(
        matches!(refused, Err(MachineError::ReservedDomain { domain }) if domain == first),
        "{refused:?}"
    );
    let whole = Layout::SharedPcpus {
        pcpus: 2,
        domains: vpmu::abi::XENPMU_DOMID_HYPERVISOR + 1,
        vcpus: 1,
    };
    assert!(whole.check_domains().is_err());
    assert!(Layout::ThreadPerVcpu(4).check_domains().is_ok());
    let message = Layout::SharedPcpu(first + 1)
        .check_domains()
        .expect_err("reserved")
        .to_string();
    assert!(message.contains("0x7ff0"), "{message}");
}

/// A queued LVTPC delivery of a vCPU that is torn down (or leaves its mode) is dropped and
/// reported to the core, which counts it only if it was in flight.
#[test]
fn discarded_deliveries_leave_the_queue() {
    use crate::personality::Personality;
    use host::QueuedPmi;
    use platform::PmiContext;
    let p = Intel::v5(Source::Precise);
    let counts = [1u32, 2];
    let index = VcpuIndex::new(&counts);
    let vpmu = Vpmu::new(p.backend(), Mode::SelfProfiling, 1);
    let ids: Vec<VcpuId> = [(0, 0), (1, 0), (1, 1)]
        .map(|(domain, vcpu)| VcpuId { domain, vcpu })
        .to_vec();
    let table = Table {
        vcpus: ids
            .iter()
            .map(|&id| Mutex::new(vpmu.new_vcpu(id).expect("an ordinary domain")))
            .collect(),
        index: index.clone(),
    };
    let (tx, _rx) = mpsc::channel();
    let shared: Shared<Intel> = Shared {
        vpmu,
        vcpus: table,
        host: Host::new(Layout::SharedPcpu(2), index, vec![tx]),
        parking: vec![Mutex::new(None)],
        hold: idle::Hold::default(),
    };
    let queue = |to| {
        shared.host.queue_lvtpc(QueuedPmi {
            to,
            mask_on_delivery: false,
            context: PmiContext {
                rip: 0,
                cpl: 0,
                mode: 0,
            },
        })
    };
    assert!(queue(ids[1]) && queue(ids[1]) && queue(ids[2]));
    let stats = |id| *shared.vcpus.lock(id).expect("vCPU").stats();
    let before = stats(ids[1]);
    assert_eq!(shared.discard_queued(ids[1]), 2);
    assert!(!shared.host.has_queued(ids[1]) && shared.host.has_queued(ids[2]));
    // Nothing was in flight in the core for these: the report changes nothing.
    assert_eq!(stats(ids[1]), before);
    assert_eq!(shared.discard_all_queued(), 1);
    assert!(!shared.host.has_queued(ids[2]));
}
