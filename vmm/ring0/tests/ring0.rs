//! The ring-0 guest on all four precise personalities, two vCPUs with real IPIs. Without a
//! usable /dev/kvm, or if the inner hypervisor's staticlib could not be built here (see
//! vmm/guests/build.rs), it says so loudly and passes.

#[test]
fn ring0_inner_hypervisor_on_two_cpus() {
    if !vpmu_ring0::available() {
        let line = "SKIPPED: ring-0 guest not built (the vpmu-guests build printed why: \
                    cargo:warning SKIPPED ...); the ring-0 test did not run";
        eprintln!("{line}");
        println!("{line}");
        return;
    }
    let kvm = match vpmu_machine::kvm::usable() {
        Ok(kvm) => kvm,
        Err(e) => {
            let line =
                format!("SKIPPED: /dev/kvm not available ({e}); the ring-0 test did not run");
            eprintln!("{line}");
            println!("{line}");
            return;
        }
    };
    let results = vpmu_ring0::ring0(&kvm).expect("the ring-0 VMs could be made");
    let report = vpmu_ring0::report(&results);
    // Straight to stderr, past the test harness's capture: the figures belong in every log.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), report.as_bytes());
    for r in results.iter().filter(|r| r.failed > 0) {
        println!("--- {} console ---\n{}", r.personality, r.console);
    }
    assert!(
        results.iter().all(|r| r.failed == 0 && r.passed > 0),
        "the ring-0 guest failed:\n{report}"
    );
}
