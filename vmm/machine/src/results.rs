//! What a run reports: per-vCPU results, the PMIs as the VMM saw them, and the lock
//! acquisitions of the calling thread (the SMP design's no-shared-lock goal is checked on them).

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use vpmu::VcpuId;

use crate::platform::PmiContext;

/// What one vCPU's run produced.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    /// The exit status the guest wrote (None: stopped by the VMM).
    pub status: Option<u32>,
    /// Console output.
    pub console: String,
    /// Single-step exits.
    pub steps: u64,
    /// MSR exits.
    pub msr_exits: u64,
    /// PMIs delivered through the LVTPC.
    pub pmis: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// Why the run failed, if it did.
    pub error: Option<String>,
    /// MSR exits and the handler time (ns) spent in them, by handler: `[vpmu, null]`.
    pub msr_exit_ns: [(u64, u64); 2],
    /// Exits and the total user-space time (ns) between `KVM_RUN`s.
    pub user_time: (u64, u64),
    /// Kicks out of `KVM_RUN` (timed overflows, slice ends, the watchdog, other pCPUs'
    /// requests).
    pub kicks: u64,
    /// The interrupted context of each PMI delivered through the LVTPC (the first 65536).
    pub pmi_contexts: Vec<PmiContext>,
    /// The VMM's own record of every PMI the core handled on this vCPU's pCPU, in order: what
    /// ran there and was interrupted, and the outcome (shared layouts: every pCPU's record, pCPU
    /// by pCPU, in the first result; a vCPU's PMIs all come from its one pCPU).
    pub pmi_log: Vec<PmiRecord>,
    /// The core's statistics of this vCPU at the end of the run.
    pub stats: Option<vpmu::VcpuStats>,
    /// The VMM stopped this vCPU before it wrote an exit status (shared pCPU, `finish_with`).
    pub stopped: bool,
    /// Which vCPU this is (None only in a result made before its vCPU existed).
    pub vcpu: Option<VcpuId>,
    /// Nanoseconds this vCPU spent in `KVM_RUN`, not halted (timed source: its CPU time).
    pub guest_ns: u128,
    /// Nanoseconds it spent halted inside `KVM_RUN` (timed source, where KVM's statistics
    /// tell: `halt::HaltClock`); no cycles are counted for them.
    pub halted_ns: u128,
    /// Shared pCPU, a Linux domain's vCPU: its slices that ended with it halted (idling in
    /// `hlt`), and their wall time: what its idling took of the pCPU (`idle`).
    pub idle_slices: u64,
    /// See `idle_slices`.
    pub idle_slice_ns: u128,
    /// Guest memory copied after the run (`Machine::peek_after_run`): (GPA, bytes).
    pub peeked: Vec<(u64, Vec<u8>)>,
    /// Locks taken over the MSR exits answered by the vpmu, each from the exit to the next
    /// entry or to the end of the vCPU's slice (`msr_exit_ns[0].0` exits).
    pub msr_exit_locks: LockCount,
    /// The guest reset the machine through the keyboard controller's reset line (boot mode:
    /// Linux's `reboot -f`, a panic with `panic=-1`). The run ended there.
    pub reset: bool,
    /// The guest powered off (boot mode: halted with interrupts off, as a kernel without
    /// ACPI does). The run ended there.
    pub powered_off: bool,
    /// The host-quirk completions the VMM performed (`quirks`).
    pub completions: crate::Completions,
    /// AMD event selects the guest enabled that the source never counts (they read 0; AMD
    /// has no CPUID to tell the guest), in the order first seen
    /// (`Personality::uncountable_event`).
    pub uncountable_events: Vec<u16>,
    /// Where the time of this vCPU's PMIs went on the VMM's side (`timing`).
    pub pmi_timing: crate::timing::PmiTiming,
    /// What the host's switch-off of the xenpmu interface did, if one was planned and came
    /// due (`Machine::switch_interface_off_after`; domain 0's vCPU 0's result).
    pub interface_off: Option<crate::interface_off::InterfaceOff>,
}

/// One PMI as the VMM saw it: the vCPU that was running on the pCPU (independent of the
/// core's routing), where it was interrupted, and the core's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PmiRecord {
    /// The vCPU the VMM was running when the PMI was raised.
    pub running: VcpuId,
    /// The VMM itself was interrupted, serving `running` (hv mode).
    pub hypervisor: bool,
    /// The interrupted registers the core was given (`Platform::interrupted`: sync regs at
    /// the exit that raised the PMI, or the VMM activity's if `hypervisor`).
    pub regs: vpmu::abi::Regs,
    /// The pCPU whose PMI it was.
    pub pcpu: u32,
    /// `Some(receiver)` if the core delivered it (LVTPC or a page sample), `None` otherwise.
    pub delivered_to: Option<VcpuId>,
    /// The core routed it but dropped it (`PmiOutcome::Dropped`).
    pub dropped: bool,
}

/// Lock acquisitions by the calling thread (`locks_taken`): the goal of the SMP design is no
/// shared lock on a guest's MSR exit (`RunResult::msr_exit_locks`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockCount {
    /// Locks other than a vCPU's own: the VMM's shared structures (a queued LVTPC delivery,
    /// the pCPU handover at a migration, the rendezvous).
    pub shared: u64,
    /// Per-vCPU locks (`VcpuTable::with_vcpu`, the vCPU at hand of an intercept).
    pub vcpu: u64,
}

impl std::ops::Add for LockCount {
    type Output = LockCount;

    fn add(self, other: LockCount) -> LockCount {
        LockCount {
            shared: self.shared + other.shared,
            vcpu: self.vcpu + other.vcpu,
        }
    }
}

impl std::ops::Sub for LockCount {
    type Output = LockCount;

    fn sub(self, other: LockCount) -> LockCount {
        LockCount {
            shared: self.shared - other.shared,
            vcpu: self.vcpu - other.vcpu,
        }
    }
}

thread_local! {
    static LOCKS: Cell<LockCount> = const { Cell::new(LockCount { shared: 0, vcpu: 0 }) };
}

/// The calling thread's lock acquisitions so far.
pub(crate) fn locks_taken() -> LockCount {
    LOCKS.with(Cell::get)
}

/// Locks one vCPU's state (counted as a per-vCPU lock).
pub(crate) fn lock_vcpu<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    LOCKS.with(|l| {
        let mut n = l.get();
        n.vcpu += 1;
        l.set(n);
    });
    lock.lock().expect("a vCPU lock (its holder panicked)")
}

/// Locks a structure several pCPU threads share (counted as a shared lock).
pub(crate) fn lock_shared<T>(lock: &Mutex<T>) -> MutexGuard<'_, T> {
    count_shared_lock();
    lock.lock()
        .expect("a shared VMM lock (its holder panicked)")
}

pub(crate) fn count_shared_lock() {
    LOCKS.with(|l| {
        let mut n = l.get();
        n.shared += 1;
        l.set(n);
    });
}
