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
use std::time::Duration;

use llvm::LlvmError;
use profraw::{ProfrawError, RawProfile};
use vpmu_machine::personality::{Intel, Source};
use vpmu_machine::symbols::{SymbolError, Symbols};
use vpmu_machine::{Layout, Machine, MachineError, RunResult};
use vpmu_selftest::SelftestError;

/// Why `vpmu coverage` could not run or finish (a failed check is an `Outcome`, not an
/// error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoverageError {
    /// KVM's supported CPUID could not be read.
    #[error("KVM CPUID: {0}")]
    Cpuid(#[source] MachineError),
    /// The coverage guest's machine could not be made.
    #[error("VM setup failed: {0}")]
    Setup(#[source] MachineError),
    /// The coverage guest's symbol table could not be read.
    #[error("the coverage guest's symbols: {0}")]
    Symbols(#[from] SymbolError),
    /// The coverage guest has no `coverage_result`.
    #[error("the coverage guest has no {RESULT_SYMBOL}")]
    NoResultSymbol,
    /// A range the VMM copies after the run is not guest RAM.
    #[error("domain {domain}: {gpa:#x}+{len:#x} is not guest RAM")]
    NotRam {
        /// The domain.
        domain: u32,
        /// Start of the range.
        gpa: u64,
        /// Its length.
        len: usize,
    },
    /// The machine did not hand back what it was asked to copy.
    #[error("the VMM did not copy {0}")]
    NotCopied(&'static str),
    /// `coverage_result` is shorter than its twelve fields.
    #[error("{RESULT_SYMBOL} is short")]
    ResultShort,
    /// A read's size is larger than its buffer.
    #[error("the {0} read overran its buffer")]
    Overrun(&'static str),
    /// The conformance suite could not run.
    #[error("the conformance suite: {0}")]
    Suite(#[from] SelftestError),
    /// The output directory could not be made.
    #[error("--out {}: {source}", path.display())]
    OutDir {
        /// The directory.
        path: PathBuf,
        /// What creating it said.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("{}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What writing it said.
        #[source]
        source: std::io::Error,
    },
    /// This binary's own path is unknown.
    #[error("this binary's path: {0}")]
    ExePath(#[source] std::io::Error),
    /// A raw profile is malformed.
    #[error("{}: {source}", path.display())]
    Profile {
        /// The profile's file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: ProfrawError,
    },
    /// A raw profile does not come from the binary it is reported against.
    #[error("{} against {}: {source}", profile.display(), binary.display())]
    Mismatch {
        /// The profile's file.
        profile: PathBuf,
        /// The binary.
        binary: PathBuf,
        /// What disagrees.
        #[source]
        source: ProfrawError,
    },
    /// The LLVM tools failed.
    #[error(transparent)]
    Llvm(#[from] LlvmError),
}

/// How `vpmu coverage` ended, when it could run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check passed.
    Passed,
    /// A check failed (see the printed checks).
    Failed,
    /// This vpmu was built without `XENPMU_OP_COVERAGE` (`-EOPNOTSUPP`).
    Unsupported,
}

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

/// The default output directory.
pub const DEFAULT_OUT: &str = "coverage-out";

/// The options of `vpmu coverage`.
#[derive(Clone, Debug)]
pub struct Options {
    /// Output directory.
    pub out: PathBuf,
    /// Run the conformance suite first.
    pub suite: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            out: PathBuf::from(DEFAULT_OUT),
            suite: true,
        }
    }
}

/// The options of `vpmu coverage report`.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// The raw profile to validate and report.
    pub file: PathBuf,
    /// The instrumented ELF it came from (default: this binary).
    pub binary: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
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
fn run_guest(kvm: &kvm_ioctls::Kvm) -> Result<GuestRun, CoverageError> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(CoverageError::Cpuid)?;
    let image = vpmu_guests::COVERAGE;
    let (result_gpa, _) =
        Symbols::address_of(image, RESULT_SYMBOL)?.ok_or(CoverageError::NoResultSymbol)?;
    let mut machine = Machine::with_layout(
        kvm,
        Intel::v5(Source::Timed),
        &cpuid,
        image,
        0,
        Layout::SharedPcpu(2),
    )
    .map_err(CoverageError::Setup)?;
    for (gpa, len) in [
        (result_gpa, RESULT_SIZE),
        (FIRST_BUFFER, BUFFER_SIZE),
        (SECOND_BUFFER, BUFFER_SIZE),
    ] {
        machine
            .peek_after_run(0, gpa, len)
            .ok_or(CoverageError::NotRam {
                domain: 0,
                gpa,
                len,
            })?;
    }
    // The unprivileged domain's own result (its -EPERM) is in its own memory.
    machine
        .peek_after_run(1, result_gpa, RESULT_SIZE)
        .ok_or(CoverageError::NotRam {
            domain: 1,
            gpa: result_gpa,
            len: RESULT_SIZE,
        })?;
    let mut results = machine.run(Duration::from_secs(60));
    let unprivileged = results
        .get_mut(1)
        .and_then(|r| r.peeked.pop())
        .and_then(|(_, bytes)| GuestResult::decode(&bytes))
        .ok_or(CoverageError::NotCopied("domain 1's result"))?;
    let peeked = std::mem::take(&mut results[0].peeked);
    let [(_, result), (_, first), (_, second)]: [(u64, Vec<u8>); 3] = peeked
        .try_into()
        .map_err(|_| CoverageError::NotCopied("the guest's results"))?;
    let mut guest = GuestResult::decode(&result).ok_or(CoverageError::ResultShort)?;
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

fn write(path: &Path, bytes: &[u8]) -> Result<(), CoverageError> {
    std::fs::write(path, bytes).map_err(|source| CoverageError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn read(path: &Path) -> Result<Vec<u8>, CoverageError> {
    std::fs::read(path).map_err(|source| CoverageError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn out_dir(path: &Path) -> Result<(), CoverageError> {
    std::fs::create_dir_all(path).map_err(|source| CoverageError::OutDir {
        path: path.to_path_buf(),
        source,
    })
}

/// `vpmu coverage report FILE [--binary ELF] [--out DIR]`: the tool side for a raw profile
/// read earlier (by this command, or by any consumer of `XENPMU_OP_COVERAGE`).
/// Ok once the profile is valid and matches its binary (with a report if LLVM's tools are
/// installed); an error names what is wrong.
pub fn report(options: &ReportOptions) -> Result<(), CoverageError> {
    let ReportOptions { file, binary, out } = options;
    let binary = match binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(CoverageError::ExePath)?,
    };
    let raw = read(file)?;
    let elf = read(&binary)?;
    let profile = RawProfile::parse(&raw).map_err(|source| CoverageError::Profile {
        path: file.clone(),
        source,
    })?;
    println!("{}: {}", file.display(), profile.summary());
    if profile.num_functions() == 0 {
        println!("an empty profile: its binary was not instrumented; nothing to report");
        return Ok(());
    }
    profile
        .check_against_elf(&elf)
        .map_err(|source| CoverageError::Mismatch {
            profile: file.clone(),
            binary: binary.clone(),
            source,
        })?;
    println!("matches {} (profile section sizes)", binary.display());
    out_dir(out)?;
    match llvm::find_tools() {
        Ok(tools) => {
            let report = llvm::report(&tools, file, &binary, out, &VPMU_SOURCES)?;
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
    Ok(())
}

/// `vpmu coverage`: runs the suite (unless `options.suite` is off) and the coverage guest,
/// checks and writes the profiles, and reports them.
pub fn command(kvm: &kvm_ioctls::Kvm, options: &Options) -> Result<Outcome, CoverageError> {
    out_dir(&options.out)?;
    let mut checks = Checks {
        lines: String::new(),
        failed: 0,
    };
    if options.suite {
        eprintln!("vpmu coverage: running the conformance suite (both vendors)");
        let results = vpmu_selftest::selftest(kvm, vpmu_selftest::VendorChoice::Both, false)?;
        let failed: u32 = results.iter().map(|r| r.failed).sum();
        let passed: u32 = results.iter().map(|r| r.passed).sum();
        // Name what failed: a coverage run is often the only run of the suite someone reads.
        let failures: Vec<String> = results
            .iter()
            .filter(|r| r.failed != 0)
            .map(|r| format!("{} {}: {}", r.personality, r.case, r.failures.join("; ")))
            .collect();
        checks.check(
            "the conformance suite passed",
            failed == 0,
            format!(
                "{} cases, {passed} checks passed, {failed} failed{}",
                results.len(),
                if failures.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", failures.join(" | "))
                }
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
        return Ok(Outcome::Unsupported);
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
    let suite_raw = take(&first, guest.first_size).ok_or(CoverageError::Overrun("first"))?;
    let reset_raw = take(&second, guest.second_size).ok_or(CoverageError::Overrun("second"))?;
    let suite_path = options.out.join("vpmu.profraw");
    let reset_path = options.out.join("after-reset.profraw");
    write(&suite_path, &suite_raw)?;
    write(&reset_path, &reset_raw)?;
    let exe_path = std::env::current_exe().map_err(CoverageError::ExePath)?;
    let exe = read(&exe_path)?;
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
            Err(e) => checks.check(
                &format!("the profile {what} is valid"),
                false,
                e.to_string(),
            ),
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
    let tools = if instrumented {
        llvm::find_tools().map_err(|e| e.to_string())
    } else {
        Err("nothing is instrumented in this binary (scripts/coverage.sh builds it)".to_string())
    };
    match tools {
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
        Outcome::Passed
    } else {
        Outcome::Failed
    })
}
