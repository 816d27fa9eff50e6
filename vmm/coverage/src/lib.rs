//! `vpmu coverage`: which vPMU code did a guest workload exercise?
//!
//! Runs the conformance suite (real guests against the vPMU, both vendors' personalities) in
//! this process, then boots `coverage/coverage.c`: its privileged domain reads the vPMU's code
//! coverage through the guest-visible `XENPMU_OP_COVERAGE` (ABI 1.1: get_size, a short read
//! that must fail `-ENOBUFS` with the size needed, a read, reset, a read after the reset), and
//! its unprivileged domain must get `-EPERM`. The VMM takes the two profiles out of the
//! guest's buffers, writes them as `.profraw` files, validates them itself (`profraw`: header,
//! sizes against this binary's profile sections, counters, names) and, when a compatible
//! `llvm-profdata`/`llvm-cov` is installed, turns them into a report (`llvm`).
//!
//! Counters exist only in a build with the vPMU crates instrumented (`scripts/coverage.sh`);
//! a default build answers `-EOPNOTSUPP`, which this command reports (exit status 3).

pub mod llvm;
pub mod profraw;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use profraw::RawProfile;
use vpmu_machine::personality::{Intel, Source};
use vpmu_machine::symbols::Symbols;
use vpmu_machine::{Layout, Machine, RunResult};

/// The usage text of `vpmu coverage`.
pub const USAGE: &str = "\
usage: vpmu coverage [--out DIR] [--no-suite]
       vpmu coverage report FILE.profraw [--binary INSTRUMENTED_ELF] [--out DIR]
  --out       output directory (default coverage-out): vpmu.profraw (after the conformance
              suite), after-reset.profraw, checks.txt, and with llvm-cov: report.txt,
              coverage.lcov, html/, uncovered.txt
  --no-suite  read the coverage without running the conformance suite first
  report      validate a raw profile read earlier (header, sizes, counters, names; against the
              binary too, which defaults to this one) and report it with llvm-cov if installed
Exit status: 0 every check passed, 1 a check failed, 2 bad options, 3 this vpmu was built
without XENPMU_OP_COVERAGE (-EOPNOTSUPP; scripts/coverage.sh builds it), 77 no /dev/kvm.";

/// The source files whose coverage matters: the vPMU crates.
pub const VPMU_SOURCES: [&str; 4] = [
    "/vpmu/src/",
    "/vendor-intel/src/",
    "/vendor-amd/src/",
    "/abi/src/",
];

/// Guest-physical addresses of the two read buffers (`coverage/coverage.c`).
const FIRST_BUFFER: u64 = 0x20_0000;
const SECOND_BUFFER: u64 = 0x30_0000;
const BUFFER_SIZE: usize = 0x10_0000;
/// `coverage_result` in `coverage/coverage.c`: twelve 8-byte fields.
const RESULT_SYMBOL: &str = "coverage_result";
const RESULT_SIZE: usize = 12 * 8;
const EOPNOTSUPP: i64 = -(vpmu::abi::ops::XENPMU_EOPNOTSUPP as i64);

/// The options of `vpmu coverage`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    /// Run the conformance suite first.
    pub suite: bool,
}

impl Options {
    /// Parses the arguments after `coverage`.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self {
            out: PathBuf::from("coverage-out"),
            suite: true,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--out" => o.out = PathBuf::from(it.next().ok_or("--out needs a value")?),
                "--no-suite" => o.suite = false,
                other => return Err(format!("unknown option {other}")),
            }
        }
        Ok(o)
    }
}

/// What the coverage guest left in `coverage_result`.
#[derive(Clone, Copy, Debug, Default)]
struct GuestResult {
    get_size: i64,
    size: u64,
    short_read: i64,
    short_needed: u64,
    first_read: i64,
    first_size: u64,
    reset: i64,
    second_read: i64,
    second_size: u64,
    unprivileged: i64,
    bad_subop: i64,
    done: u64,
}

impl GuestResult {
    fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        Some(Self {
            get_size: word(0)? as i64,
            size: word(1)?,
            short_read: word(2)? as i64,
            short_needed: word(3)?,
            first_read: word(4)? as i64,
            first_size: word(5)?,
            reset: word(6)? as i64,
            second_read: word(7)? as i64,
            second_size: word(8)?,
            unprivileged: word(9)? as i64,
            bad_subop: word(10)? as i64,
            done: word(11)?,
        })
    }
}

/// What the coverage guest left: its domains' results, its `coverage_result`, and its two
/// read buffers as the VMM found them after the run.
struct GuestRun {
    results: Vec<RunResult>,
    guest: GuestResult,
    first: Vec<u8>,
    second: Vec<u8>,
}

/// Runs the coverage guest.
fn run_guest(kvm: &kvm_ioctls::Kvm) -> Result<GuestRun, String> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(|e| format!("KVM CPUID: {e}"))?;
    let image = vpmu_guests::COVERAGE;
    let (result_gpa, _) = Symbols::address_of(image, RESULT_SYMBOL)?
        .ok_or("the coverage guest has no coverage_result")?;
    let mut machine = Machine::with_layout(
        kvm,
        Intel::v5(Source::Timed),
        &cpuid,
        image,
        0,
        Layout::SharedPcpu(2),
    )
    .map_err(|e| format!("VM setup failed: {e}"))?;
    for (gpa, len) in [
        (result_gpa, RESULT_SIZE),
        (FIRST_BUFFER, BUFFER_SIZE),
        (SECOND_BUFFER, BUFFER_SIZE),
    ] {
        machine
            .peek_after_run(0, gpa, len)
            .ok_or_else(|| format!("{gpa:#x}+{len:#x} is not guest RAM"))?;
    }
    // The unprivileged domain's own result (its -EPERM) is in its own memory.
    machine
        .peek_after_run(1, result_gpa, RESULT_SIZE)
        .ok_or("domain 1 has no coverage_result in RAM")?;
    let mut results = machine.run(Duration::from_secs(60));
    let unprivileged = results
        .get_mut(1)
        .and_then(|r| r.peeked.pop())
        .and_then(|(_, bytes)| GuestResult::decode(&bytes))
        .ok_or("the VMM did not copy domain 1's result")?;
    let peeked = std::mem::take(&mut results[0].peeked);
    let [(_, result), (_, first), (_, second)]: [(u64, Vec<u8>); 3] = peeked
        .try_into()
        .map_err(|_| "the VMM did not copy the guest's results")?;
    let mut guest = GuestResult::decode(&result).ok_or("coverage_result is short")?;
    guest.unprivileged = unprivileged.unprivileged;
    Ok(GuestRun {
        results,
        guest,
        first,
        second,
    })
}

/// One check: its line, and whether it passed.
struct Checks {
    lines: String,
    failed: u32,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: String) {
        let _ = writeln!(
            self.lines,
            "{} {name}{}",
            if ok { "PASS" } else { "FAIL" },
            if detail.is_empty() {
                String::new()
            } else {
                format!(" — {detail}")
            }
        );
        self.failed += u32::from(!ok);
    }
}

/// Demangled names of the functions of `profile` with a non-zero counter.
fn covered(profile: &RawProfile) -> Vec<String> {
    profile
        .functions()
        .iter()
        .filter(|f| f.counters.iter().any(|&c| c > 0))
        .map(|f| format!("{:#}", rustc_demangle::demangle(&f.name)))
        .collect()
}

/// vPMU paths the conformance suite must reach: (what, a part of the demangled name).
const SUITE_PATHS: [(&str, &str); 5] = [
    ("guest WRMSR intercept", "::wrmsr"),
    ("Intel backend", "vpmu_intel::"),
    ("AMD backend", "vpmu_amd::"),
    ("context switch", "context_switch"),
    ("PMI routing", "handle_pmi"),
];

/// Of those, the ones the coverage guest itself never reaches (it writes no PMU MSR and takes
/// no PMI; its two domains do switch on their shared pCPU): zero after the reset.
const QUIET_AFTER_RESET: [&str; 2] = ["::wrmsr", "handle_pmi"];

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// `vpmu coverage report FILE [--binary ELF] [--out DIR]`: the tool side for a raw profile
/// read earlier (by this command, or by any consumer of `XENPMU_OP_COVERAGE`).
pub fn report_command(args: &[String]) -> Result<ExitCode, String> {
    let mut it = args.iter();
    let mut file = None;
    let mut binary = None;
    let mut out = PathBuf::from("coverage-out");
    while let Some(a) = it.next() {
        match a.as_str() {
            "--binary" => binary = Some(PathBuf::from(it.next().ok_or("--binary needs a value")?)),
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a value")?),
            other if !other.starts_with('-') && file.is_none() => file = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    let file = file.ok_or("vpmu coverage report needs a .profraw file")?;
    let binary = match binary {
        Some(b) => b,
        None => std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?,
    };
    let raw = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    let elf = std::fs::read(&binary).map_err(|e| format!("{}: {e}", binary.display()))?;
    let profile = RawProfile::parse(&raw).map_err(|e| format!("{}: {e}", file.display()))?;
    println!("{}: {}", file.display(), profile.summary());
    if profile.num_functions() == 0 {
        println!("an empty profile: its binary was not instrumented; nothing to report");
        return Ok(ExitCode::SUCCESS);
    }
    profile
        .check_against_elf(&elf)
        .map_err(|e| format!("{} against {}: {e}", file.display(), binary.display()))?;
    println!("matches {} (profile section sizes)", binary.display());
    std::fs::create_dir_all(&out).map_err(|e| format!("--out {}: {e}", out.display()))?;
    match llvm::find_tools() {
        Ok(tools) => {
            let report = llvm::report(&tools, &file, &binary, &out, &VPMU_SOURCES)?;
            print!("{}", report.summary_text);
            let uncovered = out.join("uncovered.txt");
            write(
                &uncovered,
                (report.uncovered_functions.join("\n") + "\n").as_bytes(),
            )?;
            write(&out.join("report.txt"), report.summary_text.as_bytes())?;
            println!(
                "wrote {}, {}, {} and {}",
                out.join("report.txt").display(),
                report.lcov_path.display(),
                report.html_index.display(),
                uncovered.display()
            );
        }
        Err(missing) => {
            println!("no report: {missing}\n(the raw profile was validated without LLVM)")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `vpmu coverage`.
pub fn command(kvm: &kvm_ioctls::Kvm, options: &Options) -> Result<ExitCode, String> {
    std::fs::create_dir_all(&options.out)
        .map_err(|e| format!("--out {}: {e}", options.out.display()))?;
    let mut checks = Checks {
        lines: String::new(),
        failed: 0,
    };
    if options.suite {
        eprintln!("vpmu coverage: running the conformance suite (both vendors)");
        let results = vpmu_selftest::selftest(kvm, vpmu_selftest::VendorChoice::Both, false)?;
        let failed: u32 = results.iter().map(|r| r.failed).sum();
        let passed: u32 = results.iter().map(|r| r.passed).sum();
        checks.check(
            "the conformance suite passed",
            failed == 0,
            format!(
                "{} cases, {passed} checks passed, {failed} failed",
                results.len()
            ),
        );
    }
    eprintln!("vpmu coverage: reading the coverage through XENPMU_OP_COVERAGE from the guest");
    let GuestRun {
        results,
        guest,
        first,
        second,
    } = run_guest(kvm)?;
    if guest.get_size == EOPNOTSUPP {
        eprintln!(
            "vpmu coverage: XENPMU_OP_COVERAGE returned -EOPNOTSUPP: this vpmu was built without \
             the `coverage` feature. scripts/coverage.sh builds it with the vPMU crates \
             instrumented and runs this command."
        );
        return Ok(ExitCode::from(3));
    }
    for (d, r) in results.iter().enumerate() {
        let ok = r.error.is_none() && r.status == Some(0);
        checks.check(
            &format!("coverage guest domain {d}: every guest check passed"),
            ok,
            format!(
                "status {:?}{}; {}",
                r.status,
                r.error
                    .as_deref()
                    .map_or(String::new(), |e| format!(", {e}")),
                r.console
                    .lines()
                    .filter(|l| l.starts_with("FAIL"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
    }
    checks.check(
        "-ENOBUFS carries the size needed",
        guest.short_read == -i64::from(vpmu::abi::ops::XENPMU_ENOBUFS)
            && guest.short_needed == guest.size,
        format!(
            "returned {}, needed {} of {}",
            guest.short_read, guest.short_needed, guest.size
        ),
    );
    checks.check(
        "the privileged domain finished; read, reset, read returned 0",
        guest.done == 1 && guest.first_read == 0 && guest.reset == 0 && guest.second_read == 0,
        format!(
            "read {}, reset {}, read {}",
            guest.first_read, guest.reset, guest.second_read
        ),
    );
    checks.check(
        "an unknown sub-operation gets -EINVAL",
        guest.bad_subop == -i64::from(vpmu::abi::ops::XENPMU_EINVAL),
        format!("returned {}", guest.bad_subop),
    );
    checks.check(
        "an unprivileged caller gets -EPERM",
        guest.unprivileged == -i64::from(vpmu::abi::ops::XENPMU_EPERM),
        format!("returned {}", guest.unprivileged),
    );
    let take = |buffer: &[u8], size: u64| buffer.get(..size as usize).map(<[u8]>::to_vec);
    let suite_raw = take(&first, guest.first_size).ok_or("the first read overran its buffer")?;
    let reset_raw = take(&second, guest.second_size).ok_or("the second read overran its buffer")?;
    let suite_path = options.out.join("vpmu.profraw");
    let reset_path = options.out.join("after-reset.profraw");
    write(&suite_path, &suite_raw)?;
    write(&reset_path, &reset_raw)?;
    let exe_path = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let exe = std::fs::read(&exe_path).map_err(|e| format!("{}: {e}", exe_path.display()))?;
    let mut profiles = Vec::new();
    for (what, raw) in [
        ("after the suite", &suite_raw),
        ("after the reset", &reset_raw),
    ] {
        // An uninstrumented binary (the feature without scripts/coverage.sh) has no profile
        // sections: its valid profile is empty, and there is nothing to compare.
        let checked = RawProfile::parse(raw).and_then(|p| {
            if p.num_functions() > 0 {
                p.check_against_elf(&exe)?;
            }
            Ok(p)
        });
        match checked {
            Ok(p) => {
                let empty = if p.num_functions() == 0 {
                    " (empty: this binary is not instrumented; scripts/coverage.sh builds it so)"
                } else {
                    ""
                };
                checks.check(
                    &format!("the profile {what} is a valid raw profile of this binary"),
                    true,
                    format!("{}{empty}", p.summary()),
                );
                profiles.push(p);
            }
            Err(e) => checks.check(&format!("the profile {what} is valid"), false, e),
        }
    }
    if let [suite, reset] = &profiles[..] {
        let after_suite = covered(suite);
        let after_reset = covered(reset);
        checks.check(
            "counters are non-zero after the suite",
            suite.total_count() > 0,
            format!(
                "{} of {} functions ran",
                after_suite.len(),
                suite.num_functions()
            ),
        );
        let count =
            |names: &[String], needle: &str| names.iter().filter(|n| n.contains(needle)).count();
        if options.suite {
            for (what, needle) in SUITE_PATHS {
                let hit = count(&after_suite, needle);
                checks.check(
                    &format!("the suite reached the {what}"),
                    hit > 0,
                    format!("{hit} functions matching `{needle}` ran"),
                );
            }
        }
        for needle in QUIET_AFTER_RESET {
            let (before, after) = (count(&after_suite, needle), count(&after_reset, needle));
            checks.check(
                &format!("reset zeroed the counters of `{needle}`"),
                (before > 0 || !options.suite) && after == 0,
                format!("{before} functions ran before the reset, {after} after"),
            );
        }
        checks.check(
            "reset zeroes the counters (only the coverage read path runs after it)",
            reset.total_count() < suite.total_count() && after_reset.len() < after_suite.len(),
            format!(
                "{} functions ran after the reset: {}",
                after_reset.len(),
                after_reset.join(", ")
            ),
        );
    }
    let mut text = checks.lines.clone();
    let instrumented = profiles.first().is_some_and(|p| p.num_functions() > 0);
    match llvm::find_tools().and_then(|tools| {
        if instrumented {
            Ok(tools)
        } else {
            Err("nothing is instrumented in this binary (scripts/coverage.sh builds it)".into())
        }
    }) {
        Ok(tools) => {
            match llvm::report(&tools, &suite_path, &exe_path, &options.out, &VPMU_SOURCES) {
                Ok(report) => {
                    let _ = writeln!(text, "\n{}", report.summary_text.trim_end());
                    let t = &report.totals;
                    let _ = writeln!(
                        text,
                        "vPMU crates: functions {}/{}, lines {}/{}, regions {}/{} covered",
                        t.functions.covered,
                        t.functions.total,
                        t.lines.covered,
                        t.lines.total,
                        t.regions.covered,
                        t.regions.total
                    );
                    let uncovered = options.out.join("uncovered.txt");
                    write(
                        &uncovered,
                        (report.uncovered_functions.join("\n") + "\n").as_bytes(),
                    )?;
                    let _ = writeln!(
                        text,
                        "\n{} vPMU functions the run left uncovered: {}\nlcov: {}\nhtml: {}",
                        report.uncovered_functions.len(),
                        uncovered.display(),
                        report.lcov_path.display(),
                        report.html_index.display()
                    );
                    write(
                        &options.out.join("report.txt"),
                        report.summary_text.as_bytes(),
                    )?;
                }
                Err(e) => {
                    let _ = writeln!(text, "\nllvm-cov report failed: {e}");
                    checks.failed += 1;
                }
            }
        }
        Err(missing) => {
            let _ = writeln!(
                text,
                "\nno report: {missing}\n(the raw profiles above were validated without LLVM)"
            );
        }
    }
    print!("{text}");
    write(&options.out.join("checks.txt"), text.as_bytes())?;
    println!(
        "wrote {} and {}",
        suite_path.display(),
        reset_path.display()
    );
    Ok(if checks.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
