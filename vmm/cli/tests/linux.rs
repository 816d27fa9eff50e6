//! `vpmu boot` with a real Linux guest: the project-built Debian Linux 6.1 kernel and
//! initramfs (`vmm/linux-guest/build.sh`) on each PMU personality, Linux's own perf driver on
//! the virtual PMU, and the guest's perf tools measuring a workload whose construction is
//! known (`perftest.c`: `hot_a` runs 3 parts and `hot_b` 1 part, by iteration count).
//!
//! Checks, per personality: the run ends with isa-debug-exit code 0 (every step ran); the
//! driver's `Performance Events:` line and its counts name this personality; `cycles:u` of the
//! workload is within ±3 % of the workload's own TSC time measured natively (uncounted) in the
//! guest; the events the timed source cannot count behave as documented (Intel: the open
//! fails, CPUID leaf 0xA marks them unavailable; AMD: the open succeeds and they count 0,
//! while the VMM names them on stderr); the samples' shares are within ±3 points of 75/25;
//! and the kernel log has no warning the project causes. With Debian's perf (the
//! `initramfs-perf.cpio`), `perf stat` and `perf record` + `perf report` give the same.
//!
//! The artifacts are found in `$VPMU_LINUX_GUEST_DIR` (default `target/linux-guest`). Without
//! them or without a usable `/dev/kvm` each test says SKIPPED loudly and passes. A run takes
//! about a minute (the static tool) or a few (Debian perf), so the tests are `#[ignore]`d in
//! the default run: `cargo test --release -p vpmu-cli --test linux -- --ignored`.

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

mod linux_guest;
use linux_guest::{FORBIDDEN, artifacts, cmdline, results, tail};

/// Field `key` of a result line as a number.
fn number(f: &HashMap<&str, &str>, key: &str) -> f64 {
    linux_guest::number(f, key)
}

const SKIP: i32 = 77;
/// The construction of the workload: hot_a's share of the work.
const HOT_A: f64 = 75.0;
const HOT_B: f64 = 25.0;
/// How far a share may be from the construction (points), and cycles:u from the reference.
const SHARE_POINTS: f64 = 3.0;
/// cycles:u against the workload's own TSC time. The timed source splits each run between CPL0
/// (emulated here) and CPL3 by a per-run calibration of the emulation's speed, which moves with
/// the host's load (352 to 453 ns per emulated instruction within one hour on one host): on a
/// quiet host the ratio reads 0.99-1.02, with three builds beside it 1.03. A counter that
/// counted the kernel too, or lost its user time, would be off by far more than 8 %.
const CYCLES_TOLERANCE: f64 = 0.08;
/// How far `perf stat`'s cycles:u of the whole `perftest work` process may be from the work's
/// own TSC time.
const PERF_STAT_TOLERANCE: f64 = 0.15;

fn skip(what: &str, why: &str) {
    let line = format!("SKIPPED: Linux guest {what} did not run: {why}");
    eprintln!("{line}");
    println!("{line}");
}

/// The text between `VPMU-BEGIN name` and `VPMU-END name`.
fn section<'a>(console: &'a str, name: &str) -> Option<&'a str> {
    let begin = format!("VPMU-BEGIN {name}\n");
    let start = console.find(&begin)? + begin.len();
    let end = console[start..].find(&format!("VPMU-END {name}"))?;
    Some(&console[start..start + end])
}

/// What the kernel must say about each personality's PMU.
/// The host's CPU family (CPUID.1:EAX, with the extended family), which the guest sees too.
fn host_cpu_family() -> u32 {
    let eax = std::arch::x86_64::__cpuid(1).eax;
    let base = eax >> 8 & 0xf;
    if base == 0xf {
        base + (eax >> 20 & 0xff)
    } else {
        base
    }
}

fn expected_driver(pmu: &str) -> (&'static str, &'static [&'static str]) {
    match pmu {
        "intel-v5" => (
            "AnyThread deprecated, full-width counters, Intel PMU driver.",
            &[
                "... version:                5",
                "... generic registers:      8",
                "... fixed-purpose events:   2",
            ],
        ),
        "intel-v2" => (
            "Intel PMU driver.",
            &[
                "... version:                2",
                "... generic registers:      4",
                "... fixed-purpose events:   3",
            ],
        ),
        // Linux says "Fam17h+ " for a CPU family of 0x17 or above; the personalities pass the
        // host's family through (leaf 1), so on an Intel host (family 6) the AMD driver line
        // has no such prefix.
        "amd-perfmonv2" if host_cpu_family() >= 0x17 => (
            "Fam17h+ core perfctr, AMD PMU driver.",
            &[
                "... version:                2",
                "... generic registers:      6",
            ],
        ),
        "amd-perfmonv2" => (
            "Events: core perfctr, AMD PMU driver.",
            &[
                "... version:                2",
                "... generic registers:      6",
            ],
        ),
        "amd-k7" => (
            "AMD PMU driver.",
            &[
                "... version:                0",
                "... generic registers:      4",
            ],
        ),
        other => panic!("no such personality {other}"),
    }
}

struct Run {
    console: String,
    stderr: String,
    code: Option<i32>,
}

/// Boots the project's kernel on `pmu` with `initrd` (`mem` MiB), running `/init`'s steps
/// `run`.
fn boot(pmu: &str, initrd: &str, mem: u32, run: &str) -> Option<Run> {
    let (kernel, initrd) = match linux_guest::kernel_and_initrd(initrd) {
        Ok(files) => files,
        Err(why) => {
            skip(pmu, &why);
            return None;
        }
    };
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args([
            "boot",
            "--pmu",
            pmu,
            "--timeout",
            "900",
            "--mem",
            &mem.to_string(),
        ])
        .arg("--initrd")
        .arg(&initrd)
        .arg("--append")
        .arg(format!("{} vpmu.run={run}", cmdline()))
        .arg(&kernel)
        .output()
        .expect("run the vpmu binary");
    // The guest's tty turns each newline into CR LF.
    let console = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() == Some(SKIP) && stderr.contains("/dev/kvm is not available") {
        skip(pmu, stderr.trim());
        return None;
    }
    println!(
        "{pmu} ({run}): {:.0} s\n{}",
        start.elapsed().as_secs_f64(),
        stderr
    );
    Some(Run {
        console,
        stderr,
        code: out.status.code(),
    })
}

fn check_kernel_log(pmu: &str, r: &Run) {
    let (line, details) = expected_driver(pmu);
    let events = r
        .console
        .lines()
        .find(|l| l.contains("Performance Events: "))
        .unwrap_or_else(|| panic!("{pmu}: no Performance Events line:\n{}", r.console));
    if pmu.starts_with("intel") {
        // Linux names the microarchitecture when it knows the CPU model, which the
        // personalities pass through from the host ("Sapphire Rapids events, " on such a
        // host), and says "generic architected perfmon, " otherwise (an AMD host's model): the
        // rest of the line, and the enumeration below, must be the personality's either way.
        let (_, after) = events
            .split_once("Performance Events: ")
            .unwrap_or_default();
        let (model, rest) = after.split_once(", ").unwrap_or_default();
        assert!(
            model == "generic architected perfmon" || model.ends_with(" events"),
            "{pmu}: {events}"
        );
        assert_eq!(rest, line, "{pmu}: {events}");
    } else {
        assert!(events.ends_with(line), "{pmu}: {events}");
    }
    for d in details {
        assert!(r.console.contains(d), "{pmu}: no `{d}` in the kernel log");
    }
    for bad in FORBIDDEN {
        let hits: Vec<&str> = r.console.lines().filter(|l| l.contains(bad)).collect();
        assert!(
            hits.is_empty(),
            "{pmu}: the kernel log has {bad:?}:\n{}",
            hits.join("\n")
        );
    }
}

fn check_exit(pmu: &str, r: &Run) {
    assert!(
        r.code == Some(0) && r.stderr.contains("exited with code 0"),
        "{pmu}: the guest's run did not end with isa-debug-exit code 0 (status {:?}):\n{}\n{}",
        r.code,
        tail(&r.console, 60),
        r.stderr
    );
}

/// The `[ seconds]` stamp of the kernel line containing `what`.
fn stamp(console: &str, what: &str) -> Option<f64> {
    let line = console.lines().find(|l| l.contains(what))?;
    line.strip_prefix('[')?
        .split(']')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// A number in the VMM's closing line (`..., N PMU MSR exits, M PMIs`).
fn closing(stderr: &str, unit: &str) -> Option<f64> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.contains(" PMU MSR exits"))?;
    let before = line.split(unit).next()?;
    before
        .rsplit([' ', ','])
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

/// One row of the measurement table in vmm/README.md ("Linux guests"): boot to `/init`
/// (guest clock), the whole run, PMU MSR exits per second and per PMI, and the cost of one
/// PMI round trip (the sampling step's wall time over its work's own time, per sample).
fn measurements(pmu: &str, r: &Run, wall: f64, per_pmi_ms: f64) {
    let init = stamp(&r.console, "Run /init as init process").unwrap_or(f64::NAN);
    let took = r
        .stderr
        .lines()
        .rev()
        .find_map(|l| {
            l.split(" after ")
                .nth(1)?
                .split(" s,")
                .next()?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(wall);
    let exits = closing(&r.stderr, " PMU MSR exits").unwrap_or(f64::NAN);
    let pmis = closing(&r.stderr, " PMIs").unwrap_or(f64::NAN);
    println!(
        "MEASURED {pmu}: boot to /init {init:.1} s (guest clock); run {took:.1} s; {exits} PMU \
         MSR exits ({:.0}/s, {:.1} per PMI over {pmis} PMIs); PMI round trip {per_pmi_ms:.2} ms",
        exits / took,
        exits / pmis.max(1.0)
    );
}

/// The static tool: counting and sampling.
fn static_tool(pmu: &str) {
    let start = Instant::now();
    // Two samples per ms of a 2.4 GHz TSC: about 2000 samples of 1 s of work, so that a
    // share's binomial spread (about 1 point) is a third of the ±3-point bound.
    let Some(r) = boot(
        pmu,
        "initramfs.cpio",
        128,
        "count,sample vpmu.period=1222706",
    ) else {
        return;
    };
    let wall = start.elapsed().as_secs_f64();
    check_exit(pmu, &r);
    check_kernel_log(pmu, &r);
    let intel = pmu.starts_with("intel");

    let summary = results(&r.console, &[("cmd", "count")])
        .into_iter()
        .find(|f| f.contains_key("calibrated_tsc_median"))
        .unwrap_or_else(|| panic!("{pmu}: no count summary:\n{}", r.console));
    let reference = number(&summary, "calibrated_tsc_median");
    let event = |name: &str| {
        results(&r.console, &[("cmd", "count"), ("event", name)])
            .pop()
            .unwrap_or_else(|| panic!("{pmu}: no count of {name}"))
    };
    let cycles_u = number(&event("cycles:u"), "value");
    let ratio = cycles_u / reference;
    println!("{pmu}: cycles:u / the workload's own TSC time = {ratio:.4}");
    assert!(
        (ratio - 1.0).abs() <= CYCLES_TOLERANCE,
        "{pmu}: cycles:u {cycles_u} is {ratio:.4} of the workload's TSC time {reference}"
    );
    assert!(
        number(&event("cycles:k"), "value") > 0.0,
        "{pmu}: no kernel cycles"
    );
    for name in ["instructions:u", "branches:u"] {
        let e = event(name);
        if intel {
            // CPUID leaf 0xA EBX marks them unavailable: Linux refuses the event.
            assert_eq!(e.get("open_error"), Some(&"ENOENT"), "{pmu}: {name}: {e:?}");
        } else {
            // AMD has no such enumeration: the event opens and counts nothing, and the VMM
            // names it.
            assert_eq!(number(&e, "value"), 0.0, "{pmu}: {name}: {e:?}");
        }
    }
    if !intel {
        assert!(
            r.stderr.contains("the timed source cannot count"),
            "{pmu}: the VMM did not name the uncountable events:\n{}",
            r.stderr
        );
    }

    let sample = results(&r.console, &[("cmd", "sample")])
        .into_iter()
        .find(|f| f.contains_key("samples"))
        .unwrap_or_else(|| panic!("{pmu}: no sampling result:\n{}", r.console));
    let samples = number(&sample, "samples");
    let (a, b) = (number(&sample, "share_a"), number(&sample, "share_b"));
    println!("{pmu}: {samples} samples, hot_a {a:.2} %, hot_b {b:.2} %");
    assert!(samples >= 1000.0, "{pmu}: too few samples: {sample:?}");
    assert!(
        (a - HOT_A).abs() <= SHARE_POINTS && (b - HOT_B).abs() <= SHARE_POINTS,
        "{pmu}: shares {a} / {b}, built {HOT_A} / {HOT_B}: {sample:?}"
    );
    assert_eq!(number(&sample, "lost"), 0.0, "{pmu}: {sample:?}");
    // Per sample: the sampled run's wall time less the same work's time uncounted (its
    // iterations at the natively calibrated ticks per iteration), in TSC ticks per ms.
    let calibration = results(&r.console, &[("cmd", "sample")])
        .into_iter()
        .find(|f| f.contains_key("tsc_per_iter"))
        .unwrap_or_else(|| panic!("{pmu}: no sampling calibration"));
    let work = number(&sample, "iterations") * number(&calibration, "tsc_per_iter");
    let per_pmi_ms =
        (number(&sample, "wall_tsc") - work) / samples / number(&calibration, "tsc_khz");
    measurements(pmu, &r, wall, per_pmi_ms);
}

/// A real perf in the guest (`initrd`: Debian's perf and its libraries, or perf built static
/// from the same source): `perf stat` and `perf record` + `perf report`.
fn perf_in_guest(pmu: &str, initrd: &str) {
    let start = Instant::now();
    // The 36 MB archive and what it unpacks to need more than the default 128 MiB.
    // perf record at two samples per ms of a 2.4 GHz TSC (about 2 000 samples), so that a
    // share's spread stays well inside the bound (a few samples of the user-only event land
    // at kernel addresses, about 1 %, and count in perf report's percentages).
    let Some(r) = boot(pmu, initrd, 256, "perf vpmu.period=1222706") else {
        return;
    };
    let wall = start.elapsed().as_secs_f64();
    check_exit(pmu, &r);
    check_kernel_log(pmu, &r);
    let calibration = results(&r.console, &[])
        .into_iter()
        .find(|f| f.contains_key("tsc_per_iter") && f.contains_key("iterations"))
        .unwrap_or_else(|| panic!("{pmu}: no calibration:\n{}", r.console));
    let reference = number(&calibration, "iterations") * number(&calibration, "tsc_per_iter");
    let stat = section(&r.console, "perf-stat")
        .unwrap_or_else(|| panic!("{pmu}: no perf stat output:\n{}", tail(&r.console, 80)));
    // perf stat -x, : value,unit,event,...
    let cycles_u: f64 = stat
        .lines()
        .find_map(|l| {
            let mut cols = l.split(',');
            let value = cols.next()?;
            (cols.nth(1)? == "cycles:u").then(|| value.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{pmu}: no cycles:u in perf stat:\n{stat}"));
    let ratio = cycles_u / reference;
    println!("{pmu}: perf stat cycles:u / the workload's TSC time = {ratio:.4}");
    // perf stat counts the whole process, exec to exit, not only the workload's window as the
    // static tool does; measured 1.07-1.10 here (vmm/README.md, "Linux guests": not yet
    // explained). The bound for real perf is on the shares; this one catches a gross error.
    assert!(
        (ratio - 1.0).abs() <= PERF_STAT_TOLERANCE,
        "{pmu}: perf stat cycles:u {cycles_u} vs {reference}:\n{stat}"
    );
    let report = section(&r.console, "perf-report")
        .unwrap_or_else(|| panic!("{pmu}: no perf report output:\n{}", tail(&r.console, 80)));
    let share = |symbol: &str| -> f64 {
        report
            .lines()
            .find(|l| l.trim_end().ends_with(&format!("[.] {symbol}")))
            .and_then(|l| {
                l.split_whitespace()
                    .next()?
                    .trim_end_matches('%')
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{pmu}: no {symbol} in perf report:\n{report}"))
    };
    let (a, b) = (share("hot_a"), share("hot_b"));
    println!("{pmu}: perf report hot_a {a:.2} %, hot_b {b:.2} %");
    assert!(
        (a - HOT_A).abs() <= SHARE_POINTS && (b - HOT_B).abs() <= SHARE_POINTS,
        "{pmu}: perf report shares {a} / {b}:\n{report}"
    );
    measurements(&format!("{pmu} ({initrd})"), &r, wall, f64::NAN);
}

#[test]
#[ignore = "a minute per personality: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_perf_event_open_intel_v5() {
    static_tool("intel-v5");
}

#[test]
#[ignore = "a minute per personality: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_perf_event_open_intel_v2() {
    static_tool("intel-v2");
}

#[test]
#[ignore = "a minute per personality: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_perf_event_open_amd_perfmonv2() {
    static_tool("amd-perfmonv2");
}

#[test]
#[ignore = "a minute per personality: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_perf_event_open_amd_k7() {
    static_tool("amd-k7");
}

#[test]
#[ignore = "minutes: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_debian_perf_intel_v5() {
    perf_in_guest("intel-v5", "initramfs-perf.cpio");
}

#[test]
#[ignore = "minutes: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_debian_perf_amd_perfmonv2() {
    perf_in_guest("amd-perfmonv2", "initramfs-perf.cpio");
}

#[test]
#[ignore = "minutes: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_static_perf_amd_k7() {
    perf_in_guest("amd-k7", "initramfs-perf-static.cpio");
}

/// A guest that halts (Linux without ACPI: `halt -f` stops the CPU with interrupts off, and so
/// does its `poweroff` fallback) ends the run, with status 0; the host's parameters still reach
/// the kernel when the command line hands arguments to init after `--`.
#[test]
#[ignore = "half a minute: cargo test --release -p vpmu-cli --test linux -- --ignored"]
fn linux_halt_ends_the_run() {
    let dir = artifacts();
    let (kernel, initrd) = (dir.join("vmlinux"), dir.join("initramfs.cpio"));
    if !kernel.is_file() || !initrd.is_file() {
        return skip(
            "halt",
            "the kernel or initramfs.cpio is missing (vmm/linux-guest/build.sh)",
        );
    }
    let line = cmdline().replace("rdinit=/init", "rdinit=/bin/busybox");
    let out = Command::new(env!("CARGO_BIN_EXE_vpmu"))
        .args([
            "boot",
            "--pmu",
            "amd-perfmonv2",
            "--timeout",
            "300",
            "--initrd",
        ])
        .arg(&initrd)
        .arg("--append")
        .arg(format!("{line} -- halt -f"))
        .arg(&kernel)
        .output()
        .expect("run the vpmu binary");
    let console = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(SKIP) && stderr.contains("/dev/kvm is not available") {
        return skip("halt", stderr.trim());
    }
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{stderr}",
        tail(&console, 40)
    );
    assert!(
        stderr.contains("powered off (halted with interrupts off)"),
        "{stderr}"
    );
    let kernel_line = console
        .lines()
        .find(|l| l.contains("Kernel command line: "))
        .expect("the kernel's command line");
    let params = kernel_line.split(" -- ").next().unwrap_or_default();
    if stderr.contains("host quirk: xsave") {
        assert!(params.contains("clearcpuid=154"), "{kernel_line}");
    }
}

#[test]
fn the_vmms_closing_line_and_kernel_stamps_parse() {
    let stderr = "vpmu boot: intel-v5 exited with code 0 (status 0) after 43.5 s, 455 single \
                  steps, 6998 PMU MSR exits, 1153 PMIs";
    assert_eq!(closing(stderr, " PMU MSR exits"), Some(6998.0));
    assert_eq!(closing(stderr, " PMIs"), Some(1153.0));
    assert_eq!(
        stamp("[   24.802783] Run /init as init process\n", "Run /init"),
        Some(24.802783)
    );
}

#[test]
fn result_lines_and_sections_parse() {
    let console = "[ 1.0] x\nVPMU-RESULT cmd=count event=cycles:u value=12\n\
                   noise VPMU-RESULT cmd=sample samples=3 share_a=75.00\n\
                   VPMU-BEGIN perf-stat\n1,,cycles:u,\nVPMU-END perf-stat\n";
    let c = results(console, &[("cmd", "count"), ("event", "cycles:u")]);
    assert_eq!(c.len(), 1);
    assert_eq!(number(&c[0], "value"), 12.0);
    assert_eq!(results(console, &[("cmd", "sample")]).len(), 1);
    assert_eq!(section(console, "perf-stat"), Some("1,,cycles:u,\n"));
    assert_eq!(section(console, "perf-report"), None);
}
