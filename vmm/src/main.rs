//! `vpmu`: the reference VMM of the vpmu project on KVM (kvm-ioctls/kvm-bindings).
//!
//! * `vpmu selftest [--vendor intel|amd|both] [-v]`: the guest conformance suite, a result table.
//! * `vpmu bench [--vendor ...]`: the cost of a PMU MSR exit handled by the vpmu vs a null handler.
//!
//! One VM per domain (one or several per run), long-mode guests from `guest/` (built by
//! `build.rs`), one software PMU model per pCPU driven by the vpmu core through
//! `vpmu::Platform`.

mod attribution;
mod guest;
mod kick;
mod kvm;
mod machine;
mod personality;
#[allow(dead_code)]
mod profile;
mod selftest;

use std::process::ExitCode;

use selftest::VendorChoice;

fn usage() -> ExitCode {
    eprintln!(
        "usage: vpmu selftest [--vendor intel|amd|both] [-v]\n       vpmu bench [--vendor intel|amd|both]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        return usage();
    };
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
