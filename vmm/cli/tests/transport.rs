//! The reference transport of the xenpmu ABI (docs/abi.md "Transport"), as a guest sees it:
//! the conformance case `transport` (`vmm/guests/selftest/transport.c`) on the four precise
//! personalities. The guest discovers the interface through CPUID and checks the leaves
//! against xenpmu.h (the ABI version of the `vpmu-abi` crate) and the VMM's documented port
//! and vector, runs an operation through the register convention, and makes each malformed
//! call (RAX, RDI, RSI, access size, CPL3 with and without IOPL) expecting the specified
//! answer. Every check must run and pass. Without a usable /dev/kvm the test says so loudly
//! and passes.

use std::sync::Arc;
use std::time::Duration;

use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::{Layout, Machine};
use vpmu_selftest::records::{ResultPort, tally};

/// The case's index in `pmu.c`'s `cases[]` (the last entry).
const TRANSPORT_CASE: u64 = 20;
/// The checks `transport.c` reports: discovery 11, the operation 5, the bad calls 16.
const CHECKS: u32 = 32;

fn run_case<P: Personality + Copy + Sync>(kvm: &kvm_ioctls::Kvm, p: P) {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).expect("KVM's CPUID");
    let mut machine = Machine::with_layout(
        kvm,
        p,
        &cpuid,
        vpmu_guests::PMU,
        TRANSPORT_CASE,
        Layout::ThreadPerVcpu(1),
    )
    .expect("the VM");
    let port = Arc::new(ResultPort::default());
    machine.extend(port.clone());
    let results = machine.run(Duration::from_secs(60));
    let run = &results[0];
    let t = tally(TRANSPORT_CASE, &port.take());
    let console = &run.console;
    println!("{}:\n{console}", p.name());
    assert_eq!(t.case.as_deref(), Some("transport"), "{console}");
    assert!(
        run.error.is_none(),
        "{}: {:?}\n{console}",
        p.name(),
        run.error
    );
    assert_eq!(t.failed, 0, "{}: {:?}\n{console}", p.name(), t.failures);
    assert_eq!(t.passed, CHECKS, "{}: checks that ran\n{console}", p.name());
    assert_eq!(run.status, Some(0), "{console}");
}

#[test]
fn a_guest_discovers_and_calls_the_reference_transport() {
    let kvm = match vpmu_machine::kvm::usable() {
        Ok(kvm) => kvm,
        Err(e) => {
            let line =
                format!("SKIPPED: /dev/kvm not available: the transport case did not run ({e})");
            eprintln!("{line}");
            println!("{line}");
            return;
        }
    };
    run_case(&kvm, Intel::v5(Source::Precise));
    run_case(&kvm, Intel::v2(Source::Precise));
    run_case(&kvm, Amd::perfmon_v2(Source::Precise));
    run_case(&kvm, Amd::k7(Source::Precise));
}
