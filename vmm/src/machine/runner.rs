//! One vCPU thread: the run loop (entry, exit dispatch, PMI check) and migrations.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use kvm_bindings::kvm_sync_regs;
use vpmu::{ExecMode, PmiOutcome, SoftwarePmu, VcpuId};

use super::exit::{Exit, MsrHandler};
use super::platform::{KvmPlatform, PlatformState, VmmActivity, regs_of};
use super::{Core, PmiRecord, RunResult};
use crate::guest::port;
use crate::kick::Kick;
use crate::kvm::{Vcpu, Vm};
use crate::personality::{Personality, Source};

/// One vCPU and the pCPU it runs on: on its own thread (`run`), or time-sliced with others
/// on one thread that is one pCPU (`super::sched`).
pub(super) struct Runner<'a, P: Personality> {
    pub(super) personality: &'a P,
    /// This vCPU's VM (its domain's).
    pub(super) vm: &'a Vm,
    /// Every domain's VM, by domain number.
    pub(super) vms: &'a [Vm],
    /// vCPUs per domain, by domain number.
    pub(super) counts: &'a [u32],
    pub(super) core: &'a Mutex<Core<P>>,
    pub(super) pages: &'a Mutex<Vec<(u32, u64)>>,
    /// Samples shipped through `port::BATCH` by every vCPU of the run.
    pub(super) shipped: &'a AtomicU64,
    pub(super) vcpu: Vcpu,
    pub(super) me: VcpuId,
    /// The pCPU (software PMU model) this thread is now; starts as the vCPU index and changes
    /// when the guest asks for a migration.
    pub(super) pcpu: u32,
    pub(super) count: u32,
    /// Rendezvous of all vCPU threads for a migration.
    pub(super) barrier: &'a Rendezvous,
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
    /// Shared pCPU: the other vCPUs time-sliced on this one's pCPU (set by `sched`).
    pub(super) group: Vec<VcpuId>,
}

/// At most this many PMIs are kept in the VMM's record (`RunResult::pmi_log`): a minute of
/// sampling at 10 kHz fits.
const MAX_PMI_LOG: usize = 1 << 20;

/// Timed mode on a shared pCPU: the longest slice.
pub(super) const SLICE_TIME: Duration = Duration::from_millis(1);

/// How long a vCPU waits for the others at a migration before giving up.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(10);

/// A reusable barrier that gives up after a timeout (a vCPU that died never arrives).
pub(super) struct Rendezvous {
    count: usize,
    /// Generation and arrivals in it.
    state: Mutex<(u64, usize)>,
    all_arrived: Condvar,
}

impl Rendezvous {
    pub(super) fn new(count: usize) -> Self {
        Self {
            count,
            state: Mutex::new((0, 0)),
            all_arrived: Condvar::new(),
        }
    }

    pub(super) fn wait(&self, timeout: Duration) -> io::Result<()> {
        let poisoned = |_| io::Error::other("rendezvous lock poisoned");
        let mut state = self.state.lock().map_err(poisoned)?;
        let generation = state.0;
        state.1 += 1;
        if state.1 == self.count {
            *state = (generation + 1, 0);
            self.all_arrived.notify_all();
            return Ok(());
        }
        let (state, _) = self
            .all_arrived
            .wait_timeout_while(state, timeout, |s| s.0 == generation)
            .map_err(|_| io::Error::other("rendezvous lock poisoned"))?;
        if state.0 == generation {
            return Err(io::Error::other(
                "another vCPU never reached the rendezvous",
            ));
        }
        Ok(())
    }
}

impl<P: Personality> Runner<'_, P> {
    pub(super) fn pcpu(&self) -> usize {
        self.pcpu as usize
    }

    /// `inl` from the migrate port: every vCPU moves to the next pCPU ((p + 1) mod n), all at
    /// once, through `Vpmu::context_switch` (saves on the old pCPU's model, loads on the new
    /// one). Returns the new pCPU.
    pub(super) fn migrate(&mut self) -> io::Result<u32> {
        if self.counts.len() > 1 {
            // Several domains share one pCPU on one thread: nobody else would arrive.
            return Err(io::Error::other(
                "migration is only for the vCPUs of a one-domain run",
            ));
        }
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        let mut result = Ok(());
        if self.me.vcpu == 0 {
            let n = self.count;
            let domain = self.me.domain;
            result = with_core!(self, |platform, core| {
                let on: Vec<u32> = (0..n)
                    .map(|v| {
                        let id = VcpuId { domain, vcpu: v };
                        core.vcpus
                            .vcpu(id)
                            .and_then(|c| c.running_on())
                            .unwrap_or(v)
                    })
                    .collect();
                let switched: Result<(), vpmu::MsrFault> = (0..n)
                    .try_for_each(|p| {
                        core.vpmu.context_switch(
                            &mut platform,
                            &mut core.pcpus,
                            &mut core.vcpus,
                            p,
                            None,
                        )
                    })
                    .and_then(|()| {
                        // vCPU v ran on pCPU p; it now runs on pCPU (p + 1) mod n.
                        (0..n).try_for_each(|v| {
                            let next = VcpuId { domain, vcpu: v };
                            let p = (on[v as usize] + 1) % n;
                            core.vpmu.context_switch(
                                &mut platform,
                                &mut core.pcpus,
                                &mut core.vcpus,
                                p,
                                Some(next),
                            )
                        })
                    });
                switched
            });
        }
        self.barrier.wait(RENDEZVOUS_TIMEOUT)?;
        result.map_err(|e| io::Error::other(format!("migration: {e:?}")))?;
        self.pcpu = (self.pcpu + 1) % self.count;
        Ok(self.pcpu)
    }

    pub(super) fn run(mut self, timeout: Duration) -> RunResult {
        let start = Instant::now();
        let mut result = RunResult::default();
        let pcpu = self.pcpu;
        let me = self.me;
        let switched = with_core!(self, |platform, core| core.vpmu.context_switch(
            &mut platform,
            &mut core.pcpus,
            &mut core.vcpus,
            pcpu,
            Some(me)
        ));
        // The kicker serves the timed source's overflows and, in both modes, the watchdog: a
        // guest spinning without exits is kicked out at the timeout.
        let kick = Kick::new(self.vcpu.fd.get_kvm_run());
        self.slices += 1;
        let outcome = match (switched, kick) {
            (Ok(()), Ok(kick)) => self
                .run_loop(timeout, start, &mut result, &kick, None)
                .map(|_| ()),
            (Err(e), _) => Err(io::Error::other(format!("context_switch: {e:?}"))),
            (_, Err(e)) => Err(io::Error::other(e)),
        };
        result.elapsed = start.elapsed();
        result.pmis = self.state.pmis;
        result.vcpu = Some(self.me);
        result.pmi_contexts = std::mem::take(&mut self.state.pmi_contexts);
        if let Err(e) = outcome {
            result.error = Some(e.to_string());
        }
        result
    }

    /// Runs the vCPU until it writes its exit status (`Ok(true)`) or, with `slice`, until
    /// that many exits have been handled (`Ok(false)`: the slice is over).
    pub(super) fn run_loop(
        &mut self,
        timeout: Duration,
        start: Instant,
        result: &mut RunResult,
        kick: &Kick,
        slice: Option<u64>,
    ) -> io::Result<bool> {
        let mut back: Option<Instant> = None;
        let mut armed: Option<Instant> = None;
        let precise = self.personality.source() == Source::Precise;
        let mut exits = 0u64;
        // Timed mode on a shared pCPU: a slice also ends after `SLICE_TIME` (a CPL3 workload
        // may run without exits for as long as no counter is about to overflow).
        let slice_end = (slice.is_some() && !precise).then(|| Instant::now() + SLICE_TIME);
        loop {
            if start.elapsed() > timeout {
                return Err(io::Error::other(format!("timeout after {timeout:?}")));
            }
            if slice.is_some_and(|n| exits >= n) || slice_end.is_some_and(|e| Instant::now() >= e) {
                return Ok(false);
            }
            exits += 1;
            let (counting, until_pmi, queued) = {
                let core = self.core.lock().expect("vpmu core lock");
                if slice.is_some() && core.wake.iter().any(|w| self.group.contains(w)) {
                    // Another vCPU of this pCPU was sent the PMU VIRQ: let it run now.
                    return Ok(false);
                }
                let queued = core.queued_lvtpc.iter().any(|q| q.to == self.me);
                let model = core.pcpus[self.pcpu()].hw();
                let counting = self.personality.counting(model);
                let until = if counting && !precise {
                    model.cycles_until_pmi(self.mode())
                } else {
                    None
                };
                (counting, until, queued)
            };
            if queued {
                self.deliver_queued();
            }
            let step = precise && counting;
            // Round the overflow deadline up: the kick must not land before the overflow.
            let overflow = until_pmi.map(|cycles| {
                let ns = (u128::from(cycles) * 1_000_000).div_ceil(u128::from(self.tsc_khz));
                Instant::now() + Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64)
            });
            let watchdog = start + timeout;
            let mut deadline = overflow.map_or(watchdog, |o| o.min(watchdog));
            if let Some(end) = slice_end {
                deadline = deadline.min(end);
            }
            if armed != Some(deadline) {
                kick.arm(Some(deadline));
                armed = Some(deadline);
            }
            self.vcpu.set_stepping(step)?;
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
            let entered = Instant::now();
            let exit = self.next_exit()?;
            let ran = entered.elapsed();
            back = Some(Instant::now());
            self.sync = self.vcpu.fd.sync_regs();
            self.state.regs = regs_of(&self.sync);
            if !precise {
                self.feed_cycles(ran);
            }
            self.activity = match &exit {
                Exit::Rdmsr { .. } | Exit::Wrmsr { .. } => VmmActivity::MsrAccess,
                Exit::In {
                    port: port::HYPERCALL,
                    ..
                } => VmmActivity::Hypercall,
                Exit::In { .. } | Exit::Out { .. } => VmmActivity::PortIo,
                Exit::Kicked => VmmActivity::Kick,
                Exit::Debug { .. } | Exit::Other(_) => VmmActivity::Other,
            };
            match exit {
                Exit::Debug { pc } => {
                    result.steps += 1;
                    self.retire();
                    self.next_rip = pc;
                }
                Exit::Rdmsr { index, data, error } => {
                    result.msr_exits += 1;
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
                    self.next_rip = self.sync.regs.rip;
                    let t = Instant::now();
                    let ok = self.wrmsr(index, value);
                    self.account(result, t);
                    if !ok {
                        // SAFETY: as for reads.
                        unsafe { *error = 1 };
                    }
                }
                Exit::Out { port, value } => match port {
                    port::CONSOLE => result.console.push(char::from(value as u8)),
                    port::EXIT => {
                        result.status = Some(value);
                        return Ok(true);
                    }
                    port::BATCH => self.copy_batch(u64::from(value), result)?,
                    port::YIELD if slice.is_some() => {
                        self.check_pmi()?;
                        return Ok(false);
                    }
                    port::CONTROL => {
                        self.handler = if value == 1 {
                            MsrHandler::Null
                        } else {
                            MsrHandler::Vpmu
                        }
                    }
                    _ => {}
                },
                Exit::In { port, data, len } => {
                    let value = match port {
                        port::HYPERCALL => self.hypercall(),
                        port::MIGRATE => self.migrate()?,
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
                    // The kicker fired and forgot its deadline.
                    armed = None;
                }
                Exit::Other(what) => return Err(io::Error::other(what)),
            }
            self.check_pmi()?;
        }
    }

    /// `outl(port::BATCH, gpa)`: copies the `struct sample_batch` at `gpa` (its header and
    /// `count` samples) out of guest memory. A batch that does not fit guest memory or claims
    /// more samples than `BATCH_CAPACITY` ends the run with an error: the guest is ours.
    fn copy_batch(&mut self, gpa: u64, result: &mut RunResult) -> io::Result<()> {
        use crate::profile::protocol::{BATCH_CAPACITY, BATCH_HEADER, SAMPLE_SIZE};
        let bad = |what: &str| io::Error::other(format!("sample batch at {gpa:#x}: {what}"));
        let header = self
            .vm
            .mem
            .slice_mut(gpa, BATCH_HEADER)
            .ok_or_else(|| bad("outside guest memory"))?;
        let count = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if count > BATCH_CAPACITY {
            return Err(bad("more samples than a batch holds"));
        }
        let bytes = self
            .vm
            .mem
            .slice_mut(gpa, BATCH_HEADER + count * SAMPLE_SIZE)
            .ok_or_else(|| bad("outside guest memory"))?;
        result.batches.push(bytes.to_vec());
        self.shipped.fetch_add(count as u64, Ordering::Relaxed);
        Ok(())
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
        with_core!(self, |platform, core| {
            let mut i = 0;
            while i < platform.queued.len() {
                if platform.queued[i].to != me {
                    i += 1;
                    continue;
                }
                let q = platform.queued.remove(i);
                let delivered = platform.inject_lvtpc(q.mask_on_delivery, q.context);
                if let Some(v) = core.vcpus.vcpu_mut(me) {
                    core.vpmu.lvtpc_delivery_done(v, delivered);
                }
            }
        });
    }

    pub(super) fn check_pmi(&mut self) -> io::Result<()> {
        let pcpu = self.pcpu;
        let outcome = with_core!(self, |platform, core| {
            if platform.physical_masked[pcpu as usize]
                || !core.pcpus[pcpu as usize].hw_mut().take_pmi()
            {
                return Ok(());
            }
            let outcome =
                core.vpmu
                    .handle_pmi(&mut platform, &mut core.pcpus, &mut core.vcpus, pcpu);
            if let Ok(o) = outcome {
                let delivered_to = match o {
                    PmiOutcome::Delivered { to, .. } => Some(to),
                    _ => None,
                };
                if core.pmi_log.len() < MAX_PMI_LOG {
                    core.pmi_log.push(PmiRecord {
                        running: platform.me,
                        hypervisor: platform.state.hypervisor.is_some(),
                        regs: platform.interrupted_regs(),
                        pcpu,
                        delivered_to,
                        dropped: matches!(o, PmiOutcome::Dropped { .. }),
                    });
                }
            }
            outcome
        });
        outcome
            .map(|_| ())
            .map_err(|e| io::Error::other(format!("handle_pmi: {e:?}")))
    }
}
