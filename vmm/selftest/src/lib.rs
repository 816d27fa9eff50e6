//! The conformance suite (`vpmu selftest`): runs every conformance case of the guest
//! `selftest/pmu.c` (crate `vpmu-guests`) in a fresh VM per case, for each chosen vendor
//! personality, and makes a result table. `bench` (`vpmu bench`) measures the cost of an MSR
//! exit handled by the vpmu against a null handler, in the same run.
//!
//! Results travel through a structured channel (`records`): each check of a guest is a
//! fixed-layout record it points the VMM at through `port::RESULT`; the suite counts those,
//! not the console's text. Case numbers and the record's layout come from
//! `vpmu-guest-protocol`, which also generates the guests' C header.
#![deny(missing_docs)]

mod attribution;
pub mod records;

use std::sync::Arc;
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu_guest_protocol::selftest::{ALL_BASE, DOMAIN_BASE, NO_CASE_STATUS, SMP_BASE, TIMED_BASE};
use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::{Layout, Machine, MachineError, RunResult, indent};

use records::{ResultPort, tally};

/// Why the suite or the benchmark could not run (a failed check is a result, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SelftestError {
    /// KVM's supported CPUID could not be read.
    #[error("KVM CPUID: {0}")]
    Cpuid(#[source] MachineError),
    /// A case's or the benchmark's VM could not be made.
    #[error("{personality}: VM setup failed: {source}")]
    Setup {
        /// The personality it was made for.
        personality: String,
        /// The machine's error.
        #[source]
        source: MachineError,
    },
    /// A benchmark run broke (the vCPU's error).
    #[error("{personality}: the benchmark run failed: {message}")]
    BenchRun {
        /// The personality it ran under.
        personality: String,
        /// The run's error.
        message: String,
    },
}

/// Which personalities to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorChoice {
    /// Intel only.
    Intel,
    /// AMD only.
    Amd,
    /// Both.
    Both,
}

/// One case's result.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// Personality label.
    pub personality: String,
    /// Case name.
    pub case: String,
    /// Checks passed.
    pub passed: u32,
    /// Checks failed (including "the run broke").
    pub failed: u32,
    /// The failing lines, or the error.
    pub failures: Vec<String>,
    /// Single steps taken.
    pub steps: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Not run (why is in `failures`); neither passed nor failed.
    pub skipped: bool,
    /// Checks that did not apply to the personality (`RESULT_SKIP` records).
    pub skipped_checks: u32,
}

const CASE_TIMEOUT: Duration = Duration::from_secs(60);

fn run_cases<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    verbose: bool,
    out: &mut Vec<CaseResult>,
) -> Result<(), SelftestError> {
    // Precise: cases 0.. on one vCPU, cases SMP_BASE.. on SMP_VCPUS vCPUs (threads, one pCPU
    // each), cases DOMAIN_BASE.. on DOMAINS one-vCPU domains sharing one pCPU (one thread).
    // Timed: cases TIMED_BASE.. on one vCPU, cases ALL_BASE.. on ALL_DOMAINS one-vCPU domains
    // sharing one pCPU.
    // Precise only: the compat32 case (vpmu_guests::COMPAT, case 0).
    let groups: &[(&[u8], u64, Layout)] = match p.source() {
        Source::Precise => &[
            (vpmu_guests::PMU, 0, Layout::ThreadPerVcpu(1)),
            (vpmu_guests::PMU, SMP_BASE, Layout::ThreadPerVcpu(SMP_VCPUS)),
            (vpmu_guests::PMU, DOMAIN_BASE, Layout::SharedPcpu(DOMAINS)),
            (vpmu_guests::COMPAT, 0, Layout::ThreadPerVcpu(1)),
        ],
        Source::Timed => &[
            (vpmu_guests::PMU, TIMED_BASE, Layout::ThreadPerVcpu(1)),
            (vpmu_guests::PMU, ALL_BASE, Layout::SharedPcpu(ALL_DOMAINS)),
        ],
    };
    for &(image, base, layout) in groups {
        if image.is_empty() {
            let why = "SKIPPED: compat32_reads_64bit_sample: the -m32 consumer was not built \
                       (gcc -m32 unavailable at build time; scripts/setup.sh installs gcc-multilib)";
            eprintln!("{why}");
            println!("{why}");
            out.push(CaseResult {
                personality: p.name(),
                case: "compat32_reads_64bit_sample".into(),
                passed: 0,
                failed: 0,
                failures: vec![why.into()],
                steps: 0,
                elapsed: Duration::ZERO,
                skipped: true,
                skipped_checks: 0,
            });
            continue;
        }
        for index in base.. {
            let mut machine =
                Machine::with_layout(kvm, p, cpuid, image, index, layout).map_err(|source| {
                    SelftestError::Setup {
                        personality: p.name(),
                        source,
                    }
                })?;
            let port = Arc::new(ResultPort::default());
            machine.extend(port.clone());
            let results = machine.run(CASE_TIMEOUT);
            let records = port.take();
            let label = match layout {
                Layout::ThreadPerVcpu(_) => "vcpu",
                Layout::SharedPcpu(_) | Layout::SharedPcpus { .. } => "dom",
            };
            let mut result = merge(&results, label);
            // No such case: the guest's status says so and it reported nothing.
            if results.first().and_then(|r| r.status) == Some(NO_CASE_STATUS) && records.is_empty()
            {
                break;
            }
            let mut case = summarize(&p.name(), &result, tally(index, &records));
            if base == ALL_BASE {
                // The VMM's side of the all-mode case: attribution and conservation.
                let (summary, checks) = attribution::check_all_mode(&results);
                result.console += &summary;
                for (name, ok) in checks {
                    let line = format!("{} VMM: {name}", if ok { "PASS" } else { "FAIL" });
                    result.console += &format!("{line}\n");
                    if ok {
                        case.passed += 1;
                    } else {
                        case.failed += 1;
                        case.failures.push(line);
                    }
                }
            }
            if verbose {
                print!("{}", indent(&result.console, "  | "));
            }
            out.push(case);
        }
    }
    Ok(())
}

/// vCPUs of an SMP case (cases `SMP_BASE..`).
const SMP_VCPUS: u32 = 2;
/// Domains of a multi-domain case (cases `DOMAIN_BASE..`).
const DOMAINS: u32 = 2;
/// Domains of an all-mode case: the profiler and two guests.
const ALL_DOMAINS: u32 = 3;

/// One result for a case: the sum of the vCPUs' statuses (each reports its own failures;
/// SMP vCPUs other than 0 report none), every vCPU's console (vCPU 0 first, the others'
/// lines prefixed `[<label>N] `), the first error of any vCPU, summed steps.
fn merge(results: &[RunResult], label: &str) -> RunResult {
    let mut merged = results.first().cloned().unwrap_or_default();
    for (i, r) in results.iter().enumerate().skip(1) {
        merged.console += &indent(&r.console, &format!("[{label}{i}] "));
        merged.steps += r.steps;
        merged.status = merged
            .status
            .zip(r.status)
            .map(|(a, b)| a.saturating_add(b));
        if merged.error.is_none() {
            merged.error = r.error.clone();
        }
    }
    merged
}

/// A case's result from its records' tally and the run: a run error, or an exit status that
/// is not the number of failed checks the guest reported, is one more failure; so is a case
/// that reported no check at all.
fn summarize(personality: &str, r: &RunResult, t: records::Tally) -> CaseResult {
    let guest_failed = t.failed - t.violations;
    let mut case = CaseResult {
        personality: personality.to_string(),
        case: t.case.unwrap_or_else(|| String::from("?")),
        passed: t.passed,
        failed: t.failed,
        failures: t.failures,
        steps: r.steps,
        elapsed: r.elapsed,
        skipped: false,
        skipped_checks: t.skipped,
    };
    if let Some(e) = &r.error {
        case.failed += 1;
        case.failures.push(format!("run error: {e}"));
    } else if r.status != Some(guest_failed) {
        case.failed += 1;
        case.failures.push(format!(
            "exit status {:?} (the records report {guest_failed} failed checks)",
            r.status
        ));
    } else if case.passed == 0 && case.failed == 0 && case.skipped_checks == 0 {
        case.failed += 1;
        case.failures.push("no checks ran".into());
    }
    case
}

/// Runs the suite; returns the results (an `Err` only if no VM could be made at all).
pub fn selftest(
    kvm: &Kvm,
    vendor: VendorChoice,
    verbose: bool,
) -> Result<Vec<CaseResult>, SelftestError> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(SelftestError::Cpuid)?;
    let mut out = Vec::new();
    for source in [Source::Precise, Source::Timed] {
        if vendor != VendorChoice::Amd {
            run_cases(kvm, &cpuid, Intel::v5(source), verbose, &mut out)?;
            run_cases(kvm, &cpuid, Intel::v2(source), verbose, &mut out)?;
        }
        if vendor != VendorChoice::Intel {
            run_cases(kvm, &cpuid, Amd::perfmon_v2(source), verbose, &mut out)?;
            run_cases(kvm, &cpuid, Amd::k7(source), verbose, &mut out)?;
        }
    }
    Ok(out)
}

/// The result table: per case, its checks passed, failed and skipped (did not apply to the
/// personality), single steps and time.
pub fn table(results: &[CaseResult]) -> String {
    let mut s = format!(
        "{:<30} {:<32} {:>6} {:>6} {:>6} {:>8} {:>8}  result\n",
        "personality", "case", "pass", "fail", "skip", "steps", "ms"
    );
    for r in results {
        s += &format!(
            "{:<30} {:<32} {:>6} {:>6} {:>6} {:>8} {:>8}  {}\n",
            r.personality,
            r.case,
            r.passed,
            r.failed,
            r.skipped_checks,
            r.steps,
            r.elapsed.as_millis(),
            if r.skipped {
                "SKIPPED"
            } else if r.failed == 0 {
                "PASS"
            } else {
                "FAIL"
            }
        );
        for f in &r.failures {
            s += &format!("    {f}\n");
        }
    }
    let failed = results.iter().filter(|r| r.failed != 0).count();
    let skipped = results.iter().filter(|r| r.skipped).count();
    s += &format!(
        "{} passed, {} failed",
        results.len() - failed - skipped,
        failed
    );
    if skipped > 0 {
        s += &format!(", {skipped} SKIPPED (see above)");
    }
    s += "\n";
    s
}

/// `vpmu bench`: MSR exit cost, vpmu vs null handler, for each personality.
pub fn bench(kvm: &Kvm, vendor: VendorChoice) -> Result<String, SelftestError> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(SelftestError::Cpuid)?;
    let mut s = String::new();
    if vendor != VendorChoice::Amd {
        s += &bench_one(kvm, &cpuid, Intel::v5(Source::Precise))?;
    }
    if vendor != VendorChoice::Intel {
        s += &bench_one(kvm, &cpuid, Amd::perfmon_v2(Source::Precise))?;
    }
    Ok(s)
}

fn bench_one<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
) -> Result<String, SelftestError> {
    let setup = |source| SelftestError::Setup {
        personality: p.name(),
        source,
    };
    let broke = |message| SelftestError::BenchRun {
        personality: p.name(),
        message,
    };
    let machine = Machine::new(kvm, p, cpuid, vpmu_guests::BENCH, 0, 1).map_err(setup)?;
    let tsc_mhz = machine.tsc_khz().map_or(1.0, |k| f64::from(k) / 1000.0);
    let r = merge(&machine.run(Duration::from_secs(120)), "vcpu");
    if let Some(e) = r.error {
        return Err(broke(e));
    }
    let (tv, tn, tl) = bench_medians(&r.console);
    let [(nv, sv), (nn, sn)] = r.msr_exit_ns;
    let locks = r.msr_exit_locks;
    let per_exit = |n: u64| n as f64 / nv.max(1) as f64;
    let mut line = format!(
        "{}: guest-measured RDMSR loop iteration (median of batches): vpmu {:.2} us, null {:.2} us, \
         same loop without RDMSR {:.2} us (TSC {:.0} MHz); VMM handler time: vpmu {:.0} ns/exit \
         ({} exits), null {:.0} ns/exit ({} exits); VMM user-space time per exit {:.0} ns\n",
        p.name(),
        tv / tsc_mhz,
        tn / tsc_mhz,
        tl / tsc_mhz,
        tsc_mhz,
        sv as f64 / nv.max(1) as f64,
        nv,
        sn as f64 / nn.max(1) as f64,
        nn,
        r.user_time.1 as f64 / r.user_time.0.max(1) as f64
    );
    line += &format!(
        "{}: locks per vpmu MSR exit (from the exit to the next entry): shared {:.2}, \
         per-vCPU {:.2} ({} exits)\n",
        p.name(),
        per_exit(locks.shared),
        per_exit(locks.vcpu),
        nv
    );
    // The same loop on two vCPU threads (two pCPUs) at once: intercept throughput scales with
    // the pCPUs unless something serializes them (the single lock this VMM had).
    let pair = Machine::new(kvm, p, cpuid, vpmu_guests::BENCH, 0, 2).map_err(setup)?;
    let r2 = merge(&pair.run(Duration::from_secs(120)), "vcpu");
    if let Some(e) = r2.error {
        return Err(broke(e));
    }
    let (tv2, _, _) = bench_medians(&r2.console);
    line += &format!(
        "{}: RDMSR-exit throughput, 2 vCPU threads vs 1 (same run, medians): {:.2}x \
         (per-iteration {:.2} us on each of 2 threads, {:.2} us alone)\n",
        p.name(),
        2.0 * tv / tv2.max(f64::MIN_POSITIVE),
        tv2 / tsc_mhz,
        tv / tsc_mhz
    );
    Ok(line)
}

/// The medians of the guest's `BENCH vpmu|null|loop <ticks>` batches, in TSC ticks per
/// iteration, over every vCPU's console (merged lines carry a `[vcpuN] ` prefix).
fn bench_medians(console: &str) -> (f64, f64, f64) {
    let (mut vpmu, mut null, mut looped) = (Vec::new(), Vec::new(), Vec::new());
    for line in console.lines() {
        let line = match line.strip_prefix('[') {
            Some(rest) => rest.split_once("] ").map_or(rest, |(_, l)| l),
            None => line,
        };
        let mut w = line.split_whitespace();
        if w.next() != Some("BENCH") {
            continue;
        }
        let which = w.next();
        let ticks: f64 = w.next().and_then(|t| t.parse().ok()).unwrap_or(0.0);
        match which {
            Some("vpmu") => vpmu.push(ticks),
            Some("null") => null.push(ticks),
            Some("loop") => looped.push(ticks),
            _ => {}
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    (med(&mut vpmu), med(&mut null), med(&mut looped))
}
