//! The simulated guests: each vCPU's perf driver, programming its [`GuestPlan`], and the
//! driver's actions — set-up, counter reads, enable toggles, LVTPC mask changes — and
//! its two PMI handlers: the shared-page one (read the sample, re-arm and acknowledge by editing
//! the vendor area, flush) and the virtual-LVTPC one (RDMSR/WRMSR like on bare metal). Every
//! guest write is mirrored into the ground truth; every value the guest reads is checked
//! against it.

use std::collections::VecDeque;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    PageView, PageViewMut, XENPMU_CHAIN_COMPLETE, XENPMU_CHAIN_NONE, XENPMU_DOMID_HYPERVISOR,
    XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_OP_FINISH, XENPMU_OP_FLUSH, XENPMU_OP_INIT,
    XENPMU_OP_LVTPC_SET,
};
use vpmu::{MsrOutcome, VcpuId};

use super::plan::GuestPlan;
use super::platform::{SimPlatform, guest_frame};
use super::truth::{SimEvent, TruthPmu};
use super::vendor::{Driver, FIXED0, SimVendor};
use super::workload::{Instruction, expected_chain};
use super::world::{Pending, Sample, Source, Window, World};

/// What the world predicted for a guest, to compare with the core's statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestStats {
    /// PMIs that must have been delivered to it.
    pub delivered: u64,
    /// PMIs that must have been dropped.
    pub dropped: u64,
    /// Of those, dropped because its previous sample was still cached.
    pub dropped_cached: u64,
}

/// One simulated vCPU's guest side.
#[derive(Clone, Debug)]
pub struct Guest {
    /// The vCPU.
    pub id: VcpuId,
    /// Its workload (cyclic).
    pub instructions: Vec<Instruction>,
    next: usize,
    /// Its perf driver's plan.
    pub plan: GuestPlan,
    /// Which plan counters are enabled.
    pub enabled: Vec<bool>,
    /// Ground truth of its own counters (self/hv mode).
    pub truth: TruthPmu,
    /// The registered page's frame.
    pub page_gfn: Option<u64>,
    /// The page LVTPC mask bit in effect.
    pub page_masked: bool,
    /// The open cached window, if a sample is waiting for its handler.
    pub window: Option<Window>,
    /// Interrupts not yet handled.
    pub pending: VecDeque<Pending>,
    /// Predicted PMI counts.
    pub stats: GuestStats,
    /// What the page's dropped-sample counter must show (reset by init).
    pub page_drops: u64,
    /// The page's dropped-sample counter as the handler last saw it.
    pub seen_drops: u64,
    /// The sequence number of the last sample the handler read from the page (reset by init).
    pub last_sequence: u64,
    /// The page's dropped-sample counter when the handler last read a sample, and how much it
    /// had grown since the read before: drops of samples that arrived while that sample was
    /// cached, so after it and before the next one.
    pub drops_read: (u64, u64),
    /// The timestamp of the last sample the handler read from the page.
    pub last_tsc: u64,
    /// The event the domain's filter denies, if any.
    pub denied: Option<SimEvent>,
    acks: u64,
}

impl Guest {
    /// A guest `id` running `instructions` with `plan`.
    pub fn new(
        id: VcpuId,
        instructions: Vec<Instruction>,
        plan: GuestPlan,
        driver: &Driver,
    ) -> Self {
        Self {
            id,
            instructions,
            next: 0,
            enabled: vec![true; plan.counters.len()],
            plan,
            truth: TruthPmu::new(driver.global_reset()),
            page_gfn: None,
            page_masked: true,
            window: None,
            pending: VecDeque::new(),
            stats: GuestStats::default(),
            page_drops: 0,
            seen_drops: 0,
            last_sequence: 0,
            drops_read: (0, 0),
            last_tsc: 0,
            denied: None,
            acks: 0,
        }
    }

    /// The next instruction of the workload.
    pub fn next_instruction(&mut self) -> Instruction {
        let insn = self.instructions[self.next % self.instructions.len()];
        self.next += 1;
        insn
    }

    /// Instructions retired.
    pub fn retired(&self) -> usize {
        self.next
    }
}

const TOP_BIT: u64 = 1 << 47;

impl<V: SimVendor> World<V> {
    /// Applies `update` to every ground truth guest `g`'s PMU writes reach: its own counters,
    /// or in all mode the system-wide counters of every pCPU it profiles.
    fn with_truths(&mut self, g: usize, mut update: impl FnMut(&mut TruthPmu)) {
        assert!(
            self.has_vpmu(g),
            "only a guest with a vPMU reaches counters"
        );
        if self.mode == XENPMU_MODE_ALL {
            for p in self.profiled(g) {
                update(&mut self.pcpu_truth[p as usize]);
            }
        } else {
            update(&mut self.guests[g].truth);
        }
    }

    /// A WRMSR by guest `g`: handled if it has a vPMU, else #GP. Returns whether handled.
    pub fn guest_write(&mut self, g: usize, (msr, value): (u32, u64)) -> bool {
        let has = self.has_vpmu(g);
        let outcome = self.m.wrmsr(self.guests[g].id, msr, value);
        let expected = if has {
            MsrOutcome::Handled(())
        } else {
            MsrOutcome::GeneralProtection
        };
        assert_eq!(outcome, expected, "guest {g} WRMSR {msr:#x} <- {value:#x}");
        has
    }

    /// An RDMSR by guest `g` that must succeed.
    pub fn guest_read(&mut self, g: usize, msr: u32) -> u64 {
        match self.m.rdmsr(self.guests[g].id, msr) {
            MsrOutcome::Handled(value) => value,
            other => panic!("guest {g} RDMSR {msr:#x}: {other:?}"),
        }
    }

    /// Guest `g`'s perf driver starts: registers its page (or unmasks its virtual LVTPC) and
    /// programs its counters, running on its home pCPU.
    pub(crate) fn setup_guest(&mut self, g: usize) {
        let plan = self.guests[g].plan.clone();
        if plan.counters.is_empty() && !plan.page {
            return;
        }
        let id = self.guests[g].id;
        self.m.schedule(g as u32 % self.pcpus(), Some(id));
        let has = self.has_vpmu(g);
        if plan.page {
            let gfn = guest_frame(id.domain, u64::from(id.vcpu));
            let result = self.m.op(id, XENPMU_OP_INIT, &Params::new(gfn, id.vcpu));
            if has {
                assert!(result.is_ok(), "{id:?} init: {result:?}");
                let frame = self.m.platform.frame_mut(id.domain, gfn);
                PageViewMut::new(frame)
                    .expect("initialised")
                    .set_lvtpc_masked(false);
                let unmask = self.m.op(id, XENPMU_OP_LVTPC_SET, &Params::new(0, 0));
                assert!(unmask.is_ok(), "{id:?} lvtpc_set: {unmask:?}");
                self.guests[g].page_gfn = Some(gfn);
                self.guests[g].page_masked = false;
            } else {
                assert_eq!(result, Err(OpError::NoVpmu), "{id:?} init without a vPMU");
            }
        } else if has {
            self.m.platform.set_lvtpc_masked(id, false);
        }
        let driver = self.driver;
        let mut global = 0;
        for setup in &plan.counters {
            self.guest_write(g, driver.disable(setup.ctr));
            self.guest_write(g, driver.write_counter(setup.ctr, setup.start_value()));
            if self.guest_write(g, driver.control(setup)) {
                let stored = driver.stored(setup.ctr, setup.start_value());
                // Fixed counters are never filtered (the filter allows every fixed index).
                let denied = self.guests[g].denied == Some(setup.event) && setup.ctr < FIXED0;
                self.with_truths(g, |t| t.program(*setup, stored, !denied));
            }
            global |= setup.bit();
        }
        if let Some(write) = driver
            .global_enable(global)
            .filter(|_| !plan.counters.is_empty())
        {
            if self.guest_write(g, write) {
                self.with_truths(g, |t| t.global = global);
            }
        }
    }

    /// Takes guest `g`'s pending interrupts.
    pub fn handle_pending(&mut self, g: usize) {
        while let Some(pending) = self.guests[g].pending.pop_front() {
            match pending {
                Pending::Virq => self.page_handler(g),
                Pending::Lvtpc => self.lvtpc_handler(g),
            }
        }
    }

    /// The PMU VIRQ handler: checks the sample and the whole cached context against the
    /// prediction and the ground truth, re-arms and acknowledges by editing the page, flushes.
    fn page_handler(&mut self, g: usize) {
        let id = self.guests[g].id;
        let gfn = self.guests[g].page_gfn.expect("a VIRQ goes to a page");
        let window = self.guests[g]
            .window
            .take()
            .expect("a VIRQ comes with a sample");
        let page = self.m.platform.frame(id.domain, gfn).clone();
        let view = PageView::new(&page).expect("valid header");
        assert!(view.is_cached(), "{id:?}: VIRQ without a cached sample");
        assert_eq!(view.identity(), window.identity, "{id:?}: sample identity");
        assert_eq!(view.regs(), window.regs, "{id:?}: sample registers");
        assert_eq!(
            view.sample_is_user(),
            window.regs.cpl == 3,
            "{id:?}: user flag"
        );
        assert_eq!(
            view.dropped_samples(),
            self.guests[g].page_drops,
            "{id:?}: dropped-sample counter"
        );
        self.check_sample_info(g, &view);
        let driver = self.driver;
        let truth = match window.source {
            Source::Own => &self.guests[g].truth,
            Source::Pcpu(p) => &self.pcpu_truth[p as usize],
        };
        for setup in truth.setups() {
            let control = if truth.enabled(setup.ctr) {
                driver.control_value(&setup)
            } else {
                0
            };
            assert_eq!(
                (
                    driver.page_counter(&view, setup.ctr),
                    driver.page_control(&view, setup.ctr)
                ),
                (truth.value(setup.ctr).expect("programmed"), control),
                "{id:?}: counter {} in the page ({:?})",
                setup.ctr,
                window.source
            );
        }
        let status = driver.page_status(&view);
        if driver.has_global() {
            assert_eq!(status, truth.status, "{id:?}: overflow status in the page");
        }
        let overflowed = self.overflowed(g, status, |ctr| driver.page_counter(&view, ctr));
        let rearm: Vec<(u32, u64)> = self.guests[g]
            .plan
            .counters
            .iter()
            .filter(|c| c.period.is_some() && overflowed & c.bit() != 0)
            .map(|c| (c.ctr, c.start_value()))
            .collect();
        let identity = view.identity();
        self.samples.push(Sample {
            receiver: id,
            domain: if identity.domain_id == XENPMU_DOMID_SELF {
                id.domain
            } else {
                identity.domain_id
            },
            domain_id: identity.domain_id,
            vcpu_id: identity.vcpu_id,
            pcpu_id: identity.pcpu_id,
            rip: view.regs().rip,
            user: view.sample_is_user(),
        });
        let via_ovf = self.guests[g].acks % 2 == 0;
        self.guests[g].acks += 1;
        let frame = self.m.platform.frame_mut(id.domain, gfn);
        driver.edit_page(frame, &rearm, overflowed, via_ovf);
        let flushed = self.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0));
        assert!(
            flushed.is_ok(),
            "{id:?}: flush of a valid context: {flushed:?}"
        );
        assert!(
            !PageView::new(self.m.platform.frame(id.domain, gfn))
                .expect("page")
                .is_cached()
        );
        let finish = |t: &mut TruthPmu| {
            for &(ctr, value) in &rearm {
                t.set_value(ctr, value);
            }
            t.status &= !overflowed;
            t.stopped = false;
        };
        match window.source {
            Source::Own => finish(&mut self.guests[g].truth),
            Source::Pcpu(p) => finish(&mut self.pcpu_truth[p as usize]),
        }
        if view.dropped_samples() != self.guests[g].seen_drops {
            self.guests[g].seen_drops = view.dropped_samples();
            self.recover_from_drops(g);
        }
    }

    /// The sample details (ABI 1.2) of the sample in guest `g`'s page: the call chain read
    /// from the sampled vCPU's own address space (each vCPU's stack holds a chain of its own,
    /// so a walk in anyone else's memory is caught), none for the hypervisor's; a sequence
    /// number past every earlier one, with a gap no smaller than the drops counted since; a
    /// clock that moves forward; a non-empty overflow set.
    fn check_sample_info(&mut self, g: usize, view: &PageView<'_>) {
        let id = self.guests[g].id;
        let info = view.sample_info().expect("the page is 1.2");
        let identity = view.identity();
        match identity.domain_id {
            XENPMU_DOMID_HYPERVISOR => {
                assert_eq!(
                    (info.chain_len, info.chain_end),
                    (0, XENPMU_CHAIN_NONE),
                    "{id:?}: a hypervisor sample has no readable chain here"
                );
            }
            domain => {
                let sampled = VcpuId {
                    domain: if domain == XENPMU_DOMID_SELF {
                        id.domain
                    } else {
                        domain
                    },
                    vcpu: identity.vcpu_id,
                };
                assert_eq!(
                    (info.chain(), info.chain_end),
                    (&expected_chain(sampled)[..], XENPMU_CHAIN_COMPLETE),
                    "{id:?}: call chain of {sampled:?}'s sample"
                );
            }
        }
        let guest = &mut self.guests[g];
        // Every drop the previous read saw happened while the previous sample was cached:
        // each took a sequence number between the two samples.
        let (read_before, dropped_after_previous) = guest.drops_read;
        assert!(
            info.sequence > guest.last_sequence + dropped_after_previous,
            "{id:?}: sequence {} after {} with {dropped_after_previous} drops between",
            info.sequence,
            guest.last_sequence
        );
        guest.drops_read = (view.dropped_samples(), view.dropped_samples() - read_before);
        assert!(info.tsc > guest.last_tsc, "{id:?}: the clock moves forward");
        assert_eq!(info.tsc_khz, SimPlatform::TSC_KHZ, "{id:?}: TSC frequency");
        assert_ne!(info.overflowed, 0, "{id:?}: a sample names what overflowed");
        guest.last_sequence = info.sequence;
        guest.last_tsc = info.tsc;
    }

    /// Guest `g` unregisters its page with finish — discarding a pending sample, if any, and
    /// resetting its counters (in all mode, those of every pCPU it profiles) — then starts its
    /// perf driver again. Without a page it has nothing to finish.
    pub fn restart(&mut self, g: usize) {
        let Some(gfn) = self.guests[g].page_gfn else {
            return;
        };
        let id = self.guests[g].id;
        let result = self.m.op(id, XENPMU_OP_FINISH, &Params::new(0, id.vcpu));
        assert!(result.is_ok(), "{id:?} finish: {result:?}");
        assert!(
            !PageView::new(self.m.platform.frame(id.domain, gfn))
                .expect("page")
                .is_cached()
        );
        let reset = TruthPmu::new(self.driver.global_reset());
        let guest = &mut self.guests[g];
        guest.pending.retain(|p| *p != Pending::Virq);
        guest.window = None;
        guest.page_gfn = None;
        guest.page_masked = true;
        guest.enabled.iter_mut().for_each(|e| *e = true);
        guest.page_drops = 0;
        guest.seen_drops = 0;
        guest.last_sequence = 0;
        guest.drops_read = (0, 0);
        self.with_truths(g, |t| *t = reset.clone());
        self.setup_guest(g);
    }

    /// Guest `g` flushed its pending sample itself, without the handler's edits (its counters
    /// resume as sampled): the ground truth follows.
    pub fn abandon_sample(&mut self, g: usize) {
        let pending = self.guests[g].pending.pop_front();
        assert_eq!(pending, Some(Pending::Virq), "a sample was pending");
        let window = self.guests[g].window.take().expect("an open window");
        match window.source {
            Source::Own => self.guests[g].truth.stopped = false,
            Source::Pcpu(p) => self.pcpu_truth[p as usize].stopped = false,
        }
    }

    /// A dropped sample leaves its counter wrapped and un-re-armed (in all mode on another pCPU
    /// than the one whose sample the handler sees), so it would never interrupt again. Seeing
    /// `dropped_samples` grow, the driver re-arms every sampling counter and acknowledges every
    /// overflow with WRMSR, outside the cached window — in all mode that reaches every pCPU it
    /// profiles.
    fn recover_from_drops(&mut self, g: usize) {
        let driver = self.driver;
        let mut bits = 0;
        for setup in self.guests[g].plan.counters.clone() {
            bits |= setup.bit();
            if setup.period.is_some() {
                self.guest_write(g, driver.write_counter(setup.ctr, setup.start_value()));
                let stored = driver.stored(setup.ctr, setup.start_value());
                self.with_truths(g, |t| t.set_value(setup.ctr, stored));
            }
        }
        if let Some(ack) = driver.ack(bits) {
            self.guest_write(g, ack);
        }
        self.with_truths(g, |t| t.status &= !bits);
    }

    /// Which counters the guest's driver treats as overflowed: the status register's bits, or
    /// without one (AMD before PerfMonV2) the sampling counters whose top bit went clear.
    fn overflowed(&self, g: usize, status: u64, value: impl Fn(u32) -> u64) -> u64 {
        if self.driver.has_global() {
            return status;
        }
        self.guests[g]
            .plan
            .counters
            .iter()
            .filter(|c| c.period.is_some() && value(c.ctr) & TOP_BIT == 0)
            .fold(0, |bits, c| bits | c.bit())
    }

    /// The virtual-LVTPC PMI handler: reads status and counters, re-arms, acknowledges and
    /// unmasks the LVTPC, all through RDMSR/WRMSR.
    fn lvtpc_handler(&mut self, g: usize) {
        let driver = self.driver;
        let values = self.read_all(g);
        let status = driver.status_msr().map_or(0, |msr| self.guest_read(g, msr));
        let overflowed = self.overflowed(g, status, |ctr| {
            values
                .iter()
                .find(|(c, _)| *c == ctr)
                .map_or(0, |(_, v)| *v)
        });
        for setup in self.guests[g].plan.counters.clone() {
            if setup.period.is_some() && overflowed & setup.bit() != 0 {
                self.guest_write(g, driver.write_counter(setup.ctr, setup.start_value()));
                let stored = driver.stored(setup.ctr, setup.start_value());
                self.guests[g].truth.set_value(setup.ctr, stored);
            }
        }
        if let Some(ack) = driver.ack(overflowed).filter(|_| overflowed != 0) {
            self.guest_write(g, ack);
        }
        self.guests[g].truth.status &= !overflowed;
        let id = self.guests[g].id;
        self.m.platform.set_lvtpc_masked(id, false);
    }

    /// Guest `g` reads every counter it programmed and its overflow status, and checks them
    /// against the ground truth (in all mode: of the pCPU whose instance it reads). Returns
    /// the counter values.
    pub fn read_all(&mut self, g: usize) -> Vec<(u32, u64)> {
        if self.guests[g].plan.counters.is_empty() {
            return Vec::new();
        }
        if !self.has_vpmu(g) {
            let msr = self
                .driver
                .read_counter(self.guests[g].plan.counters[0].ctr);
            let outcome = self.m.rdmsr(self.guests[g].id, msr);
            assert_eq!(
                outcome,
                MsrOutcome::GeneralProtection,
                "read without a vPMU"
            );
            return Vec::new();
        }
        if self.mode == XENPMU_MODE_ALL {
            let profiled = self.profiled(g);
            let here = self
                .m
                .running_on(self.guests[g].id)
                .filter(|p| profiled.contains(p));
            // A profiler reads the live instance of the pCPU it runs on (its RDMSRs reach
            // that CPU's counters only, as a Xen dom0 vCPU's do): it goes to one it profiles.
            let p = match here {
                Some(p) => p,
                None => {
                    self.enter(g, Some(profiled[0]));
                    profiled[0]
                }
            };
            return self.read_system(g, p);
        }
        let truth = self.guests[g].truth.clone();
        self.read_against(g, &truth)
    }

    /// All mode: guest `g`, running on pCPU `p`, reads `p`'s instance and checks it against
    /// `p`'s ground truth.
    pub fn read_system(&mut self, g: usize, p: u32) -> Vec<(u32, u64)> {
        let truth = self.pcpu_truth[p as usize].clone();
        self.read_against(g, &truth)
    }

    fn read_against(&mut self, g: usize, truth: &TruthPmu) -> Vec<(u32, u64)> {
        let id = self.guests[g].id;
        let mut values = Vec::new();
        for setup in self.guests[g].plan.counters.clone() {
            let value = self.guest_read(g, self.driver.read_counter(setup.ctr));
            assert_eq!(
                Some(value),
                truth.value(setup.ctr),
                "{id:?}: counter {} ({setup:?}) reads its own events",
                setup.ctr
            );
            values.push((setup.ctr, value));
            self.reads_checked += 1;
        }
        if let Some(msr) = self.driver.status_msr() {
            let status = self.guest_read(g, msr);
            assert_eq!(status, truth.status, "{id:?}: overflow status");
        }
        values
    }

    /// Guest `g` disables or re-enables counter `k` of its plan.
    pub fn toggle(&mut self, g: usize, k: usize) {
        let count = self.guests[g].plan.counters.len();
        if count == 0 {
            return;
        }
        let k = k % count;
        let setup = self.guests[g].plan.counters[k];
        let enabled = self.guests[g].enabled[k];
        let write = if enabled {
            self.driver.disable(setup.ctr)
        } else {
            self.driver.control(&setup)
        };
        if self.guest_write(g, write) {
            self.with_truths(g, |t| t.set_enabled(setup.ctr, !enabled));
            self.guests[g].enabled[k] = !enabled;
        }
    }

    /// Guest `g` flips its page's LVTPC mask bit and issues lvtpc_set.
    pub fn toggle_page_mask(&mut self, g: usize) {
        let Some(gfn) = self.guests[g].page_gfn else {
            return;
        };
        let id = self.guests[g].id;
        let masked = !self.guests[g].page_masked;
        let frame = self.m.platform.frame_mut(id.domain, gfn);
        PageViewMut::new(frame)
            .expect("page")
            .set_lvtpc_masked(masked);
        let result = self.m.op(id, XENPMU_OP_LVTPC_SET, &Params::new(0, 0));
        assert!(result.is_ok(), "{id:?} lvtpc_set: {result:?}");
        self.guests[g].page_masked = masked;
    }
}
