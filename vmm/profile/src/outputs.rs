//! The profile in other tools' formats: `perf.data` for Linux `perf` (`perf report`, `perf
//! script`), `profile.pb.gz` for pprof, `stacks.folded` for FlameGraph and speedscope. Each
//! domain is a process (pid `domain + 1`, named `dom<n>`; the hypervisor pid `HYPERVISOR_PID`),
//! each of its vCPUs a thread (tid `pid * 100 + vCPU`), its ELF image written beside the
//! outputs (`images/dom<n>-<file>`, with a GNU build id) and mapped at its load addresses so
//! that perf symbolizes it; every sample carries its call chain and its time (the host TSC at
//! the PMI, in ns).
//!
//! How perf is made to name every sample, with no option: perf looks a `PERF_RECORD_MISC_KERNEL`
//! address up in its one machine-wide kernel address space, and a `_USER` one in the sampled
//! process's maps. The domains' kernels all live at the same guest addresses (every image is
//! loaded at 1 MiB), so they cannot share one kernel address space: a domain's samples, kernel
//! and user, are recorded as its process's (`PERF_RECORD_MISC_USER`, chains under
//! `PERF_CONTEXT_USER`) and found in its image, which holds both. The hypervisor is the host
//! side of every guest: its samples are `PERF_RECORD_MISC_KERNEL`, found in its symbol image
//! (`images/hypervisor-vmm.elf`, the VMM's activities as functions at their reserved
//! addresses), mapped into perf's kernel address space, where no guest address can collide
//! with it. perf's `[k]` therefore marks the hypervisor and `[.]` a guest's code, its kernel
//! too; which guest samples were taken at CPL0 is in pprof's `mode` label, the `_[k]` frames of
//! `stacks.folded` and `samples.jsonl`'s `user`. Return addresses are written one byte back,
//! inside their call instruction, as the other outputs look them up (perf looks an address up
//! as it is, and a call that ends its function would be credited to the next one).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use super::elf_image;
use super::perf_data::{self, CpuMode};
use super::pprof;
use super::report::{DomainInfo, Report};
use super::sample::{Origin, ProfileSample};
use super::stacks;

/// The hypervisor's pid in perf.data.
pub const HYPERVISOR_PID: u32 = 99;

/// The event every run samples: the counter the samplers program (`sampler.c`: the
/// architectural unhalted-cycles event on Intel, `CpuCycles` on AMD; the timed source counts
/// the TSC ticks a vCPU runs).
pub const EVENT: &str = "cycles";

/// The pid of `origin` in perf.data.
pub fn pid_of(origin: Origin) -> u32 {
    match origin {
        Origin::Domain(d) => d + 1,
        Origin::Hypervisor => HYPERVISOR_PID,
    }
}

/// The tid of `vcpu` of `origin` in perf.data.
pub fn tid_of(origin: Origin, vcpu: u32) -> u32 {
    pid_of(origin) * 100 + vcpu
}

/// A domain's program (or the hypervisor's symbol image): its origin, a file name and the ELF
/// bytes.
#[derive(Clone, Debug)]
pub struct Image<'a> {
    /// Whose.
    pub origin: Origin,
    /// Its file name (`work.elf`).
    pub file_name: String,
    /// The ELF.
    pub elf: Cow<'a, [u8]>,
}

/// Where an image was written, and the build id the written file carries.
#[derive(Clone, Debug)]
pub struct Written {
    /// The absolute path.
    pub path: PathBuf,
    /// The file's GNU build id (None: not an ELF with section headers, written as it was).
    pub build_id: Option<[u8; 20]>,
}

/// The build id as the tools print it: lower-case hex.
pub fn hex_id(id: &[u8; 20]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// An executable `PT_LOAD` segment: load address, size in memory, file offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// `p_vaddr`.
    pub address: u64,
    /// `p_memsz`.
    pub size: u64,
    /// `p_offset`.
    pub offset: u64,
}

/// The executable `PT_LOAD` segments of an ELF64 little-endian image (empty if it is none).
pub fn exec_segments(elf: &[u8]) -> Vec<Segment> {
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    // ELF64 (class 2), little-endian (data 1).
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Vec::new();
    }
    let (Some(phoff), Some(entsize), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in 0..usize::from(count) {
        let Some(at) = usize::try_from(phoff)
            .ok()
            .and_then(|p| p.checked_add(i * usize::from(entsize)))
        else {
            break;
        };
        const PT_LOAD: u32 = 1;
        const PF_X: u32 = 1;
        let (Some(kind), Some(flags), Some(offset), Some(address), Some(size)) = (
            u32_at(at),
            u32_at(at + 4),
            u64_at(at + 8),
            u64_at(at + 16),
            u64_at(at + 40),
        ) else {
            break;
        };
        if kind == PT_LOAD && flags & PF_X != 0 && size > 0 {
            out.push(Segment {
                address,
                size,
                offset,
            });
        }
    }
    out
}

/// Writes each image, with a GNU build id (`elf_image::for_tools`), into
/// `dir/images/<origin>-<file>` and returns where, by image.
pub fn write_images(dir: &Path, images: &[Image<'_>]) -> std::io::Result<Vec<Written>> {
    let folder = dir.join("images");
    std::fs::create_dir_all(&folder)?;
    let folder = std::fs::canonicalize(&folder)?;
    images
        .iter()
        .map(|image| {
            let path = folder.join(format!("{}-{}", image.origin.tag(), image.file_name));
            let (bytes, build_id) = match elf_image::for_tools(&image.elf) {
                Some((bytes, id)) => (Cow::Owned(bytes), Some(id)),
                None => (Cow::Borrowed(&image.elf[..]), None),
            };
            std::fs::write(&path, &bytes)?;
            Ok(Written { path, build_id })
        })
        .collect()
}

/// The address space perf finds `origin`'s code in (see the module's documentation).
fn perf_mode(origin: Origin) -> CpuMode {
    match origin {
        Origin::Hypervisor => CpuMode::Kernel,
        Origin::Domain(_) => CpuMode::User,
    }
}

/// The host facts perf.data's header carries (read from `/proc`; empty where unreadable).
fn host_environment(cpus: u32) -> perf_data::Environment {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpuinfo = read("/proc/cpuinfo");
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let total_mem_kb = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    perf_data::Environment {
        hostname: read("/proc/sys/kernel/hostname"),
        os_release: read("/proc/sys/kernel/osrelease"),
        version: format!("vpmu {}", env!("CARGO_PKG_VERSION")),
        arch: std::env::consts::ARCH.into(),
        cpus,
        cpu_desc: field("model name"),
        cpuid: [
            field("vendor_id"),
            field("cpu family"),
            field("model"),
            field("stepping"),
        ]
        .join(","),
        total_mem_kb,
        cmdline: std::env::args().collect(),
        build_ids: Vec::new(),
    }
}

/// The perf.data of `samples`: `written[i]` is where `images[i]` was written; `cpus` the
/// machine's pCPUs.
pub fn perf_data(
    samples: &[ProfileSample],
    images: &[Image<'_>],
    written: &[Written],
    period: u64,
    cpus: u32,
) -> std::io::Result<Vec<u8>> {
    let mut origins: Vec<Origin> = images.iter().map(|i| i.origin).collect();
    origins.extend(samples.iter().map(|s| s.origin));
    origins.sort();
    origins.dedup();
    let mut threads: Vec<(Origin, u32)> = samples.iter().map(|s| (s.origin, s.vcpu)).collect();
    threads.sort();
    threads.dedup();
    let mut comms: Vec<perf_data::Comm> = origins
        .iter()
        .map(|&o| perf_data::Comm {
            pid: pid_of(o),
            tid: pid_of(o),
            comm: o.tag(),
        })
        .collect();
    comms.extend(threads.iter().map(|&(o, vcpu)| perf_data::Comm {
        pid: pid_of(o),
        tid: tid_of(o, vcpu),
        comm: o.tag(),
    }));
    let mut mmaps = Vec::new();
    let mut env = host_environment(cpus);
    for (image, w) in images.iter().zip(written) {
        let path = w.path.display().to_string();
        for seg in exec_segments(&image.elf) {
            mmaps.push(perf_data::Mmap {
                pid: pid_of(image.origin),
                mode: perf_mode(image.origin),
                start: seg.address,
                len: seg.size,
                pgoff: seg.offset,
                path: path.clone(),
            });
        }
        if let Some(id) = w.build_id {
            env.build_ids.push(perf_data::BuildId {
                mode: perf_mode(image.origin),
                id,
                path,
            });
        }
    }
    let records: Vec<perf_data::Sample> = samples
        .iter()
        .map(|s| perf_data::Sample {
            pid: pid_of(s.origin),
            tid: tid_of(s.origin, s.vcpu),
            cpu: s.pcpu,
            time: s.details.time_ns().unwrap_or(0),
            ip: s.rip,
            mode: perf_mode(s.origin),
            // Inside the call instruction, as `stacks::frames` looks them up.
            callers: s
                .details
                .chain
                .addresses()
                .iter()
                .map(|&ret| ret.saturating_sub(1))
                .collect(),
            period,
        })
        .collect();
    perf_data::write(
        &perf_data::Event {
            name: EVENT.into(),
            kind: perf_data::PERF_TYPE_HARDWARE,
            config: perf_data::PERF_COUNT_HW_CPU_CYCLES,
            period,
        },
        &env,
        &comms,
        &mmaps,
        &records,
    )
}

/// The name pprof gives the function `name` of `origin`: `dom1:main`. pprof merges functions
/// by name across binaries in every report but disassembly (its graph keeps an object file's
/// name only there), so the domain is part of the name: `main` of the profiler and `main` of a
/// workload stay two functions.
pub fn pprof_function_name(origin: Origin, name: &str) -> String {
    format!("{}:{name}", origin.tag())
}

/// The pprof profile of `samples`: values `samples/count` and `cycles/count` (the period each
/// sample stands for), each stack's locations leaf first with the functions named from the
/// domain's symbols (`pprof_function_name`), labels `domain`, `vcpu`, `pcpu` and `mode`
/// (`user` or `kernel`). The first mapping is the VMM that ran the machine (pprof's "File:"
/// line names the first mapping: no domain's image is the whole profile's), then one mapping
/// per image (`written[i]` is where `images[i]` went), each with its build id.
pub fn pprof(
    samples: &[ProfileSample],
    domains: &[DomainInfo],
    images: &[Image<'_>],
    written: &[Written],
    period: u64,
    duration_ns: u64,
) -> pprof::Profile {
    use std::collections::HashMap;
    let mut strings = pprof::Strings::default();
    let vmm =
        std::env::current_exe().map_or_else(|_| "vpmu".to_string(), |p| p.display().to_string());
    let mut mappings = vec![pprof::Mapping {
        id: 1,
        filename: strings.intern(&vmm),
        has_functions: true,
        ..pprof::Mapping::default()
    }];
    let mut mapping_of: HashMap<Origin, u64> = HashMap::new();
    for (image, w) in images.iter().zip(written) {
        let segs = exec_segments(&image.elf);
        let (Some(start), Some(limit)) = (
            segs.iter().map(|s| s.address).min(),
            segs.iter().map(|s| s.address + s.size).max(),
        ) else {
            continue;
        };
        let id = mappings.len() as u64 + 1;
        mappings.push(pprof::Mapping {
            id,
            memory_start: start,
            memory_limit: limit,
            file_offset: segs
                .iter()
                .find(|s| s.address == start)
                .map_or(0, |s| s.offset),
            filename: strings.intern(&w.path.display().to_string()),
            build_id: w.build_id.map_or(0, |id| strings.intern(&hex_id(&id))),
            has_functions: true,
        });
        mapping_of.insert(image.origin, id);
    }
    let mut functions: Vec<pprof::Function> = Vec::new();
    let mut function_of: HashMap<(Origin, String), u64> = HashMap::new();
    let mut locations: Vec<pprof::Location> = Vec::new();
    let mut location_of: HashMap<(Origin, u64), u64> = HashMap::new();
    let key_domain = strings.intern("domain");
    let key_vcpu = strings.intern("vcpu");
    let key_pcpu = strings.intern("pcpu");
    let key_mode = strings.intern("mode");
    // vCPU and pCPU 0 are numbers like any other: with a unit pprof keeps them.
    let index = strings.intern("index");
    let sample_type = vec![
        pprof::ValueType {
            r#type: strings.intern("samples"),
            unit: strings.intern("count"),
        },
        pprof::ValueType {
            r#type: strings.intern(EVENT),
            unit: strings.intern("count"),
        },
    ];
    let mut out_samples = Vec::with_capacity(samples.len());
    for s in samples {
        let symbols = domains
            .iter()
            .find(|d| d.origin == s.origin)
            .map(|d| &d.symbols);
        let names = stacks::frames(s, symbols);
        // Addresses leaf first: RIP, then the return addresses.
        let addresses = std::iter::once(s.rip).chain(s.details.chain.addresses().iter().copied());
        let mut ids = Vec::new();
        for (address, name) in addresses.zip(names.iter().rev()) {
            let id = *location_of.entry((s.origin, address)).or_insert_with(|| {
                let fkey = (s.origin, (*name).to_string());
                let function_id = *function_of.entry(fkey).or_insert_with(|| {
                    let id = functions.len() as u64 + 1;
                    functions.push(pprof::Function {
                        id,
                        name: strings.intern(&pprof_function_name(s.origin, name)),
                        system_name: strings.intern(name),
                        filename: 0,
                    });
                    id
                });
                let id = locations.len() as u64 + 1;
                locations.push(pprof::Location {
                    id,
                    mapping_id: mapping_of.get(&s.origin).copied().unwrap_or(0),
                    address,
                    line: vec![pprof::Line {
                        function_id,
                        line: 0,
                    }],
                });
                id
            });
            ids.push(id);
        }
        let text = |key, value: &str, strings: &mut pprof::Strings| pprof::Label {
            key,
            str: strings.intern(value),
            ..pprof::Label::default()
        };
        let number = |key, num: u32| pprof::Label {
            key,
            num: i64::from(num),
            num_unit: index,
            ..pprof::Label::default()
        };
        out_samples.push(pprof::Sample {
            location_id: ids,
            value: vec![1, period as i64],
            label: vec![
                text(key_domain, &s.origin.tag(), &mut strings),
                number(key_vcpu, s.vcpu),
                number(key_pcpu, s.pcpu),
                text(
                    key_mode,
                    if s.user { "user" } else { "kernel" },
                    &mut strings,
                ),
            ],
        });
    }
    // time_nanos is wall-clock time since the epoch; the samples' clock is the host TSC, so
    // it stays unset (perf.data and samples.jsonl carry each sample's TSC time).
    let comment = strings.intern(
        "vpmu profile: functions are named <domain>:<function>; label `domain` names the \
         domain; sample times are in perf.data and samples.jsonl",
    );
    pprof::Profile {
        period_type: Some(pprof::ValueType {
            r#type: strings.intern(EVENT),
            unit: strings.intern("count"),
        }),
        sample_type,
        sample: out_samples,
        mapping: mappings,
        location: locations,
        function: functions,
        time_nanos: 0,
        duration_nanos: duration_ns as i64,
        period: period as i64,
        comment: vec![comment],
        string_table: strings.into_table(),
    }
}

/// The collapsed stacks of `report`, one line per distinct stack (`stacks::StackRow::folded`).
pub fn collapsed(report: &Report) -> String {
    let mut out = String::new();
    for line in report.folded() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_segments_of_the_work_image() {
        let segs = exec_segments(vpmu_guests::WORK);
        assert!(!segs.is_empty());
        let symbols = vpmu_machine::symbols::Symbols::from_elf(vpmu_guests::WORK).unwrap();
        // w1_main is inside an executable segment.
        let main = (0x10_0000u64..0x40_0000)
            .find(|&ip| symbols.lookup(ip) == Some("w1_main"))
            .expect("w1_main");
        assert!(
            segs.iter()
                .any(|s| (s.address..s.address + s.size).contains(&main))
        );
        assert!(exec_segments(b"not an elf").is_empty());
        assert!(exec_segments(&vpmu_guests::WORK[..0x40]).is_empty());
    }

    fn sample(origin: Origin, rip: u64, user: bool, chain: &[u64]) -> ProfileSample {
        use crate::sample::{CallChain, ChainEnd, SampleDetails};
        ProfileSample {
            origin,
            vcpu: 0,
            pcpu: 0,
            rip,
            user,
            regs: vpmu::abi::Regs::default(),
            shipped_by: 0,
            details: SampleDetails {
                chain: CallChain::new(chain, ChainEnd::Complete).unwrap(),
                ..SampleDetails::default()
            },
        }
    }

    fn info(origin: Origin, table: Vec<(u64, u64, String)>) -> DomainInfo {
        DomainInfo {
            origin,
            name: origin.tag(),
            symbols: vpmu_machine::symbols::Symbols::from_table(table),
            dropped: 0,
        }
    }

    /// Two domains with a `main` each, sampled on vCPU 0 and pCPU 0: pprof keeps the zeros
    /// (a numeric label needs a unit for that), keeps the two `main`s apart, and names no
    /// domain's image as the whole profile's.
    #[test]
    fn pprof_keeps_zero_labels_and_same_named_functions_apart() {
        let table = |base: u64| vec![(base, 0x100, "main".to_string())];
        let domains = [
            info(Origin::Domain(0), table(0x1000)),
            info(Origin::Domain(1), table(0x2000)),
        ];
        let samples = [
            sample(Origin::Domain(0), 0x1010, false, &[]),
            sample(Origin::Domain(1), 0x2010, true, &[]),
        ];
        let images = [Image {
            origin: Origin::Domain(1),
            file_name: "work.elf".into(),
            elf: Cow::Borrowed(vpmu_guests::WORK),
        }];
        let written = [Written {
            path: PathBuf::from("/x/images/dom1-work.elf"),
            build_id: Some([0xab; 20]),
        }];
        let p = pprof(&samples, &domains, &images, &written, 1000, 1);
        let string = |i: i64| p.string_table[i as usize].as_str();
        for s in &p.sample {
            for key in ["vcpu", "pcpu"] {
                let label = s.label.iter().find(|l| string(l.key) == key).expect(key);
                assert_eq!(label.num, 0);
                assert_ne!(
                    label.num_unit, 0,
                    "a zero without a unit is dropped by pprof"
                );
            }
        }
        let names: Vec<&str> = p.function.iter().map(|f| string(f.name)).collect();
        assert_eq!(names, ["dom0:main", "dom1:main"]);
        assert!(p.function.iter().all(|f| string(f.system_name) == "main"));
        assert!(!string(p.mapping[0].filename).contains("images/"));
        assert_eq!(string(p.mapping[1].filename), "/x/images/dom1-work.elf");
        assert_eq!(string(p.mapping[1].build_id), "ab".repeat(20));
    }

    /// perf finds a domain's samples, kernel or user, in the domain's process, the
    /// hypervisor's in its kernel address space; return addresses are written inside the call.
    #[test]
    fn perf_modes_and_return_addresses() {
        let hv_table = vec![(0xffff_ff00_0000_0000, 0x1000, "vmm_x".to_string())];
        let images = [
            Image {
                origin: Origin::Domain(1),
                file_name: "work.elf".into(),
                elf: Cow::Borrowed(vpmu_guests::WORK),
            },
            Image {
                origin: Origin::Hypervisor,
                file_name: "vmm.elf".into(),
                elf: Cow::Owned(elf_image::symbol_image(
                    0xffff_ff00_0000_0000,
                    0x1000,
                    &hv_table,
                )),
            },
        ];
        let written: Vec<Written> = ["/x/dom1-work.elf", "/x/hypervisor-vmm.elf"]
            .iter()
            .map(|p| Written {
                path: PathBuf::from(p),
                build_id: Some([1; 20]),
            })
            .collect();
        let samples = [
            sample(Origin::Domain(1), 0x10_0100, false, &[0x10_0205]),
            sample(Origin::Domain(1), 0x10_0300, true, &[]),
            sample(Origin::Hypervisor, 0xffff_ff00_0000_0000, false, &[]),
        ];
        let f = perf_data(&samples, &images, &written, 1000, 2).expect("writes");
        let u64_at = |at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap());
        let (data, size) = (u64_at(40) as usize, u64_at(48) as usize);
        let mut at = data;
        let (mut maps, mut sampled) = (Vec::new(), Vec::new());
        while at < data + size {
            let kind = u32::from_le_bytes(f[at..at + 4].try_into().unwrap());
            let misc = u16::from_le_bytes(f[at + 4..at + 6].try_into().unwrap());
            let len = usize::from(u16::from_le_bytes(f[at + 6..at + 8].try_into().unwrap()));
            match kind {
                1 => maps.push((u64_at(at + 16), misc)),
                9 => {
                    let caller = if u64_at(at + 48) > 2 {
                        u64_at(at + 72)
                    } else {
                        0
                    };
                    sampled.push((u64_at(at + 8), misc, u64_at(at + 56), caller));
                }
                _ => {}
            }
            at += len;
        }
        const USER: u16 = 2;
        const KERNEL: u16 = 1;
        assert_eq!(
            maps,
            [(0x10_0000, USER), (0xffff_ff00_0000_0000, KERNEL)],
            "the image in its process, the hypervisor's in the kernel's space"
        );
        let context_user = (-512i64) as u64;
        let context_kernel = (-128i64) as u64;
        assert!(sampled.contains(&(0x10_0100, USER, context_user, 0x10_0204)));
        assert!(sampled.contains(&(0x10_0300, USER, context_user, 0)));
        assert!(
            sampled
                .iter()
                .any(|s| s.0 == 0xffff_ff00_0000_0000 && (s.1, s.2) == (KERNEL, context_kernel))
        );
    }

    #[test]
    fn pids_and_tids_are_distinct() {
        let mut all = vec![pid_of(Origin::Hypervisor)];
        for d in 0..8 {
            all.push(pid_of(Origin::Domain(d)));
            for v in 0..8 {
                all.push(tid_of(Origin::Domain(d), v));
            }
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        assert!(!all.contains(&0), "pid 0 is perf's idle task");
    }
}
