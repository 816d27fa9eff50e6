//! One pCPU's thread: it owns the pCPU's [`PcpuPmu`] (and so its bus) and its platform, drains
//! its request queue before every action, and acts at random on the vCPUs it claims, checking
//! each answer of the core against what the guest and the hardware make certain.
//!
//! This module holds the thread's state, its main loop and the plumbing every action shares
//! (draining requests, context switches, control operations, livelock detection); the actions
//! themselves live in the submodules: [`guest`] (guests running and taking PMIs), [`msr`]
//! (guest WRMSRs and RDMSRs), [`control`] (control operations and the check of their answers),
//! [`pending`] (operations and event filter changes that wait for other pCPUs), [`domains`]
//! (domain reboots) and [`finale`] (the end-of-run checks).

use std::sync::atomic::Ordering;
use std::thread;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{Regs, XENPMU_MODE_ALL, XENPMU_OP_MODE_SET};
use vpmu::{
    CoreError, CrossCpuRequest, Interrupted, Mode, PcpuPmu, SystemContext, VcpuId, VcpuState, Vpmu,
};

use vpmu_sim::machine::Ctx;
use vpmu_sim::{Driver, SimVendor};

use super::bus::OwnedBus;
use super::platform::{PcpuPlatform, hypervisor_regs};
use super::rng::Rng;
use super::shared::{FREE, Shared, lock};
use super::table::SharedTable;

mod control;
mod domains;
mod finale;
mod guest;
mod msr;
mod pending;

/// A request-dependent operation still `-EAGAIN` after this many rounds (retries each made
/// after every other pCPU drained its queue since the previous one) is stuck: one round
/// completes every request it sent, so a handful suffice (a finish chasing a vCPU that keeps
/// being loaded again elsewhere, or changes queued behind others, may need a few more).
const LIVELOCK_ROUNDS: u64 = 1_000;

/// What a pending control operation's answer must be.
#[derive(Clone, Copy, Debug)]
enum OpKind {
    ModeSet { target: u64 },
    FeatureSet { features: u64 },
    Finish,
    Flush,
}

/// Progress of a waiting operation: the other pCPUs' drain counts at its last counted round.
#[derive(Clone, Debug)]
struct Wait {
    last: Vec<u64>,
    rounds: u64,
}

/// An operation waiting for other pCPUs.
#[derive(Clone, Debug)]
enum Pending {
    Op {
        caller: VcpuId,
        op: u32,
        params: Params,
        kind: OpKind,
        mode_before: Mode,
        wait: Wait,
    },
    Filter {
        domain: u32,
        committed: bool,
        wait: Wait,
    },
}

/// A pCPU's thread.
pub(super) struct Runner<'a, V: SimVendor> {
    driver: Driver,
    vpmu: &'a Vpmu<V::Backend>,
    table: &'a SharedTable<Ctx<V>>,
    shared: &'a Shared,
    pcpu: PcpuPmu<Ctx<V>, OwnedBus<V::Model>>,
    platform: PcpuPlatform<'a>,
    rng: Rng,
    here: u32,
    step: u64,
    actions: u64,
    seq: u64,
    pending: Option<Pending>,
    phase: u32,
}

impl<'a, V: SimVendor> Runner<'a, V> {
    /// Attaches pCPU `here` (on the calling thread, which owns its bus from now on).
    pub(super) fn new(
        vendor: &'a V,
        vpmu: &'a Vpmu<V::Backend>,
        table: &'a SharedTable<Ctx<V>>,
        shared: &'a Shared,
        here: u32,
    ) -> Self {
        let bus = OwnedBus::new(here, vendor.model());
        let pcpu = vpmu.attach_pcpu(here, bus).expect("a clean model attaches");
        Self {
            driver: vendor.driver(),
            vpmu,
            table,
            shared,
            pcpu,
            platform: PcpuPlatform::new(
                shared,
                here,
                Rng::new(shared.seed, 0x100 + u64::from(here)),
            ),
            rng: Rng::new(shared.seed, u64::from(here)),
            here,
            step: 0,
            actions: 0,
            seq: u64::from(here) << 40,
            pending: None,
            phase: 0,
        }
    }

    fn aborted(&self) -> bool {
        self.shared.abort.load(Ordering::SeqCst)
    }

    fn note(&mut self, entry: String) {
        self.shared
            .note(self.here, format!("#{} {entry}", self.step));
    }

    /// The thread's recent actions, oldest first.
    pub(super) fn recent(&self) -> String {
        lock(&self.shared.logs[self.here as usize])
            .iter()
            .map(|e| format!("    {e}\n"))
            .collect()
    }

    fn find(&self, kind: &'static str, what: String) {
        self.shared.finding(
            kind,
            format!(
                "  seed {:#x}, pCPU {} step {}: {what}\n  recent actions of pCPU {}:\n{}",
                self.shared.seed,
                self.here,
                self.step,
                self.here,
                self.recent()
            ),
        );
    }

    fn core_ok<T>(&self, what: &str, result: Result<T, CoreError>) -> T {
        result.unwrap_or_else(|e| {
            panic!(
                "seed {:#x}, pCPU {} step {}: {what} failed: {e:?}\nrecent actions:\n{}",
                self.shared.seed,
                self.here,
                self.step,
                self.recent()
            )
        })
    }

    // ---- the thread's life ----

    /// Runs `steps` random actions, completes its pending operation, then the final protocol.
    pub(super) fn run(mut self, steps: u64) {
        if !self.barrier() {
            return;
        }
        let most = steps.saturating_mul(super::EXTRA_STEPS_FACTOR);
        while self.actions < steps || (self.actions < most && self.unreached()) {
            if self.aborted() {
                return;
            }
            self.act();
        }
        while self.pending.is_some() {
            if self.aborted() {
                return;
            }
            self.step += 1;
            self.drain();
            self.retry_pending();
            thread::yield_now();
        }
        self.finale();
    }

    /// Whether the run has not reached something it must yet (`MUST_REACH`).
    fn unreached(&self) -> bool {
        super::MUST_REACH
            .iter()
            .any(|what| self.shared.coverage.get(what) == 0)
    }

    /// Waits, completing the requests sent to this pCPU meanwhile, until every thread has
    /// arrived at this barrier. False if the run aborted.
    fn barrier(&mut self) -> bool {
        self.phase += 1;
        let target = self.phase * self.shared.pcpus;
        self.shared.arrived.fetch_add(1, Ordering::SeqCst);
        while self.shared.arrived.load(Ordering::SeqCst) < target {
            if self.aborted() {
                return false;
            }
            self.drain();
            thread::yield_now();
        }
        true
    }

    // ---- plumbing ----

    fn progress(&self) -> Vec<u64> {
        self.shared
            .drains
            .iter()
            .map(|d| d.load(Ordering::SeqCst))
            .collect()
    }

    fn waiting(&self) -> Wait {
        Wait {
            last: self.progress(),
            rounds: 0,
        }
    }

    /// Another retry of a waiting operation answered `-EAGAIN`. Rounds are counted in the other
    /// pCPUs' progress, not in time or in this thread's retries: a descheduled pCPU delays the
    /// count, it does not advance it.
    fn check_livelock(&self, wait: &mut Wait, what: &str) {
        let now = self.progress();
        let others_drained = (0..self.shared.pcpus as usize)
            .filter(|&p| p != self.here as usize)
            .all(|p| now[p] > wait.last[p]);
        if others_drained {
            wait.rounds += 1;
            wait.last = now;
        }
        assert!(
            wait.rounds < LIVELOCK_ROUNDS,
            "seed {:#x}, pCPU {} step {}: {what} still -EAGAIN after {LIVELOCK_ROUNDS} rounds in \
             which every other pCPU completed its requests (policy {:?}, change in progress {})\n\
             recent actions:\n{}",
            self.shared.seed,
            self.here,
            self.step,
            self.vpmu.policy(),
            self.vpmu.change_in_progress(),
            self.shared.all_logs()
        );
    }

    fn last_regs(&self, id: VcpuId) -> Regs {
        *lock(&self.shared.last_regs[self.shared.flat(id)])
    }

    /// The state a PMI would find while the hypervisor works for `on_behalf_of`.
    fn in_hypervisor(&mut self, on_behalf_of: Option<VcpuId>) {
        let regs = hypervisor_regs(0xffff_8000_0010_0000 + (self.seq & 0xfff) * 4, self.seq);
        let on_behalf_of = on_behalf_of.map(|id| (id, self.last_regs(id)));
        self.platform.interrupted = Interrupted::Hypervisor { regs, on_behalf_of };
    }

    /// Completes every request sent to this pCPU, in order.
    fn drain(&mut self) {
        loop {
            let request = lock(&self.shared.queues[self.here as usize]).pop_front();
            let Some(request) = request else {
                break;
            };
            self.in_hypervisor(self.pcpu.current());
            let epoch = self.vpmu.policy().epoch;
            let result =
                self.vpmu
                    .complete_request(&mut self.platform, &mut self.pcpu, self.table, request);
            self.core_ok("complete_request", result);
            self.note(format!("completed {request:?} (epoch {epoch} before)"));
            self.shared.coverage.hit(match request {
                CrossCpuRequest::CatchUp => "request CatchUp completed",
                CrossCpuRequest::Teardown { .. } => "request Teardown completed",
                CrossCpuRequest::SystemWrite { .. } => "request SystemWrite completed",
                CrossCpuRequest::ResumeSystem { .. } => "request ResumeSystem completed",
                CrossCpuRequest::DropSystem { .. } => "request DropSystem completed",
            });
        }
        self.shared.drains[self.here as usize].fetch_add(1, Ordering::SeqCst);
    }

    fn claim(&self, id: VcpuId) -> bool {
        self.shared.claims[self.shared.flat(id)]
            .compare_exchange(FREE, self.here, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn release(&self, id: VcpuId) {
        let was = self.shared.claims[self.shared.flat(id)].swap(FREE, Ordering::SeqCst);
        assert_eq!(was, self.here, "{id:?} was claimed by this pCPU");
    }

    /// Switches to `next` (already claimed), releasing the previous vCPU.
    fn switch(&mut self, next: Option<VcpuId>) {
        let prev = self.pcpu.current();
        self.note(format!("switch {prev:?} -> {next:?}"));
        self.in_hypervisor(next);
        let result = self
            .vpmu
            .context_switch(&mut self.platform, &mut self.pcpu, self.table, next);
        self.core_ok("context_switch", result);
        if let Some(prev) = prev {
            let state = self.table.lock(prev).pmu.state();
            if state == (VcpuState::Loaded { pcpu: self.here }) {
                self.find("context left loaded after switch-out", format!("{prev:?}"));
            }
            self.release(prev);
        }
        self.shared.coverage.hit("context switches");
    }

    /// With nothing loaded here, the hardware must count nothing for anyone.
    fn check_clean_if_idle(&mut self) {
        if !matches!(self.pcpu.system(), SystemContext::Absent) {
            return;
        }
        let loaded = self.pcpu.current().is_some_and(|id| {
            self.table.lock(id).pmu.state() == (VcpuState::Loaded { pcpu: self.here })
        });
        if !loaded && !V::nothing_can_count(self.pcpu.hw().model()) {
            self.find(
                "something can count with nothing loaded",
                format!(
                    "current {:?}: {:?}",
                    self.pcpu.current(),
                    V::raw(self.pcpu.hw().model())
                ),
            );
        }
    }

    fn op(&mut self, caller: VcpuId, op: u32, params: &Params) -> Result<Params, OpError> {
        self.in_hypervisor(Some(caller));
        let result = self.vpmu.control_op(
            &mut self.platform,
            &mut self.pcpu,
            self.table,
            caller,
            op,
            params,
        );
        self.note(format!(
            "op {op} by {caller:?} val {:#x} vcpu {} -> {result:?}",
            params.val, params.vcpu
        ));
        result
    }

    // ---- one step ----

    fn act(&mut self) {
        self.step += 1;
        super::table::set_context(self.here, self.step);
        self.drain();
        if self.pending.is_some() {
            self.retry_pending();
            // Waiting is not acting: let the pCPUs it waits for run.
            thread::yield_now();
            return;
        }
        self.actions += 1;
        match self.pcpu.current() {
            None => self.idle_step(),
            Some(x) => {
                self.housekeeping(x);
                if self.pending.is_none() && self.pcpu.current() == Some(x) {
                    self.vcpu_step(x);
                }
            }
        }
        self.check_clean_if_idle();
        self.shared.coverage.hit("actions");
    }

    fn idle_step(&mut self) {
        let roll = self.rng.below(100);
        if roll < 70 {
            self.schedule_random();
        } else if roll < 90 {
            self.retire(None, 0, true);
        } else if roll < 95 {
            self.reboot_random();
        }
    }

    fn vcpu_step(&mut self, x: VcpuId) {
        let privileged = x.domain == 0;
        let quiet = self.shared.quiet.load(Ordering::SeqCst);
        let leave_pmu_alone = quiet && !privileged;
        let roll = self.rng.below(100);
        match roll {
            0..24 => self.run_guest(x),
            24..30 => self.schedule_random(),
            30..44 if !leave_pmu_alone => self.program(x),
            44..52 => self.read(x),
            52..55 if !leave_pmu_alone => self.disable(x),
            55..58 => self.illegal_write(x),
            58..60 if !leave_pmu_alone => self.global_write(x),
            60..62 if !leave_pmu_alone => self.ack_status(x),
            62..65 if !leave_pmu_alone => self.init(x),
            65..68 => self.finish(x),
            68..71 => self.lvtpc(x),
            71..74 => self.flush(x),
            74..76 => self.reboot_random(),
            76..84 if quiet => self.reboot_random(),
            _ if privileged => match roll {
                84..89 => self.mode_set(x),
                89..91 => self.feature_set(x),
                91..95 => self.filter_change(),
                95..97 => {
                    let quiet = self.rng.chance(1, 3);
                    self.note(format!("quiet {quiet}"));
                    self.shared.quiet.store(quiet, Ordering::SeqCst);
                }
                _ => self.run_guest(x),
            },
            84..86 => {
                let result = self.op(x, XENPMU_OP_MODE_SET, &Params::new(XENPMU_MODE_ALL, 0));
                if result != Err(OpError::NotPrivileged) {
                    self.find(
                        "unprivileged mode set not refused with -EPERM",
                        format!("{x:?}: {result:?}"),
                    );
                }
            }
            _ => self.run_guest(x),
        }
    }

    fn schedule_random(&mut self) {
        let current = self.pcpu.current();
        let ids = self.shared.vcpu_ids();
        let next = if current.is_some() && self.rng.chance(1, 4) {
            None
        } else {
            let id = self.rng.pick(&ids);
            if Some(id) == current || !self.claim(id) {
                return;
            }
            Some(id)
        };
        self.switch(next);
    }
}

/// Sets the abort flag and prints the thread's recent actions if the thread panics.
pub(super) struct PanicGuard<'a> {
    pub(super) shared: &'a Shared,
    pub(super) pcpu: u32,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.shared.abort.store(true, Ordering::SeqCst);
            eprintln!(
                "pCPU {} thread panicked (seed {:#x}); recent actions:\n{}",
                self.pcpu,
                self.shared.seed,
                self.shared.all_logs()
            );
        }
    }
}
