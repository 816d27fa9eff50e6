//! The mixed machine with the project's real Linux guest: Linux (`vmm/linux-guest`, built by
//! its `build.sh` into `target/linux-guest`, `$VPMU_LINUX_GUEST_DIR` overrides) as domain 0
//! and one `work.elf` workload domain on ONE shared pCPU (`Machine::linux_with_images`).
//!
//! Checks: Linux runs its `count` step and ends with isa-debug-exit 0 while the workload runs
//! beside it (its `work_stats` show rounds done); with the workloads held (`hold_workloads`)
//! and nothing in Linux starting them, the workload never runs and Linux boots alone; an idle
//! Linux's time goes to the workload; Linux user space reaches the ports through the MMIO port
//! window (busybox `devmem`: console, exit status, a read, refused widths ignored), and the
//! project's recorder's shipments arrive as `outl(BATCH)` and release held workloads. The
//! times of the runs are printed. Without the artifacts or `/dev/kvm` the test says SKIPPED and
//! passes. Each boot takes tens of seconds (Linux's CPL0 is emulated here), so it is
//! `#[ignore]`d: `cargo test --release -p vpmu-machine --test linux_mixed -- --ignored
//! --nocapture`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vpmu_guest_protocol::profile::{PROFILE_CONFIG_MAGIC, ROLE_WORKLOAD};
use vpmu_machine::linux::{DEFAULT_MEM_MIB, LinuxOptions};
use vpmu_machine::personality::{Intel, Source};
use vpmu_machine::symbols::Symbols;
use vpmu_machine::{Machine, RunResult, Workloads};

fn skip(why: &str) {
    let line = format!("SKIPPED: mixed Linux machine test did not run: {why}");
    eprintln!("{line}");
    println!("{line}");
}

fn artifacts() -> PathBuf {
    std::env::var_os("VPMU_LINUX_GUEST_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/linux-guest"),
        PathBuf::from,
    )
}

/// The project's kernel command line with `extra` appended.
fn cmdline(extra: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../linux-guest/cmdline");
    let base = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    format!("{} {extra}", base.trim())
}

/// `vmlinux` and `initramfs.cpio`, or None (SKIPPED said) without them or `/dev/kvm`.
fn guest() -> Option<(Vec<u8>, Vec<u8>)> {
    if vpmu_machine::kvm::usable().is_err() {
        skip("/dev/kvm not available");
        return None;
    }
    let dir = artifacts();
    match (
        std::fs::read(dir.join("vmlinux")),
        std::fs::read(dir.join("initramfs.cpio")),
    ) {
        (Ok(kernel), Ok(initrd)) => Some((kernel, initrd)),
        _ => {
            skip(&format!(
                "no vmlinux and initramfs.cpio in {} (vmm/linux-guest/build.sh)",
                dir.display()
            ));
            None
        }
    }
}

/// What one run gave: Linux's result, the workload's, the workload's completed rounds, the
/// wall time.
struct Outcome {
    linux: RunResult,
    work: RunResult,
    rounds: u64,
    wall: Duration,
}

fn run(kernel: &[u8], initrd: &[u8], cmdline: String, workloads: u32, hold: bool) -> Outcome {
    let kvm = vpmu_machine::kvm::usable().expect("checked by the caller");
    let cpuid = vpmu_machine::kvm::supported_cpuid(&kvm).expect("cpuid");
    let options = LinuxOptions {
        mem_size: (DEFAULT_MEM_MIB << 20) as usize,
        cmdline,
        initrd: Some(initrd.to_vec()),
        echo: false,
    };
    let work: &[u8] = vpmu_guests::WORK;
    let mut machine = Machine::linux_with_images(
        &kvm,
        Intel::v5(Source::Timed),
        &cpuid,
        kernel,
        &options,
        &Workloads {
            image_of: &|_| work,
            domains: workloads,
            vcpus: 1,
            arg: 0,
        },
    )
    .expect("the mixed machine");
    let (config, _) = Symbols::address_of(work, "profile_config")
        .expect("symbols")
        .expect("work.elf has profile_config");
    let (stats, _) = Symbols::address_of(work, "work_stats")
        .expect("symbols")
        .expect("work.elf has work_stats");
    for domain in 1..=workloads {
        // Workload 1, no sampling: it runs until the run stops it.
        let mut bytes = [0u8; 48];
        bytes[..4].copy_from_slice(&PROFILE_CONFIG_MAGIC.to_le_bytes());
        bytes[4..8].copy_from_slice(&ROLE_WORKLOAD.to_le_bytes());
        bytes[12..16].copy_from_slice(&1u32.to_le_bytes());
        machine
            .memory(domain)
            .expect("the domain")
            .write(config, &bytes)
            .expect("in RAM");
        machine
            .peek_after_run(domain, stats, 16)
            .expect("work_stats in RAM");
    }
    machine.finish_with(vec![0]);
    if hold {
        machine.hold_workloads();
    }
    let start = Instant::now();
    let mut results = machine.run(Duration::from_secs(600));
    let wall = start.elapsed();
    let linux = results.remove(0);
    let work = results.pop().unwrap_or_default();
    let rounds = work
        .peeked
        .first()
        .and_then(|(_, b)| b.get(..8))
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    Outcome {
        linux,
        work,
        rounds,
        wall,
    }
}

fn check_linux(what: &str, o: &Outcome) {
    let r = &o.linux;
    assert_eq!(r.error, None, "{what}: {}", r.console);
    assert_eq!(r.status, Some(0), "{what}: Linux's status\n{}", r.console);
    assert!(
        r.console.contains("VPMU-RESULT done status=0"),
        "{what}:\n{}",
        r.console
    );
    print_times(what, o);
}

fn print_times(what: &str, o: &Outcome) {
    let r = &o.linux;
    println!(
        "{what}: wall {:.1} s; Linux ran {:.1} s, halted in KVM_RUN {:.3} s, {} slices ended \
         halted ({:.3} s), kicked {}; workload ran {:.1} s, {} rounds",
        o.wall.as_secs_f64(),
        r.guest_ns as f64 / 1e9,
        r.halted_ns as f64 / 1e9,
        r.idle_slices,
        r.idle_slice_ns as f64 / 1e9,
        r.kicks,
        o.work.guest_ns as f64 / 1e9,
        o.rounds
    );
}

#[test]
#[ignore = "boots Linux three times (minutes): run with --ignored"]
fn linux_and_a_workload_share_one_pcpu() {
    let Some((kernel, initrd)) = guest() else {
        return;
    };
    let count = || cmdline("vpmu.run=count vpmu.seconds=1");
    let alone = run(&kernel, &initrd, count(), 0, false);
    check_linux("Linux alone", &alone);

    let shared = run(&kernel, &initrd, count(), 1, false);
    check_linux("Linux + 1 workload", &shared);
    assert_eq!(shared.work.error, None);
    assert!(shared.work.stopped, "the workload runs until Linux ends");
    assert!(
        shared.rounds > 0,
        "the workload ran no chunk: {:?}",
        shared.work
    );

    let held = run(&kernel, &initrd, count(), 1, true);
    check_linux("Linux + 1 held workload", &held);
    assert_eq!(held.rounds, 0, "a held workload ran");
    assert_eq!(held.work.guest_ns, 0, "a held workload ran");
}

/// Linux idles in `sleep 3` (busybox as init; its exit panics the kernel, which resets the
/// machine) beside a workload: the idle time goes to the workload instead of being spent
/// blocked in `KVM_RUN`. Alone, Linux's slices that end halted last about the 3 s it sleeps;
/// beside the workload, its idle turns are passed over until its timer (at most 10 ms apart)
/// and such slices take a small part of that.
#[test]
#[ignore = "boots Linux twice (a minute): run with --ignored"]
fn an_idle_linux_leaves_the_pcpu_to_the_workload() {
    let Some((kernel, initrd)) = guest() else {
        return;
    };
    let sleep = || cmdline("").replace("rdinit=/init", "rdinit=/bin/busybox") + " -- sleep 3";
    let mut idle = Vec::new();
    for workloads in [0, 1] {
        let o = run(&kernel, &initrd, sleep(), workloads, false);
        print_times(&format!("sleep 3, {workloads} workload(s)"), &o);
        let r = &o.linux;
        assert_eq!(r.error, None, "{}", r.console);
        assert!(
            r.reset,
            "init's exit resets the machine (panic=-1)\n{}",
            r.console
        );
        assert!(
            r.console.contains("Attempted to kill init"),
            "{}",
            r.console
        );
        idle.push(r.idle_slice_ns as f64 / 1e9);
    }
    assert!(
        idle[0] >= 2.5,
        "alone, Linux idles through its sleep: {idle:?}"
    );
    assert!(
        idle[1] < 0.75,
        "beside a workload, Linux's idle slices take the pCPU for {:.3} s of its 3 s sleep",
        idle[1]
    );
}

/// What domain 0 wrote to `port::BATCH`: (vCPU, value, the magic at that GPA).
#[derive(Default)]
struct Doorbell {
    rings: std::sync::Mutex<Vec<(vpmu::VcpuId, u32, Option<u32>)>>,
}

impl vpmu_machine::GuestPorts for Doorbell {
    fn out(
        &self,
        access: vpmu_machine::PortAccess<'_>,
        port: u16,
        value: u32,
    ) -> Result<(), String> {
        if port == vpmu_guest_protocol::port::BATCH {
            let magic = access
                .memory
                .to_vec(u64::from(value), 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            self.rings
                .lock()
                .map_err(|_| "poisoned")?
                .push((access.vcpu, value, magic));
        }
        Ok(())
    }
}

/// Linux's user-space recorder (`/bin/xenpmu-record`, `initramfs-xenpmu.cpio`) rings the
/// doorbell through the MMIO port window from CPL3: the shipments reach the extension as
/// `outl(BATCH)` of domain 0 with the GPA of a `struct ring_batch`, and the first one
/// releases the held workload.
#[test]
#[ignore = "boots Linux (half a minute): run with --ignored"]
fn linux_user_space_rings_the_doorbell_through_the_window() {
    let Some((kernel, _)) = guest() else {
        return;
    };
    let Ok(initrd) = std::fs::read(artifacts().join("initramfs-xenpmu.cpio")) else {
        return skip("no initramfs-xenpmu.cpio (vmm/linux-guest/build.sh)");
    };
    let kvm = vpmu_machine::kvm::usable().expect("checked");
    let cpuid = vpmu_machine::kvm::supported_cpuid(&kvm).expect("cpuid");
    let options = LinuxOptions {
        mem_size: (DEFAULT_MEM_MIB << 20) as usize,
        cmdline: cmdline(&format!(
            "vpmu.run=record vpmu.mode=self vpmu.period=500000 vpmu.seconds=1 \
             vpmu.doorbell={:#x}",
            vpmu_guest_protocol::mmio::PORTS_BASE
        )),
        initrd: Some(initrd),
        echo: false,
    };
    let work: &[u8] = vpmu_guests::WORK;
    let mut machine = Machine::linux_with_images(
        &kvm,
        Intel::v5(Source::Timed),
        &cpuid,
        &kernel,
        &options,
        &Workloads {
            image_of: &|_| work,
            domains: 1,
            vcpus: 1,
            arg: 0,
        },
    )
    .expect("the mixed machine");
    let (config, _) = Symbols::address_of(work, "profile_config")
        .expect("symbols")
        .expect("profile_config");
    let mut bytes = [0u8; 48];
    bytes[..4].copy_from_slice(&PROFILE_CONFIG_MAGIC.to_le_bytes());
    bytes[4..8].copy_from_slice(&ROLE_WORKLOAD.to_le_bytes());
    bytes[12..16].copy_from_slice(&1u32.to_le_bytes());
    machine
        .memory(1)
        .expect("domain 1")
        .write(config, &bytes)
        .expect("in RAM");
    machine.finish_with(vec![0]);
    machine.hold_workloads();
    let doorbell = std::sync::Arc::new(Doorbell::default());
    machine.extend(doorbell.clone());
    let results = machine.run(Duration::from_secs(600));
    let (linux, work) = (&results[0], &results[1]);
    println!(
        "record: Linux ran {:.1} s, {} idle slices ({:.3} s); workload ran {:.2} s",
        linux.guest_ns as f64 / 1e9,
        linux.idle_slices,
        linux.idle_slice_ns as f64 / 1e9,
        work.guest_ns as f64 / 1e9
    );
    assert_eq!(linux.error, None, "{}", linux.console);
    assert_eq!(linux.status, Some(0), "{}", linux.console);
    let rings = doorbell.rings.lock().expect("lock").clone();
    println!("{} shipments", rings.len());
    assert!(!rings.is_empty(), "no shipment:\n{}", linux.console);
    let linux_vcpu = vpmu::VcpuId { domain: 0, vcpu: 0 };
    for (vcpu, gpa, magic) in &rings {
        assert_eq!(*vcpu, linux_vcpu);
        assert_eq!(
            *magic,
            Some(vpmu_guest_protocol::profile::RING_BATCH_MAGIC),
            "at {gpa:#x}"
        );
    }
    assert!(
        work.guest_ns > 0,
        "the first shipment releases the workload"
    );
}

/// The window from a Linux domain's user space (busybox `devmem` through `/dev/mem`): a
/// 2-byte and a 1-byte write are ignored (a line on stderr each), a read gives 0, a 4-byte
/// write to the console port's slot reaches the machine's console, and one to the exit
/// port's ends the run with that status.
#[test]
#[ignore = "boots Linux (half a minute): run with --ignored"]
fn linux_user_space_reaches_the_ports_through_the_window() {
    let Some((kernel, initrd)) = guest() else {
        return;
    };
    let slot = |port: u16| vpmu_guest_protocol::mmio::PORTS_BASE + 4 * u64::from(port);
    let batch = slot(vpmu_guest_protocol::port::BATCH);
    let script = format!(
        "D=/bin/busybox; $D mount -t devtmpfs dev /dev; $D devmem {:#x} 16 1; $D devmem {:#x} 8 1; $D devmem {:#x}; \
         $D devmem {:#x} 32 0x57; $D devmem {:#x} 32 5",
        batch,
        batch + 1,
        slot(vpmu_guest_protocol::port::EXIT),
        slot(vpmu_guest_protocol::port::CONSOLE),
        slot(vpmu_guest_protocol::port::EXIT),
    );
    let line = cmdline("").replace("rdinit=/init", "rdinit=/bin/busybox")
        + &format!(" -- sh -c \"{script}\"");
    let o = run(&kernel, &initrd, line, 0, false);
    let r = &o.linux;
    assert_eq!(r.error, None, "{}", r.console);
    assert_eq!(r.status, Some(5), "the exit port's slot\n{}", r.console);
    assert!(r.console.contains("0x00000000"), "the read\n{}", r.console);
    assert!(
        r.console.contains('W'),
        "the console port's slot\n{}",
        r.console
    );
}
