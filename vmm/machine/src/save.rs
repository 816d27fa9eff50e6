//! Saving a running VM and resuming it in a new one, as a VMM snapshots or live-migrates: per
//! vCPU the KVM state (registers, system registers, XSAVE area, XCRs, debug registers, the
//! MSRs below, the local APIC, the MP state, pending events) and the vPMU's snapshot
//! (`vpmu::snapshot`, taken on the switched-out vCPU), and each domain's guest memory.
//!
//! The save is taken in the vCPU's own thread at the first exit, once `after_exits` exits
//! went by, that leaves no instruction half done: a single-step exit (or a kick). An I/O or
//! MSR exit is completed by KVM only at the next `KVM_RUN`, so a state read there would
//! resume the instruction twice or not at all. With the precise source counting, every exit
//! is a step, so the save lands exactly where it was asked.
//!
//! One vCPU per machine (`Layout::ThreadPerVcpu(1)`): several would need a rendezvous so that
//! all stop together, which this does not do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    Msrs, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::VcpuFd;
use vpmu::snapshot::SnapshotBackend;
use vpmu::{DecodeError, RestoreError, TakeError, VcpuId, VcpuPmu, VcpuSnapshot, Vpmu};

use crate::error::{MachineError, Result};
use crate::personality::Personality;
use crate::platform::{KvmPlatform, PlatformState};
use crate::runner::Runner;
use crate::{Ctx, Layout, Machine, lock_shared};

/// The MSRs the VMM carries besides the PMU's (which the vPMU snapshot holds): the TSC first
/// (the deadline is relative to it), the SYSENTER and SYSCALL MSRs, PAT, MISC_ENABLE,
/// KERNEL_GS_BASE, TSC_AUX and the TSC deadline. Those KVM does not have are left out.
const CARRIED_MSRS: [u32; 13] = [
    0x10,
    0x174,
    0x175,
    0x176,
    0x277,
    0x1A0,
    0xC000_0081,
    0xC000_0082,
    0xC000_0083,
    0xC000_0084,
    0xC000_0102,
    0xC000_0103,
    0x6E0,
];

/// A vCPU's KVM state, as `KVM_GET_*` gave it.
#[derive(Debug)]
pub struct KvmVcpuState {
    regs: kvm_regs,
    sregs: kvm_sregs,
    xsave: kvm_xsave,
    xcrs: kvm_xcrs,
    debugregs: kvm_debugregs,
    /// (MSR, value) of every `CARRIED_MSRS` entry KVM read.
    msrs: Vec<(u32, u64)>,
    lapic: kvm_lapic_state,
    mp_state: kvm_mp_state,
    events: kvm_vcpu_events,
}

impl KvmVcpuState {
    /// The state of `fd`, stopped at an exit that left no instruction half done.
    fn read(fd: &VcpuFd) -> Result<Self> {
        let mut msrs = Vec::new();
        for msr in CARRIED_MSRS {
            let mut one = Msrs::from_entries(&[kvm_msr_entry {
                index: msr,
                ..Default::default()
            }])
            .map_err(|_| MachineError::GuestProtocol("an MSR list of one entry"))?;
            if fd
                .get_msrs(&mut one)
                .map_err(MachineError::kvm("KVM_GET_MSRS"))?
                == 1
            {
                msrs.push((msr, one.as_slice()[0].data));
            }
        }
        Ok(Self {
            regs: fd.get_regs().map_err(MachineError::kvm("KVM_GET_REGS"))?,
            sregs: fd.get_sregs().map_err(MachineError::kvm("KVM_GET_SREGS"))?,
            xsave: fd.get_xsave().map_err(MachineError::kvm("KVM_GET_XSAVE"))?,
            xcrs: fd.get_xcrs().map_err(MachineError::kvm("KVM_GET_XCRS"))?,
            debugregs: fd
                .get_debug_regs()
                .map_err(MachineError::kvm("KVM_GET_DEBUGREGS"))?,
            msrs,
            lapic: fd.get_lapic().map_err(MachineError::kvm("KVM_GET_LAPIC"))?,
            mp_state: fd
                .get_mp_state()
                .map_err(MachineError::kvm("KVM_GET_MP_STATE"))?,
            events: fd
                .get_vcpu_events()
                .map_err(MachineError::kvm("KVM_GET_VCPU_EVENTS"))?,
        })
    }

    /// Installs the state into `fd`, in the order QEMU's KVM target uses (system registers
    /// before registers, MSRs before the LAPIC, events last but the debug registers).
    fn write(&self, fd: &VcpuFd) -> Result<()> {
        fd.set_sregs(&self.sregs)
            .map_err(MachineError::kvm("KVM_SET_SREGS"))?;
        fd.set_regs(&self.regs)
            .map_err(MachineError::kvm("KVM_SET_REGS"))?;
        // The area came from KVM_GET_XSAVE of a vCPU of a VM made the same way (same CPUID,
        // no KVM_CAP_XSAVE2, no dynamically enabled features such as AMX).
        // SAFETY: so it is the 4 KiB legacy layout that KVM_SET_XSAVE reads, and no more.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(MachineError::kvm("KVM_SET_XSAVE"))?;
        fd.set_xcrs(&self.xcrs)
            .map_err(MachineError::kvm("KVM_SET_XCRS"))?;
        let entries: Vec<kvm_msr_entry> = self
            .msrs
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let msrs = Msrs::from_entries(&entries)
            .map_err(|_| MachineError::GuestProtocol("too many carried MSRs"))?;
        let written = fd
            .set_msrs(&msrs)
            .map_err(MachineError::kvm("KVM_SET_MSRS"))?;
        if written != entries.len() {
            return Err(MachineError::GuestProtocol(
                "KVM refused an MSR it had read on the source",
            ));
        }
        fd.set_mp_state(self.mp_state)
            .map_err(MachineError::kvm("KVM_SET_MP_STATE"))?;
        fd.set_lapic(&self.lapic)
            .map_err(MachineError::kvm("KVM_SET_LAPIC"))?;
        fd.set_vcpu_events(&self.events)
            .map_err(MachineError::kvm("KVM_SET_VCPU_EVENTS"))?;
        fd.set_debug_regs(&self.debugregs)
            .map_err(MachineError::kvm("KVM_SET_DEBUGREGS"))?;
        Ok(())
    }

    /// The RIP the vCPU resumes at.
    pub fn rip(&self) -> u64 {
        self.regs.rip
    }
}

/// One saved vCPU.
#[derive(Debug)]
pub struct SavedVcpu {
    /// Which vCPU.
    pub id: VcpuId,
    /// Its KVM state.
    pub kvm: KvmVcpuState,
    /// Its vPMU snapshot, encoded (docs/snapshot.md): untrusted input to a restore.
    pub pmu: Vec<u8>,
    /// Whether a counter of its pCPU's model was enabled at the save (the precise source was
    /// single-stepping it: the save fell inside counting).
    pub counting: bool,
}

/// A saved VM: its vCPUs and each domain's guest memory.
#[derive(Debug)]
pub struct SavedVm {
    /// Every vCPU.
    pub vcpus: Vec<SavedVcpu>,
    /// Each domain's memory, by domain number.
    pub memory: Vec<Vec<u8>>,
}

/// Takes the vPMU snapshot of a switched-out vCPU (a function of the personality's backend,
/// which the run loop's code does not require to snapshot).
type TakeFn<P> = fn(
    &Vpmu<<P as Personality>::Backend>,
    &VcpuPmu<Ctx<P>>,
) -> std::result::Result<VcpuSnapshot, TakeError>;

/// A save a machine was asked for (`Machine::save_after`), and then its outcome.
pub struct SaveSlot<P: Personality> {
    after_exits: u64,
    exits: AtomicU64,
    take: TakeFn<P>,
    outcome: Mutex<Option<std::result::Result<SavedVm, String>>>,
}

impl<P: Personality> std::fmt::Debug for SaveSlot<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveSlot")
            .field("after_exits", &self.after_exits)
            .field("exits", &self.exits)
            .finish_non_exhaustive()
    }
}

impl<P: Personality> SaveSlot<P> {
    /// The saved VM, or why the save failed; None if the run ended before the save point.
    pub fn take(&self) -> Option<std::result::Result<SavedVm, String>> {
        lock_shared(&self.outcome).take()
    }
}

/// Why a saved VM was not restored. Every refusal but `Kvm` changes nothing in the machine
/// (the vPMU verifies before it applies, and memory and KVM state are written after it
/// accepted); after `Kvm` the machine holds a partial restore and is not to be run.
#[derive(Debug)]
pub enum RestoreRefused {
    /// The saved VM's vCPUs or domains are not this machine's (or it has more than one vCPU).
    Layout(&'static str),
    /// A vCPU's PMU bytes are no snapshot.
    Decode(VcpuId, DecodeError),
    /// The vPMU refused a vCPU's snapshot (another shape, policy or an invalid register).
    Snapshot(VcpuId, RestoreError),
    /// KVM refused the state (after the vPMU accepted it).
    Kvm(MachineError),
}

impl<P: Personality> Machine<P>
where
    P::Backend: SnapshotBackend,
{
    /// Saves the VM in its run, at the first exit after `exits` exits that leaves no
    /// instruction half done; the run then ends (its result has no status). One vCPU only.
    pub fn save_after(&mut self, exits: u64) -> Result<Arc<SaveSlot<P>>> {
        if self.layout != Layout::ThreadPerVcpu(1) {
            return Err(MachineError::GuestProtocol(
                "a save is of a one-vCPU machine (Layout::ThreadPerVcpu(1))",
            ));
        }
        let slot = Arc::new(SaveSlot {
            after_exits: exits,
            exits: AtomicU64::new(0),
            take: |vpmu, vcpu| vpmu.take_snapshot(vcpu),
            outcome: Mutex::new(None),
        });
        self.save = Some(slot.clone());
        Ok(slot)
    }

    /// Resumes `saved` in this machine, which must be fresh (never run) and made like the
    /// saved one (same personality, image and layout). The vPMU snapshots are verified and
    /// restored first, so that a refused one changes nothing; then guest memory and the KVM
    /// state are written.
    pub fn restore(&mut self, saved: &SavedVm) -> std::result::Result<(), RestoreRefused> {
        if saved.vcpus.len() != 1 || self.vcpus.len() != 1 || saved.memory.len() != self.vms.len() {
            return Err(RestoreRefused::Layout(
                "a one-vCPU machine restores one vCPU",
            ));
        }
        let (sv, (id, vcpu)) = (&saved.vcpus[0], &self.vcpus[0]);
        if sv.id != *id {
            return Err(RestoreRefused::Layout(
                "the saved vCPU is not this machine's",
            ));
        }
        if saved
            .memory
            .iter()
            .zip(&self.vms)
            .any(|(m, vm)| m.len() != vm.mem.len())
        {
            return Err(RestoreRefused::Layout("guest memory of another size"));
        }
        let snapshot = VcpuSnapshot::decode(&sv.pmu).map_err(|e| RestoreRefused::Decode(*id, e))?;
        let mut masked = false;
        let mut state = PlatformState {
            tsc_khz: vcpu.fd.get_tsc_khz().map_or(1_000_000, u64::from),
            ..PlatformState::default()
        };
        let mut platform = KvmPlatform {
            vm: &self.vms[id.domain as usize],
            vms: &self.vms,
            vcpu: &vcpu.fd,
            me: *id,
            pcpu: 0,
            host: &self.shared.host,
            physical_masked: &mut masked,
            state: &mut state,
        };
        self.shared
            .vpmu
            .restore_snapshot(&mut platform, &self.shared.vcpus, *id, &snapshot)
            .map_err(|e| RestoreRefused::Snapshot(*id, e))?;
        for (memory, vm) in saved.memory.iter().zip(&self.vms) {
            vm.mem.write(0, memory).map_err(RestoreRefused::Kvm)?;
        }
        sv.kvm.write(&vcpu.fd).map_err(RestoreRefused::Kvm)
    }
}

impl<P: Personality> Runner<'_, P> {
    /// At the end of an exit's handling (`settled`: it left no instruction half done): if a
    /// save is due, takes it and returns true (the run ends).
    pub(crate) fn save_if_due(&mut self, settled: bool) -> Result<bool> {
        let Some(slot) = self.save else {
            return Ok(false);
        };
        let seen = slot.exits.fetch_add(1, Ordering::Relaxed);
        if seen < slot.after_exits || !settled || lock_shared(&slot.outcome).is_some() {
            return Ok(false);
        }
        let personality = self.personality;
        let counting = personality.counting(self.model());
        self.complete_requests()?;
        self.switch(None).map_err(|error| MachineError::Core {
            call: "context_switch",
            error,
        })?;
        let outcome = self.save_switched_out(slot.take, counting);
        let failed = outcome.is_err();
        *lock_shared(&slot.outcome) = Some(outcome);
        if failed {
            return Err(MachineError::GuestProtocol(
                "the VM's save failed (SaveSlot::take names why)",
            ));
        }
        Ok(true)
    }

    fn save_switched_out(
        &mut self,
        take: TakeFn<P>,
        counting: bool,
    ) -> std::result::Result<SavedVm, String> {
        let snapshot = {
            let vcpu = self
                .shared
                .vcpus
                .lock(self.me)
                .ok_or("the vCPU is not in the table")?;
            take(&self.shared.vpmu, &vcpu).map_err(|e| format!("take_snapshot: {e:?}"))?
        };
        let mut pmu = vec![0; VcpuSnapshot::MAX_ENCODED_LEN];
        let len = snapshot
            .encode(&mut pmu)
            .map_err(|e| format!("encode: {e:?}"))?;
        pmu.truncate(len);
        let kvm = KvmVcpuState::read(&self.vcpu.fd).map_err(|e| e.to_string())?;
        let memory = self
            .vms
            .iter()
            .map(|vm| vm.mem.to_vec(0, vm.mem.len()))
            .collect::<Option<Vec<_>>>()
            .ok_or("guest memory unreadable")?;
        Ok(SavedVm {
            vcpus: vec![SavedVcpu {
                id: self.me,
                kvm,
                pmu,
                counting,
            }],
            memory,
        })
    }
}
