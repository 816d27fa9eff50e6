//! `--profiler linux`: domain 0 is a real Linux kernel instead of the freestanding
//! `profile/profiler.c`. The project's guest (`vmm/linux-guest/build.sh`: Linux 6.1 `vmlinux`
//! and `initramfs-xenpmu.cpio`) boots as the privileged domain, its `/init` loads the xenpmu
//! driver (`xenpmu.ko mode=all|hv`, sampling from `XENPMU_IOC_START`), and the static
//! recorder `/bin/xenpmu-record` reads each CPU's sample ring through `/dev/xenpmu` at native
//! CPL3 and ships the unread bytes to the VMM exactly as the freestanding profiler does (a
//! `struct ring_batch` at `port::BATCH`, reached from CPL3 through the machine's MMIO port
//! window, the doorbell). The VMM's side is unchanged: the same decoder, the same checks
//! against its own record of every PMI, the same outputs; domain 0's samples are symbolized
//! from `vmlinux`.
//!
//! The recorder also counts what it shipped per domain and prints it (`VPMU-RESULT record
//! ...`); [`recorder_agrees`] checks those counts against what the VMM decoded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use vpmu_machine::linux::LinuxOptions;
use vpmu_machine::personality::Personality;
use vpmu_machine::symbols::Symbols;
use vpmu_machine::{Machine, Workloads};

use crate::ProfileError;
use crate::report::Check;
use crate::run::{Mode, Plan, RunData};
use crate::sample::Origin;

/// Where `vmm/linux-guest/build.sh` puts the guest, from the repository's root.
pub const DEFAULT_DIR: &str = "target/linux-guest";
/// The environment variable naming another directory (as the tests' `VPMU_LINUX_GUEST_DIR`).
pub const DIR_VARIABLE: &str = "VPMU_LINUX_GUEST_DIR";
/// The kernel in that directory.
pub const KERNEL: &str = "vmlinux";
/// The initramfs with the driver and the recorder.
pub const INITRD: &str = "initramfs-xenpmu.cpio";
/// RAM of the Linux domain (MiB): the kernel initialises all of it under an emulated CPL0,
/// so it stays small; the driver needs one 64 KiB ring.
pub const MEM_MIB: u64 = 128;
/// The kernel command line the guest is built for (the VMM appends this host's quirks).
const BASE_CMDLINE: &str = include_str!("../../linux-guest/cmdline");
/// Data pages of the driver's ring: 64 KiB, as the freestanding profiler's.
pub const RING_PAGES: u32 = 16;

/// Seconds a run with a Linux domain 0 may take beyond its duration: the boot under an
/// emulated CPL0 (about 10 s alone here), loading the driver and starting the recorder (each
/// fork and exec costs about a second), and the unload.
pub const BOOT_ALLOWANCE_S: u64 = 300;

/// The machine of a run whose domain 0 is `linux`: the kernel with its initramfs and the
/// command line of the `record` step, then the workload domains (`workloads`, domains 1..),
/// all on one pCPU. The counter period on the command line is computed from the TSC
/// frequency KVM gives a vCPU, read from a probe vCPU first (the run reads its own vCPUs'
/// again, and refuses a difference).
pub fn machine<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    p: P,
    cpuid: &CpuId,
    linux: &LinuxProfiler,
    plan: &Plan,
    workloads: &[&[u8]],
) -> Result<Machine<P>, ProfileError> {
    let probe_khz = probe_tsc_khz(kvm)?;
    let (period, _) = crate::run::period_for(plan.frequency, probe_khz);
    let options = LinuxOptions {
        mem_size: (MEM_MIB << 20) as usize,
        cmdline: LinuxProfiler::cmdline(plan.mode, period, plan.duration),
        initrd: Some(linux.initrd.to_vec()),
        echo: false,
    };
    let image_of = |d: u32| workloads[d as usize - 1];
    let mut machine = Machine::linux_with_images(
        kvm,
        p,
        cpuid,
        &linux.kernel,
        &options,
        &Workloads {
            image_of: &image_of,
            domains: workloads.len() as u32,
            vcpus: plan.vcpus,
            arg: 0,
        },
    )
    .map_err(ProfileError::Setup)?;
    // Linux boots alone: the workloads start with the recorder's first shipment, so the
    // sampled interval is the same as with the freestanding profiler.
    machine.hold_workloads();
    let khz = machine.tsc_khz().map(u64::from);
    if khz != Some(probe_khz) {
        return Err(ProfileError::TscChanged {
            probe: probe_khz,
            vcpu: khz,
        });
    }
    Ok(machine)
}

/// The TSC frequency KVM gives a new vCPU (kHz).
fn probe_tsc_khz(kvm: &Kvm) -> Result<u64, ProfileError> {
    let vm = kvm.create_vm().map_err(|_| ProfileError::NoTscFrequency)?;
    let vcpu = vm
        .create_vcpu(0)
        .map_err(|_| ProfileError::NoTscFrequency)?;
    vcpu.get_tsc_khz()
        .map(u64::from)
        .map_err(|_| ProfileError::NoTscFrequency)
}

/// The Linux profiling domain's files, read before anything runs.
#[derive(Clone, Debug)]
pub struct LinuxProfiler {
    /// The directory they came from.
    pub dir: PathBuf,
    /// `vmlinux`.
    pub kernel: Arc<Vec<u8>>,
    /// `initramfs-xenpmu.cpio`.
    pub initrd: Arc<Vec<u8>>,
}

impl LinuxProfiler {
    /// The directory given, else `$VPMU_LINUX_GUEST_DIR`, else [`DEFAULT_DIR`].
    pub fn dir_or_default(dir: Option<&Path>) -> PathBuf {
        dir.map(Path::to_path_buf)
            .or_else(|| std::env::var_os(DIR_VARIABLE).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
    }

    /// Reads the kernel and the initramfs from `dir`, refusing a kernel without a symbol
    /// table (domain 0's samples are symbolized from it).
    pub fn load(dir: &Path) -> Result<Self, ProfileError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| ProfileError::LinuxGuest {
                path: path.clone(),
                source,
            })
        };
        let kernel = read(KERNEL)?;
        Symbols::from_elf(&kernel).map_err(|source| ProfileError::GuestSymbols {
            path: dir.join(KERNEL),
            source,
        })?;
        let initrd = read(INITRD)?;
        Ok(LinuxProfiler {
            dir: dir.to_path_buf(),
            kernel: Arc::new(kernel),
            initrd: Arc::new(initrd),
        })
    }

    /// The kernel command line of a run: the guest's own, then `/init`'s orders (the `record`
    /// step: mode, counter period, seconds to record, the doorbell's address).
    pub fn cmdline(mode: Mode, period: u64, duration: Duration) -> String {
        format!(
            "{} vpmu.run=record vpmu.mode={} vpmu.period={period} vpmu.seconds={:.3} \
             vpmu.doorbell={:#x}",
            BASE_CMDLINE.trim(),
            mode.name(),
            duration.as_secs_f64(),
            vpmu_guest_protocol::mmio::PORTS_BASE,
        )
    }

    /// Domain 0's symbols: the kernel's.
    pub fn symbols(&self) -> Symbols {
        Symbols::from_elf(&self.kernel).unwrap_or_default()
    }
}

/// The file of the output directory that keeps the Linux domain's console (its kernel log,
/// the driver's and the recorder's lines).
pub const CONSOLE_FILE: &str = "linux-console.txt";

/// Writes the Linux domain's console to [`CONSOLE_FILE`] in `out`.
pub fn write_console(out: &Path, data: &RunData) -> Result<(), ProfileError> {
    let path = out.join(CONSOLE_FILE);
    let console = data.results.first().map_or("", |r| r.console.as_str());
    std::fs::write(&path, console).map_err(ProfileError::write(&path))
}

/// The recorder's `VPMU-RESULT record=<what> key=value ...` lines of kind `what`, as maps.
fn record_lines<'c>(console: &'c str, what: &str) -> Vec<BTreeMap<&'c str, &'c str>> {
    console
        .lines()
        .filter_map(|l| l.find("VPMU-RESULT ").map(|at| &l[at..]))
        .map(|l| -> BTreeMap<&str, &str> {
            l.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .collect()
        })
        .filter(|f| f.get("record") == Some(&what))
        .collect()
}

/// The recorder's own count of the samples it shipped, per origin, from its console lines
/// `VPMU-RESULT record=domain domain=<id|self|hv> samples=<n>` (`self`: its own domain, 0).
/// None: it printed none, or one that is not a count of a known origin (`domain=other`: its
/// table of domains overflowed).
pub fn recorder_counts(console: &str) -> Option<BTreeMap<Origin, u64>> {
    let mut counts = BTreeMap::new();
    for line in record_lines(console, "domain") {
        let origin = match *line.get("domain")? {
            "hv" => Origin::Hypervisor,
            "self" => Origin::Domain(vpmu_machine::PRIVILEGED_DOMAIN),
            d => Origin::Domain(d.parse().ok()?),
        };
        *counts.entry(origin).or_default() += line.get("samples")?.parse::<u64>().ok()?;
    }
    (!counts.is_empty()).then_some(counts)
}

/// The in-guest recorder saw what the VMM decoded: its per-domain counts of the samples it
/// shipped equal the VMM's decode of domain 0's shipments, domain by domain.
pub fn recorder_agrees(data: &RunData) -> Check {
    let name = "the in-guest recorder's per-domain counts = the VMM's decode".to_string();
    let console = data.results.first().map_or("", |r| r.console.as_str());
    let Some(recorded) = recorder_counts(console) else {
        return Check {
            name,
            passed: false,
            skipped: false,
            detail: format!(
                "the recorder printed no readable `VPMU-RESULT record=domain` line (its \
                 console is in {CONSOLE_FILE})"
            ),
        };
    };
    // Only what domain 0 shipped: in hv mode the workloads ship their own samples too.
    let mut decoded: BTreeMap<Origin, u64> = BTreeMap::new();
    let shipped_by_linux = data
        .shipments
        .iter()
        .filter(|(id, _)| id.domain == vpmu_machine::PRIVILEGED_DOMAIN)
        .flat_map(|(_, shipment)| &shipment.samples);
    for s in shipped_by_linux {
        *decoded.entry(s.origin).or_default() += 1;
    }
    let show = |m: &BTreeMap<Origin, u64>| {
        m.iter()
            .map(|(o, n)| format!("{}: {n}", o.tag()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Check {
        name,
        passed: recorded == decoded,
        skipped: false,
        detail: format!(
            "recorder {{{}}}, VMM {{{}}}",
            show(&recorded),
            show(&decoded)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_carries_the_orders_of_the_record_step() {
        let c = LinuxProfiler::cmdline(Mode::All, 1_500_000, Duration::from_millis(2500));
        assert!(c.starts_with(BASE_CMDLINE.trim()), "{c}");
        for want in [
            "vpmu.run=record",
            "vpmu.mode=all",
            "vpmu.period=1500000",
            "vpmu.seconds=2.500",
            "vpmu.doorbell=0xd0000000",
        ] {
            assert!(c.split(' ').any(|w| w == want), "{want} in {c}");
        }
        assert!(!c.contains('\n'));
    }

    #[test]
    fn recorder_lines_are_summed_per_origin_and_garbage_is_refused() {
        let console = "boot\n\
            [  1.0] VPMU-RESULT record=domain domain=0 samples=5 user=0\n\
            VPMU-RESULT record=domain domain=2 samples=7\n\
            VPMU-RESULT record=domain domain=hv samples=3\n\
            VPMU-RESULT record=total samples=4 shipments=4 bytes=100\n\
            VPMU-RESULT record=domain domain=self samples=1\n";
        let c = recorder_counts(console).expect("counts");
        assert_eq!(c.get(&Origin::Domain(0)), Some(&6));
        assert_eq!(c.get(&Origin::Domain(2)), Some(&7));
        assert_eq!(c.get(&Origin::Hypervisor), Some(&3));
        assert_eq!(c.len(), 3);
        assert!(recorder_counts("VPMU-RESULT record=domain domain=other samples=1").is_none());
        assert!(recorder_counts("VPMU-RESULT record=domain domain=1 samples=-1").is_none());
        assert!(recorder_counts("VPMU-RESULT record=domain domain=1").is_none());
        assert!(recorder_counts("nothing here").is_none());
    }

    #[test]
    fn a_directory_without_the_guest_is_named() {
        let dir = Path::new("/nonexistent/linux-guest");
        let e = LinuxProfiler::load(dir).expect_err("missing");
        assert!(
            e.to_string().contains("/nonexistent/linux-guest/vmlinux"),
            "{e}"
        );
        assert!(e.to_string().contains("build.sh"), "{e}");
    }
}
