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
//! * `vpmu boot [--pmu SHAPE] [--mem MIB] [--timeout SECONDS] [--append ARGS] ELF`: runs a
//!   multiboot image (upstream kvm-unit-tests' `x86/pmu`, say) as QEMU's `-kernel` would, on one
//!   of the four PMU personalities with the precise event source (`vpmu_machine::boot`).
//!
//! This binary only parses and checks the arguments (one `clap` definition: every option is
//! validated before `/dev/kvm` is opened), checks `/dev/kvm`, calls a library and maps its
//! result to the exit status: 0 ok, 1 a check failed or the run broke, 2 bad usage, 3
//! coverage without `XENPMU_OP_COVERAGE`, 77 no usable `/dev/kvm`; `vpmu boot` exits with the
//! guest's isa-debug-exit code mapped as QEMU does (`(code << 1) | 1`, 8 bits) except that code
//! 0 gives 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use vpmu_coverage as coverage;
use vpmu_machine::{boot, kvm};
use vpmu_profile as profile;
use vpmu_selftest as selftest;

/// A virtual PMU for x86 hypervisors: the reference VMM on KVM.
#[derive(Debug, Parser)]
#[command(
    name = "vpmu",
    version,
    propagate_version = true,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Profile a whole virtual machine (docs/profile.md).
    ///
    /// A privileged domain samples guest domains through its xenpmu page; per-domain report,
    /// flamegraph, JSON, built-in checks. Exit status: 0 every check passed, 1 a check failed
    /// or the run broke, 2 bad options, 77 no /dev/kvm.
    Profile(ProfileArgs),
    /// Run the guest-visible PMU conformance suite on every PMU personality.
    Selftest(SelftestArgs),
    /// Measure a PMU MSR exit handled by the vpmu against a null handler.
    Bench(BenchArgs),
    /// The vPMU's code coverage under the conformance suite (docs/coverage.md).
    ///
    /// Read by a guest through XENPMU_OP_COVERAGE. Exit status: 0 every check passed, 1 a
    /// check failed, 2 bad options, 3 this vpmu was built without XENPMU_OP_COVERAGE
    /// (scripts/coverage.sh builds it), 77 no /dev/kvm.
    #[command(args_conflicts_with_subcommands = true)]
    Coverage(CoverageArgs),
    /// Run a multiboot image (e.g. kvm-unit-tests x86/pmu) as QEMU's -kernel would.
    ///
    /// One vCPU in flat 32-bit protected mode at the ELF entry (EAX = 0x2BADB002, EBX = the
    /// multiboot info), COM1 console on stdout, isa-debug-exit (0xf4), fw_cfg, KVM's LAPIC, and
    /// the chosen PMU on the precise (single-step) event source. Exit status: 0 when the guest
    /// wrote 0 to isa-debug-exit; for a non-zero code, (code << 1 | 1) & 0xff as QEMU's (3 for
    /// code 1; 77 for kvm-unit-tests' all-skipped code 38); 1 if the guest never wrote one
    /// (timeout, a broken run); 2 bad options; 77 no /dev/kvm.
    Boot(BootArgs),
}

/// The PMU a boot image sees (`--pmu`): the four test shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PmuArg {
    /// Intel architectural PMU v5: 8 GP counters, full-width writes.
    #[value(name = "intel-v5")]
    IntelV5,
    /// Intel architectural PMU v2: 4 GP counters, legacy writes.
    #[value(name = "intel-v2")]
    IntelV2,
    /// AMD PerfMonV2: 6 core counters, global control.
    #[value(name = "amd-perfmonv2")]
    AmdPerfMonV2,
    /// AMD legacy K7: 4 counters.
    #[value(name = "amd-k7")]
    AmdK7,
}

impl From<PmuArg> for vpmu_machine::Shape {
    fn from(p: PmuArg) -> Self {
        match p {
            PmuArg::IntelV5 => Self::IntelV5,
            PmuArg::IntelV2 => Self::IntelV2,
            PmuArg::AmdPerfMonV2 => Self::AmdPerfMonV2,
            PmuArg::AmdK7 => Self::AmdK7,
        }
    }
}

#[derive(Debug, Args)]
struct BootArgs {
    /// The multiboot image: an ELF64 x86-64 or ELF32 i386 executable with a multiboot header.
    #[arg(value_name = "ELF")]
    image: PathBuf,
    /// The PMU the guest sees.
    #[arg(long, value_enum, default_value_t = PmuArg::IntelV5)]
    pmu: PmuArg,
    /// Guest RAM in MiB.
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = boot::DEFAULT_MEM_MIB,
        value_parser = clap::value_parser!(u64).range(boot::MIN_MEM_MIB..=boot::MAX_MEM_MIB)
    )]
    mem: u64,
    /// Stop the guest after this many seconds (exit status 1).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 1800,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    timeout: u64,
    /// Arguments for the guest's command line, after the image's file name (QEMU's -append).
    #[arg(
        long,
        value_name = "ARGS",
        default_value = "",
        allow_hyphen_values = true
    )]
    append: String,
}

/// What the guests measure (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// The profiler samples every domain.
    All,
    /// Every domain samples itself and the profiler also samples the VMM.
    Hv,
    /// Every domain samples itself.
    #[value(name = "self")]
    SelfOnly,
}

/// The PMU the profiled guests see (`--vendor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum VendorArg {
    /// Intel architectural PMU v5.
    Intel,
    /// AMD PerfMonV2.
    Amd,
}

/// The personalities the suite and the benchmark run (`--vendor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum VendorsArg {
    /// Intel v5 and v2.
    Intel,
    /// AMD PerfMonV2 and legacy K7.
    Amd,
    /// Both vendors.
    Both,
}

impl From<VendorsArg> for selftest::VendorChoice {
    fn from(v: VendorsArg) -> Self {
        match v {
            VendorsArg::Intel => Self::Intel,
            VendorsArg::Amd => Self::Amd,
            VendorsArg::Both => Self::Both,
        }
    }
}

#[derive(Debug, Args)]
struct ProfileArgs {
    /// Seconds to sample (0.2 to 600).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = parse_duration)]
    duration: Duration,
    /// Samples per second of CPU time.
    #[arg(
        long,
        value_name = "HZ",
        default_value_t = 2000,
        value_parser = clap::value_parser!(u64).range(profile::MIN_FREQUENCY..=profile::MAX_FREQUENCY)
    )]
    frequency: u64,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    mode: ModeArg,
    /// The PMU the guests see: intel (architectural v5) or amd (PerfMonV2).
    #[arg(long, value_enum, default_value_t = VendorArg::Intel)]
    vendor: VendorArg,
    /// A static ELF64 guest to profile instead of the built-in workloads (repeat for more
    /// domains, at most 7); symbolized from its own symbol table. Each of its vCPUs enters its
    /// entry point (RSI = domain, LAPIC ID = vCPU): a guest that is not SMP-safe wants
    /// --vcpus 1.
    #[arg(long = "guest", value_name = "ELF")]
    guests: Vec<PathBuf>,
    /// vCPUs of each workload domain (1 to 8); vCPU i runs on pCPU i mod pcpus.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(profile::MAX_VCPUS))
    )]
    vcpus: u32,
    /// pCPUs, each a host thread time-slicing its vCPUs (1 to 8); the profiling domain has
    /// one vCPU per pCPU.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(profile::MAX_PCPUS))
    )]
    pcpus: u32,
    /// Output directory: report.txt, profile.json, samples.jsonl (every sample with its
    /// registers, time and call stack), perf.data (with images/, the ELFs it maps),
    /// profile.pb.gz (pprof), stacks.folded and flamegraph.svg.
    #[arg(long, value_name = "DIR", default_value = "profile-out")]
    out: PathBuf,
    /// Functions per domain in the text report (at least 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    top: u64,
    /// Skip the self-mode run that all mode with the built-in workloads makes to check that
    /// both modes rank each domain's functions alike (seed 002).
    #[arg(long)]
    no_compare: bool,
    /// Instead of one profile: delivered vs dropped samples and the workloads' slowdown at 1,
    /// 4 and 10 kHz in all and self mode (writes sweep.json).
    #[arg(long)]
    sweep: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// `--duration`: seconds, within the profiler's limits.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| "not a number of seconds".to_string())?;
    if !(profile::MIN_DURATION_S..=profile::MAX_DURATION_S).contains(&secs) {
        return Err(format!(
            "must be {} to {} seconds",
            profile::MIN_DURATION_S,
            profile::MAX_DURATION_S
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl ProfileArgs {
    /// The library's options; the checks clap cannot express (the number of `--guest`s, the
    /// combinations that cannot work: `given` tells whether an option was on the command
    /// line).
    fn options(self, given: &dyn Fn(&str) -> bool) -> Result<profile::Options, clap::Error> {
        let conflict = |message: String| Cli::command().error(ErrorKind::ArgumentConflict, message);
        if self.sweep && (given("mode") || given("frequency")) {
            return Err(conflict(
                "--sweep runs all and self mode at 1, 4 and 10 kHz: it takes no --mode or \
                 --frequency"
                    .into(),
            ));
        }
        if self.guests.len() > profile::MAX_GUESTS {
            return Err(Cli::command().error(
                ErrorKind::TooManyValues,
                format!(
                    "at most {} --guest images ({} given)",
                    profile::MAX_GUESTS,
                    self.guests.len()
                ),
            ));
        }
        let options = profile::Options {
            duration: self.duration,
            frequency: self.frequency,
            mode: match self.mode {
                ModeArg::All => profile::run::Mode::All,
                ModeArg::Hv => profile::run::Mode::Hv,
                ModeArg::SelfOnly => profile::run::Mode::SelfOnly,
            },
            vendor: match self.vendor {
                VendorArg::Intel => profile::Vendor::Intel,
                VendorArg::Amd => profile::Vendor::Amd,
            },
            guests: self.guests,
            vcpus: self.vcpus,
            pcpus: self.pcpus,
            out: self.out,
            top: usize::try_from(self.top).unwrap_or(usize::MAX),
            compare: !self.no_compare,
            sweep: self.sweep,
            progress: !self.quiet,
        };
        match options.conflicts().into_iter().next() {
            Some(c) => Err(conflict(c)),
            None => Ok(options),
        }
    }
}

#[derive(Debug, Args)]
struct SelftestArgs {
    /// The personalities to run.
    #[arg(long, value_enum, default_value_t = VendorsArg::Both)]
    vendor: VendorsArg,
    /// Print every case's console.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// The personalities to measure.
    #[arg(long, value_enum, default_value_t = VendorsArg::Both)]
    vendor: VendorsArg,
}

#[derive(Debug, Args)]
struct CoverageArgs {
    #[command(subcommand)]
    action: Option<CoverageAction>,
    /// Output directory: vpmu.profraw (after the conformance suite), after-reset.profraw,
    /// checks.txt, and with llvm-cov: report.txt, coverage.lcov, html/, uncovered.txt.
    #[arg(long, value_name = "DIR", default_value = coverage::DEFAULT_OUT)]
    out: PathBuf,
    /// Read the coverage without running the conformance suite first.
    #[arg(long)]
    no_suite: bool,
}

#[derive(Debug, Subcommand)]
enum CoverageAction {
    /// Validate a raw profile read earlier (header, sizes, counters, names; against the
    /// binary too, which defaults to this one) and report it with llvm-cov if installed.
    Report {
        /// The raw profile (.profraw).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The instrumented ELF the profile came from (default: this binary).
        #[arg(long, value_name = "ELF")]
        binary: Option<PathBuf>,
        /// Output directory: report.txt, coverage.lcov, html/, uncovered.txt.
        #[arg(long, value_name = "DIR", default_value = coverage::DEFAULT_OUT)]
        out: PathBuf,
    },
}

/// Bad usage: clap's first paragraph on one line (the problem, with the possible values if
/// any) and its pointer to `--help`; no usage dump. Help and version go to stdout with status 0.
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
            Ok(options) => profile_command(&options),
            Err(e) => usage_error(&e),
        },
        Command::Selftest(args) => suite_command(args.vendor.into(), Some(args.verbose)),
        Command::Bench(args) => suite_command(args.vendor.into(), None),
        Command::Coverage(CoverageArgs {
            action: Some(CoverageAction::Report { file, binary, out }),
            ..
        }) => coverage::report(&coverage::ReportOptions { file, binary, out }).map_or_else(
            |e| {
                eprintln!("vpmu coverage report: {e}");
                ExitCode::FAILURE
            },
            |()| ExitCode::SUCCESS,
        ),
        Command::Coverage(CoverageArgs {
            action: None,
            out,
            no_suite,
        }) => coverage_command(&coverage::Options {
            out,
            suite: !no_suite,
        }),
        Command::Boot(args) => boot_command(&args),
    }
}

/// `vpmu boot`: the guest's isa-debug-exit code as the exit status (`boot::exit_status`), 1
/// if it wrote none.
fn boot_command(args: &BootArgs) -> ExitCode {
    let image = match std::fs::read(&args.image) {
        Ok(image) => image,
        Err(e) => {
            eprintln!("vpmu boot: cannot read {}: {e}", args.image.display());
            return ExitCode::FAILURE;
        }
    };
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
        mem_size: usize::try_from(args.mem << 20).unwrap_or(usize::MAX),
        cmdline,
        echo: true,
    };
    let shape = vpmu_machine::Shape::from(args.pmu);
    let timeout = Duration::from_secs(args.timeout);
    let result = match boot::run(&kvm, shape, &image, &options, timeout) {
        Ok(result) => result,
        Err(e) => {
            eprintln!("vpmu boot: {e}");
            return ExitCode::FAILURE;
        }
    };
    let took = result.elapsed.as_secs_f64();
    match (result.status, &result.error) {
        (Some(code), _) => {
            let status = boot::exit_status(code);
            eprintln!(
                "vpmu boot: {} exited with code {code} (status {status}) after {took:.1} s, {} \
                 single steps, {} PMU MSR exits, {} PMIs",
                shape.name(),
                result.steps,
                result.msr_exits,
                result.pmis
            );
            ExitCode::from(status)
        }
        (None, error) => {
            eprintln!(
                "vpmu boot: {} did not exit ({}) after {took:.1} s",
                shape.name(),
                error.as_deref().unwrap_or("stopped")
            );
            ExitCode::FAILURE
        }
    }
}

/// `/dev/kvm` for `command`, or the clear message and exit status 77 without it.
fn kvm_for(command: &str) -> Result<kvm_ioctls::Kvm, ExitCode> {
    kvm::usable().map_err(|e| {
        eprintln!(
            "vpmu {command}: cannot run: /dev/kvm is not available ({e}). The guests run on \
             KVM; run this on a host with /dev/kvm readable and writable by this user."
        );
        ExitCode::from(77)
    })
}

/// `vpmu selftest` (`verbose` is Some) or `vpmu bench`.
fn suite_command(vendor: selftest::VendorChoice, verbose: Option<bool>) -> ExitCode {
    let kvm = match kvm::usable() {
        Ok(kvm) => kvm,
        Err(e) => {
            eprintln!("SKIPPED: /dev/kvm not available ({e})");
            println!("SKIPPED: /dev/kvm not available ({e})");
            return ExitCode::from(77);
        }
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

/// `vpmu profile`: 0 if every built-in check passed, 1 if one failed or the run broke.
fn profile_command(options: &profile::Options) -> ExitCode {
    let kvm = match kvm_for("profile") {
        Ok(kvm) => kvm,
        Err(code) => return code,
    };
    match profile::profile(&kvm, options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("vpmu profile: a check FAILED (see the report)");
            ExitCode::FAILURE
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
                "--sweep runs all and self mode at 1, 4 and 10 kHz: it takes no --mode or \
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
            (b.pmu, b.mem, b.timeout, b.append.as_str()),
            (PmuArg::IntelV5, 256, 1800, "")
        );
        assert_eq!(b.image, PathBuf::from("x.elf"));
        let Command::Boot(b) = parse("boot --pmu amd-k7 --mem 64 --timeout 30 --append -v y.flat")
            .expect("ok")
            .command
        else {
            panic!("boot");
        };
        assert_eq!((b.pmu, b.mem, b.timeout), (PmuArg::AmdK7, 64, 30));
        assert_eq!(b.append, "-v");
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
