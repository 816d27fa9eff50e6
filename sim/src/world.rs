//! [`World`]: a [`Machine`] with its guests and the ground truth, running a [`Scenario`].
//!
//! Before every instruction the world predicts, from the ground truth alone, whether a PMI is
//! due, which vCPU must receive it, whether it must be delivered or dropped, which counters it
//! reports and — for a sample — the exact identity and registers the page must show. After the
//! instruction it compares the machine's PMI record, VIRQs and LVTPC deliveries with the
//! prediction. Guests read their counters at random points and compare them with the truth.

use std::collections::VecDeque;

use vpmu::abi::{
    Identity, Regs, XENPMU_DOMID_SELF, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_SELF,
};
use vpmu::{CounterSet, Overflow, PmiOutcome, VcpuId};

use super::guest::Guest;
use super::machine::Machine;
use super::plan::PlanSpec;
use super::platform::SimFilter;
use super::truth::{SimEvent, TruthPmu};
use super::vendor::{Driver, SimVendor};
use super::workload::{Run, build, regs};

/// When a guest runs its PMU interrupt handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timing {
    /// Right after the instruction that raised the PMI.
    Immediate,
    /// When the receiving vCPU next starts running (or is otherwise scheduled in): samples
    /// stay cached meanwhile, and further PMIs to it can be dropped.
    Deferred,
}

/// What happens next in a scenario. vCPUs are named by their flat index (domain-major).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `vcpu` runs on `pcpu` for `count` instructions.
    Run {
        /// pCPU (modulo the pCPU count).
        pcpu: u32,
        /// vCPU (modulo the vCPU count).
        vcpu: usize,
        /// Instructions.
        count: u32,
    },
    /// `pcpu` goes idle.
    Idle {
        /// pCPU (modulo the pCPU count).
        pcpu: u32,
    },
    /// `vcpu` disables or re-enables one of its counters.
    Toggle {
        /// vCPU.
        vcpu: usize,
        /// Index into its plan.
        counter: usize,
    },
    /// `vcpu` reads all its counters (and its overflow status) and checks them.
    Read {
        /// vCPU.
        vcpu: usize,
    },
    /// `vcpu` flips the mask bit of its page's LVTPC and issues lvtpc_set.
    MaskPage {
        /// vCPU.
        vcpu: usize,
    },
    /// `vcpu` finishes its vPMU (a pending sample is discarded) and sets it up again.
    Restart {
        /// vCPU.
        vcpu: usize,
    },
}

/// A complete simulation input.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// pCPUs.
    pub pcpus: u32,
    /// vCPUs per domain; domain 0 is privileged.
    pub domains: Vec<u32>,
    /// The vPMU mode.
    pub mode: u64,
    /// Handler timing.
    pub timing: Timing,
    /// Per flat vCPU: its workload.
    pub workloads: Vec<Vec<Run>>,
    /// Per flat vCPU: what its perf driver programs.
    pub plans: Vec<PlanSpec>,
    /// The schedule and the guests' actions.
    pub steps: Vec<Step>,
    /// Per domain: the event its event filter denies, if any.
    pub filters: Vec<Option<SimEvent>>,
}

/// Where the ground truth of a sample's context lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The receiving vCPU's own counters (self/hv mode).
    Own,
    /// pCPU `p`'s system-wide counters (all mode).
    Pcpu(u32),
}

/// An open cached window: a sample in a page the guest has not flushed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Whose counters the sample stopped.
    pub source: Source,
    /// The identity the page must show.
    pub identity: Identity,
    /// The registers the page must show.
    pub regs: Regs,
}

/// A pending guest interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// The PMU VIRQ: a sample is in the page.
    Virq,
    /// A PMI through the virtual LVTPC.
    Lvtpc,
}

/// A sample as the receiving guest's profiler recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The vCPU whose page it came through.
    pub receiver: VcpuId,
    /// The sampled domain (`XENPMU_DOMID_SELF` resolved to the receiver's).
    pub domain: u32,
    /// `identity.domain_id` as written.
    pub domain_id: u32,
    /// `identity.vcpu_id`.
    pub vcpu_id: u32,
    /// `identity.pcpu_id`.
    pub pcpu_id: u32,
    /// The sampled RIP.
    pub rip: u64,
    /// `XENPMU_FLAG_SAMPLE_USER`.
    pub user: bool,
}

/// The machine, its guests and the ground truth.
#[derive(Debug)]
pub struct World<V: SimVendor> {
    /// The machine.
    pub m: Machine<V>,
    /// The guests' perf driver.
    pub driver: Driver,
    /// The mode.
    pub mode: u64,
    /// Handler timing.
    pub timing: Timing,
    /// Guests by flat index.
    pub guests: Vec<Guest>,
    /// All mode: ground truth of each pCPU's system-wide counters.
    pub pcpu_truth: Vec<TruthPmu>,
    /// Counter reads compared with the ground truth.
    pub reads_checked: u64,
    /// Every sample the guests' profilers recorded, in order of handling.
    pub samples: Vec<Sample>,
}

impl<V: SimVendor> World<V> {
    /// Builds the machine and the guests, and lets every guest set up its perf driver.
    pub fn new(vendor: V, scenario: &Scenario) -> Self {
        let driver = vendor.driver();
        let mut m = Machine::new(vendor, scenario.pcpus, &scenario.domains, scenario.mode);
        let denied = |domain: u32| scenario.filters.get(domain as usize).copied().flatten();
        for (domain, filter) in m.platform.filters.iter_mut().enumerate() {
            if let Some(event) = denied(domain as u32) {
                *filter = SimFilter::Deny(driver.event_select(event));
            }
        }
        let ids = m.vcpus.ids();
        let guests = ids
            .iter()
            .enumerate()
            .map(|(flat, &id)| {
                let runs = scenario.workloads.get(flat).cloned().unwrap_or_default();
                let spec = scenario.plans.get(flat).cloned().unwrap_or_default();
                let mut guest =
                    Guest::new(id, build(id.domain, &runs), spec.resolve(&driver), &driver);
                guest.denied = denied(id.domain);
                guest
            })
            .collect();
        let mut world = Self {
            pcpu_truth: vec![TruthPmu::new(driver.global_reset()); scenario.pcpus as usize],
            m,
            driver,
            mode: scenario.mode,
            timing: scenario.timing,
            guests,
            reads_checked: 0,
            samples: Vec::new(),
        };
        for g in 0..world.guests.len() {
            world.setup_guest(g);
        }
        for p in 0..scenario.pcpus {
            world.m.schedule(p, None);
        }
        world
    }

    /// Runs `scenario`'s steps, then [`World::finish`].
    pub fn run(vendor: V, scenario: &Scenario) -> Self {
        let mut world = Self::new(vendor, scenario);
        for step in &scenario.steps {
            world.step(*step);
        }
        world.finish();
        world
    }

    /// The pCPU count.
    pub fn pcpus(&self) -> u32 {
        self.m.pcpus.len() as u32
    }

    /// Whether the vCPU `g` has a vPMU in this mode.
    pub fn has_vpmu(&self, g: usize) -> bool {
        let privileged = self.guests[g].id.domain == self.m.platform.privileged;
        match self.mode {
            XENPMU_MODE_SELF | XENPMU_MODE_HV => true,
            XENPMU_MODE_ALL => privileged,
            _ => false,
        }
    }

    /// Flat index of `id`.
    pub fn index(&self, id: VcpuId) -> usize {
        self.guests
            .iter()
            .position(|g| g.id == id)
            .expect("known vcpu")
    }

    /// All mode: the privileged vCPU profiling `pcpu` (pCPU p → vCPU p mod n).
    pub fn profiler(&self, pcpu: u32) -> usize {
        let n = self.m.platform.vcpu_counts[self.m.platform.privileged as usize];
        self.index(VcpuId {
            domain: self.m.platform.privileged,
            vcpu: pcpu % n,
        })
    }

    /// All mode: the pCPUs privileged vCPU `g` profiles.
    pub fn profiled(&self, g: usize) -> Vec<u32> {
        let n = self.m.platform.vcpu_counts[self.m.platform.privileged as usize];
        (0..self.pcpus())
            .filter(|p| p % n == self.guests[g].id.vcpu)
            .collect()
    }

    /// Executes one step.
    pub fn step(&mut self, step: Step) {
        let vcpus = self.guests.len();
        match step {
            Step::Run { pcpu, vcpu, count } => {
                let pcpu = pcpu % self.pcpus();
                self.enter(vcpu % vcpus, Some(pcpu));
                for _ in 0..count {
                    self.retire_one(pcpu, vcpu % vcpus);
                }
            }
            Step::Idle { pcpu } => self.m.schedule(pcpu % self.pcpus(), None),
            Step::Toggle { vcpu, counter } => {
                self.enter(vcpu % vcpus, None);
                self.toggle(vcpu % vcpus, counter);
            }
            Step::Read { vcpu } => {
                self.enter(vcpu % vcpus, None);
                self.read_all(vcpu % vcpus);
            }
            Step::MaskPage { vcpu } => {
                self.enter(vcpu % vcpus, None);
                self.toggle_page_mask(vcpu % vcpus);
            }
            Step::Restart { vcpu } => self.restart(vcpu % vcpus),
        }
    }

    /// vCPU `g` is scheduled in (on `pcpu`, or where it runs, or on pCPU 0) and, at this
    /// slice boundary, takes its pending interrupts first.
    pub fn enter(&mut self, g: usize, pcpu: Option<u32>) {
        let id = self.guests[g].id;
        let target = pcpu.or(self.m.running_on(id)).unwrap_or(0);
        if self.m.running_on(id) != Some(target) {
            self.m.schedule(target, Some(id));
        }
        self.handle_pending(g);
    }

    /// vCPU `g`, running on `pcpu`, retires its next instruction; the PMI it raises (if any)
    /// is checked against the prediction.
    pub fn retire_one(&mut self, pcpu: u32, g: usize) {
        let insn = self.guests[g].next_instruction();
        let seq = self.m.retired;
        let id = self.guests[g].id;
        let (wrapped, interrupts, receiver, source) = match self.mode {
            XENPMU_MODE_SELF | XENPMU_MODE_HV => {
                let truth = &mut self.guests[g].truth;
                (
                    truth.retire(&insn),
                    truth.interrupt_bits(),
                    Some(g),
                    Source::Own,
                )
            }
            XENPMU_MODE_ALL => {
                let truth = &mut self.pcpu_truth[pcpu as usize];
                let wrapped = truth.retire(&insn);
                (
                    wrapped,
                    truth.interrupt_bits(),
                    Some(self.profiler(pcpu)),
                    Source::Pcpu(pcpu),
                )
            }
            _ => (0, 0, None, Source::Own),
        };
        let lvtpc_masked = receiver.map(|r| self.m.platform.lvtpc_masked(self.guests[r].id));
        let record = self.m.retire(pcpu, &insn);
        let due = wrapped & interrupts != 0;
        let Some(record) = record else {
            assert!(
                !due,
                "{id:?} at {insn:?}: the overflow of {wrapped:#x} raised no PMI"
            );
            self.expect_no_new_interrupts();
            return self.after_instruction();
        };
        assert!(due, "{id:?} at {insn:?}: unexpected PMI {record:?}");
        let r = receiver.expect("a PMI is routed somewhere");
        let to = self.guests[r].id;
        let counters = if self.driver.has_global() {
            wrapped
        } else {
            wrapped & interrupts
        };
        let overflow = Overflow {
            counters: CounterSet(counters),
            interrupt: true,
        };
        let sample = Window {
            source,
            identity: self.identity(to, id, pcpu),
            regs: regs(id, &insn, seq),
        };
        let delivered = self.predict_delivery(r, source, sample, lvtpc_masked == Some(true));
        let expected = if delivered {
            PmiOutcome::Delivered { to, overflow }
        } else {
            PmiOutcome::Dropped { to, overflow }
        };
        assert_eq!(
            record.outcome,
            Some(expected),
            "{id:?} on pCPU {pcpu} at {insn:?}: PMI outcome"
        );
        self.after_instruction();
    }

    /// The identity a sample of `sampled` on `pcpu` must carry in `receiver`'s page.
    fn identity(&self, receiver: VcpuId, sampled: VcpuId, pcpu: u32) -> Identity {
        let privileged = receiver.domain == self.m.platform.privileged;
        Identity {
            domain_id: if receiver == sampled {
                XENPMU_DOMID_SELF
            } else {
                sampled.domain
            },
            vcpu_id: sampled.vcpu,
            pcpu_id: if privileged { pcpu } else { sampled.vcpu },
            _pad0: 0,
        }
    }

    /// Decides from the guests' own state whether a due PMI to guest `r` is delivered, opens
    /// the window a delivered sample starts, and checks the interrupt the platform received.
    fn predict_delivery(&mut self, r: usize, source: Source, sample: Window, masked: bool) -> bool {
        let to = self.guests[r].id;
        let guest = &mut self.guests[r];
        // All mode always samples into a page; self/hv mode only for a guest with one.
        let (delivered, pending) = if guest.page_gfn.is_some() || source != Source::Own {
            let open = guest.page_gfn.is_some() && !guest.page_masked;
            let busy = guest.window.is_some();
            guest.stats.dropped_cached += u64::from(open && busy);
            guest.page_drops += u64::from(open && busy);
            (open && !busy, Pending::Virq)
        } else {
            (!masked, Pending::Lvtpc)
        };
        if delivered {
            guest.stats.delivered += 1;
        } else {
            guest.stats.dropped += 1;
        }
        let mut expected = (VecDeque::new(), VecDeque::new());
        if delivered {
            match pending {
                Pending::Virq => {
                    expected.0.push_back(to);
                    guest.window = Some(sample);
                    match source {
                        Source::Own => guest.truth.stopped = true,
                        Source::Pcpu(p) => self.pcpu_truth[p as usize].stopped = true,
                    }
                }
                Pending::Lvtpc => expected.1.push_back(to),
            }
            self.guests[r].pending.push_back(pending);
        }
        let platform = &mut self.m.platform;
        let actual = (
            std::mem::take(&mut platform.virqs),
            std::mem::take(&mut platform.lvtpc_deliveries),
        );
        assert_eq!(
            actual, expected,
            "(VIRQs, LVTPC deliveries) of a PMI to {to:?}"
        );
        delivered
    }

    fn expect_no_new_interrupts(&self) {
        assert!(
            self.m.platform.virqs.is_empty() && self.m.platform.lvtpc_deliveries.is_empty(),
            "an interrupt without a PMI"
        );
    }

    fn after_instruction(&mut self) {
        if self.timing == Timing::Immediate {
            for g in 0..self.guests.len() {
                self.handle_pending(g);
            }
        }
    }

    /// Ends a run: every pending interrupt is handled, every counter read and checked, every
    /// pCPU idled; then the hardware must be clean (self/hv mode) and PMIs conserved.
    pub fn finish(&mut self) {
        for g in 0..self.guests.len() {
            if !self.guests[g].pending.is_empty() {
                self.enter(g, Some(0));
            }
        }
        for (g, guest) in self.guests.iter().enumerate() {
            assert_eq!(
                guest.window, None,
                "guest {g}: a sample never reached its handler"
            );
        }
        match self.mode {
            XENPMU_MODE_SELF | XENPMU_MODE_HV => {
                for g in 0..self.guests.len() {
                    if !self.guests[g].plan.counters.is_empty() {
                        self.enter(g, Some(0));
                        self.read_all(g);
                    }
                }
            }
            XENPMU_MODE_ALL => {
                for g in 0..self.guests.len() {
                    if self.has_vpmu(g) && !self.guests[g].plan.counters.is_empty() {
                        for p in self.profiled(g) {
                            self.enter(g, Some(p));
                            self.read_system(g, p);
                        }
                    }
                }
            }
            _ => {}
        }
        for p in 0..self.pcpus() {
            self.m.schedule(p, None);
        }
        if self.mode != XENPMU_MODE_ALL {
            for (p, cpu) in self.m.pcpus.iter().enumerate() {
                assert!(
                    V::nothing_can_count(cpu.hw()),
                    "pCPU {p}: nothing can count when idle"
                );
            }
        }
        self.m.assert_conservation();
        for guest in &self.guests {
            let stats = *self.m.vcpu(guest.id).stats();
            assert_eq!(
                (stats.pmis_delivered, stats.pmis_dropped),
                (guest.stats.delivered, guest.stats.dropped),
                "{:?}: PMIs delivered and dropped, as predicted",
                guest.id
            );
        }
    }
}
