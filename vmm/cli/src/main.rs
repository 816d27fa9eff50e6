//! `vpmu`: the reference VMM of the vpmu project on KVM (kvm-ioctls/kvm-bindings).
//!
//! * `vpmu profile [options]`: system-wide sampling of guest domains by a privileged profiling
//!   domain, per-domain reports, flamegraph, JSON, built-in validation (`vpmu-profile`).
//! * `vpmu selftest [--vendor intel|amd|both] [-v]`: the guest conformance suite, a result table.
//! * `vpmu bench [--vendor ...]`: the cost of a PMU MSR exit handled by the vpmu vs a null handler.
//! * `vpmu coverage [--out DIR] [--no-suite]` and `vpmu coverage report FILE [--binary ELF]
//!   [--out DIR]`: the vPMU's code coverage under the suite, read by a guest through
//!   `XENPMU_OP_COVERAGE` (`vpmu-coverage`).
//!
//! * `vpmu boot [--pmu SHAPE] [--source precise|timed] [--mem MIB] [--timeout SECONDS]
//!   [--append ARGS] [--initrd FILE] IMAGE`: runs a multiboot image (upstream kvm-unit-tests'
//!   `x86/pmu`, say) as QEMU's `-kernel` would (`vpmu_machine::boot`; the precise source by
//!   default), or boots a Linux kernel with an initrd (`vpmu_machine::linux`; the timed source
//!   by default), on one of the four PMU personalities.
//!
//! This binary only parses and checks the arguments (one `clap` definition: every option is
//! validated before `/dev/kvm` is opened, and so is every path: an input that cannot be read
//! or an output directory that cannot be created), checks `/dev/kvm`, calls a library and maps
//! its result to the exit status: 0 ok, 1 a check failed or the run broke, 2 bad usage or a
//! bad path, 3 coverage without `XENPMU_OP_COVERAGE`, 77 no usable `/dev/kvm` (the same two
//! lines from every subcommand: `kvm_for`), 130 `vpmu profile` interrupted (SIGINT; the
//! outputs hold what was collected); `vpmu boot` exits with the guest's isa-debug-exit code
//! mapped as QEMU does (`(code << 1) | 1`, 8 bits) except that code 0 gives 0, and 0 for a
//! keyboard-controller reset.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use vpmu_coverage as coverage;
use vpmu_machine::{boot, kvm, linux};
use vpmu_profile as profile;
use vpmu_selftest as selftest;

mod args;

use args::*;

/// Bad usage or a bad path.
const BAD_USAGE: u8 = 2;
/// `vpmu profile` interrupted by SIGINT (128 + 2, as a shell reports it, and as `perf record`
/// ends).
const INTERRUPTED: u8 = 130;

/// Bad usage: clap's first paragraph on one line (the problem, with the possible values if
/// any), its suggestions ("tip: a similar argument exists: '--mode'") and its pointer to
/// `--help`; no usage dump. Help and version go to stdout with status 0.
fn usage_error(e: &clap::Error) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        eprintln!("error: a subcommand is required: profile, selftest, bench, coverage or boot");
        eprintln!("For more information, try '--help'.");
        return ExitCode::from(2);
    }
    let text = e.render().to_string();
    let problem = text
        .split("\n\n")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("{problem}");
    for tip in text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("tip:"))
    {
        eprintln!("  {tip}");
    }
    if let Some(hint) = text
        .lines()
        .rev()
        .find(|l| l.starts_with("For more information"))
    {
        eprintln!("{hint}");
    }
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => return usage_error(&e),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let given = |id: &str| given_to_profile(&matches, id);
    match cli.command {
        Command::Profile(args) => match args.options(&given) {
            Ok(options) => profile_command(options),
            Err(e) => usage_error(&e),
        },
        Command::Selftest(args) => suite_command(args.vendor.into(), Some(args.verbose)),
        Command::Bench(args) => suite_command(args.vendor.into(), None),
        Command::Coverage(CoverageArgs {
            action: Some(CoverageAction::Report { file, binary, out }),
            ..
        }) => {
            let paths = readable("coverage report", &file)
                .and_then(|()| {
                    binary
                        .as_deref()
                        .map_or(Ok(()), |b| readable("coverage report", b))
                })
                .and_then(|()| creatable("coverage report", &out));
            if let Err(code) = paths {
                return code;
            }
            coverage::report(&coverage::ReportOptions { file, binary, out }).map_or_else(
                |e| {
                    eprintln!("vpmu coverage report: {e}");
                    ExitCode::FAILURE
                },
                |()| ExitCode::SUCCESS,
            )
        }
        Command::Coverage(CoverageArgs {
            action: None,
            out,
            no_suite,
        }) => match creatable("coverage", &out) {
            Ok(()) => coverage_command(&coverage::Options {
                out,
                suite: !no_suite,
            }),
            Err(code) => code,
        },
        Command::Boot(args) => boot_command(&args),
    }
}

/// `vpmu boot`: the guest's isa-debug-exit code as the exit status (`boot::exit_status`), 0
/// for a reset, 1 if it did neither. A multiboot image or a Linux kernel, by what the file is.
fn boot_command(args: &BootArgs) -> ExitCode {
    let image = match std::fs::read(&args.image) {
        Ok(image) => image,
        Err(e) => {
            eprintln!("vpmu boot: cannot read {}: {e}", args.image.display());
            return ExitCode::from(BAD_USAGE);
        }
    };
    if let Err(code) = args
        .initrd
        .as_deref()
        .map_or(Ok(()), |initrd| readable("boot", initrd))
    {
        return code;
    }
    if vpmu_machine::loader::multiboot_header(&image).is_some() {
        if args.initrd.is_some() || args.xenpmu_off_after.is_some() {
            eprintln!(
                "vpmu boot: --initrd and --xenpmu-off-after are for a Linux kernel, not a \
                 multiboot image"
            );
            return ExitCode::from(2);
        }
        return multiboot_command(args, &image);
    }
    if linux::kernel_format(&image).is_none() {
        eprintln!(
            "vpmu boot: {} is neither a multiboot image (magic 0x1BADB002 with its checksum in \
             the first 8 KiB) nor a Linux kernel (an ELF64 x86-64 vmlinux, or a bzImage)",
            args.image.display()
        );
        return ExitCode::from(2);
    }
    linux_command(args, &image)
}

fn multiboot_command(args: &BootArgs, image: &[u8]) -> ExitCode {
    let name = args
        .image
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let cmdline = if args.append.is_empty() {
        name
    } else {
        format!("{name} {}", args.append)
    };
    if cmdline.len() > boot::MAX_CMDLINE {
        eprintln!(
            "vpmu boot: the command line (file name and --append) is longer than {} bytes",
            boot::MAX_CMDLINE
        );
        return ExitCode::from(2);
    }
    let kvm = match kvm_for("boot") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    let options = boot::BootOptions {
        mem_size: usize::try_from(args.mem.unwrap_or(boot::DEFAULT_MEM_MIB) << 20)
            .unwrap_or(usize::MAX),
        cmdline,
        echo: true,
    };
    let shape = vpmu_machine::Shape::from(args.pmu);
    let source = args.source.unwrap_or(SourceArg::Precise).into();
    let timeout = Duration::from_secs(args.timeout);
    match boot::run(&kvm, shape, source, image, &options, timeout) {
        Ok(result) => boot_outcome(shape, &result, "single steps"),
        Err(e) => {
            eprintln!("vpmu boot: {e}");
            ExitCode::FAILURE
        }
    }
}

fn linux_command(args: &BootArgs, kernel: &[u8]) -> ExitCode {
    let mem = args.mem.unwrap_or(linux::DEFAULT_MEM_MIB);
    if !(linux::MIN_MEM_MIB..=linux::MAX_MEM_MIB).contains(&mem) {
        eprintln!(
            "vpmu boot: a Linux guest needs --mem {} to {} (MiB)",
            linux::MIN_MEM_MIB,
            linux::MAX_MEM_MIB
        );
        return ExitCode::from(2);
    }
    if args.append.len() > linux::MAX_CMDLINE {
        eprintln!(
            "vpmu boot: the kernel command line (--append) is longer than {} bytes",
            linux::MAX_CMDLINE
        );
        return ExitCode::from(2);
    }
    let initrd = match &args.initrd {
        Some(path) => match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                eprintln!("vpmu boot: cannot read {}: {e}", path.display());
                return ExitCode::from(BAD_USAGE);
            }
        },
        None => None,
    };
    let kvm = match kvm_for("boot") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    let options = linux::LinuxOptions {
        mem_size: usize::try_from(mem << 20).unwrap_or(usize::MAX),
        cmdline: args.append.clone(),
        initrd,
        echo: true,
    };
    let shape = vpmu_machine::Shape::from(args.pmu);
    let source = args.source.unwrap_or(SourceArg::Timed).into();
    let timeout = Duration::from_secs(args.timeout);
    let off = args.xenpmu_off_after;
    let run = match linux::run_switching_off(&kvm, shape, source, kernel, options, timeout, off) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("vpmu boot: {e}");
            return ExitCode::FAILURE;
        }
    };
    for line in run.quirks.describe() {
        eprintln!("vpmu boot: host quirk: {line}");
    }
    eprintln!("vpmu boot: kernel command line: {}", run.cmdline);
    match (&run.result.interface_off, off) {
        (Some(done), _) => eprintln!("vpmu boot: {}", done.describe()),
        (None, Some(_)) => eprintln!(
            "vpmu boot: the xenpmu interface was not switched off: the guest had no PMI, or \
             the run ended before it was due"
        ),
        (None, None) => {}
    }
    let c = run.result.completions;
    eprintln!(
        "vpmu boot: completed for the guest: {} SYSCALLs, {} INT3, {} FWAIT ({} other #PFs \
         stepped over)",
        c.syscalls, c.int3, c.fwait, c.page_faults_passed
    );
    if !run.result.uncountable_events.is_empty() {
        let events: Vec<String> = run
            .result
            .uncountable_events
            .iter()
            .map(|e| format!("{e:#05x}"))
            .collect();
        eprintln!(
            "vpmu boot: the guest enabled AMD events the {} source cannot count (they count 0; \
             AMD has no CPUID vector to mark them unavailable): {}",
            source_name(args.source.unwrap_or(SourceArg::Timed)),
            events.join(", ")
        );
    }
    boot_outcome(shape, &run.result, "single steps")
}

fn source_name(s: SourceArg) -> &'static str {
    vpmu_machine::personality::Source::from(s).name()
}

/// The end of a boot run as the exit status, with a line on stderr.
fn boot_outcome(
    shape: vpmu_machine::Shape,
    result: &vpmu_machine::RunResult,
    steps: &str,
) -> ExitCode {
    let took = result.elapsed.as_secs_f64();
    let counts = format!(
        "{} {steps}, {} PMU MSR exits, {} PMIs",
        result.steps, result.msr_exits, result.pmis
    );
    match (
        result.status,
        result.reset || result.powered_off,
        &result.error,
    ) {
        (Some(code), _, _) => {
            let status = boot::exit_status(code);
            eprintln!(
                "vpmu boot: {} exited with code {code} (status {status}) after {took:.1} s, \
                 {counts}",
                shape.name(),
            );
            ExitCode::from(status)
        }
        (None, true, _) => {
            eprintln!(
                "vpmu boot: {} {} after {took:.1} s, {counts}",
                shape.name(),
                if result.reset {
                    "reset the machine (keyboard controller)"
                } else {
                    "powered off (halted with interrupts off)"
                }
            );
            ExitCode::SUCCESS
        }
        (None, false, error) => {
            eprintln!(
                "vpmu boot: {} did not exit ({}) after {took:.1} s",
                shape.name(),
                error.as_deref().unwrap_or("stopped")
            );
            ExitCode::FAILURE
        }
    }
}

/// Ok if `path` can be read; otherwise the problem on stderr and exit status 2.
fn readable(command: &str, path: &std::path::Path) -> Result<(), ExitCode> {
    std::fs::File::open(path).map(drop).map_err(|e| {
        eprintln!("vpmu {command}: cannot read {}: {e}", path.display());
        ExitCode::from(BAD_USAGE)
    })
}

/// Ok if the directory `path` exists or could be created; otherwise the problem on stderr and
/// exit status 2.
fn creatable(command: &str, path: &std::path::Path) -> Result<(), ExitCode> {
    std::fs::create_dir_all(path).map_err(|e| {
        eprintln!(
            "vpmu {command}: cannot create the output directory {}: {e}",
            path.display()
        );
        ExitCode::from(BAD_USAGE)
    })
}

/// `/dev/kvm` for `command`, or, without it, exit status 77 and the same two lines from every
/// subcommand: the reason on stderr, `SKIPPED: ...` on stdout (for test harnesses).
fn kvm_for(command: &str) -> Result<kvm_ioctls::Kvm, ExitCode> {
    kvm::usable().map_err(|e| {
        eprintln!(
            "vpmu {command}: cannot run: /dev/kvm is not available ({e}). The guests run on \
             KVM; run this on a host with /dev/kvm readable and writable by this user."
        );
        println!("SKIPPED: /dev/kvm not available ({e})");
        ExitCode::from(77)
    })
}

/// `vpmu selftest` (`verbose` is Some) or `vpmu bench`.
fn suite_command(vendor: selftest::VendorChoice, verbose: Option<bool>) -> ExitCode {
    let command = if verbose.is_some() {
        "selftest"
    } else {
        "bench"
    };
    let kvm = match kvm_for(command) {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    let Some(verbose) = verbose else {
        return match selftest::bench(&kvm, vendor) {
            Ok(s) => {
                print!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("bench: {e}");
                ExitCode::FAILURE
            }
        };
    };
    match selftest::selftest(&kvm, vendor, verbose) {
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
    }
}

/// Whether `vpmu profile`'s option `id` was on the command line (not its default).
fn given_to_profile(matches: &clap::ArgMatches, id: &str) -> bool {
    matches
        .subcommand_matches("profile")
        .and_then(|m| m.value_source(id))
        == Some(ValueSource::CommandLine)
}

/// `vpmu profile`: 0 if every built-in check passed, 1 if one failed or the run broke, 2 a bad
/// path, 130 interrupted (the outputs are written of what was collected).
fn profile_command(mut options: profile::Options) -> ExitCode {
    if let Err(e) = options.check_paths() {
        eprintln!("vpmu profile: {e}");
        return ExitCode::from(BAD_USAGE);
    }
    let kvm = match kvm_for("profile") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    if !options.sweep {
        // The first ^C asks the run to stop and keep its samples; a second one ends the
        // process at once (the flag is already set then), as with `perf record`.
        let interrupt = Arc::new(AtomicBool::new(false));
        let sigint = signal_hook::consts::SIGINT;
        let registered =
            signal_hook::flag::register_conditional_shutdown(sigint, INTERRUPTED.into(), {
                interrupt.clone()
            })
            .and_then(|_| signal_hook::flag::register(sigint, interrupt.clone()));
        match registered {
            Ok(_) => options.interrupt = Some(interrupt),
            Err(e) => eprintln!("vpmu profile: ^C will not keep the samples ({e})"),
        }
    }
    match profile::profile(&kvm, &options) {
        Ok(profile::Outcome::Passed) => ExitCode::SUCCESS,
        Ok(profile::Outcome::Failed) => {
            eprintln!("vpmu profile: a check FAILED (see the report)");
            ExitCode::FAILURE
        }
        Ok(profile::Outcome::Interrupted) => {
            eprintln!("vpmu profile: interrupted; the outputs hold the samples collected");
            ExitCode::from(INTERRUPTED)
        }
        Err(e) => {
            eprintln!("vpmu profile: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `vpmu coverage`: 0 passed, 1 a check failed or the run broke, 3 `-EOPNOTSUPP`.
fn coverage_command(options: &coverage::Options) -> ExitCode {
    let kvm = match kvm_for("coverage") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    match coverage::command(&kvm, options) {
        Ok(coverage::Outcome::Passed) => ExitCode::SUCCESS,
        Ok(coverage::Outcome::Failed) => ExitCode::FAILURE,
        Ok(coverage::Outcome::Unsupported) => ExitCode::from(3),
        Err(e) => {
            eprintln!("vpmu coverage: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::PathBuf;

    fn parse(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vpmu").chain(args.split_whitespace()))
    }

    fn profile_options(args: &str) -> Result<profile::Options, clap::Error> {
        let words = ["vpmu", "profile"]
            .into_iter()
            .chain(args.split_whitespace());
        let matches = Cli::command().try_get_matches_from(words)?;
        match Cli::from_arg_matches(&matches)?.command {
            Command::Profile(p) => p.options(&|id| given_to_profile(&matches, id)),
            other => panic!("not profile: {other:?}"),
        }
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn profile_defaults_are_the_library_defaults() {
        let o = profile_options("").expect("defaults");
        let d = profile::Options::default();
        assert_eq!(
            (o.duration, o.frequency, o.mode, o.vendor, o.vcpus, o.pcpus),
            (d.duration, d.frequency, d.mode, d.vendor, d.vcpus, d.pcpus)
        );
        assert_eq!(
            (&o.out, o.top, o.compare, o.sweep),
            (&d.out, d.top, d.compare, d.sweep)
        );
        assert!(o.guests.is_empty() && o.progress);
    }

    #[test]
    fn profile_options_parse() {
        // (Guests that cannot be read are the run's to report, not a conflict.)
        let o = profile_options(
            "--duration 1.5 --frequency 4000 --mode hv --vendor amd --out /tmp/x --top 3 \
             --quiet --vcpus 3 --pcpus 1 --no-compare --guest a.elf --guest b.elf",
        )
        .expect("valid");
        assert_eq!(o.duration, Duration::from_millis(1500));
        assert_eq!(
            (o.mode, o.vendor, o.frequency, o.top, o.vcpus, o.pcpus),
            (profile::run::Mode::Hv, profile::Vendor::Amd, 4000, 3, 3, 1)
        );
        assert!(!o.progress && !o.compare && !o.sweep);
        assert_eq!(o.guests, [PathBuf::from("a.elf"), PathBuf::from("b.elf")]);
        let linux = profile_options("--profiler linux --linux-guest /g --mode hv").expect("linux");
        assert_eq!(
            linux.profiler,
            profile::Profiler::Linux(PathBuf::from("/g"))
        );
        assert_eq!((linux.pcpus, linux.mode), (1, profile::run::Mode::Hv));
        assert_eq!(
            profile_options("").expect("").profiler,
            profile::Profiler::BuiltIn
        );
        let sweep = profile_options("--sweep --duration 1 --vendor amd").expect("sweep");
        assert!(sweep.sweep);
        assert_eq!(
            profile_options("--mode self").expect("self").mode,
            profile::run::Mode::SelfOnly
        );
    }

    #[test]
    fn combinations_that_cannot_work_are_refused_on_one_line_each() {
        // A guest without profile_config (passive) and one with it (a profile guest).
        let dir = std::env::temp_dir().join(format!("vpmu-cli-conflicts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let passive = dir.join("example.elf");
        std::fs::write(&passive, vpmu_guests::EXAMPLE).expect("write example.elf");
        let taking_part = dir.join("work.elf");
        std::fs::write(&taking_part, vpmu_guests::WORK).expect("write work.elf");
        let (passive, taking_part) = (passive.display(), taking_part.display());
        for (bad, says) in [
            (
                format!("--sweep --guest {passive}"),
                "--sweep measures the built-in workloads' slowdown".to_string(),
            ),
            (
                "--sweep --mode self".into(),
                "--sweep runs all and self mode at 1, 5, 10 and 20 kHz: it takes no --mode or \
                 --frequency"
                    .into(),
            ),
            (
                "--sweep --frequency 2000".into(),
                "it takes no --mode or --frequency".into(),
            ),
            (
                format!("--mode self --guest {passive}"),
                format!(
                    "--guest {passive} has no profile_config: it can only be profiled \
                     passively (--mode all), not sample itself in --mode self"
                ),
            ),
            (
                format!("--mode hv --guest {taking_part} --guest {passive}"),
                "not sample itself in --mode hv".into(),
            ),
            ("--profiler linux --pcpus 2".into(), "uniprocessor".into()),
            ("--profiler linux --mode self".into(), "not self".into()),
            (
                "--profiler linux --page".into(),
                "it takes no --page".into(),
            ),
            (
                "--profiler linux --sweep".into(),
                "no --profiler linux".into(),
            ),
            ("--linux-guest d".into(), "it needs --profiler linux".into()),
        ] {
            let e = profile_options(&bad).expect_err(&bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
            let text = e.render().to_string();
            assert!(text.contains(&says), "{bad}: {text}");
            assert_eq!(
                text.lines().next().map(|l| l.contains(&says)),
                Some(true),
                "{text}"
            );
        }
        // What does work: passive guests in all mode, guests that take part in any mode,
        // and the sweep's own options.
        for good in [
            format!("--guest {passive}"),
            format!("--mode self --guest {taking_part}"),
            "--sweep --duration 1 --vendor amd --pcpus 1".into(),
        ] {
            profile_options(&good).expect(&good);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_options_are_named_on_one_line() {
        for (bad, says) in [
            ("--mode both", "'both' for '--mode <MODE>'"),
            ("--frequency 0", "0 is not in 1..=20000"),
            ("--frequency 50000", "50000 is not in 1..=20000"),
            ("--duration x", "not a number of seconds"),
            ("--duration 0.01", "must be 0.2 to 600 seconds"),
            ("--duration 601", "must be 0.2 to 600 seconds"),
            ("--vendor via", "'via' for '--vendor <VENDOR>'"),
            ("--top 0", "0 is not in 1.."),
            ("--vcpus 0", "0 is not in 1..=8"),
            ("--vcpus 9", "9 is not in 1..=8"),
            ("--pcpus 0", "0 is not in 1..=8"),
            ("--pcpus 9", "9 is not in 1..=8"),
            ("--bogus", "unexpected argument '--bogus'"),
            ("--out", "a value is required for '--out <DIR>'"),
        ] {
            let e = profile_options(bad).expect_err(bad);
            assert_eq!(e.exit_code(), 2, "{bad}");
            let first = e.render().to_string();
            assert!(first.contains(says), "{bad}: {first}");
        }
        let eight = "--guest g ".repeat(profile::MAX_GUESTS + 1);
        let e = profile_options(&eight).expect_err("too many guests");
        assert!(e.to_string().contains("at most 7 --guest images"), "{e}");
        assert!(profile_options(&"--guest g ".repeat(profile::MAX_GUESTS)).is_ok());
    }

    #[test]
    fn selftest_bench_and_coverage_parse() {
        let Command::Selftest(s) = parse("selftest --vendor amd -v").expect("ok").command else {
            panic!("selftest");
        };
        assert_eq!((s.vendor, s.verbose), (VendorsArg::Amd, true));
        let Command::Bench(b) = parse("bench").expect("ok").command else {
            panic!("bench");
        };
        assert_eq!(b.vendor, VendorsArg::Both);
        assert!(parse("selftest --vendor via").is_err());
        let Command::Coverage(c) = parse("coverage --no-suite --out d").expect("ok").command else {
            panic!("coverage");
        };
        assert!(c.no_suite && c.action.is_none() && c.out == std::path::Path::new("d"));
        let Command::Coverage(c) = parse("coverage report f.profraw --binary e --out d")
            .expect("ok")
            .command
        else {
            panic!("coverage report");
        };
        let Some(CoverageAction::Report { file, binary, out }) = c.action else {
            panic!("report");
        };
        assert_eq!(
            (file, binary, out),
            (
                PathBuf::from("f.profraw"),
                Some(PathBuf::from("e")),
                PathBuf::from("d")
            )
        );
        assert!(parse("coverage report").is_err(), "FILE is required");
        assert!(parse("coverage --no-suite report f").is_err());
        assert!(parse("").is_err(), "a subcommand is required");
    }

    #[test]
    fn boot_parses() {
        let Command::Boot(b) = parse("boot x.elf").expect("ok").command else {
            panic!("boot");
        };
        assert_eq!(
            (b.pmu, b.mem, b.timeout, b.append.as_str(), b.source),
            (PmuArg::IntelV5, None, 1800, "", None)
        );
        assert_eq!(b.image, PathBuf::from("x.elf"));
        let Command::Boot(b) = parse("boot --pmu amd-k7 --mem 64 --timeout 30 --append -v y.flat")
            .expect("ok")
            .command
        else {
            panic!("boot");
        };
        assert_eq!((b.pmu, b.mem, b.timeout), (PmuArg::AmdK7, Some(64), 30));
        assert_eq!(b.append, "-v");
        let Command::Boot(b) =
            parse("boot --source timed --initrd i.cpio --append console=ttyS0 vmlinux")
                .expect("ok")
                .command
        else {
            panic!("boot");
        };
        assert_eq!(b.source, Some(SourceArg::Timed));
        assert_eq!(b.initrd, Some(PathBuf::from("i.cpio")));
        assert_eq!(b.append, "console=ttyS0");
        assert_eq!(b.xenpmu_off_after, None);
        let Command::Boot(b) = parse("boot --xenpmu-off-after 1.5 v").expect("ok").command else {
            panic!("boot");
        };
        assert_eq!(b.xenpmu_off_after, Some(Duration::from_millis(1500)));
        for pmu in ["intel-v5", "intel-v2", "amd-perfmonv2", "amd-k7"] {
            let Command::Boot(b) = parse(&format!("boot --pmu {pmu} z")).expect(pmu).command else {
                panic!("boot");
            };
            assert_eq!(vpmu_machine::Shape::from(b.pmu).name(), pmu);
        }
        for bad in [
            "boot",
            "boot --pmu via x",
            "boot --mem 1 x",
            "boot --mem 4096 x",
            "boot --timeout 0 x",
            "boot --source exact x",
            "boot --xenpmu-off-after 0 x",
            "boot --xenpmu-off-after soon x",
        ] {
            assert_eq!(parse(bad).expect_err(bad).exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn help_and_version_are_not_errors() {
        for args in [
            "--help",
            "--version",
            "profile --help",
            "coverage report --help",
        ] {
            let e = parse(args).expect_err(args);
            assert_eq!(e.exit_code(), 0, "{args}");
        }
    }
}
