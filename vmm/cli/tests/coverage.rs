//! `vpmu coverage` in the build under test. Without the `coverage` feature (the default build)
//! XENPMU_OP_COVERAGE must answer -EOPNOTSUPP to the guest, which the command reports with
//! exit status 3. With the feature (scripts/coverage.sh builds it instrumented and runs the
//! whole command, suite included), the operation's contract must hold: -ENOBUFS with the size
//! needed, -EPERM for the unprivileged domain, -EINVAL for an unknown sub-operation, and
//! valid raw profiles. Without a usable /dev/kvm the binary exits with 77 and this test says
//! so loudly and passes.

use std::process::Command;

const SKIP: i32 = 77;

#[test]
fn coverage_operation_in_this_build() {
    let out = std::env::temp_dir().join(format!("vpmu-coverage-{}", std::process::id()));
    let result = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["coverage", "--no-suite", "--out"])
        .arg(&out)
        .output()
        .expect("run the vpmu binary");
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    if result.status.code() == Some(SKIP) {
        let line = format!(
            "SKIPPED: /dev/kvm not available: vpmu coverage did not run ({})",
            stderr.trim()
        );
        eprintln!("{line}");
        println!("{line}");
        return;
    }
    println!("{stdout}\n{stderr}");
    if cfg!(feature = "coverage") {
        let checks = std::fs::read_to_string(out.join("checks.txt")).expect("checks.txt");
        for wanted in [
            "PASS -ENOBUFS carries the size needed",
            "PASS an unprivileged caller gets -EPERM",
            "PASS an unknown sub-operation gets -EINVAL",
            "PASS the privileged domain finished; read, reset, read returned 0",
            "PASS the profile after the suite is a valid raw profile of this binary",
            "PASS the profile after the reset is a valid raw profile of this binary",
        ] {
            assert!(checks.contains(wanted), "missing `{wanted}`:\n{checks}");
        }
    } else {
        assert_eq!(result.status.code(), Some(3), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("XENPMU_OP_COVERAGE returned -EOPNOTSUPP"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The tool side alone: a saved raw profile is validated; one from another binary is refused
/// against this one, and a damaged one is refused outright (no KVM needed).
#[test]
fn coverage_report_validates_a_saved_profile() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../coverage/tests-data/minicov-v10.profraw"
    );
    let out = std::env::temp_dir().join(format!("vpmu-coverage-report-{}", std::process::id()));
    let run = |file: &str| {
        Command::new(env!("CARGO_BIN_EXE_vpmu"))
            .args(["coverage", "report", file, "--out"])
            .arg(&out)
            .output()
            .expect("run the vpmu binary")
    };
    let result = run(fixture);
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stdout.contains("raw profile v10: 8 functions"), "{stdout}");
    assert_eq!(result.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("does not match"), "{stderr}");
    let damaged = out.with_extension("profraw");
    let mut bytes = std::fs::read(fixture).expect("fixture");
    bytes[8] = 11; // raw version 11
    std::fs::write(&damaged, bytes).expect("write");
    let result = run(damaged.to_str().expect("utf-8 path"));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("version"), "{stderr}");
    let _ = std::fs::remove_file(&damaged);
    let _ = std::fs::remove_dir_all(&out);
}
