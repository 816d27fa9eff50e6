//! A writer of Linux `perf.data` files (the format `perf record` writes and `perf report`,
//! `perf script` and their consumers read), as the Linux tree's
//! `tools/perf/Documentation/perf.data-file-format.txt` describes it: a file header, one event
//! attribute, a data section of records (`PERF_RECORD_COMM` and `PERF_RECORD_MMAP` naming the
//! processes and their executables, `PERF_RECORD_SAMPLE` with IP, pid/tid, time, CPU, period and
//! call chain), then the feature sections (`HEADER_BUILD_ID`, `HEADER_HOSTNAME`,
//! `HEADER_OSRELEASE`, `HEADER_VERSION`, `HEADER_ARCH`, `HEADER_NRCPUS`, `HEADER_CPUDESC`,
//! `HEADER_CPUID`, `HEADER_TOTAL_MEM`, `HEADER_CMDLINE`, `HEADER_EVENT_DESC`). Little-endian,
//! like the x86 machines it describes. No crate writes perf.data (the ones there are read it), hence this one; the
//! tests check its layout here and the CLI's tests open its output with the real `perf`.

use std::io;

/// `PERF_TYPE_HARDWARE`.
pub const PERF_TYPE_HARDWARE: u32 = 0;
/// `PERF_COUNT_HW_CPU_CYCLES`.
pub const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;

const MAGIC: &[u8; 8] = b"PERFILE2";
/// `struct perf_file_header`: magic, size, attr_size, three sections, 256 feature bits.
const FILE_HEADER_SIZE: u64 = 8 + 8 + 8 + 3 * 16 + 32;
/// `PERF_ATTR_SIZE_VER7`: `struct perf_event_attr` up to `sig_data`.
const ATTR_SIZE: usize = 128;

const PERF_RECORD_MMAP: u32 = 1;
const PERF_RECORD_COMM: u32 = 3;
const PERF_RECORD_SAMPLE: u32 = 9;

const PERF_SAMPLE_IP: u64 = 1 << 0;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
const PERF_SAMPLE_CPU: u64 = 1 << 7;
const PERF_SAMPLE_PERIOD: u64 = 1 << 8;
/// What every sample carries, in this order (the kernel's): ip, pid/tid, time, cpu, period,
/// call chain.
const SAMPLE_TYPE: u64 = PERF_SAMPLE_IP
    | PERF_SAMPLE_TID
    | PERF_SAMPLE_TIME
    | PERF_SAMPLE_CPU
    | PERF_SAMPLE_PERIOD
    | PERF_SAMPLE_CALLCHAIN;

/// `perf_event_attr` flag bits.
const ATTR_MMAP: u64 = 1 << 8;
const ATTR_COMM: u64 = 1 << 9;
const ATTR_SAMPLE_ID_ALL: u64 = 1 << 18;

/// `PERF_CONTEXT_*`: call chain markers, saying in which mode the addresses after them are.
const PERF_CONTEXT_HV: u64 = (-32i64) as u64;
const PERF_CONTEXT_KERNEL: u64 = (-128i64) as u64;
const PERF_CONTEXT_USER: u64 = (-512i64) as u64;

const HEADER_BUILD_ID: usize = 2;
const HEADER_HOSTNAME: usize = 3;
const HEADER_OSRELEASE: usize = 4;
const HEADER_VERSION: usize = 5;
const HEADER_ARCH: usize = 6;
const HEADER_NRCPUS: usize = 7;
const HEADER_CPUDESC: usize = 8;
const HEADER_CPUID: usize = 9;
const HEADER_TOTAL_MEM: usize = 10;
const HEADER_CMDLINE: usize = 11;
const HEADER_EVENT_DESC: usize = 12;

/// `PERF_RECORD_MISC_BUILD_ID_SIZE`: a build-id record says how long its id is.
const MISC_BUILD_ID_SIZE: u16 = 1 << 15;
/// perf's pid of the host machine in build-id records (`HOST_KERNEL_ID`): every process here
/// is a process of the one machine perf knows.
const HOST_PID: i32 = -1;

/// Where a sample was taken (`PERF_RECORD_MISC_*` cpumode, and the call chain's context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuMode {
    /// `PERF_RECORD_MISC_KERNEL`, chain under `PERF_CONTEXT_KERNEL`.
    Kernel,
    /// `PERF_RECORD_MISC_USER`, chain under `PERF_CONTEXT_USER`.
    User,
    /// `PERF_RECORD_MISC_HYPERVISOR`, chain under `PERF_CONTEXT_HV`.
    Hypervisor,
}

impl CpuMode {
    fn misc(self) -> u16 {
        match self {
            CpuMode::Kernel => 1,
            CpuMode::User => 2,
            CpuMode::Hypervisor => 3,
        }
    }

    fn context(self) -> u64 {
        match self {
            CpuMode::Kernel => PERF_CONTEXT_KERNEL,
            CpuMode::User => PERF_CONTEXT_USER,
            CpuMode::Hypervisor => PERF_CONTEXT_HV,
        }
    }
}

/// The sampled event.
#[derive(Clone, Debug)]
pub struct Event {
    /// Its name (`cycles`), for `HEADER_EVENT_DESC`.
    pub name: String,
    /// `perf_event_attr.type` (`PERF_TYPE_HARDWARE`).
    pub kind: u32,
    /// `perf_event_attr.config` (`PERF_COUNT_HW_CPU_CYCLES`).
    pub config: u64,
    /// `perf_event_attr.sample_period`: events between samples.
    pub period: u64,
}

/// A thread's name (`PERF_RECORD_COMM`).
#[derive(Clone, Debug)]
pub struct Comm {
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// The name (perf keeps 16 bytes of it).
    pub comm: String,
}

/// An executable mapping of a process (`PERF_RECORD_MMAP`): `[start, start + len)` maps the
/// file `path` from byte `pgoff`. perf files a `Kernel` map in its one machine-wide kernel
/// address space (as a kernel module), a `User` one in the process `pid`.
#[derive(Clone, Debug)]
pub struct Mmap {
    /// Process.
    pub pid: u32,
    /// Which address space perf files it in (`User` or `Kernel`).
    pub mode: CpuMode,
    /// Start address.
    pub start: u64,
    /// Length, bytes.
    pub len: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file (absolute, so that perf finds it).
    pub path: String,
}

/// One sample (`PERF_RECORD_SAMPLE`).
#[derive(Clone, Debug)]
pub struct Sample {
    /// Process.
    pub pid: u32,
    /// Thread.
    pub tid: u32,
    /// CPU.
    pub cpu: u32,
    /// Nanoseconds.
    pub time: u64,
    /// The sampled instruction pointer.
    pub ip: u64,
    /// Where it was taken.
    pub mode: CpuMode,
    /// Return addresses, innermost caller first (without `ip`, without markers).
    pub callers: Vec<u64>,
    /// Events this sample stands for.
    pub period: u64,
}

/// The build id of a file the maps name (`HEADER_BUILD_ID`).
#[derive(Clone, Debug)]
pub struct BuildId {
    /// The address space its maps are in (`User` or `Kernel`).
    pub mode: CpuMode,
    /// The id (20 bytes: GNU ld's SHA-1 size).
    pub id: [u8; 20],
    /// The file, as the maps name it.
    pub path: String,
}

/// What goes into the file besides the records.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// `HEADER_HOSTNAME`.
    pub hostname: String,
    /// `HEADER_OSRELEASE`.
    pub os_release: String,
    /// `HEADER_VERSION`: the program that wrote the file (`perf report` shows it as "perf
    /// version").
    pub version: String,
    /// `HEADER_ARCH`.
    pub arch: String,
    /// `HEADER_NRCPUS`: CPUs available and online.
    pub cpus: u32,
    /// `HEADER_CPUDESC`: the CPU's model name.
    pub cpu_desc: String,
    /// `HEADER_CPUID`: `vendor,family,model,stepping`, as perf writes it on x86.
    pub cpuid: String,
    /// `HEADER_TOTAL_MEM`: kB.
    pub total_mem_kb: u64,
    /// `HEADER_CMDLINE`: the command that made the file, word by word.
    pub cmdline: Vec<String>,
    /// `HEADER_BUILD_ID`: the ids of the files the maps name.
    pub build_ids: Vec<BuildId>,
}

fn u16le(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u32le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn u64le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A NUL-terminated string padded with NULs to a multiple of 8 bytes (record strings).
fn padded_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    out.extend_from_slice(bytes);
    let len = (bytes.len() + 1).next_multiple_of(8);
    out.resize(out.len() + len - bytes.len(), 0);
}

/// `struct perf_header_string`: u32 length (NUL and padding to 64 bytes included), string.
fn header_string(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let bytes = &bytes[..bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len())];
    let len = (bytes.len() + 1).next_multiple_of(64);
    u32le(out, len as u32);
    out.extend_from_slice(bytes);
    out.resize(out.len() + len - bytes.len(), 0);
}

/// `struct perf_event_attr` (`ATTR_SIZE` bytes).
fn attr(event: &Event) -> Vec<u8> {
    let mut a = Vec::with_capacity(ATTR_SIZE);
    u32le(&mut a, event.kind);
    u32le(&mut a, ATTR_SIZE as u32);
    u64le(&mut a, event.config);
    u64le(&mut a, event.period); // sample_period (freq = 0)
    u64le(&mut a, SAMPLE_TYPE);
    u64le(&mut a, 0); // read_format
    u64le(&mut a, ATTR_MMAP | ATTR_COMM | ATTR_SAMPLE_ID_ALL);
    a.resize(ATTR_SIZE, 0); // wakeup, breakpoints, branch, regs, stack, clockid, ...: 0
    a
}

/// The `sample_id` trailer of a non-sample record (`sample_id_all`): pid/tid, time, cpu.
fn sample_id(out: &mut Vec<u8>, pid: u32, tid: u32, time: u64) {
    u32le(out, pid);
    u32le(out, tid);
    u64le(out, time);
    u32le(out, 0); // cpu
    u32le(out, 0); // res
}

/// A record: `struct perf_event_header` (type, misc, size) and `body`.
fn record(out: &mut Vec<u8>, kind: u32, misc: u16, body: &[u8]) -> io::Result<()> {
    let size = u16::try_from(8 + body.len())
        .map_err(|_| io::Error::other(format!("a perf record of {} bytes", body.len())))?;
    u32le(out, kind);
    u16le(out, misc);
    u16le(out, size);
    out.extend_from_slice(body);
    Ok(())
}

/// The whole file: header, attribute, records (names and maps first, then the samples in time
/// order), features.
pub fn write(
    event: &Event,
    env: &Environment,
    comms: &[Comm],
    mmaps: &[Mmap],
    samples: &[Sample],
) -> io::Result<Vec<u8>> {
    let attr = attr(event);
    // Layout: header | attr section (one perf_file_attr, no ids) | data | feature index |
    // features.
    let attrs_offset = FILE_HEADER_SIZE;
    let attrs_size = (ATTR_SIZE + 16) as u64;
    let data_offset = attrs_offset + attrs_size;

    let mut data = Vec::new();
    let first_time = samples.iter().map(|s| s.time).min().unwrap_or(0);
    for c in comms {
        let mut body = Vec::new();
        u32le(&mut body, c.pid);
        u32le(&mut body, c.tid);
        padded_string(&mut body, &c.comm);
        sample_id(&mut body, c.pid, c.tid, first_time);
        record(&mut data, PERF_RECORD_COMM, 0, &body)?;
    }
    for m in mmaps {
        let mut body = Vec::new();
        u32le(&mut body, m.pid);
        u32le(&mut body, m.pid);
        u64le(&mut body, m.start);
        u64le(&mut body, m.len);
        u64le(&mut body, m.pgoff);
        padded_string(&mut body, &m.path);
        sample_id(&mut body, m.pid, m.pid, first_time);
        record(&mut data, PERF_RECORD_MMAP, m.mode.misc(), &body)?;
    }
    let mut order: Vec<&Sample> = samples.iter().collect();
    order.sort_by_key(|s| s.time);
    for s in order {
        let mut body = Vec::new();
        u64le(&mut body, s.ip);
        u32le(&mut body, s.pid);
        u32le(&mut body, s.tid);
        u64le(&mut body, s.time);
        u32le(&mut body, s.cpu);
        u32le(&mut body, 0);
        u64le(&mut body, s.period);
        // The chain as the kernel records it: context marker, the IP, then the callers.
        u64le(&mut body, 2 + s.callers.len() as u64);
        u64le(&mut body, s.mode.context());
        u64le(&mut body, s.ip);
        for &a in &s.callers {
            u64le(&mut body, a);
        }
        record(&mut data, PERF_RECORD_SAMPLE, s.mode.misc(), &body)?;
    }

    // Features, in bit order.
    let mut features: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut f = Vec::new();
    for b in &env.build_ids {
        // `struct perf_record_header_build_id`: header (type 0, the map's cpumode and
        // BUILD_ID_SIZE, size), pid, 20 id bytes padded to 24 with the size in byte 20, then
        // the file name padded to 64 bytes.
        let name = b.path.as_bytes();
        let name_len = (name.len() + 1).next_multiple_of(64);
        let size = u16::try_from(36 + name_len)
            .map_err(|_| io::Error::other(format!("a build-id path of {} bytes", name.len())))?;
        u32le(&mut f, 0);
        u16le(&mut f, b.mode.misc() | MISC_BUILD_ID_SIZE);
        u16le(&mut f, size);
        f.extend_from_slice(&HOST_PID.to_le_bytes());
        f.extend_from_slice(&b.id);
        f.extend_from_slice(&[20, 0, 0, 0]);
        f.extend_from_slice(name);
        f.resize(f.len() + name_len - name.len(), 0);
    }
    features.push((HEADER_BUILD_ID, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.hostname);
    features.push((HEADER_HOSTNAME, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.os_release);
    features.push((HEADER_OSRELEASE, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.version);
    features.push((HEADER_VERSION, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.arch);
    features.push((HEADER_ARCH, f));
    let mut f = Vec::new();
    u32le(&mut f, env.cpus);
    u32le(&mut f, env.cpus);
    features.push((HEADER_NRCPUS, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.cpu_desc);
    features.push((HEADER_CPUDESC, f));
    let mut f = Vec::new();
    header_string(&mut f, &env.cpuid);
    features.push((HEADER_CPUID, f));
    let mut f = Vec::new();
    u64le(&mut f, env.total_mem_kb);
    features.push((HEADER_TOTAL_MEM, f));
    let mut f = Vec::new();
    u32le(&mut f, env.cmdline.len() as u32);
    for word in &env.cmdline {
        header_string(&mut f, word);
    }
    features.push((HEADER_CMDLINE, f));
    let mut f = Vec::new();
    u32le(&mut f, 1); // events
    u32le(&mut f, ATTR_SIZE as u32);
    f.extend_from_slice(&attr);
    u32le(&mut f, 0); // ids
    header_string(&mut f, &event.name);
    features.push((HEADER_EVENT_DESC, f));

    let index_offset = data_offset + data.len() as u64;
    let mut index = Vec::new();
    let mut bodies = Vec::new();
    let mut at = index_offset + 16 * features.len() as u64;
    let mut bits = [0u64; 4];
    for (bit, body) in &features {
        bits[bit / 64] |= 1 << (bit % 64);
        u64le(&mut index, at);
        u64le(&mut index, body.len() as u64);
        at += body.len() as u64;
        bodies.extend_from_slice(body);
    }

    let mut out = Vec::with_capacity(at as usize);
    out.extend_from_slice(MAGIC);
    u64le(&mut out, FILE_HEADER_SIZE);
    u64le(&mut out, attrs_size);
    u64le(&mut out, attrs_offset);
    u64le(&mut out, attrs_size);
    u64le(&mut out, data_offset);
    u64le(&mut out, data.len() as u64);
    u64le(&mut out, 0); // event_types: unused
    u64le(&mut out, 0);
    for b in bits {
        u64le(&mut out, b);
    }
    debug_assert_eq!(out.len() as u64, FILE_HEADER_SIZE);
    out.extend_from_slice(&attr);
    u64le(&mut out, 0); // ids section: none (one event)
    u64le(&mut out, 0);
    out.extend_from_slice(&data);
    out.extend_from_slice(&index);
    out.extend_from_slice(&bodies);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
    }

    fn file() -> Vec<u8> {
        write(
            &Event {
                name: "cycles".into(),
                kind: PERF_TYPE_HARDWARE,
                config: PERF_COUNT_HW_CPU_CYCLES,
                period: 1_000_000,
            },
            &Environment {
                hostname: "host".into(),
                os_release: "rel".into(),
                version: "vpmu 0.1".into(),
                arch: "x86_64".into(),
                cpus: 2,
                cpu_desc: "a CPU".into(),
                cpuid: "GenuineIntel,6,85,7".into(),
                total_mem_kb: 1 << 20,
                cmdline: vec!["vpmu".into(), "profile".into()],
                build_ids: vec![BuildId {
                    mode: CpuMode::User,
                    id: [7; 20],
                    path: "/x/work.elf".into(),
                }],
            },
            &[Comm {
                pid: 2,
                tid: 2000,
                comm: "dom1".into(),
            }],
            &[Mmap {
                pid: 2,
                mode: CpuMode::User,
                start: 0x10_0000,
                len: 0x3000,
                pgoff: 0x1000,
                path: "/x/work.elf".into(),
            }],
            &[
                Sample {
                    pid: 2,
                    tid: 2000,
                    cpu: 1,
                    time: 20,
                    ip: 0x10_0040,
                    mode: CpuMode::User,
                    callers: vec![0x10_0010, 0x10_0020],
                    period: 1_000_000,
                },
                Sample {
                    pid: 2,
                    tid: 2000,
                    cpu: 0,
                    time: 10,
                    ip: 0x10_0080,
                    mode: CpuMode::Kernel,
                    callers: vec![],
                    period: 1_000_000,
                },
            ],
        )
        .expect("writes")
    }

    #[test]
    fn header_and_attribute() {
        let f = file();
        assert_eq!(&f[..8], b"PERFILE2");
        assert_eq!(u64_at(&f, 8), 104);
        assert_eq!(u64_at(&f, 16), ATTR_SIZE as u64 + 16);
        assert_eq!((u64_at(&f, 24), u64_at(&f, 32)), (104, 144));
        // Feature bits: build_id, hostname, osrelease, version, arch, nrcpus, cpudesc,
        // cpuid, total_mem, cmdline, event_desc.
        assert_eq!(u64_at(&f, 72), 0b1_1111_1111_1100);
        let a = 104;
        assert_eq!((u32_at(&f, a), u32_at(&f, a + 4)), (0, 128));
        assert_eq!(u64_at(&f, a + 8), 0); // cycles
        assert_eq!(u64_at(&f, a + 16), 1_000_000);
        assert_eq!(u64_at(&f, a + 24), 0x1a7);
        assert_eq!(u64_at(&f, a + 40), (1 << 8) | (1 << 9) | (1 << 18));
    }

    #[test]
    fn records_and_features() {
        let f = file();
        let (data, size) = (u64_at(&f, 40) as usize, u64_at(&f, 48) as usize);
        let mut at = data;
        let mut kinds = Vec::new();
        let mut sample_times = Vec::new();
        while at < data + size {
            let (kind, misc, len) = (u32_at(&f, at), u16_at(&f, at + 4), u16_at(&f, at + 6));
            assert_eq!(len % 8, 0, "records stay 8-byte aligned");
            kinds.push((kind, misc));
            if kind == PERF_RECORD_SAMPLE {
                sample_times.push(u64_at(&f, at + 8 + 16));
                let nr = u64_at(&f, at + 8 + 40);
                let marker = u64_at(&f, at + 8 + 48);
                let ip = u64_at(&f, at + 8 + 56);
                assert_eq!(ip, u64_at(&f, at + 8));
                if misc == 2 {
                    assert_eq!((nr, marker), (4, PERF_CONTEXT_USER));
                    assert_eq!(u64_at(&f, at + 8 + 64), 0x10_0010);
                } else {
                    assert_eq!((nr, marker), (2, PERF_CONTEXT_KERNEL));
                }
            }
            if kind == PERF_RECORD_MMAP {
                assert_eq!(u64_at(&f, at + 16), 0x10_0000);
                assert_eq!(&f[at + 40..at + 51], b"/x/work.elf");
            }
            at += usize::from(len);
        }
        assert_eq!(at, data + size);
        assert_eq!(
            kinds,
            [
                (PERF_RECORD_COMM, 0),
                (PERF_RECORD_MMAP, 2),
                (PERF_RECORD_SAMPLE, 1),
                (PERF_RECORD_SAMPLE, 2)
            ]
        );
        assert_eq!(sample_times, [10, 20], "samples in time order");
        // Eleven feature sections follow the data; the first holds the build ids, the last is
        // the event's description.
        let index = data + size;
        let build_ids = u64_at(&f, index) as usize;
        assert_eq!(u64_at(&f, index + 8), 36 + 64);
        assert_eq!(u16_at(&f, build_ids + 4), 2 | (1 << 15));
        assert_eq!(u16_at(&f, build_ids + 6), 100);
        assert_eq!(
            u32_at(&f, build_ids + 8),
            u32::MAX,
            "the host machine's pid, -1"
        );
        assert_eq!((f[build_ids + 12], f[build_ids + 32]), (7, 20));
        assert_eq!(&f[build_ids + 36..build_ids + 48], b"/x/work.elf\0");
        let (desc, desc_len) = (u64_at(&f, index + 160) as usize, u64_at(&f, index + 168));
        assert_eq!(desc as u64 + desc_len, f.len() as u64);
        assert_eq!((u32_at(&f, desc), u32_at(&f, desc + 4)), (1, 128));
        let name = desc + 8 + 128 + 4;
        assert_eq!(u32_at(&f, name), 64);
        assert_eq!(&f[name + 4..name + 11], b"cycles\0");
    }

    #[test]
    fn strings_are_padded() {
        let mut b = Vec::new();
        padded_string(&mut b, "1234567");
        assert_eq!(b.len(), 8);
        padded_string(&mut b, "12345678");
        assert_eq!(b.len(), 24);
        let mut h = Vec::new();
        header_string(&mut h, "x86_64");
        assert_eq!((h.len(), u32_at(&h, 0)), (68, 64));
    }
}
