//! The host switches the xenpmu interface off while the xenpmu driver (`xenpmu.ko`) and its
//! recorder sample in the project's Linux guest (`vpmu boot --xenpmu-off-after SECONDS`; the
//! semantics are in vmm/machine/src/interface_off.rs: Xen's administrator setting the vPMU
//! mode off, the driver not told).
//!
//! The guest runs the `/init` step `record` in mode self (`initramfs-xenpmu.cpio`: insmod
//! `reader=user start=open`, `/bin/xenpmu-record SECONDS --doorbell none`, `/proc/xenpmu`,
//! rmmod) for a session far longer than the time to the switch. Checks, per personality:
//! the VMM switched the mode off (self -> off) and the guest got no PMI after it; the driver
//! said so in one kernel-log line per CPU (`xenpmu: cpu0: the hypervisor switched the
//! interface off (...)`); the recorder ended its session early with a line saying so, status
//! 3 and `ended_by=interface-off`, having read every record published before (its counts add
//! up to the producer's final ones, which are the PMIs the VMM delivered before the switch);
//! the losses are counted (`lost_unreported` = the producer's lost less those the records
//! reported; the unsampled rest of the session); `/proc/xenpmu` and the driver's finish line
//! say the same with `off=1`; rmmod works; the kernel log has no oops, BUG or WARNING.
//!
//! Needs the artifacts of `vmm/linux-guest/build.sh` in `$VPMU_LINUX_GUEST_DIR` (default
//! `target/linux-guest`) and `/dev/kvm`; without either each test says SKIPPED loudly and
//! passes. `cargo test --release -p vpmu-cli --test linux_module_off -- --ignored`.

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

mod linux_guest;
use linux_guest::{FORBIDDEN, cmdline, kernel_and_initrd, results, tail};

fn number(f: &HashMap<&str, &str>, key: &str) -> u64 {
    linux_guest::number(f, key)
}

const SKIP: i32 = 77;
/// The recorder's planned session (s) and when the host switches the interface off (s after
/// the guest's first PMI, which comes when the recorder opens /dev/xenpmu: `start=open`).
const SESSION_S: f64 = 20.0;
const OFF_AFTER_S: f64 = 1.5;
fn switched_off_mid_session(pmu: &str) {
    let (kernel, initrd) = match kernel_and_initrd("initramfs-xenpmu.cpio") {
        Ok(files) => files,
        Err(why) => {
            let line = format!("SKIPPED: xenpmu switch-off on {pmu} did not run: {why}");
            eprintln!("{line}");
            println!("{line}");
            return;
        }
    };
    let steps = format!(
        "vpmu.run=record vpmu.seconds={SESSION_S} vpmu.mode=self vpmu.period=1000000 \
         vpmu.doorbell=none"
    );
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args(["boot", "--pmu", pmu, "--timeout", "300", "--mem", "128"])
        .args(["--xenpmu-off-after", &OFF_AFTER_S.to_string()])
        .arg("--initrd")
        .arg(&initrd)
        .arg("--append")
        .arg(format!("{} {steps}", cmdline()))
        .arg(&kernel)
        .output()
        .expect("run the vpmu binary");
    let console = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() == Some(SKIP) && stderr.contains("/dev/kvm is not available") {
        let line = format!(
            "SKIPPED: xenpmu switch-off on {pmu} did not run: {}",
            stderr.trim()
        );
        eprintln!("{line}");
        println!("{line}");
        return;
    }
    let wall = start.elapsed().as_secs_f64();
    println!("{pmu}: {wall:.0} s\n{stderr}");
    for line in console.lines().filter(|l| l.contains("xenpmu")) {
        println!("{pmu} console: {line}");
    }

    // The VMM's side: mode self -> off, no PMI delivered after it.
    let vmm = stderr
        .lines()
        .find(|l| l.contains("the host switched the xenpmu interface off"))
        .unwrap_or_else(|| panic!("{pmu}: no switch-off line from the VMM:\n{stderr}"));
    assert!(vmm.contains("(mode self -> off"), "{pmu}: {vmm}");
    let count_after = |label: &str| -> u64 {
        let at = vmm
            .find(label)
            .unwrap_or_else(|| panic!("{pmu}: {label:?} in {vmm}"));
        vmm[at + label.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{pmu}: no number after {label:?} in {vmm}"))
    };
    let delivered_before = count_after("PMIs delivered before ");
    assert_eq!(
        count_after(", after "),
        0,
        "{pmu}: PMIs after the switch: {vmm}"
    );
    assert!(delivered_before > 0, "{pmu}: {vmm}");

    // The driver: one line per CPU (the guest has one), naming what happened.
    let off_lines: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("xenpmu: cpu0: the hypervisor switched the interface off ("))
        .collect();
    assert_eq!(
        off_lines.len(),
        1,
        "{pmu}: {off_lines:?}\n{}",
        tail(&console, 60)
    );
    assert!(
        off_lines[0].contains("MODE_GET: mode off"),
        "{pmu}: {}",
        off_lines[0]
    );

    // The recorder: ended early, said so, read and accounted for everything published.
    assert!(
        console.contains("xenpmu-record: cpu0: the hypervisor switched the interface off"),
        "{pmu}: no line from the recorder:\n{}",
        tail(&console, 60)
    );
    let off = results(&console, &[("record", "interface-off")]);
    assert_eq!(off.len(), 1, "{pmu}: {off:?}");
    let at_s: f64 = linux_guest::number(&off[0], "at_s");
    assert!(
        (OFF_AFTER_S * 0.5..SESSION_S / 2.0).contains(&at_s),
        "{pmu}: the recorder noticed at {at_s} s (switch {OFF_AFTER_S} s after its start)"
    );
    let cpu = results(&console, &[("record", "cpu")]);
    let total = results(&console, &[("record", "total")]);
    let driver = results(&console, &[("record", "driver")]);
    assert!(
        cpu.len() == 1 && total.len() == 1 && driver.len() == 1,
        "{pmu}: {cpu:?} {total:?} {driver:?}\n{}",
        tail(&console, 60)
    );
    let (cpu, total, driver) = (&cpu[0], &total[0], &driver[0]);
    println!("{pmu}: {cpu:?}\n{pmu}: {total:?}\n{pmu}: {driver:?}");
    assert_eq!(
        total.get("ended_by"),
        Some(&"interface-off"),
        "{pmu}: {total:?}"
    );
    assert_eq!(total.get("status"), Some(&"3"), "{pmu}: {total:?}");
    let unsampled: f64 = linux_guest::number(total, "unsampled_s");
    assert!(
        unsampled > SESSION_S / 2.0 && unsampled < SESSION_S,
        "{pmu}: {total:?}"
    );
    let step = results(&console, &[("step", "record")]);
    assert!(
        step.len() == 1 && step[0].get("status") == Some(&"3"),
        "{pmu}: the record step: {step:?}"
    );
    let samples = number(cpu, "samples");
    let (lost, produced_lost) = (number(cpu, "lost"), number(cpu, "produced_lost"));
    assert!(samples > 0, "{pmu}: {cpu:?}");
    assert_eq!(cpu.get("accounted"), Some(&"1"), "{pmu}: {cpu:?}");
    assert_eq!(cpu.get("interface_off"), Some(&"1"), "{pmu}: {cpu:?}");
    assert_eq!(number(cpu, "produced"), samples, "{pmu}: {cpu:?}");
    assert_eq!(
        number(cpu, "lost_unreported"),
        produced_lost - lost,
        "{pmu}: {cpu:?}"
    );
    // Every sample the core generated for the ring before the switch is a record, a lost
    // sample or a withheld one: the VMM delivered exactly those.
    assert_eq!(
        samples + produced_lost + number(cpu, "withheld"),
        delivered_before,
        "{pmu}: the producer's counts vs the VMM's PMIs before the switch: {cpu:?} {vmm}"
    );
    // The driver agrees, knows it is off, and counted the same losses.
    assert_eq!(driver.get("off"), Some(&"1"), "{pmu}: {driver:?}");
    assert_eq!(driver.get("accounted"), Some(&"1"), "{pmu}: {driver:?}");
    for key in [
        "samples",
        "lost",
        "produced",
        "produced_lost",
        "lost_unreported",
    ] {
        assert_eq!(
            number(driver, key),
            number(cpu, key),
            "{pmu}: /proc/xenpmu's {key} vs the recorder's"
        );
    }
    // The unload: FINISH works (the registrations outlived the switch), accounted.
    let finished: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("xenpmu: cpu0: finished: "))
        .collect();
    assert!(
        finished.len() == 1
            && finished[0].contains(" off=1 ")
            && finished[0].ends_with("accounted=1"),
        "{pmu}: {finished:?}"
    );
    assert!(
        console.contains("xenpmu: unloaded") && !console.contains("FINISH refused"),
        "{pmu}: the unload:\n{}",
        tail(&console, 40)
    );
    assert!(
        !console.contains("init: rmmod xenpmu failed"),
        "{pmu}: rmmod failed"
    );
    for bad in FORBIDDEN {
        let hits: Vec<&str> = console.lines().filter(|l| l.contains(bad)).collect();
        assert!(
            hits.is_empty(),
            "{pmu}: the kernel log has {bad:?}:\n{}",
            hits.join("\n")
        );
    }
    // The run itself ends normally: isa-debug-exit with the record step's failure bit (128),
    // which `vpmu boot` answers with status 1.
    assert!(
        out.status.code() == Some(1) && stderr.contains("exited with code 128"),
        "{pmu}: status {:?}\n{stderr}",
        out.status.code()
    );
}

#[test]
#[ignore = "half a minute per personality: cargo test --release -p vpmu-cli --test linux_module_off -- --ignored"]
fn xenpmu_switched_off_mid_session_intel_v5() {
    switched_off_mid_session("intel-v5");
}

#[test]
#[ignore = "half a minute per personality: cargo test --release -p vpmu-cli --test linux_module_off -- --ignored"]
fn xenpmu_switched_off_mid_session_amd_perfmonv2() {
    switched_off_mid_session("amd-perfmonv2");
}
