//! One vCPU thread: the run loop (requests, entry, exit dispatch, PMI check) and migrations.

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_sync_regs;
use vpmu::{CoreError, CrossCpuRequest, PcpuPmu, PmiOutcome, SystemContext, VcpuId};
use vpmu_models::{ExecMode, SoftwarePmu};

use super::exit::{Exit, MsrHandler};
use super::platform::{KvmPlatform, PlatformState, VmmActivity, paging_of, regs_of};
use super::{Ctx, LockCount, Pcpu, PmiRecord, RunResult, Shared, lock_shared, locks_taken};
use super::{GuestPorts, PortAccess};
use crate::error::{MachineError, Result};
use crate::halt::HaltClock;
use crate::kick::ThreadKick;
use crate::kvm::{GuestDebug, Vcpu, Vm};
use crate::personality::{Personality, Source};
use crate::port;
use crate::rendezvous::{RENDEZVOUS_TIMEOUT, Rendezvous};
use crate::sched::{Slice, thread_cpu_time};

/// One vCPU and the pCPU it runs on: on its own thread (`run`), or time-sliced with others
/// on one thread that is one pCPU (`super::sched`).
pub(super) struct Runner<'a, P: Personality> {
    pub(super) personality: &'a P,
    /// This vCPU's VM (its domain's).
    pub(super) vm: &'a Vm,
    /// Every domain's VM, by domain number.
    pub(super) vms: &'a [Vm],
    pub(super) shared: &'a Shared<P>,
    /// The consumer's ports (`Machine::extend`), if any.
    pub(super) extension: Option<&'a dyn GuestPorts>,
    pub(super) vcpu: Vcpu,
    pub(super) me: VcpuId,
    /// The pCPU (software PMU model) this thread is now; starts as the vCPU index and changes
    /// when the guest asks for a migration.
    pub(super) pcpu: u32,
    pub(super) count: u32,
    /// Rendezvous of all vCPU threads for a migration.
    pub(super) barrier: &'a Rendezvous,
    /// The pCPU, while this vCPU runs on it (a shared pCPU's thread hands it to the vCPU it
    /// runs for the slice).
    pub(super) cpu: Option<Pcpu<P>>,
    pub(super) state: PlatformState,
    pub(super) sync: kvm_sync_regs,
    /// Address of the instruction the next single-step retires.
    pub(super) next_rip: u64,
    pub(super) handler: MsrHandler,
    /// Guest TSC kHz (timed mode).
    pub(super) tsc_khz: u64,
    /// Timed mode: nanoseconds in `KVM_RUN` so far, and the cycles fed for them.
    pub(super) run_ns: u128,
    pub(super) fed_cycles: u64,
    /// Times this vCPU was scheduled in (its slices on a shared pCPU; 1 on its own thread).
    pub(super) slices: u32,
    /// The exit the VMM handled last (what a hypervisor sample caught).
    pub(super) activity: VmmActivity,
    /// What was left of this vCPU's slice when a vCPU sent the PMU VIRQ preempted it (it
    /// resumes the slice after that one: the boost must not shorten the preempted vCPU's
    /// turn, or the samples would decide the schedule).
    pub(super) preempted: Option<Slice>,
    /// Timed mode: the vCPU's halted-time clock (None where KVM does not tell), and the
    /// nanoseconds it spent halted inside `KVM_RUN` so far.
    pub(super) halt: Option<HaltClock>,
    pub(super) halted_ns: u128,
    /// The vCPU was halted in its last `KVM_RUN`; it was still halted at that run's exit.
    pub(super) halted_in_run: bool,
    pub(super) halted_at_entry: bool,
    /// Boot-image mode: the PC devices, which replace the project's guest ports.
    pub(super) devices: Option<crate::boot::PcDevices>,
    /// The next entry single-steps once over a handler's breakpoint (`rdpmc`, `complete`).
    pub(super) stepping_over: bool,
    /// The host quirks the VMM completes, and how often it did.
    pub(super) quirks: &'a crate::quirks::HostQuirks,
    pub(super) completions: crate::Completions,
    /// Timed mode on a host that emulates CPL0: each run's time split between the levels by
    /// the instructions KVM emulated in it (`timed`).
    pub(super) split: Option<crate::timed::CplSplit>,
    /// A shared pCPU's halting vCPU with others waiting: look this often whether it halted
    /// (its `hlt` blocks in `KVM_RUN`; `idle`).
    pub(super) halt_check: Option<Duration>,
    /// Domain 0's vCPU 0: the host's planned switch-off of the interface (`interface_off`).
    pub(super) interface_off: Option<crate::interface_off::Plan>,
    /// A save of the VM asked for (`crate::save`).
    pub(super) save: Option<&'a crate::save::SaveSlot<P>>,
}

/// A runner's view for one call into the core: the platform, its pCPU's parts, the shared
/// state.
pub(super) struct Parts<'r, P: Personality> {
    pub(super) platform: KvmPlatform<'r>,
    pub(super) pmu: &'r mut PcpuPmu<Ctx<P>, P::Model>,
    pub(super) requests: &'r Receiver<CrossCpuRequest>,
    pub(super) pmi_log: &'r mut Vec<PmiRecord>,
    pub(super) shared: &'r Shared<P>,
}

/// At most this many PMIs are kept in the VMM's record (`RunResult::pmi_log`): a minute of
/// sampling at 10 kHz fits.
const MAX_PMI_LOG: usize = 1 << 20;

impl<'a, P: Personality> Runner<'a, P> {
    /// This runner's view for a call into the core. Panics if it does not hold its pCPU: the
    /// run loop only runs with it.
    pub(super) fn parts(&mut self) -> Parts<'_, P> {
        let cpu = self
            .cpu
            .as_mut()
            .expect("a vCPU runs only while it holds its pCPU");
        let pcpu = cpu.pmu.index();
        Parts {
            platform: KvmPlatform {
                vm: self.vm,
                vms: self.vms,
                vcpu: &self.vcpu.fd,
                me: self.me,
                pcpu,
                host: &self.shared.host,
                physical_masked: &mut cpu.masked,
                state: &mut self.state,
            },
            pmu: &mut cpu.pmu,
            requests: &cpu.requests,
            pmi_log: &mut cpu.pmi_log,
            shared: self.shared,
        }
    }

    /// This pCPU's software PMU model.
    pub(super) fn model(&mut self) -> &mut P::Model {
        self.cpu
            .as_mut()
            .expect("a vCPU runs only while it holds its pCPU")
            .pmu
            .hw_mut()
    }

    /// Completes the requests other pCPUs sent this one, in order (before the next guest
    /// entry). Lock-free when there are none.
    pub(super) fn complete_requests(&mut self) -> Result<()> {
        loop {
            let Some(request) = self.parts().requests.try_recv().ok() else {
                return Ok(());
            };
            // A `CatchUp` that saves this vCPU delivers an overflow the save found at once.
            self.recording_kept_pending(|p| {
                p.shared
                    .vpmu
                    .complete_request(&mut p.platform, p.pmu, &p.shared.vcpus, request)
            })
            .map_err(|error| MachineError::Request { request, error })?;
        }
    }

    /// `Vpmu::context_switch` of this pCPU to this runner's vCPU (`Some`) or to none.
    pub(super) fn switch(&mut self, next: Option<VcpuId>) -> Result<(), CoreError> {
        if next.is_some() {
            self.recording_kept_pending(|p| {
                p.shared
                    .vpmu
                    .context_switch(&mut p.platform, p.pmu, &p.shared.vcpus, next)
            })
        } else {
            let mut p = self.parts();
            p.shared
                .vpmu
                .context_switch(&mut p.platform, p.pmu, &p.shared.vcpus, None)
        }
    }

    /// Runs `call`, in which the core may route an overflow kept pending with this vCPU's
    /// context (delivered where the vCPU resumes, `Platform::resume_regs`), and records such
    /// a PMI in the pCPU's PMI log as `check_pmi` records the others.
    fn recording_kept_pending<R>(&mut self, call: impl FnOnce(&mut Parts<'_, P>) -> R) -> R {
        let me = self.me;
        let stats = |r: &Self| r.shared.vcpus.lock(me).map(|v| *v.stats());
        let before = stats(self);
        let out = call(&mut self.parts());
        let after = stats(self);
        if let (Some(b), Some(a)) = (before, after) {
            if a.pmis_kept_pending > b.pmis_kept_pending {
                let delivered = a.pmis_delivered > b.pmis_delivered;
                let dropped = a.pmis_dropped > b.pmis_dropped;
                let regs = self.state.regs;
                self.log_pmi(PmiRecord {
                    running: me,
                    hypervisor: false,
                    regs,
                    pcpu: self.pcpu,
                    delivered_to: delivered.then_some(me),
                    dropped,
                });
            }
        }
        out
    }

    fn log_pmi(&mut self, record: PmiRecord) {
        let log = self.parts().pmi_log;
        if log.len() < MAX_PMI_LOG {
            log.push(record);
        }
    }

    /// The end of this thread's time as its pCPU: completes what was sent to it, switches
    /// the vCPU off (saving its context), and takes the pCPU out of service, so that no policy
    /// change waits for it any more. Returns the pCPU's PMI record.
    pub(super) fn leave_pcpu(&mut self) -> (Vec<PmiRecord>, Option<MachineError>) {
        if self.cpu.is_none() {
            return (Vec::new(), None);
        }
        let mut error = self.complete_requests().err();
        if let Err(e) = self.switch(None) {
            error.get_or_insert(MachineError::Core {
                call: "context_switch",
                error: e,
            });
        }
        let Some(mut cpu) = self.cpu.take() else {
            return (Vec::new(), error);
        };
        let log = std::mem::take(&mut cpu.pmi_log);
        let mut masked = cpu.masked;
        let mut platform = KvmPlatform {
            vm: self.vm,
            vms: self.vms,
            vcpu: &self.vcpu.fd,
            me: self.me,
            pcpu: cpu.pmu.index(),
            host: &self.shared.host,
            physical_masked: &mut masked,
            state: &mut self.state,
        };
        if let Err(e) = self
            .shared
            .vpmu
            .detach_pcpu(&mut platform, cpu.pmu, &self.shared.vcpus)
        {
            error.get_or_insert(MachineError::Core {
                call: "detach_pcpu",
                error: e.error,
            });
        }
        (log, error)
    }

    /// `inl` from the migrate port: every vCPU moves to the next pCPU ((p + 1) mod n), all at
    /// once: each thread switches its vCPU off its pCPU (saving it from that model) and parks
    /// the pCPU; once all are parked, each takes over the next pCPU and switches its vCPU in
    /// there (loading it onto that model). Returns the new pCPU.
    pub(super) fn migrate(&mut self, kick: &ThreadKick<'_>) -> Result<u32> {
        if self.vms.len() > 1 {
            // Several domains share one pCPU on one thread: nobody else would arrive.
            return Err(MachineError::GuestProtocol(
                "migration is only for the vCPUs of a one-domain run",
            ));
        }
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        let (from, to) = (self.pcpu, (self.pcpu + 1) % self.count);
        let mut result = self
            .complete_requests()
            .and_then(|()| {
                self.switch(None).map_err(|error| MachineError::Core {
                    call: "context_switch",
                    error,
                })
            })
            .map_err(|e| MachineError::MigrationOff {
                from,
                source: Box::new(e),
            });
        kick.unregister(from);
        let parked = self.cpu.take();
        *lock_shared(&self.shared.parking[from as usize]) = parked;
        // Every vCPU is off its pCPU before any is loaded onto another.
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        self.cpu = lock_shared(&self.shared.parking[to as usize]).take();
        if self.cpu.is_none() {
            return Err(MachineError::NotHandedOver(to));
        }
        self.pcpu = to;
        kick.register(to);
        if result.is_ok() {
            result = self
                .switch(Some(self.me))
                .map_err(|error| MachineError::MigrationOnto { to, error });
        }
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        result.map(|()| to)
    }

    pub(super) fn run(mut self, timeout: Duration) -> RunResult {
        let start = Instant::now();
        let mut result = RunResult::default();
        let switched = self.switch(Some(self.me));
        // The next step retires the instruction at RIP (a restored vCPU may resume counting).
        self.next_rip = self.vcpu.fd.get_regs().map_or(0, |r| r.rip);
        if let Some(cpu) = self.cpu.as_mut() {
            cpu.ring_poll.vcpus = vec![self.me];
        }
        // The kicker serves the timed source's overflows, the requests of other pCPUs and, in
        // both modes, the watchdog: a guest spinning without exits is kicked out at the timeout.
        let kick = ThreadKick::new(self.vcpu.fd.get_kvm_run(), &self.shared.host);
        self.slices += 1;
        let outcome = match (switched, kick) {
            (Ok(()), Ok(kick)) => {
                kick.register(self.pcpu);
                let outcome = self
                    .run_loop(timeout, start, &mut result, &kick, None)
                    .map(|_| ());
                let (_, left) = self.leave_pcpu();
                outcome.and_then(|()| left.map_or(Ok(()), Err))
            }
            (Err(error), _) => Err(MachineError::Core {
                call: "context_switch",
                error,
            }),
            (_, Err(e)) => Err(e),
        };
        if outcome.is_err() {
            // Out of service on every path, so that the other threads' changes never wait
            // for this pCPU.
            let _ = self.leave_pcpu();
        }
        result.elapsed = start.elapsed();
        result.pmis = self.state.pmis;
        result.pmi_timing = self.state.timing;
        result.guest_ns = self.run_ns;
        result.halted_ns = self.halted_ns;
        result.vcpu = Some(self.me);
        result.pmi_contexts = std::mem::take(&mut self.state.pmi_contexts);
        result.completions = self.completions;
        if let Err(e) = outcome {
            result.error = Some(e.to_string());
        }
        result
    }

    /// Runs the vCPU until it writes its exit status (`Ok(true)`) or, with `slice`, until
    /// the slice is over (`Ok(false)`; `preempted` holds what was left of it if another
    /// vCPU of the pCPU was sent the PMU VIRQ).
    pub(super) fn run_loop(
        &mut self,
        timeout: Duration,
        start: Instant,
        result: &mut RunResult,
        kick: &ThreadKick<'_>,
        slice: Option<Slice>,
    ) -> Result<bool> {
        let mut back: Option<Instant> = None;
        let mut armed: Option<Instant> = None;
        let precise = self.personality.source() == Source::Precise;
        let split = !precise && self.split.is_some();
        // Boot mode: a guest that powered off (halted with interrupts off) is looked for at
        // least this often (`boot::POWER_CHECK`).
        let mut power_check = self
            .devices
            .as_ref()
            .map(|_| Instant::now() + crate::boot::POWER_CHECK);
        let mut exits = 0u64;
        // The locks taken since the last exit, if it was a PMU MSR exit the vpmu answered.
        let mut msr_exit: Option<LockCount> = None;
        // A slice is a budget: of exits with the precise source (a single-stepped instruction
        // is one exit), of the thread's CPU time with the timed source (the vCPU's time on the
        // pCPU: guest time and the VMM's serving it, as a hypervisor charges a vCPU's credit;
        // never the time the host ran other threads, nor a halt). Exits are no measure of
        // time there, and a budget of wall time would let a loaded host's preemptions decide
        // who gets the pCPU's cycles.
        let slice_exits = slice.filter(|_| precise).map(|s| s.exits);
        let slice_cpu = slice
            .filter(|_| !precise)
            .map(|s| (thread_cpu_time(), s.time));
        self.halted_in_run = false;
        loop {
            if start.elapsed() > timeout {
                return Err(MachineError::Timeout(timeout));
            }
            // While this vCPU's page holds the pCPU's system-wide sample (all mode), the
            // pCPU's counters are stopped for every vCPU until it flushes: its slice does not
            // end (any other vCPU would run uncounted, and the domains that run then would
            // lose samples).
            let reading = self.reads_frozen_sample();
            let time_left =
                slice_cpu.map(|(t0, budget)| budget.saturating_sub(thread_cpu_time() - t0));
            // A vCPU that halted blocks: it gives the rest of its slice up.
            if !reading
                && (slice_exits.is_some_and(|n| exits >= n)
                    || time_left.is_some_and(|t| t.is_zero())
                    || (slice.is_some() && self.halted_in_run))
            {
                // The slice ends after that exit: its locks are counted up to here.
                if let Some(at) = msr_exit.take() {
                    result.msr_exit_locks = result.msr_exit_locks + (locks_taken() - at);
                }
                return Ok(false);
            }
            exits += 1;
            // What other pCPUs need of this one happens before the entry (their kick brought
            // the vCPU out of KVM_RUN).
            self.complete_requests()?;
            let interface_off = self.switch_interface_off_when_due(result)?;
            self.poll_rings()?;
            if let Some(s) = slice.filter(|_| !reading && self.shared.host.woken_on(self.pcpu)) {
                // Another vCPU of this pCPU was sent the PMU VIRQ: let it run now, and come
                // back for the rest of this slice.
                self.preempted = Some(Slice {
                    exits: slice_exits.map_or(s.exits, |n| n.saturating_sub(exits).max(1)),
                    time: time_left.unwrap_or(s.time),
                });
                if let Some(at) = msr_exit.take() {
                    result.msr_exit_locks = result.msr_exit_locks + (locks_taken() - at);
                }
                return Ok(false);
            }
            if self.shared.host.has_queued(self.me) {
                self.deliver_queued();
            }
            let mode = self.mode();
            let personality = self.personality;
            let model = self.model();
            let counting = personality.counting(model);
            // The model's own arithmetic on this thread's model: no copy, no lock.
            let until_pmi = if counting && !precise {
                let here = model.cycles_until_pmi(mode);
                if split {
                    // A run's time may go to either level: the nearer overflow decides (the
                    // kick re-arms after it if it was early).
                    let other = ExecMode {
                        cpl: if mode.cpl == 3 { 0 } else { 3 },
                        host: false,
                    };
                    [here, model.cycles_until_pmi(other)]
                        .into_iter()
                        .flatten()
                        .min()
                } else {
                    here
                }
            } else {
                None
            };
            let step = precise && counting;
            // Round the overflow deadline up: the kick must not land before the overflow.
            let overflow = until_pmi.map(|cycles| {
                let mut ns = (u128::from(cycles) * 1_000_000).div_ceil(u128::from(self.tsc_khz));
                if split {
                    // The deadline assumes the nearer level's counter gets all the time; a
                    // vCPU that stays at the other level would be kicked at once, again and
                    // again, and never run (a user-only counter just short of its overflow
                    // while the kernel runs).
                    ns = ns.max(crate::timed::MIN_SPLIT_KICK_NS);
                }
                Instant::now() + Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            });
            self.state.kick_deadline = overflow;
            let watchdog = start + timeout;
            let mut deadline = overflow.map_or(watchdog, |o| o.min(watchdog));
            if let Some(left) = time_left.filter(|_| !reading) {
                // Early if the host preempts the thread: the loop then enters again for the
                // rest.
                deadline = deadline.min(Instant::now() + left);
            }
            if let Some(every) = self.halt_check {
                deadline = deadline.min(Instant::now() + every);
            }
            deadline = interface_off.map_or(deadline, |at| deadline.min(at));
            if let Some(at) = power_check {
                if Instant::now() >= at {
                    power_check = Some(Instant::now() + crate::boot::POWER_CHECK);
                }
                deadline = deadline.min(power_check.unwrap_or(at));
            }
            if armed != Some(deadline) {
                kick.kick().arm(Some(deadline));
                armed = Some(deadline);
            }
            let debug = if step || self.stepping_over {
                GuestDebug::SingleStep
            } else {
                self.unstepped_debug()
            };
            self.vcpu.set_debug(debug)?;
            if !step {
                // An injected interrupt's handler runs unstepped: nothing to attribute.
                self.state.injected = None;
            }
            if let Some(t) = back.take() {
                let vmm_time = t.elapsed();
                result.user_time.0 += 1;
                result.user_time.1 += vmm_time.as_nanos() as u64;
                if !precise {
                    self.feed_vmm_cycles(vmm_time)?;
                }
            }
            if let Some(at) = msr_exit.take() {
                result.msr_exit_locks = result.msr_exit_locks + (locks_taken() - at);
            }
            let on_cpu = (!precise).then(thread_cpu_time);
            let entered = Instant::now();
            let exit = self.next_exit()?;
            let ran = entered.elapsed();
            // The thread's CPU time in the run, which leaves out the time the host ran other
            // threads (a loaded host preempts a vCPU thread inside KVM_RUN for milliseconds;
            // the guest ran none of it).
            let on_cpu = on_cpu.map_or(ran, |t| thread_cpu_time().saturating_sub(t));
            back = Some(Instant::now());
            let locks_at_exit = locks_taken();
            self.sync = self.vcpu.fd.sync_regs();
            self.state.regs = regs_of(&self.sync);
            self.state.paging = paging_of(&self.sync);
            if !precise {
                self.feed_cycles(ran, on_cpu, mode);
            }
            // The MMIO port window's writes are `outl`s of the project's ports.
            let (exit, via_window) = match self.window_exit(exit)? {
                crate::window::Routed::Exit(exit, via_window) => (exit, via_window),
                crate::window::Routed::Handled => {
                    self.check_pmi()?;
                    continue;
                }
            };
            self.activity = match &exit {
                Exit::Rdmsr { .. } | Exit::Wrmsr { .. } => VmmActivity::MsrAccess,
                Exit::In {
                    port: port::HYPERCALL,
                    ..
                } => VmmActivity::Hypercall,
                Exit::In { .. } | Exit::Out { .. } => VmmActivity::PortIo,
                Exit::Kicked => VmmActivity::Kick,
                _ => VmmActivity::Other,
            };
            if self.activity == VmmActivity::MsrAccess && self.handler == MsrHandler::Vpmu {
                msr_exit = Some(locks_at_exit);
            }
            // Boot mode: the PC devices take their exits first (not the window's).
            if self.devices.is_some() && !via_window {
                if let Some(ended) = self.device_exit(&exit, result)? {
                    if ended {
                        return Ok(true);
                    }
                    self.check_pmi()?;
                    continue;
                }
            }
            if let Exit::Out { port, value, .. } = exit {
                self.release_on(port, value);
            }
            let settled = matches!(exit, Exit::Debug { .. } | Exit::Kicked);
            match exit {
                Exit::Debug { pc } if matches!(debug, GuestDebug::Breakpoints([Some(at), _]) if at == pc) =>
                {
                    // The guest's #GP handler is about to run: a faulting RDPMC?
                    self.rdpmc_at_gp_handler()?;
                }
                Exit::Debug { pc } if matches!(debug, GuestDebug::Breakpoints([_, Some(at)]) if at == pc) =>
                {
                    // The guest's #PF handler is about to run: a SYSCALL left at CPL3?
                    self.syscall_at_pf_handler()?;
                }
                Exit::Debug { pc } => {
                    result.steps += 1;
                    self.stepping_over = false;
                    if step {
                        self.retire(pc);
                        self.next_rip = pc;
                        self.rdpmc_at_step()?;
                    } else {
                        // A step over the #GP handler's breakpoint: nothing counts.
                        self.next_rip = pc;
                    }
                }
                Exit::Rdmsr { index, data, error } => {
                    result.msr_exits += 1;
                    self.observe_msr(index, None);
                    self.next_rip = self.sync.regs.rip;
                    let t = Instant::now();
                    let value = self.rdmsr(index);
                    self.account(result, t);
                    // SAFETY: both point into the vCPU's kvm_run page, mapped while the vCPU
                    // fd lives; no reference to that page is alive now.
                    unsafe {
                        match value {
                            Some(v) => *data = v,
                            None => *error = 1,
                        }
                    }
                }
                Exit::Wrmsr {
                    index,
                    value,
                    error,
                } => {
                    result.msr_exits += 1;
                    self.observe_msr(index, Some(value));
                    self.next_rip = self.sync.regs.rip;
                    let t = Instant::now();
                    let ok = self.wrmsr(index, value);
                    self.account(result, t);
                    if let Some(event) = ok
                        .then(|| self.personality.uncountable_event(index, value))
                        .flatten()
                    {
                        if !result.uncountable_events.contains(&event) {
                            result.uncountable_events.push(event);
                        }
                    }
                    if !ok {
                        // SAFETY: as for reads.
                        unsafe { *error = 1 };
                    }
                }
                Exit::InternalError => {
                    if !self.complete_unemulated()? {
                        return Err(MachineError::UnexpectedExit(format!(
                            "KVM_EXIT_INTERNAL_ERROR at RIP {:#x} (CPL {})",
                            self.sync.regs.rip,
                            self.sync.sregs.cs.selector & 3
                        )));
                    }
                }
                Exit::Out { port, value, .. } => match port {
                    port::CONSOLE => result.console.push(char::from(value as u8)),
                    port::EXIT => {
                        result.status = Some(value);
                        return Ok(true);
                    }
                    port::YIELD if slice.is_some() => {
                        self.check_pmi()?;
                        // A vCPU whose page holds the pCPU's sample does not give the pCPU
                        // up (as a hypervisor's block returns at once with an event pending):
                        // it takes the VIRQ at its next entry.
                        if !self.reads_frozen_sample() {
                            return Ok(false);
                        }
                    }
                    // An OUT to the transport's port is no call: ignored. START is the
                    // hold's (`release_on`).
                    port::HYPERCALL | port::START => {}
                    port::CONTROL => {
                        self.handler = if value == 1 {
                            MsrHandler::Null
                        } else {
                            MsrHandler::Vpmu
                        }
                    }
                    other => {
                        if let Some(extension) = self.extension {
                            let access = PortAccess {
                                vcpu: self.me,
                                memory: &self.vm.mem,
                            };
                            extension.out(access, other, value).map_err(|message| {
                                MachineError::Port {
                                    port: other,
                                    value,
                                    message,
                                }
                            })?;
                        }
                    }
                },
                Exit::In { port, data, len } => {
                    let value = match port {
                        port::HYPERCALL => self.hypercall(len, start + timeout)?,
                        port::MIGRATE => self.migrate(kick)?,
                        port::SLICES => self.slices,
                        port::PMI_CONTEXT => {
                            self.state.last_pmi.map_or(u32::MAX, |c| c.port_value())
                        }
                        _ => u32::MAX,
                    };
                    let bytes = value.to_le_bytes();
                    // SAFETY: `data` points at `len` bytes of the kvm_run page (the I/O data
                    // area KVM named in the exit), alive while the vCPU fd lives.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data, len.min(4)) };
                }
                Exit::Kicked => {
                    result.kicks += 1;
                    // The kicker fired and forgot its deadline (or another pCPU kicked: the
                    // deadline is re-armed either way).
                    armed = None;
                }
                Exit::MmioRead { addr, .. } | Exit::MmioWrite { addr, .. } => {
                    return Err(MachineError::UnexpectedExit(format!(
                        "MMIO outside RAM and the port window, at {addr:#x}"
                    )));
                }
                Exit::Shutdown => {
                    return Err(MachineError::UnexpectedExit(
                        "the vCPU shut down (a triple fault)".into(),
                    ));
                }
                Exit::Other(what) => return Err(MachineError::UnexpectedExit(what)),
            }
            self.check_pmi()?;
            if self.save_if_due(settled)? {
                return Ok(true);
            }
        }
    }

    /// Whether this pCPU's system-wide counters (all mode) are stopped with their sample
    /// cached in this vCPU's page: until it flushes, nothing counts on the pCPU.
    pub(super) fn reads_frozen_sample(&self) -> bool {
        self.cpu.as_ref().is_some_and(|cpu| {
            matches!(cpu.pmu.system(), SystemContext::Cached { profiler, .. } if *profiler == self.me)
        })
    }

    /// Tells the consumer's extension, if any, of a PMU MSR exit of this vCPU.
    fn observe_msr(&self, msr: u32, write: Option<u64>) {
        if let Some(extension) = self.extension {
            let access = PortAccess {
                vcpu: self.me,
                memory: &self.vm.mem,
            };
            extension.msr(access, msr, write);
        }
    }

    /// The guest's execution mode at the last exit.
    pub(super) fn mode(&self) -> ExecMode {
        ExecMode {
            cpl: (self.sync.sregs.cs.selector & 3) as u8,
            host: false,
        }
    }

    /// Performs the LVTPC deliveries queued for this vCPU by other threads or vCPUs
    /// (`LvtpcDelivery::Queued`) on its own LAPIC, before its next entry, and reports each
    /// outcome to the core.
    fn deliver_queued(&mut self) {
        let me = self.me;
        let shared = self.shared;
        for q in shared.host.take_queued(me) {
            let delivered = self
                .parts()
                .platform
                .inject_lvtpc(q.mask_on_delivery, q.context);
            if let Some(mut v) = shared.vcpus.lock(me) {
                shared.vpmu.lvtpc_delivery_done(&mut v, delivered);
            }
        }
    }

    pub(super) fn check_pmi(&mut self) -> Result<()> {
        let pcpu = self.pcpu;
        let mut p = self.parts();
        if *p.platform.physical_masked || !p.pmu.hw_mut().take_pmi() {
            return Ok(());
        }
        let entered = Instant::now();
        let outcome = p
            .shared
            .vpmu
            .handle_pmi(&mut p.platform, p.pmu, &p.shared.vcpus);
        let late = crate::timing::lateness(p.platform.state.kick_deadline.take(), entered);
        p.platform.state.timing.record(entered.elapsed(), late);
        if let Ok(o) = outcome {
            let delivered_to = match o {
                PmiOutcome::Delivered { to, .. } => Some(to),
                _ => None,
            };
            if p.pmi_log.len() < MAX_PMI_LOG {
                p.pmi_log.push(PmiRecord {
                    running: p.platform.me,
                    hypervisor: p.platform.state.hypervisor.is_some(),
                    regs: p.platform.interrupted_regs(),
                    pcpu,
                    delivered_to,
                    dropped: matches!(o, PmiOutcome::Dropped { .. }),
                });
            }
        }
        outcome.map(|_| ()).map_err(|error| MachineError::Core {
            call: "handle_pmi",
            error,
        })
    }
}
