//! `vpmu profile --profiler linux` end to end on KVM: the project's Linux guest is domain 0,
//! the privileged profiling domain. Its `/init` loads the xenpmu driver (`xenpmu.ko
//! mode=all|hv`) and runs the static recorder `xenpmu-record`, which reads the driver's
//! sample ring through `/dev/xenpmu` and ships it to the VMM, while the three built-in
//! workload domains share the pCPU with it. Every check of the default run applies as with
//! the freestanding profiler (attribution 100 % against the VMM's record of each PMI, the
//! ring's loss accounting, fairness, function and call-stack shares, passive vs self
//! ranking), plus the recorder's own per-domain counts against the VMM's decode; the outputs
//! open in `perf report` and `go tool pprof`. Intel v5 and AMD PerfMonV2, all mode; hv mode
//! (the hypervisor's samples reach Linux too) on Intel.
//!
//! Needs the artifacts of `vmm/linux-guest/build.sh` (`$VPMU_LINUX_GUEST_DIR`, default
//! `target/linux-guest`) and `/dev/kvm`; without either each test says SKIPPED loudly and
//! passes. `cargo test --release -p vpmu-cli --test profile_linux -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

#[expect(
    dead_code,
    reason = "the shared Linux-guest helpers; this test needs the artifacts and the forbidden lines"
)]
mod linux_guest;

const SKIP: i32 = 77;

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vpmu-linux-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Says loudly that `what` did not run, and why.
fn skipped(what: &str, why: &str) {
    let line = format!("SKIPPED: {why}: {what} did not run");
    eprintln!("{line}");
    println!("{line}");
}

/// Runs `vpmu profile --profiler linux ARGS --quiet --out DIR`, which must exit 0 (every
/// check made passed): the JSON document and stdout, or None (said loudly) without the
/// guest's artifacts or /dev/kvm.
fn profile(args: &[&str], out: &Path) -> Option<(serde_json::Value, String)> {
    let dir = linux_guest::artifacts();
    let what = format!("vpmu profile --profiler linux {}", args.join(" "));
    if let Err(why) = linux_guest::kernel_and_initrd("initramfs-xenpmu.cpio") {
        skipped(&what, &why);
        return None;
    }
    let started = std::time::Instant::now();
    let result = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["profile", "--profiler", "linux", "--linux-guest"])
        .arg(&dir)
        .args(args)
        .args(["--quiet", "--out"])
        .arg(out)
        .output()
        .expect("run the vpmu binary");
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&result.stderr);
    if result.status.code() == Some(SKIP) {
        skipped(
            &what,
            &format!("/dev/kvm not available ({})", stderr.trim()),
        );
        return None;
    }
    println!("{what}: {:.1} s\n{stdout}", started.elapsed().as_secs_f64());
    assert!(
        result.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        result.status
    );
    let console = std::fs::read_to_string(out.join("linux-console.txt"))
        .expect("the Linux console kept in linux-console.txt");
    for bad in linux_guest::FORBIDDEN {
        let hits: Vec<&str> = console.lines().filter(|l| l.contains(bad)).collect();
        assert!(
            hits.is_empty(),
            "{what}: the kernel log has {bad:?}:\n{}",
            hits.join("\n")
        );
    }
    let json = std::fs::read_to_string(out.join("profile.json")).expect("profile.json written");
    Some((
        serde_json::from_str(&json).expect("profile.json is JSON"),
        stdout,
    ))
}

/// The names of the checks made (not skipped) that passed.
fn passed(doc: &serde_json::Value) -> Vec<String> {
    doc["report"]["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["passed"].as_bool() == Some(true))
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect()
}

/// The samples of domain `d` in the report.
fn domain_samples(doc: &serde_json::Value, d: u32) -> u64 {
    doc["report"]["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .find(|x| x["origin"]["kind"] == "domain" && x["origin"]["domain"] == d)
        .and_then(|x| x["samples"].as_u64())
        .unwrap_or(0)
}

/// Runs `program args`, expecting success; its stdout.
fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): scripts/setup.sh installs linux-perf and golang-go")
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {} failed ({}):\n{stdout}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The checks every Linux-profiler run must have made and passed, and its outputs opened by
/// perf and pprof with each workload's hot function.
fn check_run(doc: &serde_json::Value, out: &Path, what: &str, compared: bool) {
    let passed = passed(doc);
    let mut want = vec![
        "attribution 100 %",
        "ring losses accounted",
        "the in-guest recorder's per-domain counts",
        "fairness",
    ];
    if compared {
        want.push("self-mode run: attribution 100 %");
    }
    for prefix in want {
        assert!(
            passed.iter().any(|n| n.starts_with(prefix)),
            "{what}: no passed check {prefix:?}: {:#?}",
            doc["report"]["checks"]
        );
    }
    // Domain 0 is the Linux guest, symbolized from vmlinux; every workload was sampled.
    let domains = doc["report"]["domains"].as_array().expect("domains");
    assert!(
        domains
            .iter()
            .any(|d| d["name"].as_str() == Some("linux (vmlinux)")),
        "{what}: domain 0 is not the Linux guest: {domains:#?}"
    );
    for d in 1..=3 {
        assert!(domain_samples(doc, d) > 0, "{what}: no samples of dom{d}");
    }
    let perf_data = out.join("perf.data");
    let perf_data = perf_data.to_str().expect("a UTF-8 path");
    let report = tool(
        "perf",
        &["report", "-i", perf_data, "--stdio", "--no-children"],
    );
    let pb = out.join("profile.pb.gz");
    let pb = pb.to_str().expect("a UTF-8 path");
    let top = tool(
        "go",
        &["tool", "pprof", "-top", "-sample_index=samples", pb],
    );
    for hot in ["w1_deflate", "w2_lookup", "w3_merge"] {
        assert!(
            report.contains(&format!("[.] {hot}")),
            "{what}: {hot} not in perf report:\n{report}"
        );
        assert!(top.contains(hot), "{what}: {hot} not in pprof -top:\n{top}");
    }
}

#[test]
#[ignore = "boots Linux under KVM: about a minute; run with --ignored"]
fn linux_profiles_all_mode_intel() {
    let out = out_dir("all-intel");
    let Some((doc, _)) = profile(&["--vendor", "intel", "--duration", "2"], &out) else {
        return;
    };
    check_run(&doc, &out, "all mode, Intel", true);
    assert!(
        passed(&doc)
            .iter()
            .any(|n| n.contains("passive") || n.contains("seed 002")),
        "the passive vs self ranking was not checked: {:#?}",
        doc["report"]["checks"]
    );
}

#[test]
#[ignore = "boots Linux under KVM: about a minute; run with --ignored"]
fn linux_profiles_all_mode_amd() {
    let out = out_dir("all-amd");
    let Some((doc, _)) = profile(&["--vendor", "amd", "--duration", "2"], &out) else {
        return;
    };
    check_run(&doc, &out, "all mode, AMD", true);
}

#[test]
#[ignore = "boots Linux under KVM: about a minute; run with --ignored"]
fn linux_receives_the_hypervisors_samples_in_hv_mode() {
    let out = out_dir("hv-intel");
    let Some((doc, _)) = profile(
        &["--vendor", "intel", "--mode", "hv", "--duration", "2"],
        &out,
    ) else {
        return;
    };
    let passed = passed(&doc);
    for prefix in [
        "attribution 100 %",
        "the in-guest recorder's per-domain counts",
    ] {
        assert!(
            passed.iter().any(|n| n.starts_with(prefix)),
            "hv mode: no passed check {prefix:?}: {:#?}",
            doc["report"]["checks"]
        );
    }
    let hypervisor = doc["report"]["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .find(|x| x["origin"]["kind"] == "hypervisor")
        .and_then(|x| x["samples"].as_u64())
        .unwrap_or(0);
    assert!(
        hypervisor > 0,
        "hv mode: Linux received no hypervisor sample"
    );
}
