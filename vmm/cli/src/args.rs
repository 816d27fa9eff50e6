//! The command line: one `clap` definition of every subcommand and option, and the
//! conversions of the parsed arguments into the libraries' options.

use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use vpmu_coverage as coverage;
use vpmu_machine::boot;
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
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Run a multiboot image (e.g. kvm-unit-tests x86/pmu) or a Linux kernel with a virtual PMU.
    ///
    /// A multiboot image: one vCPU in flat 32-bit protected mode at the ELF entry (EAX =
    /// 0x2BADB002, EBX = the multiboot info), fw_cfg, the precise event source by default. A
    /// Linux kernel (vmlinux or bzImage): the x86 64-bit boot protocol with boot_params, an
    /// e820 map, an MP table, --initrd and --append as its command line, the timed event
    /// source by default; the host's quirks are probed first and what Linux must not use is
    /// appended to its command line. Both: COM1 console on stdout (with its transmitter
    /// interrupt), isa-debug-exit (0xf4), KVM's LAPIC, the chosen PMU. Exit status: 0 when the
    /// guest wrote 0 to isa-debug-exit or reset the machine (keyboard controller); for a
    /// non-zero code, (code << 1 | 1) & 0xff as QEMU's (3 for code 1; 77 for
    /// kvm-unit-tests' all-skipped code 38); 1 if the guest did neither (timeout, a triple
    /// fault, a broken run); 2 bad options; 77 no /dev/kvm.
    Boot(BootArgs),
}

/// The PMU a boot image sees (`--pmu`): the four test shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum PmuArg {
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

/// The event source of `vpmu boot` (`--source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum SourceArg {
    /// Single-stepping CPL0: exact instructions and branches; never counts CPL3.
    Precise,
    /// Time in KVM_RUN as cycles, split by privilege level; for a kernel with user space.
    Timed,
}

impl From<SourceArg> for vpmu_machine::personality::Source {
    fn from(s: SourceArg) -> Self {
        match s {
            SourceArg::Precise => Self::Precise,
            SourceArg::Timed => Self::Timed,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct BootArgs {
    /// The image: a multiboot ELF (ELF64 x86-64 or ELF32 i386 with a multiboot header), or a
    /// Linux kernel (an ELF64 vmlinux without one, or a bzImage).
    #[arg(value_name = "IMAGE")]
    pub(crate) image: PathBuf,
    /// The PMU the guest sees.
    #[arg(long, value_enum, default_value_t = PmuArg::IntelV5)]
    pub(crate) pmu: PmuArg,
    /// The event source [default: precise for a multiboot image, timed for a kernel].
    #[arg(long, value_enum)]
    pub(crate) source: Option<SourceArg>,
    /// Guest RAM in MiB [default: 256 for a multiboot image (2 to 3072), 128 for a kernel
    /// (32 to 3072)].
    #[arg(
        long,
        value_name = "MIB",
        value_parser = clap::value_parser!(u64).range(boot::MIN_MEM_MIB..=boot::MAX_MEM_MIB)
    )]
    pub(crate) mem: Option<u64>,
    /// The initial RAM disk of a kernel (a cpio archive the kernel can unpack).
    #[arg(long, value_name = "FILE")]
    pub(crate) initrd: Option<PathBuf>,
    /// Stop the guest after this many seconds (exit status 1).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 1800,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub(crate) timeout: u64,
    /// A multiboot image's arguments, after its file name; a kernel's whole command line
    /// (QEMU's -append).
    #[arg(
        long,
        value_name = "ARGS",
        default_value = "",
        allow_hyphen_values = true
    )]
    pub(crate) append: String,
    /// A Linux kernel: the host switches the xenpmu interface off this many seconds after
    /// the guest's first PMI, as an administrator sets the vPMU mode off (fractions allowed;
    /// the guest's driver finds mode off and its registrations kept: docs in
    /// vmm/machine/src/interface_off.rs).
    #[arg(long, value_name = "SECONDS", value_parser = positive_seconds)]
    pub(crate) xenpmu_off_after: Option<Duration>,
}

/// A number of seconds above 0 (fractions allowed), at most a day.
fn positive_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!(
            "{s}: expected seconds above 0 (at most 86400), e.g. 1.5"
        )),
    }
}

/// What the guests measure (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModeArg {
    /// The profiler samples every domain.
    All,
    /// Every domain samples itself and the profiler also samples the VMM.
    Hv,
    /// Every domain samples itself.
    #[value(name = "self")]
    SelfOnly,
}

/// Domain 0, the privileged profiling domain (`--profiler`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProfilerArg {
    /// The freestanding profiler guest built into vpmu.
    Builtin,
    /// The project's Linux guest: xenpmu.ko and its recorder (vmm/linux-guest).
    Linux,
}

/// The PMU the profiled guests see (`--vendor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum VendorArg {
    /// Intel architectural PMU v5.
    Intel,
    /// AMD PerfMonV2.
    Amd,
}

/// The personalities the suite and the benchmark run (`--vendor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum VendorsArg {
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
pub(crate) struct ProfileArgs {
    /// Seconds to sample (0.2 to 600).
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Samples per second of CPU time.
    #[arg(
        long,
        value_name = "HZ",
        default_value_t = 2000,
        value_parser = clap::value_parser!(u64).range(profile::MIN_FREQUENCY..=profile::MAX_FREQUENCY)
    )]
    pub(crate) frequency: u64,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    pub(crate) mode: ModeArg,
    /// The PMU the guests see: intel (architectural v5) or amd (PerfMonV2).
    #[arg(long, value_enum, default_value_t = VendorArg::Intel)]
    pub(crate) vendor: VendorArg,
    /// A static ELF64 guest to profile instead of the built-in workloads (repeat for more
    /// domains, at most 7); symbolized from its own symbol table. Each of its vCPUs enters its
    /// entry point (RSI = domain, LAPIC ID = vCPU): a guest that is not SMP-safe wants
    /// --vcpus 1.
    #[arg(long = "guest", value_name = "ELF")]
    pub(crate) guests: Vec<PathBuf>,
    /// vCPUs of each workload domain (1 to 8); vCPU i runs on pCPU i mod pcpus.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(profile::MAX_VCPUS))
    )]
    pub(crate) vcpus: u32,
    /// pCPUs, each a host thread time-slicing its vCPUs (1 to 8); the profiling domain has
    /// one vCPU per pCPU.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 2,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(profile::MAX_PCPUS))
    )]
    pub(crate) pcpus: u32,
    /// Output directory: report.txt, profile.json, samples.jsonl (every sample with its
    /// registers, time and call stack), perf.data (with images/, the ELFs it maps),
    /// profile.pb.gz (pprof), stacks.folded and flamegraph.svg.
    #[arg(long, value_name = "DIR", default_value = "profile-out")]
    pub(crate) out: PathBuf,
    /// Functions per domain in the text report (at least 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) top: u64,
    /// Skip the self-mode run that all mode with the built-in workloads makes to check that
    /// both modes rank each domain's functions alike (seed 002).
    #[arg(long)]
    pub(crate) no_compare: bool,
    /// Samples through a sample ring (ABI 1.4; the default): the hypervisor writes records
    /// and re-arms the counter, the guest is woken once per batch. Falls back to the page if
    /// the hypervisor has no ring.
    #[arg(long, conflicts_with = "page")]
    pub(crate) ring: bool,
    /// Samples through the xenpmu page: one interrupt, guest handler and flush per sample.
    #[arg(long)]
    pub(crate) page: bool,
    /// Instead of one profile: page vs ring delivery side by side at 1, 5, 10 and 20 kHz in
    /// all and self mode (expected, delivered, lost, slowdown, where the time per sample
    /// goes; writes sweep.json).
    #[arg(long)]
    pub(crate) sweep: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Domain 0: the built-in profiler guest, or a real Linux kernel running the xenpmu
    /// driver and its recorder (all or hv mode, one pCPU; build it with
    /// vmm/linux-guest/build.sh).
    #[arg(long, value_enum, default_value_t = ProfilerArg::Builtin)]
    pub(crate) profiler: ProfilerArg,
    /// --profiler linux: the directory with vmlinux and initramfs-xenpmu.cpio (default
    /// $VPMU_LINUX_GUEST_DIR, else target/linux-guest).
    #[arg(long, value_name = "DIR")]
    pub(crate) linux_guest: Option<PathBuf>,
}

/// `--duration`: seconds, within the profiler's limits.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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
    pub(crate) fn options(
        self,
        given: &dyn Fn(&str) -> bool,
    ) -> Result<profile::Options, clap::Error> {
        let conflict = |message: String| Cli::command().error(ErrorKind::ArgumentConflict, message);
        if self.sweep && (given("mode") || given("frequency")) {
            return Err(conflict(
                "--sweep runs all and self mode at 1, 5, 10 and 20 kHz: it takes no --mode or \
                 --frequency"
                    .into(),
            ));
        }
        if self.sweep && (self.ring || self.page) {
            return Err(conflict(
                "--sweep runs page and ring delivery side by side: it takes no --ring or --page"
                    .into(),
            ));
        }
        if self.linux_guest.is_some() && self.profiler != ProfilerArg::Linux {
            return Err(conflict(
                "--linux-guest names the Linux profiling domain's files: it needs \
                 --profiler linux"
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
            // The Linux guest is uniprocessor: one pCPU unless the user asked otherwise
            // (which `conflicts` refuses).
            pcpus: if self.profiler == ProfilerArg::Linux && !given("pcpus") {
                1
            } else {
                self.pcpus
            },
            out: self.out,
            top: usize::try_from(self.top).unwrap_or(usize::MAX),
            compare: !self.no_compare,
            delivery: if self.page {
                profile::DeliveryPath::Page
            } else {
                profile::DeliveryPath::Ring
            },
            sweep: self.sweep,
            progress: !self.quiet,
            interrupt: None,
            profiler: match self.profiler {
                ProfilerArg::Builtin => profile::Profiler::BuiltIn,
                ProfilerArg::Linux => profile::Profiler::Linux(
                    profile::linux::LinuxProfiler::dir_or_default(self.linux_guest.as_deref()),
                ),
            },
        };
        match options.conflicts().into_iter().next() {
            Some(c) => Err(conflict(c)),
            None => Ok(options),
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct SelftestArgs {
    /// The personalities to run.
    #[arg(long, value_enum, default_value_t = VendorsArg::Both)]
    pub(crate) vendor: VendorsArg,
    /// Print every case's console.
    #[arg(short, long)]
    pub(crate) verbose: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The personalities to measure.
    #[arg(long, value_enum, default_value_t = VendorsArg::Both)]
    pub(crate) vendor: VendorsArg,
}

#[derive(Debug, Args)]
pub(crate) struct CoverageArgs {
    #[command(subcommand)]
    pub(crate) action: Option<CoverageAction>,
    /// Output directory: vpmu.profraw (after the conformance suite), after-reset.profraw,
    /// checks.txt, and with llvm-cov: report.txt, coverage.lcov, html/, uncovered.txt.
    #[arg(long, value_name = "DIR", default_value = coverage::DEFAULT_OUT)]
    pub(crate) out: PathBuf,
    /// Read the coverage without running the conformance suite first.
    #[arg(long)]
    pub(crate) no_suite: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum CoverageAction {
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
