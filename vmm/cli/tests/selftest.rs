//! Runs `vpmu selftest` for both vendor personalities on KVM. Without a usable /dev/kvm the
//! binary exits with 77 and this test says so loudly and passes.

use std::process::Command;

const SKIP: i32 = 77;

fn selftest(vendor: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["selftest", "--vendor", vendor])
        .output()
        .expect("run the vpmu binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(SKIP) {
        let line = format!(
            "SKIPPED: /dev/kvm not available: vpmu selftest --vendor {vendor} did not run ({})",
            stderr.trim()
        );
        eprintln!("{line}");
        println!("{line}");
        return;
    }
    println!("{stdout}");
    assert!(
        out.status.success(),
        "vpmu selftest --vendor {vendor} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains(" passed, 0 failed"),
        "no result table:\n{stdout}"
    );
}

/// Both vendors, one after the other: the timed cases measure kick latency, which suffers
/// when two suites compete for the host's CPUs.
#[test]
fn selftest_both_vendors() {
    selftest("intel");
    selftest("amd");
}

/// The skip path itself: a missing device gives exit status 77 and the loud line.
#[test]
fn missing_kvm_is_a_loud_skip() {
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["selftest"])
        .env("VPMU_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(SKIP));
    assert!(String::from_utf8_lossy(&out.stdout).contains("SKIPPED: /dev/kvm not available"));
}
