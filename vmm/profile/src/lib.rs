//! `vpmu profile`: system-wide sampling of real guests by a privileged profiling domain.
//!
//! Domain 0 runs `profile/profiler.c`: it sets the mode, registers its xenpmu page, samples and
//! ships the samples it reads from the page in batches; domains 1.. run the built-in CPL3
//! workloads (`profile/work.c`) or the user's ELFs. All share one pCPU (the timed event source;
//! see `vpmu_machine`). The VMM only carries the batches; attribution comes from the pages,
//! and is checked against the VMM's own record of every PMI (`validate`).
//!
//! Modules: `protocol` (the guest/VMM batch format), `run` (one run), `symbols` (ELF symbol
//! tables), `report` (per-domain tables, folded stacks, SVG, JSON), `validate` (the built-in
//! checks), `workloads` (the built-in workloads' construction), `sweep` (delivered vs dropped
//! and slowdown by frequency).

pub mod protocol;
pub mod report;
pub mod run;
pub mod sample;
pub mod sweep;

pub mod validate;
pub mod workloads;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use serde::Serialize;
use vpmu_amd::PmuShape;

use report::{DomainInfo, Report, RunInfo};
use run::{DomainPlan, Mode, Plan, RunData};
use sample::Origin;
use vpmu_machine::VmmActivity;
use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::symbols::Symbols;
use workloads::{BUILT_IN, Workload};

/// The usage text of `vpmu profile`.
pub const USAGE: &str = "\
usage: vpmu profile [--duration SECONDS] [--frequency HZ] [--mode all|hv|self]
                    [--vendor intel|amd] [--guest ELF]... [--vcpus N] [--pcpus N]
                    [--out DIR] [--top N]
                    [--no-compare] [--sweep] [--quiet]
  --duration   seconds to sample (default 5)
  --frequency  samples per second of CPU time (default 2000; 1..=20000)
  --mode       all: the profiler samples every domain (default); hv: every domain samples
               itself and the profiler also samples the VMM; self: every domain samples itself
  --vendor     the PMU the guests see: intel (architectural v5, default) or amd (PerfMonV2)
  --guest      a static ELF64 guest to profile instead of the built-in workloads (repeat for
               more domains, at most 7); symbolized from its own symbol table. Each of its
               vCPUs enters its entry point (RSI = domain, LAPIC ID = vCPU): a guest that is
               not SMP-safe wants --vcpus 1
  --vcpus      vCPUs of each workload domain (default 2; 1..=8); vCPU i on pCPU i mod pcpus
  --pcpus      pCPUs, each a host thread time-slicing its vCPUs (default 2; 1..=8); the
               profiling domain has one vCPU per pCPU
  --out        output directory (default profile-out): report.txt, profile.json, flamegraph.svg,
               samples.jsonl (every sample with its full register set)
  --top        functions per domain in the text report (default 10)
  --no-compare all mode with the built-in workloads also runs them in self mode to check that
               both rank each domain's functions alike (seed 002); this skips that run
  --sweep      instead of one profile: delivered vs dropped samples and the workloads'
               slowdown at 1, 4 and 10 kHz in all and self mode (writes sweep.json)
  --quiet      no progress bar";

/// The PMU personality the guests see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel architectural PMU v5 (8 GP counters, full-width writes).
    Intel,
    /// AMD PerfMonV2 (6 counters).
    Amd,
}

/// The options of `vpmu profile`.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long to sample.
    pub duration: Duration,
    /// Samples per second of CPU time.
    pub frequency: u64,
    /// What to measure.
    pub mode: Mode,
    /// The PMU the guests see.
    pub vendor: Vendor,
    /// User guests instead of the built-in workloads.
    pub guests: Vec<PathBuf>,
    /// vCPUs of each workload domain.
    pub vcpus: u32,
    /// pCPUs (host threads).
    pub pcpus: u32,
    /// Where the outputs go.
    pub out: PathBuf,
    /// Functions per domain in the text report.
    pub top: usize,
    /// Run the self-mode comparison (all mode, built-in workloads).
    pub compare: bool,
    /// Measure the frequency sweep instead.
    pub sweep: bool,
    /// Draw a progress bar.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(5),
            frequency: 2000,
            mode: Mode::All,
            vendor: Vendor::Intel,
            guests: Vec::new(),
            vcpus: 2,
            pcpus: 2,
            out: PathBuf::from("profile-out"),
            top: 10,
            compare: true,
            sweep: false,
            progress: true,
        }
    }
}

/// The most workload domains (the profiler is one more).
const MAX_GUESTS: usize = 7;
/// The most vCPUs per workload domain (the guests' per-vCPU state and the VMM's TSSes).
const MAX_VCPUS: u32 = 8;
/// The most pCPUs (host threads); the profiling domain has one vCPU per pCPU.
const MAX_PCPUS: u32 = 8;

impl Options {
    /// Parses the arguments after `profile`.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match a.as_str() {
                "--duration" => {
                    let v = value(a)?;
                    let s: f64 = v
                        .parse()
                        .map_err(|_| format!("--duration {v}: not a number of seconds"))?;
                    if !(0.2..=600.0).contains(&s) {
                        return Err(format!("--duration {v}: must be 0.2 to 600 seconds"));
                    }
                    o.duration = Duration::from_secs_f64(s);
                }
                "--frequency" => {
                    let v = value(a)?;
                    o.frequency = v
                        .parse()
                        .ok()
                        .filter(|f| (1..=20_000).contains(f))
                        .ok_or_else(|| format!("--frequency {v}: must be 1 to 20000 Hz"))?;
                }
                "--mode" => {
                    let v = value(a)?;
                    o.mode = match v.as_str() {
                        "all" => Mode::All,
                        "hv" => Mode::Hv,
                        "self" => Mode::SelfOnly,
                        _ => return Err(format!("--mode {v}: must be all, hv or self")),
                    };
                }
                "--vendor" => {
                    let v = value(a)?;
                    o.vendor = match v.as_str() {
                        "intel" => Vendor::Intel,
                        "amd" => Vendor::Amd,
                        _ => return Err(format!("--vendor {v}: must be intel or amd")),
                    };
                }
                "--guest" => o.guests.push(PathBuf::from(value(a)?)),
                "--pcpus" => {
                    let v = value(a)?;
                    o.pcpus = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_PCPUS).contains(n))
                        .ok_or_else(|| format!("--pcpus {v}: must be 1 to {MAX_PCPUS}"))?;
                }
                "--vcpus" => {
                    let v = value(a)?;
                    o.vcpus = v
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_VCPUS).contains(n))
                        .ok_or_else(|| format!("--vcpus {v}: must be 1 to {MAX_VCPUS}"))?;
                }
                "--out" => o.out = PathBuf::from(value(a)?),
                "--top" => {
                    let v = value(a)?;
                    o.top = v
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("--top {v}: must be a positive number"))?;
                }
                "--no-compare" => o.compare = false,
                "--sweep" => o.sweep = true,
                "--quiet" => o.progress = false,
                other => return Err(format!("unknown option {other}")),
            }
        }
        if o.guests.len() > MAX_GUESTS {
            return Err(format!("at most {MAX_GUESTS} --guest images"));
        }
        Ok(o)
    }

    /// The workload domains: the built-in ones, or the user's images.
    fn workloads(&self) -> Result<Vec<DomainPlan>, String> {
        if self.guests.is_empty() {
            return Ok(BUILT_IN
                .iter()
                .map(|w| DomainPlan {
                    name: format!("work.elf ({})", w.label),
                    image: vpmu_guests::WORK.to_vec(),
                    workload: Some(*w),
                })
                .collect());
        }
        self.guests
            .iter()
            .map(|path| {
                let image =
                    std::fs::read(path).map_err(|e| format!("--guest {}: {e}", path.display()))?;
                // Refuse what cannot be symbolized before booting anything.
                Symbols::from_elf(&image)
                    .map_err(|e| format!("--guest {}: {e}", path.display()))?;
                let name = path.file_name().map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                );
                Ok(DomainPlan {
                    name,
                    image,
                    workload: None,
                })
            })
            .collect()
    }
}

/// One run's delivery numbers, for the JSON and the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct Delivery {
    /// The run's mode.
    pub mode: &'static str,
    /// Samples per second of CPU time asked for.
    pub frequency_hz: u64,
    /// The counter's mean period (cycles = TSC ticks).
    pub period_cycles: u64,
    /// Samples the counters' overflows should have produced: the frequency times the CPU time
    /// the sampled contexts ran (the counters count guest cycles: all mode, every domain's
    /// time on the pCPU; self mode, each sampler's own; hv mode, also the VMM's time serving
    /// the profiler, which is not included here).
    pub expected: u64,
    /// The CPU time (seconds in `KVM_RUN`) of the sampled contexts.
    pub sampled_cpu_s: f64,
    /// PMIs the core handled with an interrupt (generated).
    pub generated: u64,
    /// Samples the guests shipped.
    pub delivered: u64,
    /// Samples the core dropped (a sample still unread in the page, or no page).
    pub dropped: u64,
    /// Samples the guests read but could not buffer.
    pub lost_in_guest: u64,
    /// Each workload domain's progress: rounds of its loop per second of wall time.
    pub work_rates: Vec<f64>,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
}

impl Delivery {
    /// The numbers of `data`.
    pub fn of(data: &RunData) -> Self {
        // All mode: the pCPU's counter, every domain's time. Self/hv: each sampler's own; the
        // profiler (domain 0) samples only in hv mode.
        let cpu_s: f64 = data
            .results
            .iter()
            .filter(|r| r.vcpu.is_some_and(|v| v.domain != 0) || data.mode != Mode::SelfOnly)
            .map(|r| r.guest_ns as f64 / 1e9)
            .sum();
        let stats = data.results.iter().filter_map(|r| r.stats);
        Self {
            mode: data.mode.name(),
            frequency_hz: data.frequency,
            period_cycles: data.period,
            expected: (data.frequency as f64 * cpu_s).round() as u64,
            sampled_cpu_s: cpu_s,
            generated: stats.clone().map(|s| s.pmis_generated).sum(),
            delivered: data.samples().count() as u64,
            dropped: stats.map(|s| s.pmis_dropped).sum(),
            lost_in_guest: data.shipments.iter().map(|(_, s)| s.lost).sum(),
            work_rates: (0..data.work.len())
                .filter_map(|d| data.work_rate(d))
                .collect(),
            wall_s: data.wall.as_secs_f64(),
        }
    }
}

/// The domains of `data` as the report sees them: the profiler, the workloads, and the
/// hypervisor in hv mode, each with its symbols and the samples the vpmu dropped while it ran.
fn domain_infos(data: &RunData, workloads: &[DomainPlan]) -> Vec<DomainInfo> {
    let log = data.results.first().map_or(&[][..], |r| &r.pmi_log[..]);
    let dropped = |origin: Origin| {
        log.iter()
            .filter(|r| r.dropped)
            .filter(|r| match origin {
                Origin::Hypervisor => r.hypervisor,
                Origin::Domain(d) => !r.hypervisor && r.running.domain == d,
            })
            .count() as u64
    };
    let symbols = |image: &[u8]| Symbols::from_elf(image).unwrap_or_default();
    let mut domains = vec![DomainInfo {
        origin: Origin::Domain(0),
        name: "profiler.elf".into(),
        symbols: symbols(vpmu_guests::PROFILER),
        dropped: dropped(Origin::Domain(0)),
    }];
    for (i, w) in workloads.iter().enumerate() {
        let origin = Origin::Domain(i as u32 + 1);
        domains.push(DomainInfo {
            origin,
            name: w.name.clone(),
            symbols: symbols(&w.image),
            dropped: dropped(origin),
        });
    }
    if data.mode == Mode::Hv {
        domains.push(DomainInfo {
            origin: Origin::Hypervisor,
            name: "vmm".into(),
            symbols: Symbols::from_table(VmmActivity::symbols()),
            dropped: dropped(Origin::Hypervisor),
        });
    }
    domains
}

/// The per-domain report of `data` (profiler, workloads, and the hypervisor in hv mode).
pub fn report_of(
    data: &RunData,
    workloads: &[DomainPlan],
    vendor: &str,
    duration: Duration,
) -> Report {
    let samples: Vec<_> = data.samples().copied().collect();
    Report::build(
        RunInfo {
            mode: data.mode.name().into(),
            vendor: vendor.into(),
            frequency_hz: data.frequency,
            duration_s: duration.as_secs_f64(),
            tsc_khz: data.tsc_khz,
            pcpus: data.pcpus,
            vcpus: data.vcpus,
        },
        &samples,
        &domain_infos(data, workloads),
    )
}

/// Every sample of `data` as one JSON object per line: who it caught, where (symbolized from
/// that domain's image), and the full register set the profiling guest read from its page.
fn samples_jsonl(data: &RunData, workloads: &[DomainPlan]) -> String {
    let infos = domain_infos(data, workloads);
    let mut out = String::new();
    for s in data.samples() {
        let function = infos
            .iter()
            .find(|d| d.origin == s.origin)
            .and_then(|d| d.symbols.lookup(s.rip));
        let r = &s.regs;
        let hex = |v: u64| format!("{v:#x}");
        let line = serde_json::json!({
            "origin": s.origin,
            "vcpu": s.vcpu,
            "pcpu": s.pcpu,
            "user": s.user,
            "function": function,
            "shipped_by": s.shipped_by,
            "regs": {
                "rax": hex(r.rax), "rbx": hex(r.rbx), "rcx": hex(r.rcx), "rdx": hex(r.rdx),
                "rsi": hex(r.rsi), "rdi": hex(r.rdi), "rbp": hex(r.rbp), "rsp": hex(r.rsp),
                "r8": hex(r.r8), "r9": hex(r.r9), "r10": hex(r.r10), "r11": hex(r.r11),
                "r12": hex(r.r12), "r13": hex(r.r13), "r14": hex(r.r14), "r15": hex(r.r15),
                "rip": hex(r.rip), "rflags": hex(r.rflags),
                "cs": r.cs, "ss": r.ss, "ds": r.ds, "es": r.es, "fs": r.fs, "gs": r.gs,
                "cpl": r.cpl, "mode": r.mode,
            },
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// The JSON document: the report, its delivery numbers, and the comparison run's.
#[derive(Serialize)]
struct Document<'a> {
    report: &'a Report,
    delivery: Delivery,
    comparison: Option<Comparison<'a>>,
}

#[derive(Serialize)]
struct Comparison<'a> {
    report: &'a Report,
    delivery: Delivery,
}

/// Runs `vpmu profile` and prints the report; Ok(true) if every check passed.
pub fn profile(kvm: &Kvm, options: &Options) -> Result<bool, String> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(|e| format!("KVM CPUID: {e}"))?;
    match options.vendor {
        Vendor::Intel => profile_with(kvm, &cpuid, Intel::v5(Source::Timed), options),
        Vendor::Amd => profile_with(
            kvm,
            &cpuid,
            Amd {
                source: Source::Timed,
                shape: PmuShape::PerfMonV2 { counters: 6 },
            },
            options,
        ),
    }
}

fn profile_with<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    options: &Options,
) -> Result<bool, String> {
    let workloads = options.workloads()?;
    std::fs::create_dir_all(&options.out)
        .map_err(|e| format!("--out {}: {e}", options.out.display()))?;
    if options.sweep {
        return sweep::sweep(kvm, cpuid, p, options, &workloads);
    }
    let plan = Plan {
        mode: options.mode,
        frequency: options.frequency,
        duration: options.duration,
        vcpus: options.vcpus,
        pcpus: options.pcpus,
        workloads: workloads.clone(),
        progress: options.progress,
    };
    let built_in: Vec<Option<Workload>> = workloads.iter().map(|w| w.workload).collect();
    eprintln!(
        "vpmu profile: {} mode, {} Hz, {:.1} s, {} workload domains, {}",
        options.mode.name(),
        options.frequency,
        options.duration.as_secs_f64(),
        workloads.len(),
        p.name()
    );
    let data = run::run(kvm, cpuid, p, &plan)?;
    let mut report = report_of(&data, &workloads, &p.name(), options.duration);
    report.checks.push(validate::attribution(&data));
    report.checks.extend(validate::shares(&report, &built_in));
    let compare =
        options.compare && options.mode == Mode::All && built_in.iter().all(Option::is_some);
    let comparison = if compare {
        eprintln!(
            "vpmu profile: the same workloads profiling themselves (self mode), for seed 002"
        );
        let own_plan = Plan {
            mode: Mode::SelfOnly,
            ..plan.clone()
        };
        let own = run::run(kvm, cpuid, p, &own_plan)?;
        let mut own_report = report_of(&own, &workloads, &p.name(), options.duration);
        let mut attribution = validate::attribution(&own);
        attribution.name = format!("self-mode run: {}", attribution.name);
        report.checks.push(attribution);
        report.checks.extend(validate::passive_agrees_with_self(
            &report,
            &own_report,
            &built_in,
        ));
        own_report.checks = validate::shares(&own_report, &built_in);
        Some((own_report, Delivery::of(&own)))
    } else {
        None
    };
    let delivery = Delivery::of(&data);
    let text = format!(
        "{}\ndelivery: {} samples expected, {} PMIs, {} delivered, {} dropped by the vpmu, \
         {} lost in the guest; run took {:.1} s\n",
        report.to_text(options.top),
        delivery.expected,
        delivery.generated,
        delivery.delivered,
        delivery.dropped,
        delivery.lost_in_guest,
        delivery.wall_s
    );
    print!("{text}");
    let samples = options.out.join("samples.jsonl");
    std::fs::write(&samples, samples_jsonl(&data, &workloads))
        .map_err(|e| format!("{}: {e}", samples.display()))?;
    write_outputs(&options.out, &report, &text, delivery, comparison.as_ref())?;
    Ok(report.checks.iter().all(|c| c.passed))
}

fn write_outputs(
    out: &Path,
    report: &Report,
    text: &str,
    delivery: Delivery,
    comparison: Option<&(Report, Delivery)>,
) -> Result<(), String> {
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    let txt = out.join("report.txt");
    std::fs::write(&txt, text).map_err(|e| io(&txt, e))?;
    let svg = out.join("flamegraph.svg");
    report.write_svg(&svg).map_err(|e| io(&svg, e))?;
    let json = out.join("profile.json");
    let doc = Document {
        report,
        delivery,
        comparison: comparison.map(|(r, d)| Comparison {
            report: r,
            delivery: d.clone(),
        }),
    };
    let body = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(&json, body).map_err(|e| io(&json, e))?;
    println!(
        "wrote {}, {}, {} and samples.jsonl",
        txt.display(),
        svg.display(),
        json.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn defaults_need_no_arguments() {
        let o = Options::parse(&[]).expect("defaults");
        assert_eq!(
            (o.mode, o.vendor, o.frequency, o.top),
            (Mode::All, Vendor::Intel, 2000, 10)
        );
        assert!(o.compare && !o.sweep && o.guests.is_empty());
    }

    #[test]
    fn options_parse_and_bad_ones_are_named() {
        let o = Options::parse(&args(
            "--duration 1.5 --frequency 4000 --mode hv --vendor amd --out /tmp/x --top 3 --quiet \
             --vcpus 3 --pcpus 1",
        ))
        .expect("valid");
        assert_eq!((o.vcpus, o.pcpus), (3, 1));
        assert_eq!(o.duration, Duration::from_millis(1500));
        assert_eq!(
            (o.mode, o.vendor, o.frequency, o.top),
            (Mode::Hv, Vendor::Amd, 4000, 3)
        );
        assert!(!o.progress);
        for (bad, says) in [
            ("--mode both", "--mode both"),
            ("--frequency 0", "1 to 20000"),
            ("--frequency 50000", "1 to 20000"),
            ("--duration x", "not a number"),
            ("--duration 0.01", "0.2 to 600"),
            ("--vendor via", "intel or amd"),
            ("--top 0", "positive"),
            ("--vcpus 0", "1 to 8"),
            ("--pcpus 0", "1 to 8"),
            ("--vcpus 9", "1 to 8"),
            ("--bogus", "unknown option"),
            ("--out", "needs a value"),
        ] {
            let e = Options::parse(&args(bad)).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_user_guest_must_be_a_readable_elf_with_symbols() {
        let o = Options::parse(&args("--guest /nonexistent/guest.elf")).expect("parses");
        assert!(
            o.workloads()
                .expect_err("unreadable")
                .contains("/nonexistent/guest.elf")
        );
        let dir = std::env::temp_dir().join(format!("vpmu-guest-{}", std::process::id()));
        std::fs::write(&dir, b"not an elf").expect("temp file");
        let o =
            Options::parse(&[String::from("--guest"), dir.display().to_string()]).expect("parses");
        assert!(
            o.workloads()
                .expect_err("not an ELF")
                .contains("not an ELF")
        );
        std::fs::remove_file(&dir).ok();
        let o = Options::parse(&[]).expect("defaults");
        let w = o.workloads().expect("built-in");
        assert_eq!(w.len(), 3);
        assert!(w.iter().all(|d| d.workload.is_some()));
    }
}
