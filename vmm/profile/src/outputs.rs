//! The profile in other tools' formats: `perf.data` for Linux `perf` (`perf report`, `perf
//! script`), `profile.pb.gz` for pprof, `stacks.folded` for FlameGraph and speedscope. Each
//! domain is a process (pid `domain + 1`, named `dom<n>`; the hypervisor pid `HYPERVISOR_PID`),
//! each of its vCPUs a thread (tid `pid * 100 + vCPU`), its ELF image written beside the
//! outputs (`images/dom<n>-<file>`) and mapped at its load addresses so that perf symbolizes
//! it; every sample carries its call chain and its time (the host TSC at the PMI, in ns).

use std::path::{Path, PathBuf};

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

/// A domain's program: its origin, a file name and the ELF bytes.
#[derive(Clone, Debug)]
pub struct Image<'a> {
    /// Whose.
    pub origin: Origin,
    /// Its file name (`work.elf`).
    pub file_name: String,
    /// The ELF.
    pub elf: &'a [u8],
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

/// Writes each image into `dir/images/dom<n>-<file>` and returns the absolute paths, by image.
pub fn write_images(dir: &Path, images: &[Image<'_>]) -> std::io::Result<Vec<PathBuf>> {
    let folder = dir.join("images");
    std::fs::create_dir_all(&folder)?;
    let folder = std::fs::canonicalize(&folder)?;
    images
        .iter()
        .map(|image| {
            let path = folder.join(format!("{}-{}", image.origin.tag(), image.file_name));
            std::fs::write(&path, image.elf)?;
            Ok(path)
        })
        .collect()
}

/// The perf.data of `samples`: `paths[i]` is where `images[i]` was written.
#[allow(clippy::too_many_arguments)]
pub fn perf_data(
    samples: &[ProfileSample],
    images: &[Image<'_>],
    paths: &[PathBuf],
    period: u64,
    cpus: u32,
    run_label: &str,
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
    for (image, path) in images.iter().zip(paths) {
        for seg in exec_segments(image.elf) {
            mmaps.push(perf_data::Mmap {
                pid: pid_of(image.origin),
                start: seg.address,
                len: seg.size,
                pgoff: seg.offset,
                path: path.display().to_string(),
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
            mode: match (s.origin, s.user) {
                (Origin::Hypervisor, _) => CpuMode::Hypervisor,
                (_, true) => CpuMode::User,
                (_, false) => CpuMode::Kernel,
            },
            callers: s.details.chain.addresses().to_vec(),
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
        &perf_data::Environment {
            hostname: "vpmu".into(),
            os_release: run_label.into(),
            arch: "x86_64".into(),
            cpus,
        },
        &comms,
        &mmaps,
        &records,
    )
}

/// The pprof profile of `samples`: values `samples/count` and `cycles/count` (the period each
/// sample stands for), each stack's locations leaf first with the functions named from the
/// domain's symbols, labels `domain`, `vcpu`, `pcpu` and `mode` (`user` or `kernel`).
pub fn pprof(
    samples: &[ProfileSample],
    domains: &[DomainInfo],
    images: &[Image<'_>],
    paths: &[PathBuf],
    period: u64,
    duration_ns: u64,
) -> pprof::Profile {
    use std::collections::HashMap;
    let mut strings = pprof::Strings::default();
    let mut mappings: Vec<pprof::Mapping> = Vec::new();
    let mut mapping_of: HashMap<Origin, u64> = HashMap::new();
    for (image, path) in images.iter().zip(paths) {
        let segs = exec_segments(image.elf);
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
            filename: strings.intern(&path.display().to_string()),
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
                    let n = strings.intern(name);
                    functions.push(pprof::Function {
                        id,
                        name: n,
                        system_name: n,
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
        out_samples.push(pprof::Sample {
            location_id: ids,
            value: vec![1, period as i64],
            label: vec![
                pprof::Label {
                    key: key_domain,
                    str: strings.intern(&s.origin.tag()),
                    num: 0,
                },
                pprof::Label {
                    key: key_vcpu,
                    str: 0,
                    num: i64::from(s.vcpu),
                },
                pprof::Label {
                    key: key_pcpu,
                    str: 0,
                    num: i64::from(s.pcpu),
                },
                pprof::Label {
                    key: key_mode,
                    str: strings.intern(if s.user { "user" } else { "kernel" }),
                    num: 0,
                },
            ],
        });
    }
    // time_nanos is wall-clock time since the epoch; the samples' clock is the host TSC, so
    // it stays unset (perf.data and samples.jsonl carry each sample's TSC time).
    let comment = strings.intern(
        "vpmu profile: label `domain` names the domain; sample times are in perf.data and samples.jsonl",
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
