//! One pCPU's thread: it owns the pCPU's [`PcpuPmu`] (and so its bus) and its platform, drains
//! its request queue before every action, and acts at random on the vCPUs it claims, checking
//! each answer of the core against what the guest and the hardware make certain.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::thread;

use vpmu::abi::ops::{OpError, Params, is_valid_features, is_valid_mode};
use vpmu::abi::{
    PageViewMut, Regs, XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY,
    XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_FEATURE_SET,
    XENPMU_OP_FINISH, XENPMU_OP_FLUSH, XENPMU_OP_INIT, XENPMU_OP_LVTPC_SET, XENPMU_OP_MODE_SET,
};
use vpmu::{
    ChangeRefused, Completion, CoreError, CrossCpuRequest, ExecMode, HwEvent, Interrupted, Mode,
    Msr, MsrOutcome, PcpuPmu, PmiOutcome, SoftwarePmu, SystemContext, VcpuId, VcpuState, Vpmu,
};

use crate::sim::machine::Ctx;
use crate::sim::truth::{CounterSetup, SimEvent};
use crate::sim::vendor::{COUNTER_MASK, FIXED0};
use crate::sim::workload::{Instruction, function_base, regs};
use crate::sim::{Driver, SimVendor};

use super::bus::OwnedBus;
use super::platform::{PcpuPlatform, hypervisor_regs};
use super::rng::Rng;
use super::shared::{FRAMES_PER_DOMAIN, FREE, FilterView, REBOOTING, Shared, guest_frame, lock};
use super::table::{CounterBook, Ledger, SharedTable};

/// A request-dependent operation still `-EAGAIN` after this many rounds (retries each made
/// after every other pCPU drained its queue since the previous one) is stuck: one round
/// completes every request it sent, so a handful suffice (a finish chasing a vCPU that keeps
/// being loaded again elsewhere, or changes queued behind others, may need a few more).
const LIVELOCK_ROUNDS: u64 = 1_000;
/// AMD's HostOnly bit (legal for the privileged domain in hv and all mode only).
const AMD_HOST_ONLY: u64 = 1 << 41;
/// Bit 21 of an event select: AnyThread on Intel, reserved on AMD; a guest may never set it.
const ILLEGAL_CTRL_BIT: u64 = 1 << 21;

/// Whose context raised a PMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The vCPU's own context (self and hv mode).
    Own(VcpuId),
    /// The pCPU's system-wide context of this profiler's program (all mode).
    System(VcpuId),
}

impl Owner {
    fn vcpu(self) -> VcpuId {
        match self {
            Owner::Own(id) | Owner::System(id) => id,
        }
    }
}

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
        while self.actions < steps {
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

    /// Every vCPU is switched out, the mode is brought back to self (so that no system-wide
    /// context keeps a pCPU busy), and each pCPU checks its hardware is clean and detaches.
    fn finale(mut self) {
        if !self.barrier() {
            return;
        }
        self.note("finale: switch out".into());
        if self.pcpu.current().is_some() {
            self.switch(None);
        }
        if !self.barrier() {
            return;
        }
        if self.here == 0 {
            self.final_mode_set();
        }
        if !self.barrier() {
            return;
        }
        self.drain();
        let system = !matches!(self.pcpu.system(), SystemContext::Absent);
        let clean = V::is_clean(self.pcpu.hw().model());
        if self.pcpu.current().is_some() || system || !clean {
            self.find(
                "idle pCPU not clean at the end",
                format!(
                    "current {:?}, system context {system}, hardware clean {clean}: {:?}",
                    self.pcpu.current(),
                    V::raw(self.pcpu.hw().model())
                ),
            );
        }
        if self.platform.physical_masked || self.pcpu.lvtpc_masked() {
            self.find(
                "physical LVTPC left masked at the end",
                format!(
                    "platform masked {}, core masked for {:?}",
                    self.platform.physical_masked,
                    self.pcpu.lvtpc_masked()
                ),
            );
        }
        if !self.barrier() {
            return;
        }
        self.drain();
        let Runner {
            vpmu,
            mut platform,
            pcpu,
            shared,
            here,
            table,
            ..
        } = self;
        let left = lock(&shared.queues[here as usize]).len();
        let hw = vpmu
            .detach_pcpu(&mut platform, pcpu, table)
            .expect("detach");
        if left != 0 || !V::is_clean(hw.model()) {
            shared.finding(
                "pCPU not clean at detach",
                format!(
                    "seed {:#x}: pCPU {here}: {left} requests left, hardware {:?}",
                    shared.seed,
                    V::raw(hw.model())
                ),
            );
        }
        shared.coverage.add("requests sent", platform.requests_sent);
        shared.coverage.add("diagnostics", platform.diagnostics);
    }

    fn final_mode_set(&mut self) {
        let caller = VcpuId { domain: 0, vcpu: 0 };
        assert!(self.claim(caller), "every vCPU is free at the end");
        self.switch(Some(caller));
        let mut wait = self.waiting();
        loop {
            if self.aborted() {
                return;
            }
            self.step += 1;
            self.drain();
            match self.op(
                caller,
                XENPMU_OP_MODE_SET,
                &Params::new(XENPMU_MODE_SELF, 0),
            ) {
                Ok(_) => break,
                Err(OpError::Again) => self.check_livelock(&mut wait, "the final mode set"),
                Err(e) => {
                    self.find("final mode set to self refused", format!("{e:?}"));
                    break;
                }
            }
        }
        // The change is complete only when every pCPU caught up.
        while self.vpmu.change_in_progress() && !self.aborted() {
            self.drain();
            thread::yield_now();
        }
        self.switch(None);
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
            let unloads_running = match request {
                CrossCpuRequest::Unload { vcpu } if self.pcpu.current() == Some(vcpu) => {
                    let state = self.table.lock(vcpu).pmu.state();
                    (state == VcpuState::Loaded { pcpu: self.here }).then_some(vcpu)
                }
                _ => None,
            };
            let epoch = self.vpmu.policy().epoch;
            let result =
                self.vpmu
                    .complete_request(&mut self.platform, &mut self.pcpu, self.table, request);
            self.core_ok("complete_request", result);
            self.note(format!("completed {request:?} (epoch {epoch} before)"));
            if let Some(vcpu) = unloads_running {
                self.table.lock(vcpu).book.unloaded_by_request = true;
            }
            self.shared.coverage.hit(match request {
                CrossCpuRequest::CatchUp => "request CatchUp completed",
                CrossCpuRequest::Unload { .. } => "request Unload completed",
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
        if let Some(next) = next {
            self.table.lock(next).book.unloaded_by_request = false;
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
        if !loaded && !V::is_clean(self.pcpu.hw().model()) {
            self.find(
                "hardware not clean with nothing loaded",
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

    // ---- guests ----

    /// The guest's side of PMIs before it runs: queued LVTPC deliveries are completed from
    /// its own context, and its handlers take what was delivered.
    fn housekeeping(&mut self, x: VcpuId) {
        let flat = self.shared.flat(x);
        let mut slot = self.table.lock(x);
        let outcomes: Vec<bool> = {
            let mut vlapic = lock(&self.shared.vlapics[flat]);
            let queued: Vec<bool> = vlapic.queued.drain(..).collect();
            queued
                .into_iter()
                .map(|mask| {
                    let delivered = !vlapic.masked;
                    if delivered {
                        vlapic.delivered += 1;
                        vlapic.masked |= mask;
                    }
                    delivered
                })
                .collect()
        };
        for delivered in outcomes {
            let vpmu = self.vpmu;
            if !slot.observed(|pmu| vpmu.lvtpc_delivery_done(pmu, delivered)) {
                drop(slot);
                self.find("queued LVTPC delivery not in flight", format!("{x:?}"));
                slot = self.table.lock(x);
            }
            self.shared
                .coverage
                .hit("queued LVTPC deliveries completed");
        }
        drop(slot);
        let (delivered, virqs) = {
            let mut vlapic = lock(&self.shared.vlapics[flat]);
            (
                std::mem::take(&mut vlapic.delivered),
                std::mem::take(&mut vlapic.virqs),
            )
        };
        if delivered > 0 {
            self.note(format!("{x:?} takes {delivered} LVTPC PMIs"));
            // A Linux-like handler: acknowledge what overflowed, then unmask the LVTPC.
            if self.rng.chance(3, 4) {
                self.ack_status(x);
            }
            if self.rng.chance(4, 5) {
                lock(&self.shared.vlapics[flat]).masked = false;
            }
        }
        if virqs > 0 {
            self.note(format!("{x:?} takes {virqs} VIRQs"));
            if self.rng.chance(1, 2) {
                self.flush(x);
            }
        }
    }

    fn run_guest(&mut self, x: VcpuId) {
        let (pending, history) = {
            let slot = self.table.lock(x);
            (slot.pmu.pending_pmi(), slot.book.history_text())
        };
        if pending.is_some() && self.pcpu.mode_seen().switches_contexts() {
            self.find(
                "PMI withheld from a running vCPU",
                format!(
                    "{x:?} enters the guest on pCPU {} with a PMI kept pending ({pending:?}); it is \
                     delivered only at its next switch-in; its history:{history}",
                    self.here
                ),
            );
        }
        let roll = self.rng.below(100);
        if roll < 60 {
            self.retire(Some(x), 3, false);
        } else if roll < 85 {
            self.retire(Some(x), 0, false);
        } else {
            self.retire(Some(x), 0, true);
        }
    }

    /// `running` (or the idle hypervisor) retires a batch of instructions at `cpl` (`host`:
    /// hypervisor code). The guest's book follows what must count; a PMI the batch raises is
    /// attributed to the context that was loaded, and taken — sometimes only after a switch,
    /// as a real PMI can arrive after the hypervisor has already begun switching.
    fn retire(&mut self, running: Option<VcpuId>, cpl: u8, host: bool) {
        let shared = self.shared;
        let _gate = shared.avoid_known_bugs.then(|| {
            shared
                .policy_gate
                .read()
                .unwrap_or_else(PoisonError::into_inner)
        });
        if _gate.is_some() {
            // No policy change reaches this pCPU between an overflow and its interrupt.
            self.drain();
        }
        let k = 1 + self.rng.below(48);
        let seq = self.seq;
        self.seq += k;
        let here = self.here;
        let mut owner = None;
        if self.pcpu.hw().model().pmi_pending() {
            self.find(
                "PMI line left asserted before a batch",
                format!("running {running:?}"),
            );
            self.pcpu.hw_mut().model_mut().take_pmi();
        }
        let mode = ExecMode { cpl, host };
        match running {
            Some(x) => {
                let function = if cpl == 3 { 4 } else { 0 } + self.rng.below(4) as u32;
                let insn = Instruction {
                    rip: function_base(x.domain, function) + 4 * (seq % 0x4000),
                    cpl,
                    branch: false,
                };
                let guest = regs(x, &insn, seq + k - 1);
                self.platform.interrupted = if host {
                    Interrupted::Hypervisor {
                        regs: hypervisor_regs(
                            0xffff_8000_0020_0000 + 4 * (seq % 0x4000),
                            seq + k - 1,
                        ),
                        on_behalf_of: Some((x, self.last_regs(x))),
                    }
                } else {
                    Interrupted::Guest {
                        vcpu: x,
                        regs: guest,
                    }
                };
                let view = self.shared.filters[x.domain as usize].view();
                let mut slot = self.table.lock(x);
                if !host {
                    *lock(&self.shared.last_regs[self.shared.flat(x)]) = guest;
                }
                let state = slot.pmu.state();
                let loaded = state == (VcpuState::Loaded { pcpu: here });
                if loaded {
                    slot.book.unloaded_by_request = false;
                }
                let mut problem = None;
                if let (Some(ledger), 3, false) = (slot.book.ledger.as_mut(), cpl, host) {
                    let enabled: Vec<u32> = ledger
                        .counters
                        .keys()
                        .copied()
                        .filter(|&c| ledger.enabled(c))
                        .collect();
                    let must_count = enabled
                        .iter()
                        .any(|&c| !Ledger::filtered(c) || view == FilterView::Allow);
                    match state {
                        VcpuState::Loaded { pcpu } if pcpu == here => {
                            for c in enabled {
                                let book =
                                    ledger.counters.get_mut(&c).expect("a counter of the guest");
                                match (Ledger::filtered(c), view) {
                                    (false, _) | (true, FilterView::Allow) => {
                                        book.lo += k;
                                        book.hi += k;
                                    }
                                    (true, FilterView::Changing) => book.hi += k,
                                    (true, FilterView::Deny) => {}
                                }
                            }
                        }
                        VcpuState::Loaded { pcpu } => {
                            problem = Some((
                                "vCPU runs here while its context is loaded elsewhere",
                                pcpu,
                            ));
                        }
                        // The cached window stops the counters.
                        VcpuState::Cached { .. } => {}
                        VcpuState::Saved | VcpuState::Allocated => {
                            if must_count && !slot.book.unloaded_by_request {
                                problem = Some((
                                    "guest counters enabled but its context is not loaded",
                                    here,
                                ));
                            }
                        }
                    }
                }
                self.pcpu
                    .hw_mut()
                    .model_mut()
                    .count(HwEvent::Instructions, k, mode);
                if self.pcpu.hw().model().pmi_pending() && loaded {
                    slot.book.due += 1;
                    slot.book.event(format!("due (own) k {k}"));
                    owner = Some(Owner::Own(x));
                }
                drop(slot);
                if let Some((kind, pcpu)) = problem {
                    self.find(
                        kind,
                        format!(
                            "{x:?} on pCPU {here}, state {state:?} (pCPU {pcpu}), filter {view:?}"
                        ),
                    );
                }
                self.shared.coverage.hit("instruction batches");
            }
            None => {
                self.platform.interrupted = Interrupted::Hypervisor {
                    regs: hypervisor_regs(0xffff_8000_0030_0000 + 4 * (seq % 0x4000), seq + k - 1),
                    on_behalf_of: None,
                };
                self.pcpu
                    .hw_mut()
                    .model_mut()
                    .count(HwEvent::Instructions, k, mode);
            }
        }
        if self.pcpu.hw().model().pmi_pending() && owner.is_none() {
            match *self.pcpu.system() {
                SystemContext::Loaded { profiler, .. } => {
                    let mut slot = self.table.lock(profiler);
                    slot.book.due += 1;
                    slot.book.event(format!("due (system) on pCPU {here}"));
                    drop(slot);
                    owner = Some(Owner::System(profiler));
                }
                _ => {
                    self.find(
                        "PMI raised by hardware no context owns",
                        format!("running {running:?}: {:?}", V::raw(self.pcpu.hw().model())),
                    );
                    self.pcpu.hw_mut().model_mut().take_pmi();
                }
            }
        }
        self.note(format!(
            "{running:?} retires {k} at cpl {cpl} host {host} -> PMI {owner:?}"
        ));
        if let Some(owner) = owner {
            let delayed = running.is_some() && self.rng.chance(1, 4);
            self.take_pmi(owner, delayed);
        }
    }

    /// The PMI line is up for `owner`'s overflow: the interrupt is taken now, or (`delayed`)
    /// after the hypervisor switched the vCPU out first.
    fn take_pmi(&mut self, owner: Owner, delayed: bool) {
        if delayed {
            let x = self
                .pcpu
                .current()
                .expect("a delayed PMI interrupts a vCPU");
            let next = self
                .shared
                .vcpu_ids()
                .into_iter()
                .find(|&id| id != x && self.claim(id));
            self.note(format!("PMI delayed: switch {x:?} -> {next:?} first"));
            self.in_hypervisor(next);
            let (before, discarded) = {
                let slot = self.table.lock(x);
                (
                    format!("{:?} {:?}", slot.pmu.state(), slot.pmu.context()),
                    slot.book.discarded,
                )
            };
            let hw_before = format!("{:?}", V::raw(self.pcpu.hw().model()));
            let result =
                self.vpmu
                    .context_switch(&mut self.platform, &mut self.pcpu, self.table, next);
            self.core_ok("context_switch", result);
            if let Owner::Own(owner) = owner {
                if owner == x {
                    let slot = self.table.lock(x);
                    // A sibling's finish may tear the vCPU down (discarding what is pending)
                    // as soon as it is off the hardware.
                    let kept = slot.pmu.pending_pmi().is_some() || slot.book.discarded > discarded;
                    let after = format!(
                        "{:?} {:?} {:?}",
                        slot.pmu.state(),
                        slot.pmu.context(),
                        slot.pmu.stats()
                    );
                    drop(slot);
                    if !kept {
                        self.table.lock(x).book.reported_lost += 1;
                        self.find(
                            "PMI lost at switch-out",
                            format!(
                                "{x:?}'s overflow was neither kept pending nor delivered when it \
                                 was switched out\n  before: {before}\n  hardware: {hw_before}\n  after: {after}"
                            ),
                        );
                    }
                }
            }
            self.release(x);
            self.shared.coverage.hit("PMIs taken after a switch");
        }
        if !self.pcpu.hw_mut().model_mut().take_pmi() {
            return;
        }
        if self.platform.physical_masked {
            if delayed && matches!(owner, Owner::Own(_)) {
                // The vCPU switched in published a sample of its own (a PMI kept pending for
                // it) and masked the LVTPC; the overflow of the one switched out was checked
                // to be kept with its context above.
                return;
            }
            self.table.lock(owner.vcpu()).book.reported_lost += 1;
            self.find(
                "counters ran under a masked physical LVTPC",
                format!("{owner:?}'s PMI was discarded by the masked LVTPC"),
            );
            return;
        }
        if delayed {
            self.in_hypervisor(self.pcpu.current());
        }
        let discarded = self.table.lock(owner.vcpu()).book.discarded;
        let result = self
            .vpmu
            .handle_pmi(&mut self.platform, &mut self.pcpu, self.table);
        let outcome = self.core_ok("handle_pmi", result);
        self.note(format!("PMI of {owner:?} -> {outcome:?}"));
        match outcome {
            PmiOutcome::Delivered { to, .. }
            | PmiOutcome::Dropped { to, .. }
            | PmiOutcome::Queued { to, .. } => {
                self.shared.coverage.hit(match (outcome, owner) {
                    (PmiOutcome::Delivered { .. }, Owner::System(_)) => {
                        "system-wide samples delivered"
                    }
                    (PmiOutcome::Delivered { .. }, _) => "PMIs delivered",
                    (PmiOutcome::Dropped { .. }, _) => "PMIs dropped",
                    _ => "PMIs queued",
                });
                let delayed_own = delayed && matches!(owner, Owner::Own(_));
                if delayed_own || to != owner.vcpu() {
                    self.find(
                        "PMI misrouted",
                        format!("{owner:?}'s overflow (delayed {delayed}) went to {to:?}"),
                    );
                }
            }
            PmiOutcome::Spurious | PmiOutcome::NoInterrupt(_) => match owner {
                Owner::System(profiler) => {
                    if self.pcpu.mode_seen() == Mode::All {
                        self.table.lock(profiler).book.reported_lost += 1;
                        self.find(
                            "system-wide PMI lost",
                            format!("{profiler:?}'s overflow on pCPU {}: {outcome:?}", self.here),
                        );
                    } else {
                        // Leaving all mode discards the system-wide contexts with their
                        // overflows (docs/core.md).
                        self.table.lock(profiler).book.system_discarded += 1;
                    }
                }
                Owner::Own(x) if !delayed => {
                    // Not taken now: a policy change caught up at the PMI must have saved the
                    // overflow with the context.
                    let kept = {
                        let slot = self.table.lock(x);
                        slot.pmu.pending_pmi().is_some() || slot.book.discarded > discarded
                    };
                    if !kept {
                        self.table.lock(x).book.reported_lost += 1;
                        self.find(
                            "PMI lost",
                            format!("{x:?}'s overflow: {outcome:?}, nothing kept pending"),
                        );
                    }
                }
                Owner::Own(_) => {}
            },
        }
    }

    /// A legal WRMSR by `x`: see `wrmsr_checked`.
    fn wrmsr(
        &mut self,
        x: VcpuId,
        (msr, value): (u32, u64),
        apply: impl FnOnce(&mut Ledger),
    ) -> MsrOutcome<()> {
        self.wrmsr_checked(x, (msr, value), true, apply)
    }

    /// A WRMSR by `x` (`legal`: of a value the guest may write, which an unprivileged vCPU
    /// whose vPMU is in use must then have handled unless in its cached window). `apply` runs
    /// on the guest's book if handled.
    fn wrmsr_checked(
        &mut self,
        x: VcpuId,
        (msr, value): (u32, u64),
        legal: bool,
        apply: impl FnOnce(&mut Ledger),
    ) -> MsrOutcome<()> {
        self.in_hypervisor(Some(x));
        let mut slot = self.table.lock(x);
        let may_refuse = !slot.pmu.in_use() || matches!(slot.pmu.state(), VcpuState::Cached { .. });
        let (vpmu, platform, pcpu) = (self.vpmu, &mut self.platform, &mut self.pcpu);
        let result = slot.observed(|pmu| vpmu.wrmsr(platform, pcpu, pmu, Msr(msr), value));
        let state = slot.pmu.state();
        if result == Ok(MsrOutcome::Handled(())) {
            if let Some(ledger) = slot.book.ledger.as_mut() {
                apply(ledger);
            }
        }
        drop(slot);
        let outcome = self.core_ok("wrmsr", result);
        self.note(format!("{x:?} WRMSR {msr:#x} <- {value:#x}: {outcome:?}"));
        let unprivileged = x.domain != 0;
        if legal && unprivileged && outcome == MsrOutcome::GeneralProtection && !may_refuse {
            self.find(
                "legal WRMSR of an in-use vPMU refused",
                format!("{x:?} WRMSR {msr:#x} <- {value:#x}: #GP in state {state:?}"),
            );
        }
        if outcome == MsrOutcome::NotPmu {
            self.find("PMU MSR not recognised", format!("{msr:#x}"));
        }
        outcome
    }

    /// A RDMSR by `x`: the outcome, whether its vPMU was in use, and the guest's book on
    /// counter `ctr` as it stood at the read (under the same lock: a sibling's finish may reset
    /// it right after).
    fn rdmsr(
        &mut self,
        x: VcpuId,
        msr: u32,
        ctr: u32,
    ) -> (MsrOutcome<u64>, bool, Option<(CounterBook, u64)>) {
        self.in_hypervisor(Some(x));
        let mut slot = self.table.lock(x);
        let in_use = slot.pmu.in_use();
        let (vpmu, platform, pcpu) = (self.vpmu, &mut self.platform, &mut self.pcpu);
        let result = slot.observed(|pmu| vpmu.rdmsr(platform, pcpu, pmu, Msr(msr)));
        let book = match (&result, slot.book.ledger.as_ref()) {
            (Ok(MsrOutcome::Handled(value)), Some(ledger)) => {
                Some((ledger.counters[&ctr], ledger.advance(ctr, *value)))
            }
            _ => None,
        };
        drop(slot);
        let outcome = self.core_ok("rdmsr", result);
        (outcome, in_use, book)
    }

    fn program(&mut self, x: VcpuId) {
        let privileged = x.domain == 0;
        let avoid = self.shared.avoid_known_bugs;
        if avoid {
            // No overflow left unacknowledged when a counter is armed again.
            self.ack_status(x);
        }
        let counters = self.driver.counters();
        let c = self.rng.pick(&counters);
        let interrupt = privileged || self.rng.chance(2, 3);
        // Without its interrupt a counter must not overflow silently when known bugs are
        // avoided.
        let near = (interrupt || !avoid) && self.rng.chance(if privileged { 2 } else { 1 }, 3);
        let initial = if near {
            COUNTER_MASK - self.rng.below(300)
        } else {
            self.rng.below(1 << 20)
        };
        let os = privileged && self.rng.chance(1, 2);
        let setup = CounterSetup {
            ctr: c,
            event: SimEvent::Instructions,
            os,
            usr: true,
            period: interrupt.then_some(1),
            initial,
        };
        let mut control = self.driver.control(&setup);
        let host_only = privileged && c < FIXED0 && !self.driver.is_intel();
        if host_only && self.rng.chance(1, 3) {
            control.1 |= AMD_HOST_ONLY;
        }
        let stored = self.driver.stored(c, initial);
        let steps = [
            (self.driver.disable(c), 0u8),
            (self.driver.write_counter(c, initial), 1),
            (control, 2),
        ];
        for (write, what) in steps {
            let outcome = self.wrmsr(x, write, |ledger| {
                let book = ledger.counters.get_mut(&c).expect("a counter of the guest");
                match what {
                    0 => book.ctrl_on = false,
                    1 => {
                        book.base = stored;
                        book.lo = 0;
                        book.hi = 0;
                    }
                    _ => book.ctrl_on = true,
                }
            });
            if outcome != MsrOutcome::Handled(()) {
                return;
            }
        }
        let global = self
            .table
            .lock(x)
            .book
            .ledger
            .as_ref()
            .map_or(0, |l| l.global);
        if let Some(enable) = self.driver.global_enable(global | 1 << c) {
            self.wrmsr(x, enable, |ledger| ledger.global = enable.1);
        }
        // As a perf driver sets its LVTPC up when it starts counting.
        if self.rng.chance(3, 4) {
            lock(&self.shared.vlapics[self.shared.flat(x)]).masked = false;
        }
        self.shared.coverage.hit("counters programmed");
    }

    fn disable(&mut self, x: VcpuId) {
        let c = self.rng.pick(&self.driver.counters());
        self.wrmsr(x, self.driver.disable(c), |ledger| {
            ledger.counters.get_mut(&c).expect("a counter").ctrl_on = false;
        });
    }

    fn global_write(&mut self, x: VcpuId) {
        let all = self
            .driver
            .counters()
            .iter()
            .fold(0u64, |bits, &c| bits | 1 << c);
        let value = self.rng.next_u64() & all;
        if let Some(write) = self.driver.global_enable(value) {
            self.wrmsr(x, write, |ledger| ledger.global = value);
        }
    }

    fn ack_status(&mut self, x: VcpuId) {
        let Some(status_msr) = self.driver.status_msr() else {
            return;
        };
        let (outcome, _, _) = self.rdmsr(x, status_msr, 0);
        if let MsrOutcome::Handled(status) = outcome {
            if let Some(ack) = self.driver.ack(status) {
                if status != 0 {
                    self.wrmsr(x, ack, |_| {});
                }
            }
        }
    }

    fn read(&mut self, x: VcpuId) {
        let c = self.rng.pick(&self.driver.counters());
        let (outcome, in_use, book) = self.rdmsr(x, self.driver.read_counter(c), c);
        self.note(format!("{x:?} reads counter {c}: {outcome:?}"));
        match outcome {
            MsrOutcome::Handled(value) => {
                let Some((book, advance)) = book else {
                    return;
                };
                let state = self.table.lock(x).pmu.state();
                self.shared.coverage.hit("counter reads checked");
                if book.lo == book.hi {
                    self.shared.coverage.hit("counter reads checked exactly");
                }
                if advance < book.lo || advance > book.hi {
                    let view = self.shared.filters[x.domain as usize].view();
                    self.find(
                        "counter read outside what the guest's own instructions allow",
                        format!(
                            "{x:?} counter {c} reads {value:#x}: advanced {advance} from {:#x}, expected {}..={} \
                             (state {state:?}, filter {view:?})",
                            book.base, book.lo, book.hi
                        ),
                    );
                }
            }
            MsrOutcome::GeneralProtection if in_use && x.domain != 0 => {
                self.find(
                    "RDMSR of an in-use vPMU refused",
                    format!("{x:?} counter {c}"),
                );
            }
            MsrOutcome::NotPmu => self.find("PMU MSR not recognised", format!("counter {c}")),
            MsrOutcome::GeneralProtection => {}
        }
    }

    fn illegal_write(&mut self, x: VcpuId) {
        let gp: Vec<u32> = self
            .driver
            .counters()
            .into_iter()
            .filter(|&c| c < FIXED0)
            .collect();
        let c = self.rng.pick(&gp);
        let full_width = matches!(
            self.driver,
            Driver::Amd { .. }
                | Driver::Intel {
                    full_width: true,
                    ..
                }
        );
        let write = match self.rng.below(3) {
            0 => {
                let setup = CounterSetup {
                    ctr: c,
                    event: SimEvent::Instructions,
                    os: false,
                    usr: true,
                    period: None,
                    initial: 0,
                };
                let (msr, value) = self.driver.control(&setup);
                (msr, value | ILLEGAL_CTRL_BIT)
            }
            1 if full_width => (self.driver.write_counter(c, 0).0, COUNTER_MASK + 1),
            _ => match self.driver.status_msr() {
                Some(msr) => (msr, 1),
                None => (self.driver.control_msr(c), ILLEGAL_CTRL_BIT),
            },
        };
        let outcome = self.wrmsr_checked(x, write, false, |_| {});
        if outcome != MsrOutcome::GeneralProtection {
            self.find(
                "illegal WRMSR accepted",
                format!("{x:?} WRMSR {:#x} <- {:#x}: {outcome:?}", write.0, write.1),
            );
        }
        self.shared.coverage.hit("illegal WRMSRs refused");
    }

    // ---- control operations ----

    fn sibling(&mut self, x: VcpuId) -> VcpuId {
        VcpuId {
            domain: x.domain,
            vcpu: self
                .rng
                .below(u64::from(self.shared.vcpu_counts[x.domain as usize]))
                as u32,
        }
    }

    fn init(&mut self, x: VcpuId) {
        let target = if self.rng.chance(3, 4) {
            x
        } else {
            self.sibling(x)
        };
        let foreign = self.rng.chance(1, 20);
        let gfn = if foreign {
            guest_frame((x.domain + 1) % self.shared.vcpu_counts.len() as u32, 0)
        } else {
            guest_frame(x.domain, self.rng.below(FRAMES_PER_DOMAIN))
        };
        let mode_before = self.vpmu.mode();
        let result = self.op(x, XENPMU_OP_INIT, &Params::new(gfn, target.vcpu));
        let switching = mode_before.switches_contexts() && self.vpmu.mode().switches_contexts();
        match result {
            Ok(_) if foreign => {
                self.find("foreign frame registered", format!("{x:?} frame {gfn:#x}"))
            }
            Ok(_) => {
                self.shared.coverage.hit("pages registered");
                if target == x && self.rng.chance(3, 4) {
                    self.lvtpc_set(x, false);
                }
            }
            Err(OpError::InvalidArgument) if foreign => {}
            Err(OpError::AlreadyRegistered) => {}
            Err(OpError::FrameInUse) => self
                .shared
                .coverage
                .hit("registrations refused: frame in use"),
            Err(OpError::NoVpmu) if !switching || x.domain == 0 => {}
            Err(e) => self.find(
                "init answered an impossible error",
                format!("{x:?} for {target:?}: {e:?}"),
            ),
        }
    }

    fn finish(&mut self, x: VcpuId) {
        let target = if self.rng.chance(1, 2) {
            x
        } else {
            self.sibling(x)
        };
        self.start_op(
            x,
            XENPMU_OP_FINISH,
            Params::new(0, target.vcpu),
            OpKind::Finish,
        );
    }

    fn flush(&mut self, x: VcpuId) {
        self.start_op(x, XENPMU_OP_FLUSH, Params::new(0, 0), OpKind::Flush);
    }

    fn lvtpc(&mut self, x: VcpuId) {
        if self.rng.chance(1, 2) {
            let masked = self.rng.chance(1, 5);
            lock(&self.shared.vlapics[self.shared.flat(x)]).masked = masked;
            self.note(format!("{x:?} vLAPIC LVTPC masked {masked}"));
        } else {
            let masked = self.rng.chance(1, 4);
            self.lvtpc_set(x, masked);
        }
    }

    /// `x` writes its page's LVTPC mask and tells the hypervisor.
    fn lvtpc_set(&mut self, x: VcpuId, masked: bool) {
        if let Some(slot) = self.table.lock(x).pmu.page() {
            self.shared.with_mapped(slot.0, |page| {
                if let Ok(mut view) = PageViewMut::new(page) {
                    view.set_lvtpc_masked(masked);
                }
            });
        }
        match self.op(x, XENPMU_OP_LVTPC_SET, &Params::new(0, 0)) {
            Ok(_) | Err(OpError::NoVpmu) => {}
            Err(e) => self.find(
                "lvtpc_set answered an impossible error",
                format!("{x:?}: {e:?}"),
            ),
        }
    }

    fn mode_set(&mut self, x: VcpuId) {
        let quiet = self.shared.quiet.load(Ordering::SeqCst);
        let target = if self.rng.chance(1, 20) {
            XENPMU_MODE_SELF | XENPMU_MODE_HV
        } else if quiet {
            self.rng.pick(&[
                XENPMU_MODE_ALL,
                XENPMU_MODE_ALL,
                XENPMU_MODE_OFF,
                XENPMU_MODE_SELF,
            ])
        } else {
            self.rng.pick(&[
                XENPMU_MODE_SELF,
                XENPMU_MODE_HV,
                XENPMU_MODE_ALL,
                XENPMU_MODE_OFF,
            ])
        };
        {
            self.start_op(
                x,
                XENPMU_OP_MODE_SET,
                Params::new(target, 0),
                OpKind::ModeSet { target },
            );
        }
    }

    fn feature_set(&mut self, x: VcpuId) {
        let features = if self.driver.is_intel() {
            self.rng.pick(&[
                0,
                XENPMU_FEATURE_INTEL_BTS,
                XENPMU_FEATURE_IPC_ONLY,
                XENPMU_FEATURE_ARCH_ONLY,
                XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_INTEL_BTS,
                XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY,
            ])
        } else {
            self.rng.pick(&[0, XENPMU_FEATURE_INTEL_BTS])
        };
        {
            self.start_op(
                x,
                XENPMU_OP_FEATURE_SET,
                Params::new(features, 0),
                OpKind::FeatureSet { features },
            );
        }
    }

    fn start_op(&mut self, caller: VcpuId, op: u32, params: Params, kind: OpKind) {
        self.pending = Some(Pending::Op {
            caller,
            op,
            params,
            kind,
            mode_before: self.vpmu.mode(),
            wait: self.waiting(),
        });
        self.retry_pending();
    }

    /// The integrator installs a new event filter for an unprivileged domain at run time.
    fn filter_change(&mut self) {
        let domain = 1 + self.rng.below(self.shared.vcpu_counts.len() as u64 - 1) as u32;
        let filter = &self.shared.filters[domain as usize];
        if filter
            .changing
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        filter.generation.fetch_add(1, Ordering::SeqCst);
        let deny = !filter.deny.load(Ordering::SeqCst);
        filter.deny.store(deny, Ordering::SeqCst);
        self.note(format!(
            "filter of domain {domain}: deny instructions {deny}"
        ));
        self.pending = Some(Pending::Filter {
            domain,
            committed: false,
            wait: self.waiting(),
        });
        self.retry_pending();
    }

    fn retry_pending(&mut self) {
        let Some(mut pending) = self.pending.take() else {
            return;
        };
        match pending {
            Pending::Op {
                caller,
                op,
                params,
                kind,
                mode_before,
                ref mut wait,
            } => {
                let changes = matches!(kind, OpKind::ModeSet { .. } | OpKind::FeatureSet { .. });
                let shared = self.shared;
                let gate = (changes && shared.avoid_known_bugs).then(|| {
                    shared
                        .policy_gate
                        .write()
                        .unwrap_or_else(PoisonError::into_inner)
                });
                let result = self.op(caller, op, &params);
                drop(gate);
                if result == Err(OpError::Again) {
                    let what = format!("{kind:?} by {caller:?}");
                    self.check_livelock(wait, &what);
                    self.shared.coverage.hit("operations answered -EAGAIN");
                    self.pending = Some(pending);
                    return;
                }
                self.check_op(caller, kind, mode_before, result.map(|_| ()));
            }
            Pending::Filter {
                domain,
                committed,
                ref mut wait,
            } => {
                let done = if committed {
                    !self.vpmu.change_in_progress()
                } else {
                    let shared = self.shared;
                    let gate = shared.avoid_known_bugs.then(|| {
                        shared
                            .policy_gate
                            .write()
                            .unwrap_or_else(PoisonError::into_inner)
                    });
                    let result = self.vpmu.event_filter_changed(
                        &mut self.platform,
                        &mut self.pcpu,
                        self.table,
                    );
                    drop(gate);
                    match result {
                        Ok(Completion::Done) => true,
                        Ok(Completion::Pending) => {
                            self.pending = Some(Pending::Filter {
                                domain,
                                committed: true,
                                wait: wait.clone(),
                            });
                            return;
                        }
                        Err(ChangeRefused::InProgress) => false,
                        Err(ChangeRefused::InUse) => {
                            self.find("filter change refused as in use", String::new());
                            true
                        }
                        Err(ChangeRefused::Fault(e)) => {
                            self.core_ok("event_filter_changed", Err(e))
                        }
                    }
                };
                if done {
                    let filter = &self.shared.filters[domain as usize];
                    filter.generation.fetch_add(1, Ordering::SeqCst);
                    filter.changing.store(false, Ordering::SeqCst);
                    self.note(format!("filter of domain {domain} in force"));
                    self.shared.coverage.hit("filter changes completed");
                } else {
                    self.check_livelock(wait, "an event filter change");
                    self.pending = Some(pending);
                }
            }
        }
    }

    fn check_op(
        &mut self,
        caller: VcpuId,
        kind: OpKind,
        mode_before: Mode,
        result: Result<(), OpError>,
    ) {
        let mode_after = self.vpmu.mode();
        let allowed = match (kind, result) {
            (OpKind::ModeSet { target }, Err(OpError::InvalidArgument)) => !is_valid_mode(target),
            (OpKind::ModeSet { target }, Ok(())) => {
                self.shared.coverage.hit(match target {
                    XENPMU_MODE_OFF => "mode set to off",
                    XENPMU_MODE_SELF => "mode set to self",
                    XENPMU_MODE_HV => "mode set to hv",
                    _ => "mode set to all",
                });
                is_valid_mode(target)
            }
            (OpKind::ModeSet { target }, Err(OpError::Busy)) => {
                // Only leaving or entering the modes where every vCPU has a vPMU needs none
                // in use; self ⇄ hv never does (and no other change completed meanwhile).
                let swap = Mode::from_abi(target).is_some_and(Mode::switches_contexts)
                    && mode_before.switches_contexts()
                    && mode_after.switches_contexts();
                !swap
            }
            (OpKind::FeatureSet { features }, Err(OpError::InvalidArgument)) => {
                !is_valid_features(features)
            }
            (OpKind::FeatureSet { features }, Err(OpError::NotSupported)) => {
                !self.driver.is_intel() && features != 0
            }
            (OpKind::FeatureSet { features }, Ok(())) => {
                self.shared.coverage.hit("features set");
                is_valid_features(features) && (self.driver.is_intel() || features == 0)
            }
            (OpKind::FeatureSet { .. }, Err(OpError::Busy)) => true,
            (OpKind::Finish, Ok(())) => {
                self.shared.coverage.hit("finishes");
                true
            }
            (OpKind::Finish, Err(OpError::NoVpmu)) => true,
            (OpKind::Flush, Ok(())) => {
                self.shared.coverage.hit("flushes");
                true
            }
            (OpKind::Flush, Err(OpError::InvalidContext)) => {
                self.find(
                    "unedited page refused at flush (-EIO)",
                    format!("{caller:?}: the guest never edited its vendor area"),
                );
                true
            }
            (OpKind::Flush, Err(OpError::InvalidArgument | OpError::NoVpmu)) => true,
            _ => false,
        };
        if !allowed {
            self.find(
                "control operation answered an impossible result",
                format!("{caller:?} {kind:?}: {result:?} (mode {mode_before:?} -> {mode_after:?})"),
            );
        }
    }

    // ---- domains ----

    /// A domain is destroyed and rebuilt: none of its vCPUs may run meanwhile, so tearing
    /// each down must need no other pCPU (nothing is left loaded where a vCPU does not run).
    fn reboot_random(&mut self) {
        let domain = 1 + self.rng.below(self.shared.vcpu_counts.len() as u64 - 1) as u32;
        let ids: Vec<VcpuId> = (0..self.shared.vcpu_counts[domain as usize])
            .map(|vcpu| VcpuId { domain, vcpu })
            .collect();
        let mark = REBOOTING + self.here;
        let mut claimed = Vec::new();
        for &id in &ids {
            let claim = self.shared.claims[self.shared.flat(id)].compare_exchange(
                FREE,
                mark,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
            if claim.is_err() {
                break;
            }
            claimed.push(id);
        }
        if claimed.len() == ids.len() {
            self.note(format!("reboot domain {domain}"));
            for &id in &ids {
                self.in_hypervisor(self.pcpu.current());
                let result =
                    self.vpmu
                        .teardown_vcpu(&mut self.platform, &mut self.pcpu, self.table, id);
                if self.core_ok("teardown_vcpu", result) != Completion::Done {
                    self.find(
                        "teardown of a vCPU that runs nowhere needed another pCPU",
                        format!("{id:?}: its context was left loaded somewhere"),
                    );
                    let mut wait = self.waiting();
                    loop {
                        self.drain();
                        self.in_hypervisor(self.pcpu.current());
                        let result = self.vpmu.teardown_vcpu(
                            &mut self.platform,
                            &mut self.pcpu,
                            self.table,
                            id,
                        );
                        if self.core_ok("teardown_vcpu", result) == Completion::Done
                            || self.aborted()
                        {
                            break;
                        }
                        self.check_livelock(&mut wait, "a teardown");
                    }
                }
            }
            self.shared.coverage.hit("domains rebooted");
        }
        for id in claimed {
            self.shared.claims[self.shared.flat(id)].store(FREE, Ordering::SeqCst);
        }
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
