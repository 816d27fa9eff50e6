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
//!
//! The command line lives in `vpmu-cli`; this library takes typed `Options`, whose limits are
//! the public constants below.

mod delivery;
mod elf_image;
mod error;
pub mod linux;
mod options;
pub mod outputs;
pub mod perf_data;
pub mod pprof;
pub mod protocol;
pub mod report;
pub mod ring_batch;
pub mod run;
pub mod sample;
pub mod stacks;
pub mod sweep;

pub mod validate;
pub mod validate_stacks;
pub mod workloads;

use std::path::Path;
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use serde::Serialize;

use report::{DomainInfo, Report, RunInfo};
pub use run::DeliveryPath;
use run::{DomainPlan, Mode, Plan, RunData};
use sample::Origin;
use vpmu_machine::VmmActivity;
use vpmu_machine::personality::{Amd, Intel, Personality, Source};
use vpmu_machine::symbols::Symbols;
use workloads::Workload;

pub use delivery::Delivery;
pub use error::ProfileError;
pub use options::{
    MAX_DURATION_S, MAX_FREQUENCY, MAX_GUESTS, MAX_PCPUS, MAX_VCPUS, MIN_DURATION_S, MIN_FREQUENCY,
    Options, Profiler, Vendor,
};

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
    let (name, profiler_symbols) = match &data.linux {
        Some(linux) => (format!("linux ({})", linux::KERNEL), linux.symbols()),
        None => ("profiler.elf".into(), symbols(vpmu_guests::PROFILER)),
    };
    let mut domains = vec![DomainInfo {
        origin: Origin::Domain(0),
        name,
        symbols: profiler_symbols,
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
            symbols: Symbols::from_table(vmm_activity_symbols()),
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

/// The version of `profile.json`'s shape (`schema_version` at its top); 2 added it, the
/// `{kind, domain}` origin, the sampled event (`report.event`), call-chain ends per domain
/// (`chains`) and the call stacks (`report.stacks`).
pub const PROFILE_SCHEMA_VERSION: u32 = 2;

/// The version of `samples.jsonl`'s object shape (`schema_version` in every line); 2 added
/// `schema_version`, the `{kind, domain}` origin, time, sequence, overflowed counters and
/// call stacks.
pub const SAMPLES_SCHEMA_VERSION: u32 = 2;

/// Every sample of `data` as one JSON object per line: who it caught, where (symbolized from
/// that domain's image), and the full register set the profiling guest read from its page.
fn samples_jsonl(data: &RunData, workloads: &[DomainPlan]) -> String {
    let infos = domain_infos(data, workloads);
    let mut out = String::new();
    for s in data.samples() {
        let symbols = infos
            .iter()
            .find(|d| d.origin == s.origin)
            .map(|d| &d.symbols);
        let function = symbols.and_then(|sym| sym.lookup(s.rip));
        let r = &s.regs;
        let hex = |v: u64| format!("{v:#x}");
        let d = &s.details;
        let regs = serde_json::json!({
            "rax": hex(r.rax), "rbx": hex(r.rbx), "rcx": hex(r.rcx), "rdx": hex(r.rdx),
            "rsi": hex(r.rsi), "rdi": hex(r.rdi), "rbp": hex(r.rbp), "rsp": hex(r.rsp),
            "r8": hex(r.r8), "r9": hex(r.r9), "r10": hex(r.r10), "r11": hex(r.r11),
            "r12": hex(r.r12), "r13": hex(r.r13), "r14": hex(r.r14), "r15": hex(r.r15),
            "rip": hex(r.rip), "rflags": hex(r.rflags),
            "cs": r.cs, "ss": r.ss, "ds": r.ds, "es": r.es, "fs": r.fs, "gs": r.gs,
            "cpl": r.cpl, "mode": r.mode,
        });
        let line = serde_json::json!({
            "schema_version": SAMPLES_SCHEMA_VERSION,
            "origin": s.origin,
            "time_ns": d.time_ns(),
            "tsc": d.tsc,
            "tsc_khz": d.tsc_khz,
            "sequence": d.sequence,
            "overflowed": hex(d.overflowed),
            "stack": stacks::frames(s, symbols),
            "callchain": d.chain.addresses().iter().map(|&a| hex(a)).collect::<Vec<_>>(),
            "chain_end": d.chain.end(),
            "vcpu": s.vcpu,
            "pcpu": s.pcpu,
            "user": s.user,
            "function": function,
            "shipped_by": s.shipped_by,
            "regs": regs,
        });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// The JSON document: the report, its delivery numbers, and the comparison run's.
#[derive(Serialize)]
struct Document<'a> {
    schema_version: u32,
    report: &'a Report,
    delivery: Delivery,
    comparison: Option<Comparison<'a>>,
}

#[derive(Serialize)]
struct Comparison<'a> {
    report: &'a Report,
    delivery: Delivery,
}

/// How a `vpmu profile` run ended (its outputs written in every case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check made held.
    Passed,
    /// A check failed.
    Failed,
    /// `Options::interrupt` was set: the outputs hold what was collected until then.
    Interrupted,
}

/// Runs `vpmu profile` and prints the report.
pub fn profile(kvm: &Kvm, options: &Options) -> Result<Outcome, ProfileError> {
    let cpuid = vpmu_machine::kvm::supported_cpuid(kvm).map_err(ProfileError::Cpuid)?;
    match options.vendor {
        Vendor::Intel => profile_with(kvm, &cpuid, Intel::v5(Source::Timed), options),
        Vendor::Amd => profile_with(kvm, &cpuid, Amd::perfmon_v2(Source::Timed), options),
    }
}

fn profile_with<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    options: &Options,
) -> Result<Outcome, ProfileError> {
    let workloads = options.workloads()?;
    let linux = options.linux()?;
    std::fs::create_dir_all(&options.out).map_err(|source| ProfileError::OutDir {
        path: options.out.clone(),
        source,
    })?;
    if options.sweep {
        return Ok(if sweep::sweep(kvm, cpuid, p, options, &workloads)? {
            Outcome::Passed
        } else {
            Outcome::Failed
        });
    }
    let plan = Plan {
        mode: options.mode,
        frequency: options.frequency,
        delivery: options.delivery,
        duration: options.duration,
        vcpus: options.vcpus,
        pcpus: options.pcpus,
        workloads: workloads.clone(),
        progress: options.progress,
        interrupt: options.interrupt.clone(),
        linux,
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
    report.checks.push(validate::fairness(
        &validate::domain_shares(&data),
        data.mode.name(),
        data.frequency,
    ));
    report.checks.extend(validate::shares(&report, &built_in));
    report
        .checks
        .extend(validate_stacks::stack_shares(&report, &built_in));
    report.checks.extend(delivery::ring_accounting(&data));
    if data.linux.is_some() {
        report.checks.push(linux::recorder_agrees(&data));
    }
    if options.interrupted() {
        eprintln!(
            "vpmu profile: interrupted after {:.1} s: writing what was collected",
            data.wall.as_secs_f64()
        );
    }
    let compare = options.compare
        && !options.interrupted()
        && options.mode == Mode::All
        && built_in.iter().all(Option::is_some);
    let comparison = if compare {
        eprintln!(
            "vpmu profile: the same workloads profiling themselves (self mode), for seed 002"
        );
        // Self mode leaves domain 0 idle: the freestanding profiler is enough there.
        let own_plan = Plan {
            mode: Mode::SelfOnly,
            linux: None,
            ..plan.clone()
        };
        let own = run::run(kvm, cpuid, p, &own_plan)?;
        let mut own_report = report_of(&own, &workloads, &p.name(), options.duration);
        let mut attribution = validate::attribution(&own);
        attribution.name = format!("self-mode run: {}", attribution.name);
        report.checks.push(attribution);
        let mut fairness = validate::fairness(
            &validate::domain_shares(&own),
            own.mode.name(),
            own.frequency,
        );
        fairness.name = format!("self-mode run: {}", fairness.name);
        report.checks.push(fairness);
        if let Some(mut ring) = delivery::ring_accounting(&own) {
            ring.name = format!("self-mode run: {}", ring.name);
            report.checks.push(ring);
        }
        report.checks.extend(validate::passive_agrees_with_self(
            &report,
            &own_report,
            &built_in,
        ));
        own_report.checks = validate::shares(&own_report, &built_in);
        own_report
            .checks
            .extend(validate_stacks::stack_shares(&own_report, &built_in));
        Some((own_report, Delivery::of(&own)))
    } else {
        None
    };
    let delivery = Delivery::of(&data);
    let text = format!("{}\n{}\n", report.to_text(options.top), delivery.line());
    print!("{text}");
    if data.linux.is_some() {
        linux::write_console(&options.out, &data)?;
    }
    let samples = options.out.join("samples.jsonl");
    std::fs::write(&samples, samples_jsonl(&data, &workloads))
        .map_err(ProfileError::write(&samples))?;
    write_outputs(&options.out, &report, &text, delivery, comparison.as_ref())?;
    write_tool_formats(&options.out, &data, &workloads, &report, options.duration)?;
    Ok(if options.interrupted() {
        Outcome::Interrupted
    } else if report.checks.iter().any(report::Check::fails) {
        Outcome::Failed
    } else {
        Outcome::Passed
    })
}

fn write_outputs(
    out: &Path,
    report: &Report,
    text: &str,
    delivery: Delivery,
    comparison: Option<&(Report, Delivery)>,
) -> Result<(), ProfileError> {
    let txt = out.join("report.txt");
    std::fs::write(&txt, text).map_err(ProfileError::write(&txt))?;
    let svg = out.join("flamegraph.svg");
    report.write_svg(&svg).map_err(ProfileError::write(&svg))?;
    let json = out.join("profile.json");
    let doc = Document {
        schema_version: PROFILE_SCHEMA_VERSION,
        report,
        delivery,
        comparison: comparison.map(|(r, d)| Comparison {
            report: r,
            delivery: d.clone(),
        }),
    };
    let body = serde_json::to_string_pretty(&doc)?;
    std::fs::write(&json, body).map_err(ProfileError::write(&json))?;
    println!(
        "wrote {}, {}, {} and samples.jsonl",
        txt.display(),
        svg.display(),
        json.display()
    );
    Ok(())
}

/// The ELF image of each domain of a run: the profiler's and each workload domain's, and in
/// hv mode the hypervisor's symbol image.
fn images<'a>(
    workloads: &'a [DomainPlan],
    mode: Mode,
    linux: Option<&'a linux::LinuxProfiler>,
) -> Vec<outputs::Image<'a>> {
    use std::borrow::Cow;
    let mut images = vec![match linux {
        Some(linux) => outputs::Image {
            origin: Origin::Domain(0),
            file_name: linux::KERNEL.into(),
            elf: Cow::Borrowed(&linux.kernel[..]),
        },
        None => outputs::Image {
            origin: Origin::Domain(0),
            file_name: "profiler.elf".into(),
            elf: Cow::Borrowed(vpmu_guests::PROFILER),
        },
    }];
    for (i, w) in workloads.iter().enumerate() {
        images.push(outputs::Image {
            origin: Origin::Domain(i as u32 + 1),
            // "work.elf (compressor)" for the built-ins, the file's name for the user's.
            file_name: w.name.split(' ').next().unwrap_or("guest.elf").into(),
            elf: Cow::Borrowed(&w.image),
        });
    }
    if mode == Mode::Hv {
        images.push(outputs::Image {
            origin: Origin::Hypervisor,
            file_name: "vmm.elf".into(),
            elf: Cow::Owned(hypervisor_image()),
        });
    }
    images
}

/// The hypervisor's symbol image: `vmm_activity_symbols` as an ELF (`elf_image::symbol_image`).
fn hypervisor_image() -> Vec<u8> {
    let table = vmm_activity_symbols();
    let start = table.iter().map(|t| t.0).min().unwrap_or(0);
    let end = table.iter().map(|t| t.0 + t.1).max().unwrap_or(start);
    elf_image::symbol_image(start, end - start, &table)
}

/// Writes the formats other tools read: `perf.data` (with the images it maps under
/// `images/`), `profile.pb.gz` and `stacks.folded`.
fn write_tool_formats(
    out: &Path,
    data: &RunData,
    workloads: &[DomainPlan],
    report: &Report,
    duration: Duration,
) -> Result<(), ProfileError> {
    let images = images(workloads, data.mode, data.linux.as_deref());
    let folder = out.join("images");
    let written = outputs::write_images(out, &images).map_err(ProfileError::write(&folder))?;
    let samples: Vec<_> = data.samples().copied().collect();
    let perf = out.join("perf.data");
    let bytes = outputs::perf_data(&samples, &images, &written, data.period, data.pcpus)
        .map_err(ProfileError::write(&perf))?;
    std::fs::write(&perf, bytes).map_err(ProfileError::write(&perf))?;
    let pb = out.join("profile.pb.gz");
    let profile = outputs::pprof(
        &samples,
        &domain_infos(data, workloads),
        &images,
        &written,
        data.period,
        duration.as_nanos() as u64,
    );
    let bytes = pprof::encode_gz(&profile).map_err(ProfileError::write(&pb))?;
    std::fs::write(&pb, bytes).map_err(ProfileError::write(&pb))?;
    let folded = out.join("stacks.folded");
    std::fs::write(&folded, outputs::collapsed(report)).map_err(ProfileError::write(&folded))?;
    println!(
        "wrote {}, {} and {} (perf report -i {} --stdio; go tool pprof -top {})",
        perf.display(),
        pb.display(),
        folded.display(),
        perf.display(),
        pb.display()
    );
    Ok(())
}

/// The names `vpmu profile` gives the VMM's activities in hypervisor samples: a symbol table of
/// their reserved RIP ranges (start, length, name).
fn vmm_activity_symbols() -> Vec<(u64, u64, String)> {
    VmmActivity::ALL
        .iter()
        .map(|&activity| {
            let name = match activity {
                VmmActivity::PortIo => "vmm_port_io_exit",
                VmmActivity::MsrAccess => "vmm_pmu_msr_exit",
                VmmActivity::Hypercall => "vmm_xenpmu_hypercall",
                VmmActivity::Kick => "vmm_kick_exit",
                VmmActivity::Other => "vmm_other_exit",
            };
            (activity.rip(), VmmActivity::STRIDE, name.to_string())
        })
        .collect()
}
