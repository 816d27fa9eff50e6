//! `vpmu`: the reference VMM of the vpmu project on KVM (kvm-ioctls/kvm-bindings).
//!
//! * `vpmu profile [options]`: system-wide sampling of guest domains by a privileged profiling
//!   domain, per-domain reports, flamegraph, JSON, built-in validation (`profile::USAGE`).
//! * `vpmu selftest [--vendor intel|amd|both] [-v]`: the guest conformance suite, a result table.
//! * `vpmu coverage [--out DIR] [--no-suite]`: the vPMU's code coverage under the suite, read by
//!   a guest through `XENPMU_OP_COVERAGE` (`coverage::USAGE`).
//! * `vpmu bench [--vendor ...]`: the cost of a PMU MSR exit handled by the vpmu vs a null handler.
//!
//! One VM per domain (one or several per run), long-mode guests from `guest/` (built by
//! `build.rs`), one software PMU model per pCPU driven by the vpmu core through
//! `vpmu::Platform`.

use std::process::ExitCode;

use vpmu_coverage as coverage;
use vpmu_machine::kvm;
use vpmu_profile as profile;
use vpmu_selftest as selftest;
use vpmu_selftest::VendorChoice;

fn usage() -> ExitCode {
    eprintln!(
        "usage: vpmu profile [options]   (vpmu profile --help)\n       vpmu coverage [options]  (vpmu coverage --help)\n       vpmu selftest [--vendor intel|amd|both] [-v]\n       vpmu bench [--vendor intel|amd|both]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
    if cmd == "profile" {
        return profile_command(&args[1..]);
    }
    if cmd == "coverage" {
        return coverage_command(&args[1..]);
    }
    let mut vendor = VendorChoice::Both;
    let mut verbose = false;
    let mut rest = args[1..].iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--vendor" => {
                vendor = match rest.next().map(String::as_str) {
                    Some("intel") => VendorChoice::Intel,
                    Some("amd") => VendorChoice::Amd,
                    Some("both") => VendorChoice::Both,
                    _ => return usage(),
                }
            }
            "-v" | "--verbose" => verbose = true,
            _ => return usage(),
        }
    }
    let kvm = match kvm::usable() {
        Ok(kvm) => kvm,
        Err(e) => {
            eprintln!("SKIPPED: /dev/kvm not available ({e})");
            println!("SKIPPED: /dev/kvm not available ({e})");
            return ExitCode::from(77);
        }
    };
    match cmd.as_str() {
        "selftest" => match selftest::selftest(&kvm, vendor, verbose) {
            Ok(results) => {
                print!("{}", selftest::table(&results));
                if results.iter().all(|r| r.failed == 0) {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Err(e) => {
                eprintln!("selftest: {e}");
                ExitCode::FAILURE
            }
        },
        "bench" => match selftest::bench(&kvm, vendor) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bench: {e}");
                ExitCode::FAILURE
            }
        },
        _ => usage(),
    }
}

/// `/dev/kvm` for `command`, or the clear message and exit status 77 without it.
fn kvm_for(command: &str) -> Result<kvm_ioctls::Kvm, ExitCode> {
    kvm::usable().map_err(|e| {
        eprintln!(
            "vpmu {command}: cannot run: /dev/kvm is not available ({e}). The guests run on \
             KVM; run this on a host with /dev/kvm readable and writable by this user."
        );
        ExitCode::from(77)
    })
}

/// `vpmu profile`: exit 0 if every built-in check passed, 1 if one failed or the run broke,
/// 2 for bad options, 77 without a usable /dev/kvm.
fn profile_command(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", profile::USAGE);
        return ExitCode::SUCCESS;
    }
    let options = match profile::Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vpmu profile: {e}\n{}", profile::USAGE);
            return ExitCode::from(2);
        }
    };
    let kvm = match kvm_for("profile") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    match profile::profile(&kvm, &options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("vpmu profile: a check FAILED (see the report)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("vpmu profile: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `vpmu coverage`: exit statuses as `coverage::USAGE` lists them.
fn coverage_command(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{}", coverage::USAGE);
        return ExitCode::SUCCESS;
    }
    if args.first().map(String::as_str) == Some("report") {
        return coverage::report_command(&args[1..]).unwrap_or_else(|e| {
            eprintln!("vpmu coverage report: {e}");
            ExitCode::FAILURE
        });
    }
    let options = match coverage::Options::parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vpmu coverage: {e}\n{}", coverage::USAGE);
            return ExitCode::from(2);
        }
    };
    let kvm = match kvm_for("coverage") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    coverage::command(&kvm, &options).unwrap_or_else(|e| {
        eprintln!("vpmu coverage: {e}");
        ExitCode::FAILURE
    })
}
