//! A hostile workload domain (`vpmu_guests::HOSTILE`, `vmm/guests/profile/hostile.c` and
//! `hostile_ring.c`) against the interface it attacks: privileged and malformed operations,
//! parameter blocks outside RAM or across a page, bad page and ring registrations, reserved
//! bits and absent counters in the PMU registers, RDPMC at CPL3, DEBUGCTL's branch bits, a
//! PMI flood into a masked ring and a consumer storing impossible tails. The
//! guest ends its vCPU's run with status 0xbad (its console naming the outcome) at the first
//! outcome the ABI rules out, so every run here fails if one happens.
//!
//! * In `vpmu profile` (all mode, beside the example guest) it has no vPMU: the run must end
//!   cleanly with every check passed, the hostile domain sampled, its CPL3 function among
//!   them.
//! * On the machine directly (self and hv mode, set by domain 0, which is privileged there),
//!   where it registers its page and a ring every round: every vCPU must end with status 0
//!   and a summary of its counts with no violation.
//! * With the Linux guest as the profiler (`--profiler linux`, ignored: needs the guest's
//!   artifacts): the same as the first, and Linux's console without an oops or warning.
//!
//! Without a usable /dev/kvm (or the Linux artifacts) each test says SKIPPED loudly and passes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::{Layout, Machine};

#[expect(
    dead_code,
    reason = "the Linux-guest tests' shared helpers: this test needs no kernel command line"
)]
mod linux_guest;

const SKIP: i32 = 77;

/// The KVM runs here take both of this host's cores: one at a time (a profile run sharing
/// them with another machine can fail its fairness check, which is not under test here).
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_run_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
/// `XENPMU_MODE_SELF` and `XENPMU_MODE_HV`.
const MODE_SELF: u64 = 1;
const MODE_HV: u64 = 2;

/// Says loudly that `what` did not run, and why.
fn skipped(what: &str, why: &str) {
    let line = format!("SKIPPED: {why}: {what} did not run");
    eprintln!("{line}");
    println!("{line}");
}

/// A fresh directory under the temporary one, with the hostile and the example guest in it.
fn scratch(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("vpmu-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    let hostile = dir.join("hostile.elf");
    let example = dir.join("example.elf");
    std::fs::write(&hostile, vpmu_guests::HOSTILE).expect("write hostile.elf");
    std::fs::write(&example, vpmu_guests::EXAMPLE).expect("write example.elf");
    (dir, hostile, example)
}

/// Runs `vpmu profile ARGS --quiet --out OUT`: its exit code, stdout and stderr.
fn vpmu_profile(args: &[&str], out: &Path) -> (Option<i32>, String, String) {
    let result = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .arg("profile")
        .args(args)
        .args(["--quiet", "--out"])
        .arg(out)
        .output()
        .expect("run the vpmu binary");
    (
        result.status.code(),
        String::from_utf8_lossy(&result.stdout).into_owned(),
        String::from_utf8_lossy(&result.stderr).into_owned(),
    )
}

/// The checks of a profile run with the hostile domain as domain 1 and the example as 2: it
/// passed attribution and the ring's loss accounting, and sampled both, the hostile domain's
/// CPL3 work included.
fn check_profile(out: &Path, what: &str, stdout: &str) {
    let json = std::fs::read_to_string(out.join("profile.json")).expect("profile.json written");
    let doc: serde_json::Value = serde_json::from_str(&json).expect("profile.json is JSON");
    let checks = doc["report"]["checks"].as_array().expect("checks");
    for prefix in ["attribution 100 %", "ring losses accounted"] {
        assert!(
            checks.iter().any(|c| c["passed"].as_bool() == Some(true)
                && c["name"].as_str().is_some_and(|n| n.starts_with(prefix))),
            "{what}: no passed check {prefix:?}: {checks:#?}\n{stdout}"
        );
    }
    let domain = |d: u32| {
        doc["report"]["domains"]
            .as_array()
            .expect("domains")
            .iter()
            .find(|x| x["origin"]["kind"] == "domain" && x["origin"]["domain"] == d)
            .cloned()
            .unwrap_or_else(|| panic!("{what}: no domain {d} in the report\n{stdout}"))
    };
    let hostile = domain(1);
    assert_eq!(hostile["name"], "hostile.elf", "{what}: domain 1");
    let functions: Vec<&str> = hostile["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(
        hostile["samples"].as_u64().unwrap_or(0) > 0 && hostile["user"].as_u64().unwrap_or(0) > 0,
        "{what}: the hostile domain was not sampled at CPL3: {hostile:#}"
    );
    for f in ["hostile_user", "attack_operations"] {
        assert!(
            functions.contains(&f),
            "{what}: {f} not among the hostile domain's functions: {functions:?}"
        );
    }
    assert!(
        domain(2)["functions"]
            .as_array()
            .expect("functions")
            .iter()
            .any(|f| f["name"] == "example_sort"),
        "{what}: the example guest's example_sort was not sampled"
    );
}

#[test]
fn a_hostile_domain_leaves_an_all_mode_profile_intact() {
    let _one = one_run_at_a_time();
    let (dir, hostile, example) = scratch("all");
    let out = dir.join("out");
    let args = [
        "--guest",
        hostile.to_str().expect("UTF-8"),
        "--guest",
        example.to_str().expect("UTF-8"),
        "--duration",
        "2",
        "--no-compare",
    ];
    let what = "vpmu profile --guest hostile.elf --guest example.elf";
    let (code, stdout, stderr) = vpmu_profile(&args, &out);
    if code == Some(SKIP) {
        skipped(what, &format!("/dev/kvm not available ({})", stderr.trim()));
        return;
    }
    println!("{what}:\n{stdout}");
    assert_eq!(code, Some(0), "{what} failed:\n{stdout}\n{stderr}");
    check_profile(&out, what, &stdout);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_passive_hostile_domain_is_refused_in_self_and_hv_mode() {
    let (dir, hostile, _) = scratch("refused");
    for mode in ["self", "hv"] {
        let args = ["--guest", hostile.to_str().expect("UTF-8"), "--mode", mode];
        let (code, stdout, stderr) = vpmu_profile(&args, &dir.join("out"));
        assert_eq!(code, Some(2), "--mode {mode}: {stdout}\n{stderr}");
        assert!(
            stderr.contains("has no profile_config"),
            "--mode {mode}: the refusal does not say why: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The counts one vCPU's summary line reports (`hostile: cpu C mode M rounds R ops ...`).
fn summary(line: &str) -> std::collections::HashMap<String, u64> {
    let words: Vec<&str> = line.trim_start_matches("hostile: ").split(' ').collect();
    words
        .chunks(2)
        .filter_map(|kv| Some((kv[0].to_string(), kv.get(1)?.parse().ok()?)))
        .collect()
}

/// Domain 0 (privileged on the machine) sets `mode` and leaves; domain 1, two vCPUs on two
/// pCPUs, attacks for `rounds` rounds each.
fn run_on_machine<P: Personality + Copy + Sync>(kvm: &kvm_ioctls::Kvm, p: P, mode: u64) {
    const ROUNDS: u64 = 12;
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).expect("KVM's CPUID");
    let machine = Machine::with_images(
        kvm,
        p,
        &cpuid,
        &|_| vpmu_guests::HOSTILE,
        ROUNDS | mode << 32,
        Layout::SharedPcpus {
            pcpus: 2,
            domains: 2,
            vcpus: 2,
        },
    )
    .expect("the VM");
    let what = format!("{} mode {mode}", p.name());
    let results = machine.run(Duration::from_secs(120));
    assert_eq!(results.len(), 4, "{what}: one result per vCPU");
    for r in &results {
        let id = r.vcpu.expect("a vCPU's result");
        let console = &r.console;
        println!("{what}: domain {} vCPU {}:\n{console}", id.domain, id.vcpu);
        assert!(r.error.is_none(), "{what}: {:?}\n{console}", r.error);
        assert_eq!(r.status, Some(0), "{what}: exit status\n{console}");
        if id.domain == 0 {
            continue;
        }
        let last = console
            .lines()
            .rfind(|l| l.starts_with("hostile: cpu "))
            .unwrap_or_else(|| panic!("{what}: no summary line\n{console}"));
        let counts = summary(last);
        let count = |k: &str| counts.get(k).copied().unwrap_or(0);
        assert_eq!(
            count("mode"),
            mode,
            "{what}: the mode it attacked in: {last}"
        );
        assert_eq!(count("rounds"), ROUNDS, "{what}: {last}");
        assert_eq!(count("violations"), 0, "{what}: {last}");
        // Three rings a round: period 1 (registered only), the masked flood, the consumer's.
        assert_eq!(count("rings"), 3 * ROUNDS, "{what}: {last}");
        assert_eq!(count("tail_attacks"), 3 * ROUNDS, "{what}: {last}");
        for k in [
            "ops",
            "msr_gp",
            "msr_ok",
            "rdpmc_gp",
            "ring_refused",
            "records",
            "withheld",
        ] {
            assert!(count(k) > 0, "{what}: no {k}: {last}");
        }
    }
}

#[test]
fn a_hostile_domain_with_a_page_and_a_ring_in_self_and_hv_mode() {
    let _one = one_run_at_a_time();
    let kvm = match vpmu_machine::kvm::usable() {
        Ok(kvm) => kvm,
        Err(e) => {
            skipped(
                "the hostile domain on the machine",
                &format!("/dev/kvm not available ({e})"),
            );
            return;
        }
    };
    for mode in [MODE_SELF, MODE_HV] {
        run_on_machine(&kvm, Intel::v5(Source::Timed), mode);
        run_on_machine(&kvm, Amd::perfmon_v2(Source::Timed), mode);
    }
}

#[test]
#[ignore = "boots Linux under KVM: about a minute; run with --ignored"]
fn a_hostile_domain_beside_the_linux_profiler() {
    let _one = one_run_at_a_time();
    let dir = linux_guest::artifacts();
    let what = "vpmu profile --profiler linux --guest hostile.elf --guest example.elf";
    for file in ["vmlinux", "initramfs-xenpmu.cpio"] {
        if !dir.join(file).exists() {
            let why = format!(
                "{} missing (run vmm/linux-guest/build.sh)",
                dir.join(file).display()
            );
            skipped(what, &why);
            return;
        }
    }
    let (scratch, hostile, example) = scratch("linux");
    let out = scratch.join("out");
    let args = [
        "--profiler",
        "linux",
        "--linux-guest",
        dir.to_str().expect("UTF-8"),
        "--guest",
        hostile.to_str().expect("UTF-8"),
        "--guest",
        example.to_str().expect("UTF-8"),
        "--duration",
        "2",
        "--no-compare",
    ];
    let (code, stdout, stderr) = vpmu_profile(&args, &out);
    if code == Some(SKIP) {
        skipped(what, &format!("/dev/kvm not available ({})", stderr.trim()));
        return;
    }
    println!("{what}:\n{stdout}");
    assert_eq!(code, Some(0), "{what} failed:\n{stdout}\n{stderr}");
    check_profile(&out, what, &stdout);
    let console = std::fs::read_to_string(out.join("linux-console.txt"))
        .expect("the Linux console kept in linux-console.txt");
    for bad in ["Oops", "BUG", "WARNING", "Call Trace"] {
        assert!(
            !console.contains(bad),
            "{what}: {bad:?} on the Linux console:\n{console}"
        );
    }
    // The recorder ended cleanly, having shipped samples of the hostile domain (1).
    let total = linux_guest::results(&console, &[("record", "total")]);
    assert_eq!(
        total.len(),
        1,
        "{what}: the recorder's total line:\n{console}"
    );
    assert_eq!(total[0].get("status"), Some(&"0"), "{what}: {:?}", total[0]);
    let hostile = linux_guest::results(&console, &[("record", "domain"), ("domain", "1")]);
    assert!(
        hostile
            .first()
            .is_some_and(|f| linux_guest::number::<u64>(f, "samples") > 0),
        "{what}: the recorder shipped no sample of the hostile domain:\n{console}"
    );
    let _ = std::fs::remove_dir_all(&scratch);
}
