//! What this host's KVM does not do for an ordinary kernel, detected by probing (never assumed),
//! and the VMM's completions. On a host without a quirk the probe says so and its completion
//! never engages.
//!
//! The host here is `kvm_pvm` (guest CPL0 is run by KVM's instruction emulator, guest CPL3
//! natively). Booting Linux on it showed four things a real CPU does and it does not:
//!
//! 1. **SYSCALL from CPL3 stays at CPL3.** The host performs the register part of SYSCALL
//!    (RCX, R11, RFLAGS masked, RIP = LSTAR) but keeps the user CS/SS, so the fetch of the
//!    kernel's entry page faults: the guest takes #PF (error 0x15) at `entry_SYSCALL_64` and
//!    init dies. Completion: a hardware breakpoint (DR1) on the guest's #PF handler; at a
//!    #PF whose frame shows RIP = LSTAR from CPL3, the VMM finishes the SYSCALL: the #PF's
//!    delivery already brought the vCPU to CPL0 on the kernel's code segment, so it resumes
//!    at LSTAR with the user RSP and the masked RFLAGS from the frame, abandoning the #PF
//!    frame (CS = STAR bits 47:32 and SS = CS + 8 are loaded only if the #PF gate's segment
//!    differs); any other #PF runs after one single step over the breakpoint. The return
//!    (SYSRET, IRET) works.
//! 2. **INT3 and FWAIT at CPL0** end the run with `KVM_EXIT_INTERNAL_ERROR` (dmesg:
//!    "kvm-pvm: INTERNAL_ERROR in batch emul"). Linux runs INT3 in `int3_selftest` and FWAIT
//!    in `fpu__drop`. Completion, at that exit with the byte at RIP read through the guest's
//!    page tables: INT3 → RIP + 1 and #BP injected (a trap: the frame's RIP is past it);
//!    FWAIT → #MF injected if the x87 status has an unmasked exception pending (FSW.ES) and
//!    CR0.NE is set, else RIP + 1. Detection is the exit itself plus a probe that names it.
//! 3. **RDPMC at guest CPL0 raises #GP** (KVM's own PMU is off and RDPMC cannot be filtered):
//!    completed at the #GP handler (`rdpmc`), the IDT and frame read through the guest's page
//!    tables. Any host where KVM's PMU is off needs it; it is not specific to this one.
//! 4. **CPUID features the emulator cannot execute.** `KVM_SET_CPUID2` on this host does not
//!    clear leaf 1 or leaf 7 feature bits, so the guest sees instructions its CPL0 cannot run
//!    (POPCNT, XRSTOR, CMPXCHG16B, ...). Each candidate [`FEATURES`] has a probe instruction;
//!    a feature the guest's CPUID shows and whose probe ends in `KVM_EXIT_INTERNAL_ERROR` is
//!    switched off in the kernel by `clearcpuid=N` with Linux 6.1's bit number (XSAVE's too,
//!    instead of `noxsave`, which Linux would also hand to init as an argument), which
//!    `vpmu boot` appends to the command line.
//!
//! Each probe is a fresh VM with one vCPU (long mode, the machine's identity map), an IDT whose
//! every exception gate runs `out 0xf5`, and the instruction under test followed by `out 0xf4`;
//! a watchdog kick ends a probe that does not come back in [`PROBE_TIMEOUT`].

use std::time::{Duration, Instant};

use kvm_bindings::{CpuId, Msrs, kvm_msr_entry};
use kvm_ioctls::{Kvm, VcpuExit};

mod features;

pub use features::{FEATURES, Feature};

use crate::error::{MachineError, Result};
use crate::kick::Kick;
use crate::kvm::{Vm, flat_segment};

/// The #PF vector.
pub(crate) const PF_VECTOR: u8 = 14;
/// #BP and #MF.
pub(crate) const BP_VECTOR: u8 = 3;
pub(crate) const MF_VECTOR: u8 = 16;
/// The opcodes completed at an internal error.
pub(crate) const INT3: u8 = 0xcc;
pub(crate) const FWAIT: u8 = 0x9b;

/// A probe that has not come back by then failed (the emulator is slow, not this slow).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What the probes found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostQuirks {
    /// SYSCALL from CPL3 stays at CPL3 (completed at the #PF handler).
    pub syscall_lands_at_cpl3: bool,
    /// INT3 at CPL0 is an internal error (completed by the VMM).
    pub int3_unemulated: bool,
    /// FWAIT at CPL0 is an internal error (completed by the VMM).
    pub fwait_unemulated: bool,
    /// Features the guest's CPUID shows whose instruction CPL0 cannot execute.
    pub unexecutable: Vec<&'static Feature>,
    /// Guest CPL0 code is run by KVM's instruction emulator (a loop of N instructions at
    /// CPL0 grew KVM's `insn_emulation` count by about N), so the timed source splits each
    /// run's time by that count (`timed::CplSplit`).
    pub cpl0_emulated: bool,
    /// Picoseconds per emulated instruction in that loop (the split's first estimate).
    pub ps_per_emulated: u64,
}

/// How one probe ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The code after the instruction ran, at this CPL.
    Completed { cpl: u8 },
    /// An exception handler ran instead (#UD, #GP, #PF, ...).
    Exception,
    /// `KVM_EXIT_INTERNAL_ERROR`: the emulator could not run it.
    InternalError,
    /// Anything else (a shutdown, the watchdog), described.
    Other(String),
}

/// Probe guest layout.
const PROBE_MEM: usize = 2 << 20;
const CODE: u64 = 0x1_0000;
const IDT: u64 = 0x1_1000;
const HANDLER: u64 = 0x1_2000;
const DATA: u64 = 0x1_3000;
const LSTAR_CODE: u64 = 0x1_4000;
const STACK: u64 = 0x1_f000;
const DONE_PORT: u16 = 0xf4;
const EXCEPTION_PORT: u16 = 0xf5;
/// `out DONE_PORT, al` and `out EXCEPTION_PORT, al`.
const OUT_DONE: [u8; 2] = [0xe6, DONE_PORT as u8];
const OUT_EXCEPTION: [u8; 2] = [0xe6, EXCEPTION_PORT as u8];
/// MSRs of SYSCALL.
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_FMASK: u32 = 0xc000_0084;
const EFER_SCE: u64 = 1;

/// What a probe runs.
struct Probe<'c> {
    code: &'c [u8],
    cr4: u64,
    /// Enter at CPL3 with SYSCALL set up (LSTAR runs `out DONE_PORT`).
    syscall_from_user: bool,
}

/// How a probe ran: its outcome, the instructions KVM emulated and the time it took.
struct Ran {
    outcome: Outcome,
    emulated: Option<u64>,
    took: Duration,
}

fn probe(kvm: &Kvm, cpuid: &CpuId, p: &Probe<'_>) -> Result<Outcome> {
    probe_counted(kvm, cpuid, p).map(|r| r.outcome)
}

fn probe_counted(kvm: &Kvm, cpuid: &CpuId, p: &Probe<'_>) -> Result<Ran> {
    let vm = Vm::empty(kvm, &[], PROBE_MEM)?;
    crate::kvm::setup_page_tables(&vm.mem)?;
    let mut code = p.code.to_vec();
    code.extend(OUT_DONE);
    vm.mem.write(CODE, &code)?;
    let mut handler = OUT_EXCEPTION.to_vec();
    handler.extend(OUT_EXCEPTION);
    vm.mem.write(HANDLER, &handler)?;
    vm.mem.write(LSTAR_CODE, &OUT_DONE)?;
    for vector in 0..32u64 {
        let [lo, hi] = interrupt_gate(HANDLER);
        vm.mem.write_u64(IDT + 16 * vector, lo)?;
        vm.mem.write_u64(IDT + 16 * vector + 8, hi)?;
    }
    let vcpu = vm.create_vcpu(0, cpuid, CODE, STACK, 0, DATA)?;
    let fd = &vcpu.fd;
    let mut sregs = fd.get_sregs().map_err(MachineError::kvm("KVM_GET_SREGS"))?;
    sregs.idt.base = IDT;
    sregs.idt.limit = 32 * 16 - 1;
    sregs.cr4 |= p.cr4;
    if p.syscall_from_user {
        sregs.efer |= EFER_SCE;
        sregs.cs = flat_segment(0x2b, 0xb, true, 3);
        sregs.ss = flat_segment(0x23, 0x3, false, 3);
        let entries = [
            (MSR_STAR, 0x8u64 << 32),
            (MSR_LSTAR, LSTAR_CODE),
            (MSR_FMASK, 0x200),
        ]
        .map(|(index, data)| kvm_msr_entry {
            index,
            data,
            ..Default::default()
        });
        let msrs =
            Msrs::from_entries(&entries).map_err(|_| MachineError::Boot("MSR list".into()))?;
        fd.set_msrs(&msrs)
            .map_err(MachineError::kvm("KVM_SET_MSRS"))?;
    }
    fd.set_sregs(&sregs)
        .map_err(MachineError::kvm("KVM_SET_SREGS"))?;
    run_probe(vcpu)
}

/// Runs a probe vCPU on a thread of its own (the watchdog kick is a timer of the calling
/// thread) to its first meaningful exit.
fn run_probe(mut vcpu: crate::kvm::Vcpu) -> Result<Ran> {
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut count = crate::halt::EmulationCount::new(&vcpu.fd);
            let kick = Kick::new(vcpu.fd.get_kvm_run())?;
            let start = Instant::now();
            kick.arm(Some(start + PROBE_TIMEOUT));
            let outcome = match vcpu.fd.run() {
                Ok(VcpuExit::IoOut(DONE_PORT, _)) => {
                    let cpl = (vcpu.fd.sync_regs().sregs.cs.selector & 3) as u8;
                    Outcome::Completed { cpl }
                }
                Ok(VcpuExit::IoOut(EXCEPTION_PORT, _)) => Outcome::Exception,
                Ok(VcpuExit::InternalError) => Outcome::InternalError,
                Ok(other) => Outcome::Other(format!("{other:?}")),
                Err(e) if e.errno() == libc::EINTR => Outcome::Other("no exit in time".into()),
                Err(e) => Outcome::Other(format!("KVM_RUN: {e}")),
            };
            let took = start.elapsed();
            kick.arm(None);
            Ok(Ran {
                outcome,
                emulated: count.as_mut().map(|c| c.since()),
                took,
            })
        })
        .join()
        .unwrap_or_else(|_| Err(MachineError::Boot("a quirk probe panicked".into())))
    })
}

/// A 64-bit interrupt gate (present, DPL0, CS 0x8) to `handler`.
fn interrupt_gate(handler: u64) -> [u64; 2] {
    let lo = (handler & 0xffff) | 0x8 << 16 | 0x8e << 40 | (handler >> 16 & 0xffff) << 48;
    [lo, handler >> 32]
}

/// Whether `cpuid` (what KVM installed) has `f`'s bit set.
fn has(cpuid: &CpuId, f: &Feature) -> bool {
    cpuid
        .as_slice()
        .iter()
        .find(|e| e.function == f.leaf && e.index == f.subleaf)
        .is_some_and(|e| {
            let reg = [e.eax, e.ebx, e.ecx, e.edx][usize::from(f.register)];
            reg >> f.bit & 1 == 1
        })
}

impl HostQuirks {
    /// Probes the host with the CPUID a guest is given (`cpuid`): what KVM installs of it
    /// is what the feature probes judge (this host ignores some edits).
    pub fn detect(kvm: &Kvm, cpuid: &CpuId) -> Result<Self> {
        let installed = installed_cpuid(kvm, cpuid)?;
        let run = |code: &[u8], cr4: u64, syscall_from_user: bool| {
            probe(
                kvm,
                &installed,
                &Probe {
                    code,
                    cr4,
                    syscall_from_user,
                },
            )
        };
        // SYSCALL (0f 05) from CPL3: LSTAR's `out` must run at CPL0.
        let syscall = run(&[0x0f, 0x05], 0, true)?;
        let int3 = run(&[INT3], 0, false)?;
        let fwait = run(&[FWAIT], 0, false)?;
        // mov ecx, LOOP; 1: dec ecx; jnz 1b
        const LOOP: u32 = 20_000;
        let mut counted = vec![0xb9];
        counted.extend(LOOP.to_le_bytes());
        counted.extend([0xff, 0xc9, 0x75, 0xfc]);
        let emulation = probe_counted(
            kvm,
            &installed,
            &Probe {
                code: &counted,
                cr4: 0,
                syscall_from_user: false,
            },
        )?;
        let executed = 2 * u64::from(LOOP) + 2;
        let cpl0_emulated = emulation.outcome == (Outcome::Completed { cpl: 0 })
            && emulation
                .emulated
                .is_some_and(|n| n >= executed && n < 2 * executed);
        let ps_per_emulated = if cpl0_emulated {
            (emulation.took.as_nanos() * 1000 / u128::from(executed)) as u64
        } else {
            0
        };
        let mut unexecutable = Vec::new();
        for f in FEATURES.iter().filter(|f| has(&installed, f)) {
            if run(f.probe, f.cr4, false)? == Outcome::InternalError {
                unexecutable.push(f);
            }
        }
        Ok(Self {
            syscall_lands_at_cpl3: syscall != Outcome::Completed { cpl: 0 },
            // INT3 must reach its handler (#BP); FWAIT must fall through.
            int3_unemulated: int3 == Outcome::InternalError,
            fwait_unemulated: fwait == Outcome::InternalError,
            unexecutable,
            cpl0_emulated,
            ps_per_emulated,
        })
    }

    /// The kernel parameters that keep Linux off the unexecutable features (empty if none):
    /// one `clearcpuid=` list. (Not `noxsave`: a word without `=` that Linux does not know at
    /// its late parsing is handed to init as an argument, and a busybox init takes it for an
    /// applet's name; `clearcpuid=` of XSAVE's bit does what `noxsave` does, in the same early
    /// function.)
    pub fn kernel_parameters(&self) -> String {
        let bits: Vec<String> = self
            .unexecutable
            .iter()
            .map(|f| f.linux_bit.to_string())
            .collect();
        if bits.is_empty() {
            String::new()
        } else {
            format!("clearcpuid={}", bits.join(","))
        }
    }

    /// One line per quirk found, with its evidence.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.syscall_lands_at_cpl3 {
            lines.push(
                "SYSCALL from CPL3 does not reach CPL0 (probe: LSTAR's code did not run at \
                 CPL0); completed at the guest's #PF handler"
                    .to_string(),
            );
        }
        if self.int3_unemulated {
            lines.push("INT3 at CPL0: KVM_EXIT_INTERNAL_ERROR; completed (#BP injected)".into());
        }
        if self.cpl0_emulated {
            lines.push(format!(
                "CPL0 is emulated (KVM counted every instruction of a CPL0 loop as emulated; \
                 {} ns each): the timed source splits each run's time by that count",
                self.ps_per_emulated as f64 / 1000.0
            ));
        }
        if self.fwait_unemulated {
            lines.push("FWAIT at CPL0: KVM_EXIT_INTERNAL_ERROR; completed (skipped)".into());
        }
        for f in &self.unexecutable {
            let switch = format!("clearcpuid={}", f.linux_bit);
            lines.push(format!(
                "{}: shown in CPUID, but {} at CPL0 is KVM_EXIT_INTERNAL_ERROR (Linux uses it \
                 in {}): {switch}",
                f.name, f.instruction, f.used_by
            ));
        }
        lines
    }
}

/// The CPUID KVM installs for a vCPU given `cpuid` (read back with `KVM_GET_CPUID2`).
fn installed_cpuid(kvm: &Kvm, cpuid: &CpuId) -> Result<CpuId> {
    let vm = kvm
        .create_vm()
        .map_err(MachineError::kvm("KVM_CREATE_VM"))?;
    let vcpu = vm
        .create_vcpu(0)
        .map_err(MachineError::kvm("KVM_CREATE_VCPU"))?;
    vcpu.set_cpuid2(cpuid)
        .map_err(MachineError::kvm("KVM_SET_CPUID2"))?;
    vcpu.get_cpuid2(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(MachineError::kvm("KVM_GET_CPUID2"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_name_each_bit_once() {
        let none = HostQuirks::default();
        assert_eq!(none.kernel_parameters(), "");
        assert!(none.describe().is_empty());
        let find = |name: &str| FEATURES.iter().find(|f| f.name == name).expect(name);
        let q = HostQuirks {
            syscall_lands_at_cpl3: true,
            int3_unemulated: true,
            fwait_unemulated: false,
            unexecutable: vec![find("xsave"), find("popcnt"), find("smap")],
            ..HostQuirks::default()
        };
        assert_eq!(q.kernel_parameters(), "clearcpuid=154,151,308");
        assert_eq!(q.describe().len(), 5);
    }

    #[test]
    fn feature_rows_are_distinct_and_gates_encode() {
        for (i, a) in FEATURES.iter().enumerate() {
            for b in &FEATURES[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.linux_bit, b.linux_bit);
                assert_ne!((a.leaf, a.register, a.bit), (b.leaf, b.register, b.bit));
            }
        }
        let [lo, hi] = interrupt_gate(0x1234_5678_9abc_def0);
        assert_eq!(lo & 0xffff, 0xdef0);
        assert_eq!(lo >> 48, 0x9abc);
        assert_eq!(hi, 0x1234_5678);
        assert_eq!(lo >> 16 & 0xffff, 0x8);
    }

    /// On a machine with `/dev/kvm`, the probes run and agree with themselves: a second
    /// detection finds the same. (What they find is this host's; printed for the record.)
    #[test]
    fn detection_runs_and_is_stable() {
        let Ok(kvm) = crate::kvm::usable() else {
            println!("SKIPPED: /dev/kvm not available: quirk probes not run");
            eprintln!("SKIPPED: /dev/kvm not available: quirk probes not run");
            return;
        };
        let cpuid = crate::kvm::supported_cpuid(&kvm).expect("cpuid");
        let first = HostQuirks::detect(&kvm, &cpuid).expect("probes");
        let second = HostQuirks::detect(&kvm, &cpuid).expect("probes");
        // The time per emulated instruction is a measurement; everything else a fact.
        let facts = |q: &HostQuirks| HostQuirks {
            ps_per_emulated: 0,
            ..q.clone()
        };
        assert_eq!(facts(&first), facts(&second));
        assert_eq!(first.cpl0_emulated, first.ps_per_emulated > 0);
        for line in first.describe() {
            println!("host quirk: {line}");
        }
    }
}
