//! `vpmu boot` end to end: someone else's test suite, upstream kvm-unit-tests `x86/pmu`
//! (commit 1da1819e49fc4938985edca67df669099b4c87a7, built with its loop count N lowered to
//! 10000 so that single-stepping it takes minutes), run unmodified on each of the four PMU
//! personalities. Each run must end with isa-debug-exit code 0 (status 0) and a `SUMMARY` line
//! without unexpected failures.
//!
//! The image is `$VPMU_KUT_PMU_ELF` (its default is in `image()`). Without the image or without a usable
//! `/dev/kvm` each test says SKIPPED loudly and passes. The runs take minutes each (see
//! vmm/README.md, "Boot images"), so they are `#[ignore]`d in the default test run:
//! `cargo test --release -p vpmu-cli --test boot -- --ignored`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const SKIP: i32 = 77;

/// The kvm-unit-tests image, if present.
fn image() -> Result<PathBuf, String> {
    let path = std::env::var_os("VPMU_KUT_PMU_ELF").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../../shared/peer/kvm-unit-tests/pmu-n10000.elf")
        },
        PathBuf::from,
    );
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found (set VPMU_KUT_PMU_ELF to a kvm-unit-tests x86/pmu image)",
            path.display()
        ))
    }
}

fn skip(pmu: &str, why: &str) {
    let line =
        format!("SKIPPED: vpmu boot --pmu {pmu} (kvm-unit-tests x86/pmu) did not run: {why}");
    eprintln!("{line}");
    println!("{line}");
}

/// The unexpected failures of a kvm-unit-tests `SUMMARY: N tests[, F unexpected failures]...`
/// line (kvm-unit-tests leaves the count out when it is 0).
fn unexpected_failures(summary: &str) -> Option<u64> {
    let rest = summary.strip_prefix("SUMMARY: ")?;
    let mut parts = rest.split(", ");
    parts.next()?.strip_suffix(" tests")?.parse::<u64>().ok()?;
    parts
        .find_map(|p| p.strip_suffix(" unexpected failures"))
        .map_or(Some(0), |n| n.parse().ok())
}

/// Whether this machine's KVM installed RTM (CPUID.(7,0):EBX bit 11) in the guest's CPUID
/// although the personality asked for none: the VMM names every leaf it could not install on
/// stderr (`asked [eax, ebx, ecx, edx], installed [...]`). kvm-unit-tests then runs its
/// TSX-cycles check, whose event select with IN_TX the personality (no TSX) refuses with #GP
/// and whose XBEGIN the machine cannot run (#UD).
fn rtm_forced(stderr: &str) -> bool {
    const RTM: u32 = 1 << 11;
    let ebx = |list: &str| -> Option<u32> {
        let inner = list.trim_start().strip_prefix('[')?;
        let word = inner.split([',', ']']).nth(1)?.trim();
        u32::from_str_radix(word, 16).ok()
    };
    stderr.lines().any(|line| {
        let Some(rest) = line.split("leaf 0x7.0: asked ").nth(1) else {
            return false;
        };
        let Some((asked, installed)) = rest.split_once(", installed ") else {
            return false;
        };
        matches!(
            (ebx(asked), ebx(installed)),
            (Some(a), Some(i)) if a & RTM == 0 && i & RTM != 0
        )
    })
}

/// On a machine that forces RTM into the guest, a run that ends in an unhandled exception
/// right after the last check before the TSX-cycles one (`running counter wrmsr`), with no
/// failure before it, is as far as kvm-unit-tests can get here: said loudly, not passed over.
fn stopped_at_forced_tsx(pmu: &str, stdout: &str, stderr: &str) -> bool {
    if !rtm_forced(stderr) || stdout.lines().any(|l| l.starts_with("FAIL")) {
        return false;
    }
    let mut reports = stdout
        .lines()
        .filter(|l| l.starts_with("PASS") || l.starts_with("SKIP"));
    let passed = stdout.lines().filter(|l| l.starts_with("PASS")).count();
    let last = reports.next_back().unwrap_or("");
    let crashed = stdout.contains("Unhandled exception");
    if !(crashed && last.contains("running counter wrmsr") && passed > 0) {
        return false;
    }
    let line = format!(
        "SKIPPED (PARTIAL): vpmu boot --pmu {pmu} (kvm-unit-tests x86/pmu) ran only up to its \
         TSX-cycles check: this machine's KVM installs RTM in the guest's CPUID against the \
         personality's (no TSX), so that check faults and ends the run; the {passed} checks \
         before it passed, none failed (any full-width or K7 pass after it did not run)"
    );
    eprintln!("{line}");
    println!("{line}");
    true
}

#[test]
fn rtm_forced_reads_the_vmms_warning() {
    let forced = "vpmu: WARNING: KVM does not install the guest CPUID asked for: leaf 0x7.0: \
                  asked [00000002, 01802042, 1a010104, 20010000], installed [00000002, \
                  f1bf2bfb, 1a005f46, 20814010]";
    assert!(rtm_forced(forced));
    let not_rtm = forced.replace("f1bf2bfb", "f1bf23fb");
    assert!(!rtm_forced(&not_rtm));
    assert!(!rtm_forced("vpmu boot: amd-k7 exited with code 0"));
}

fn kvm_unit_tests_pmu(pmu: &str) {
    let image = match image() {
        Ok(image) => image,
        Err(why) => return skip(pmu, &why),
    };
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["boot", "--pmu", pmu, "--timeout", "3000"])
        .arg(&image)
        .output()
        .expect("run the vpmu binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(SKIP) && stderr.contains("/dev/kvm is not available") {
        return skip(pmu, stderr.trim());
    }
    let failures: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    let summary = stdout.lines().rev().find(|l| l.starts_with("SUMMARY: "));
    println!(
        "{pmu}: {} ({:.0} s)\n{}{}",
        summary.unwrap_or("no SUMMARY line"),
        start.elapsed().as_secs_f64(),
        failures.join("\n"),
        stderr
    );
    if summary.is_none() && stopped_at_forced_tsx(pmu, &stdout, &stderr) {
        return;
    }
    let summary = summary.unwrap_or_else(|| panic!("{pmu}: no SUMMARY line:\n{stdout}\n{stderr}"));
    assert_eq!(
        unexpected_failures(summary),
        Some(0),
        "{pmu}: {summary}\n{}",
        failures.join("\n")
    );
    assert!(
        out.status.success(),
        "{pmu}: exit status {} ({summary}):\n{stderr}",
        out.status
    );
}

#[test]
#[ignore = "minutes per personality: cargo test --release -p vpmu-cli --test boot -- --ignored"]
fn kvm_unit_tests_pmu_intel_v5() {
    kvm_unit_tests_pmu("intel-v5");
}

#[test]
#[ignore = "minutes per personality: cargo test --release -p vpmu-cli --test boot -- --ignored"]
fn kvm_unit_tests_pmu_intel_v2() {
    kvm_unit_tests_pmu("intel-v2");
}

#[test]
#[ignore = "minutes per personality: cargo test --release -p vpmu-cli --test boot -- --ignored"]
fn kvm_unit_tests_pmu_amd_perfmonv2() {
    kvm_unit_tests_pmu("amd-perfmonv2");
}

#[test]
#[ignore = "minutes per personality: cargo test --release -p vpmu-cli --test boot -- --ignored"]
fn kvm_unit_tests_pmu_amd_k7() {
    kvm_unit_tests_pmu("amd-k7");
}

#[test]
fn summary_lines_are_read_as_kvm_unit_tests_writes_them() {
    assert_eq!(
        unexpected_failures("SUMMARY: 159 tests, 18 skipped"),
        Some(0)
    );
    assert_eq!(
        unexpected_failures("SUMMARY: 159 tests, 18 unexpected failures, 18 skipped"),
        Some(18)
    );
    assert_eq!(unexpected_failures("SUMMARY: 3 tests"), Some(0));
    assert_eq!(unexpected_failures("SUMMARY: x tests"), None);
    assert_eq!(unexpected_failures("PASS: a"), None);
}

/// The skip paths of the binary: no device (77, loud), no image (a clear error, status 2 as
/// every subcommand gives for a bad path), not a multiboot image (status 2).
#[test]
fn boot_without_kvm_or_image_says_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["boot", "/nonexistent/image.elf"])
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/image.elf"));
    // A multiboot header (magic, flags, checksum) is all the check before /dev/kvm needs.
    let dir = std::env::temp_dir().join(format!("vpmu-boot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let multiboot = dir.join("multiboot.bin");
    let magic = 0x1BAD_B002u32;
    let header: Vec<u8> = [magic, 0, magic.wrapping_neg()]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    std::fs::write(&multiboot, header).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .arg("boot")
        .arg(&multiboot)
        .env("VPMU_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(SKIP));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/kvm is not available"));
    // The binary itself is an ELF64 executable but neither a multiboot image nor a kernel
    // (a position-independent program): bad input, said before /dev/kvm is opened.
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["boot", env!("CARGO_BIN_EXE_vpmu")])
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("neither a multiboot image"), "{stderr}");
    // An initrd is for a kernel.
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .arg("boot")
        .arg(&multiboot)
        .args(["--initrd", env!("CARGO_BIN_EXE_vpmu")])
        .output()
        .expect("run the vpmu binary");
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
