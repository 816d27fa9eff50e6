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
        crate::guest::PMU,
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
