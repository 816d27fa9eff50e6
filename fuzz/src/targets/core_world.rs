//! The core itself, driven as the simulator drives it: a [`World`] (the core over two pCPUs
//! with software PMU models, guests with perf drivers, a ground truth) plays a sequence of
//! scheduling with migration, instructions retiring and raising PMIs, guest RDMSR/WRMSR,
//! counter enable toggles, reads, page LVTPC changes, finish/init restarts and the page
//! handlers' flushes — and the World checks everything it checks in the `sim_*` suites: every
//! PMI's verdict, receiver, identity and registers against the prediction, every counter read
//! against the ground truth, PMI conservation, the dropped-sample counter and sequence numbers,
//! and at the end a clean hardware with nothing loaded.
//!
//! Alongside, a hostile vCPU (domain 2, unprivileged, not driven by the World) makes arbitrary
//! guest RDMSR/WRMSR/RDPMC, arbitrary control operations (any number, version, vCPU, value;
//! pages registered in its own frames; sample rings, ABI 1.4, registered from a configuration
//! its ring area starts with, or finished), arbitrary edits of its own frames and of its ring
//! area (tails and configurations included), consumes its ring, and runs instructions that
//! overflow whatever it programmed. It must never disturb the World's guests
//! (their ground truth stays exact), its PMIs must reach it and nobody else, and without a vPMU
//! (off and all mode) every access to a PMU MSR faults. Nothing may make the core return an
//! error or panic.
//!
//! The input is a byte format of its own ([`CoreInput::parse`], with [`CoreInput::to_bytes`]
//! its inverse for the seeds): a header (shape, mode, topology, filters), one perf-driver plan
//! and workload per World vCPU, then the actions.

use vpmu::abi::ops::{Params, Version};
use vpmu::abi::{
    PageView, XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_FLUSH,
    XENPMU_OP_INIT, XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT,
};
use vpmu::{MsrOutcome, PmiOutcome, PmuBackend};
use vpmu_sim::plan::{CounterSpec, PlanSpec};
use vpmu_sim::platform::{FRAMES_PER_DOMAIN, guest_frame};
use vpmu_sim::ring::{self, RingGuest};
use vpmu_sim::{
    Run, Scenario, SimEvent, SimVendor, Step, Timing, World, amd_legacy, amd_v2, intel_v2, intel_v5,
};

use crate::seeds::Seed;
use crate::shapes::{ACCESS_BYTES, Access};

/// Milestone: a World guest's page handler read a published sample.
pub const PUBLISHED: &str = "core_world: a sample published and read from a page";
/// Milestone: a World guest with programmed counters ran on the other pCPU than before.
pub const MIGRATED: &str = "core_world: a vCPU with live counters migrated";
/// Milestone: the hostile vCPU's consumer found records in its ring.
pub const HOSTILE_RING: &str = "core_world: the hostile vCPU's ring holds records";
/// Milestone: the hostile vCPU flushed its page while a sample of its own was cached.
pub const HOSTILE_FLUSH: &str = "core_world: a hostile flush of a cached sample";

/// The first frame (index in the hostile domain) of the hostile vCPU's ring area: a control
/// page holding a valid configuration (2 data pages, counter 0 re-armed every 17), then the
/// data pages.
pub const RING_AREA: u64 = 0x10;
/// Frames of the hostile vCPU's ring area.
const RING_AREA_FRAMES: u64 = 3;

/// pCPUs of every machine.
pub const PCPUS: u32 = 2;
/// The hostile domain.
pub const HOSTILE_DOMAIN: u32 = 2;
/// Actions per input at most.
pub const MAX_ACTIONS: usize = 64;
/// Instructions retired per input at most (World and hostile runs together).
pub const MAX_RETIRED: u32 = 4000;

/// One counter of a World guest's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterIn {
    /// `CounterSpec::slot`.
    pub slot: u8,
    /// Bit 0: branches (else instructions); bit 1: OS; bit 2: USR; bit 3: sampling.
    pub flags: u8,
    /// The sampling period is `3 + period % 38` (the simulator suites' range).
    pub period: u8,
    /// The start value is `initial % 1000`.
    pub initial: u16,
}

/// One run of a World guest's workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunIn {
    /// The function (modulo 8).
    pub function: u8,
    /// `1 + len % 40` instructions.
    pub len: u8,
    /// Every `branch_every % 4`-th instruction is a branch.
    pub branch_every: u8,
}

/// A World guest: its perf driver's plan and its workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestIn {
    /// Whether it registers a shared page.
    pub page: bool,
    /// Up to 4 counters.
    pub counters: Vec<CounterIn>,
    /// 1 to 6 runs.
    pub runs: Vec<RunIn>,
}

/// What happens next. World vCPUs are named by flat index (modulo their count), pCPUs by bit 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `Step::Run` for `1 + count % 150` instructions.
    Run {
        /// pCPU.
        pcpu: u8,
        /// World vCPU.
        vcpu: u8,
        /// Instructions.
        count: u8,
    },
    /// `Step::Idle`.
    Idle {
        /// pCPU.
        pcpu: u8,
    },
    /// `Step::Toggle`.
    Toggle {
        /// World vCPU.
        vcpu: u8,
        /// Counter of its plan.
        counter: u8,
    },
    /// `Step::Read`.
    Read {
        /// World vCPU.
        vcpu: u8,
    },
    /// `Step::MaskPage`.
    MaskPage {
        /// World vCPU.
        vcpu: u8,
    },
    /// `Step::Restart`.
    Restart {
        /// World vCPU.
        vcpu: u8,
    },
    /// A hostile RDMSR or WRMSR; with `range & 0x7f == 0x7e` an RDPMC of ECX = the value's
    /// low 32 bits, at CPL 3 if `offset` bit 0, CR4.PCE = `offset` bit 1.
    Access(Access),
    /// A hostile action: `kind % 4` is 0: control operation `a % 10` on vCPU `b & 3`
    /// (`u32::MAX` if `b & 4`) with `val` = `value` (an INIT's `value` below 8 names that
    /// frame of its domain; a RING_INIT's names frame `RING_AREA + value`), version major 0 if
    /// `b & 0x100`, `_pad0` 1 if `b & 0x200`; operation 9 is RING_FINISH if `b & 0x400`; 1:
    /// runs `1 + value % 150` instructions on pCPU `a & 1`; 2: writes `value` at byte
    /// `b % 4089` of its frame `a % 4` (of its ring area's 3 frames, from `RING_AREA`, at
    /// `a % 3`, if `a & 0x80`), or with `b & 0x8000` consumes its ring (stores the head it
    /// finds as the tail); 3: XENPMU_OP_FLUSH.
    Hostile {
        /// What.
        kind: u8,
        /// First operand.
        a: u8,
        /// Second operand.
        b: u16,
        /// The value.
        value: u64,
    },
}

/// A whole input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreInput {
    /// `% 4`: intel-v5, intel-v2, amd-perfmonv2, amd-k7.
    pub vendor: u8,
    /// `% 4`: off, self, hv, all.
    pub mode: u8,
    /// Bit 0: handlers deferred to the next run; bit 1: the privileged domain has 2 vCPUs;
    /// bit 2: domain 1 has 2 vCPUs; bits 4:3 and 6:5: the event the filter of domain 0 and 1
    /// denies (1 instructions, 2 branches, else none).
    pub flags: u8,
    /// The World guests, domain-major (as many as the topology has; missing ones do nothing).
    pub guests: Vec<GuestIn>,
    /// The actions.
    pub actions: Vec<Action>,
}

const ACTION_RUN: u8 = 0;
const ACTION_IDLE: u8 = 1;
const ACTION_TOGGLE: u8 = 2;
const ACTION_READ: u8 = 3;
const ACTION_MASK: u8 = 4;
const ACTION_RESTART: u8 = 5;
const ACTION_ACCESS: u8 = 6;
const ACTION_HOSTILE: u8 = 7;

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }
}

impl CoreInput {
    /// The World vCPUs per domain (0 and 1).
    pub fn topology(flags: u8) -> [u32; 2] {
        [1 + u32::from(flags >> 1 & 1), 1 + u32::from(flags >> 2 & 1)]
    }

    /// Decodes an input; `None` if it is shorter than its header and plans.
    pub fn parse(data: &[u8]) -> Option<CoreInput> {
        let mut r = Reader(data);
        let [vendor, mode, flags] = r.bytes::<3>()?;
        let [dom0, dom1] = Self::topology(flags);
        let mut guests = Vec::new();
        for _ in 0..dom0 + dom1 {
            let head = r.byte()?;
            let mut guest = GuestIn {
                page: head & 0x80 != 0,
                counters: Vec::new(),
                runs: Vec::new(),
            };
            for _ in 0..head % 8 % 5 {
                let [slot, flags, period, lo, hi] = r.bytes::<5>()?;
                guest.counters.push(CounterIn {
                    slot,
                    flags,
                    period,
                    initial: u16::from_le_bytes([lo, hi]),
                });
            }
            for _ in 0..1 + (head >> 3 & 7) % 6 {
                let [function, len, branch_every] = r.bytes::<3>()?;
                guest.runs.push(RunIn {
                    function,
                    len,
                    branch_every,
                });
            }
            guests.push(guest);
        }
        let mut actions = Vec::new();
        while actions.len() < MAX_ACTIONS {
            let Some(op) = r.byte() else { break };
            let action = match op % 8 {
                ACTION_RUN => {
                    let [pcpu, vcpu, count] = r.bytes::<3>()?;
                    Action::Run { pcpu, vcpu, count }
                }
                ACTION_IDLE => Action::Idle { pcpu: r.byte()? },
                ACTION_TOGGLE => {
                    let [vcpu, counter] = r.bytes::<2>()?;
                    Action::Toggle { vcpu, counter }
                }
                ACTION_READ => Action::Read { vcpu: r.byte()? },
                ACTION_MASK => Action::MaskPage { vcpu: r.byte()? },
                ACTION_RESTART => Action::Restart { vcpu: r.byte()? },
                ACTION_ACCESS => Action::Access(Access::parse(&r.bytes::<ACCESS_BYTES>()?).next()?),
                _ => {
                    let [kind, a, b0, b1, v @ ..] = r.bytes::<12>()?;
                    Action::Hostile {
                        kind,
                        a,
                        b: u16::from_le_bytes([b0, b1]),
                        value: u64::from_le_bytes(v),
                    }
                }
            };
            actions.push(action);
        }
        Some(CoreInput {
            vendor,
            mode,
            flags,
            guests,
            actions,
        })
    }

    /// The input's bytes: `parse(to_bytes(x)) == x` for every `x` within the format's limits
    /// (as many guests as the topology has, at most 4 counters and 1 to 6 runs each, at most
    /// [`MAX_ACTIONS`] actions).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![self.vendor, self.mode, self.flags];
        for guest in &self.guests {
            let head = u8::from(guest.page) << 7
                | (guest.runs.len() as u8 - 1) << 3
                | guest.counters.len() as u8;
            out.push(head);
            for c in &guest.counters {
                out.extend_from_slice(&[c.slot, c.flags, c.period]);
                out.extend_from_slice(&c.initial.to_le_bytes());
            }
            for run in &guest.runs {
                out.extend_from_slice(&[run.function, run.len, run.branch_every]);
            }
        }
        for action in &self.actions {
            match *action {
                Action::Run { pcpu, vcpu, count } => {
                    out.extend_from_slice(&[ACTION_RUN, pcpu, vcpu, count])
                }
                Action::Idle { pcpu } => out.extend_from_slice(&[ACTION_IDLE, pcpu]),
                Action::Toggle { vcpu, counter } => {
                    out.extend_from_slice(&[ACTION_TOGGLE, vcpu, counter])
                }
                Action::Read { vcpu } => out.extend_from_slice(&[ACTION_READ, vcpu]),
                Action::MaskPage { vcpu } => out.extend_from_slice(&[ACTION_MASK, vcpu]),
                Action::Restart { vcpu } => out.extend_from_slice(&[ACTION_RESTART, vcpu]),
                Action::Access(access) => {
                    out.push(ACTION_ACCESS);
                    out.extend_from_slice(&access.to_bytes());
                }
                Action::Hostile { kind, a, b, value } => {
                    out.extend_from_slice(&[ACTION_HOSTILE, kind, a]);
                    out.extend_from_slice(&b.to_le_bytes());
                    out.extend_from_slice(&value.to_le_bytes());
                }
            }
        }
        out
    }

    /// The simulator's scenario this input sets up (its steps are played one by one).
    pub fn scenario(&self) -> Scenario {
        let [dom0, dom1] = Self::topology(self.flags);
        let world_vcpus = (dom0 + dom1) as usize;
        let filter = |bits: u8| match bits & 3 {
            1 => Some(SimEvent::Instructions),
            2 => Some(SimEvent::Branches),
            _ => None,
        };
        let guest = |g: usize| self.guests.get(g);
        Scenario {
            pcpus: PCPUS,
            domains: vec![dom0, dom1, 1],
            mode: [
                XENPMU_MODE_OFF,
                XENPMU_MODE_SELF,
                XENPMU_MODE_HV,
                XENPMU_MODE_ALL,
            ][usize::from(self.mode % 4)],
            timing: if self.flags & 1 != 0 {
                Timing::Deferred
            } else {
                Timing::Immediate
            },
            workloads: (0..world_vcpus)
                .map(|g| {
                    guest(g).map_or_else(Vec::new, |guest| {
                        guest
                            .runs
                            .iter()
                            .map(|run| Run {
                                function: u32::from(run.function % 8),
                                len: 1 + u32::from(run.len % 40),
                                branch_every: u32::from(run.branch_every % 4),
                            })
                            .collect()
                    })
                })
                .chain([vec![Run {
                    function: 5,
                    len: 40,
                    branch_every: 2,
                }]])
                .collect(),
            plans: (0..world_vcpus)
                .map(|g| {
                    guest(g).map_or_else(PlanSpec::default, |guest| PlanSpec {
                        counters: guest
                            .counters
                            .iter()
                            .map(|c| CounterSpec {
                                slot: usize::from(c.slot),
                                event: if c.flags & 1 != 0 {
                                    SimEvent::Branches
                                } else {
                                    SimEvent::Instructions
                                },
                                os: c.flags & 2 != 0,
                                usr: c.flags & 4 != 0,
                                period: (c.flags & 8 != 0).then(|| 3 + u64::from(c.period % 38)),
                                initial: u64::from(c.initial % 1000),
                            })
                            .collect(),
                        page: guest.page,
                    })
                })
                .chain([PlanSpec::default()])
                .collect(),
            steps: Vec::new(),
            filters: vec![filter(self.flags >> 3), filter(self.flags >> 5), None],
        }
    }
}

/// The target.
pub fn run(data: &[u8]) {
    let Some(input) = CoreInput::parse(data) else {
        return;
    };
    match input.vendor % 4 {
        0 => play(intel_v5(), &input),
        1 => play(intel_v2(), &input),
        2 => play(amd_v2(), &input),
        _ => play(amd_legacy(), &input),
    }
}

/// Plays `input` on `vendor`'s machine.
pub fn play<V: SimVendor>(vendor: V, input: &CoreInput) {
    let scenario = input.scenario();
    let mut world = World::new(vendor, &scenario);
    let hostile = world.guests.len() - 1;
    let world_vcpus = hostile;
    RingGuest::prepare(
        &mut world.m.platform,
        HOSTILE_DOMAIN,
        guest_frame(HOSTILE_DOMAIN, RING_AREA),
        &ring::config(2, 0, 0, &[(false, 0, 17)]),
    );
    let mut budget = MAX_RETIRED;
    let mut last_pcpu = vec![None; world_vcpus];
    for action in &input.actions {
        match *action {
            Action::Run { pcpu, vcpu, count } => {
                let (pcpu, g) = (u32::from(pcpu & 1), usize::from(vcpu) % world_vcpus);
                let count = (1 + u32::from(count) % 150).min(budget);
                budget -= count;
                if last_pcpu[g].is_some_and(|p| p != pcpu)
                    && world.has_vpmu(g)
                    && !world.guests[g].plan.counters.is_empty()
                {
                    crate::reached(MIGRATED);
                }
                last_pcpu[g] = Some(pcpu);
                world.step(Step::Run {
                    pcpu,
                    vcpu: g,
                    count,
                });
            }
            Action::Idle { pcpu } => world.step(Step::Idle {
                pcpu: u32::from(pcpu & 1),
            }),
            Action::Toggle { vcpu, counter } => world.step(Step::Toggle {
                vcpu: usize::from(vcpu) % world_vcpus,
                counter: usize::from(counter),
            }),
            Action::Read { vcpu } => world.step(Step::Read {
                vcpu: usize::from(vcpu) % world_vcpus,
            }),
            Action::MaskPage { vcpu } => world.step(Step::MaskPage {
                vcpu: usize::from(vcpu) % world_vcpus,
            }),
            Action::Restart { vcpu } => world.step(Step::Restart {
                vcpu: usize::from(vcpu) % world_vcpus,
            }),
            Action::Access(access) => hostile_access(&mut world, hostile, access),
            Action::Hostile { kind, a, b, value } => {
                hostile_action(&mut world, hostile, kind, a, b, value, &mut budget)
            }
        }
        take_hostile_interrupts(&mut world, hostile);
    }
    if !world.samples.is_empty() {
        crate::reached(PUBLISHED);
    }
    // The hostile vCPU runs no more: every pCPU idles, and its PMIs are what the core counted
    // (it has no ground truth; its conservation is still checked by `finish`).
    for p in 0..PCPUS {
        world.m.schedule(p, None);
    }
    take_hostile_interrupts(&mut world, hostile);
    let id = world.guests[hostile].id;
    let stats = *world.m.vcpu(id).stats();
    world.guests[hostile].stats.delivered = stats.pmis_delivered;
    world.guests[hostile].stats.dropped = stats.pmis_dropped;
    world.finish();
}

/// Whether the hostile vCPU has a vPMU in the World's mode (self and hv mode: yes).
fn hostile_has_vpmu<V: SimVendor>(world: &World<V>, hostile: usize) -> bool {
    world.has_vpmu(hostile)
}

fn hostile_access<V: SimVendor>(world: &mut World<V>, hostile: usize, access: Access) {
    let id = world.guests[hostile].id;
    let has = hostile_has_vpmu(world, hostile);
    // An intercept comes from the running vCPU: it is scheduled in where it ran, or on pCPU 0.
    if world.m.running_on(id).is_none() {
        world.m.schedule(0, Some(id));
    }
    let backend = world.m.vpmu.backend();
    if access.range & 0x7f == 0x7e {
        let selector = access.value as u32;
        let valid = backend.rdpmc_counter(selector).is_some();
        let outcome = world.m.rdpmc(
            id,
            selector,
            3 * (access.offset & 1),
            access.offset & 2 != 0,
        );
        if !has || !valid {
            assert_eq!(
                outcome,
                MsrOutcome::GeneralProtection,
                "RDPMC {selector:#x}"
            );
        }
        return;
    }
    let msr = access.msr(backend.msr_ranges());
    let owned = backend.owns(msr);
    let faults = if access.is_read() {
        world.m.rdmsr(id, msr.0) == MsrOutcome::GeneralProtection
    } else {
        world.m.wrmsr(id, msr.0, access.value) == MsrOutcome::GeneralProtection
    };
    if owned && !has {
        assert!(faults, "{msr:?} without a vPMU faults");
    }
}

fn hostile_action<V: SimVendor>(
    world: &mut World<V>,
    hostile: usize,
    kind: u8,
    a: u8,
    b: u16,
    value: u64,
    budget: &mut u32,
) {
    let id = world.guests[hostile].id;
    match kind % 4 {
        0 | 3 => {
            let op = match u32::from(a % 10) {
                _ if kind % 4 == 3 => XENPMU_OP_FLUSH,
                XENPMU_OP_RING_INIT if b & 0x400 != 0 => XENPMU_OP_RING_FINISH,
                op => op,
            };
            let mut params = Params::new(value, u32::from(b & 3));
            if kind.is_multiple_of(4) {
                if b & 4 != 0 {
                    params.vcpu = u32::MAX;
                }
                if b & 0x100 != 0 {
                    params.version = Version { major: 0, minor: 0 };
                }
                params._pad0 = u32::from(b >> 9 & 1);
            } else {
                params.vcpu = 0;
            }
            if op == XENPMU_OP_INIT && value < 8 {
                params.val = guest_frame(HOSTILE_DOMAIN, value);
            }
            if op == XENPMU_OP_RING_INIT && value < 8 {
                params.val = guest_frame(HOSTILE_DOMAIN, RING_AREA + value);
            }
            let cached = op == XENPMU_OP_FLUSH && page_cached(world);
            let result = world.m.op(id, op, &params);
            if cached && result.is_ok() {
                crate::reached(HOSTILE_FLUSH);
            }
        }
        1 => {
            let pcpu = u32::from(a & 1);
            let count = (1 + (value % 150) as u32).min(*budget);
            *budget -= count;
            if hostile_has_vpmu(world, hostile) {
                world.m.schedule(pcpu, Some(id));
                for _ in 0..count {
                    let insn = world.guests[hostile].next_instruction();
                    let record = world.m.retire(pcpu, &insn);
                    if let Some(PmiOutcome::Delivered { to, .. } | PmiOutcome::Dropped { to, .. }) =
                        record.and_then(|r| r.outcome)
                    {
                        assert_eq!(to, id, "the hostile vCPU's PMI reaches it alone");
                    }
                    take_hostile_interrupts(world, hostile);
                }
            } else {
                // Without a vPMU its instructions are the World's business (counted by an
                // all-mode profiler's system-wide counters).
                world.step(Step::Run {
                    pcpu,
                    vcpu: hostile,
                    count,
                });
            }
        }
        _ if b & 0x8000 != 0 => {
            // The consumer: everything up to the head it finds is read.
            let ring = RingGuest {
                domain: HOSTILE_DOMAIN,
                gfn: guest_frame(HOSTILE_DOMAIN, RING_AREA),
                data_pages: 2,
                tail: 0,
            };
            let head = ring.producer(&world.m.platform).head;
            let mut ring = ring;
            ring.store_tail(&mut world.m.platform, head);
            if head != 0 {
                crate::reached(HOSTILE_RING);
            }
        }
        _ => {
            // Its own frames, or (`a & 0x80`) the control page and 2 data pages of its ring area.
            let (first, frames) = if a & 0x80 != 0 {
                (RING_AREA, RING_AREA_FRAMES)
            } else {
                (0, FRAMES_PER_DOMAIN)
            };
            let gfn = guest_frame(HOSTILE_DOMAIN, first + u64::from(a) % frames);
            let frame = world.m.platform.frame_mut(HOSTILE_DOMAIN, gfn);
            let bytes = zerocopy::IntoBytes::as_mut_bytes(frame);
            let at = usize::from(b) % (bytes.len() - 7);
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
    }
}

/// Whether one of the hostile domain's frames holds a cached sample.
fn page_cached<V: SimVendor>(world: &World<V>) -> bool {
    (0..FRAMES_PER_DOMAIN).any(|index| {
        let frame = world
            .m
            .platform
            .frame(HOSTILE_DOMAIN, guest_frame(HOSTILE_DOMAIN, index));
        PageView::new(frame).is_ok_and(|view| view.is_cached())
    })
}

/// The hostile vCPU takes its interrupts (it ignores them); any interrupt for someone else
/// left by its actions fails the run.
fn take_hostile_interrupts<V: SimVendor>(world: &mut World<V>, hostile: usize) {
    let id = world.guests[hostile].id;
    let platform = &mut world.m.platform;
    for queue in [&mut platform.virqs, &mut platform.lvtpc_deliveries] {
        assert!(
            queue.iter().all(|&to| to == id),
            "an interrupt for a World guest outside its PMIs: {queue:?}"
        );
        queue.clear();
    }
}

/// Seeds for the ring actions: on each shape in self mode, the World's sampling guest runs
/// while the hostile vCPU registers its page, unmasks it, programs a sampling counter with the
/// driver's writes, registers its ring (the configuration at `RING_AREA`), runs into samples,
/// consumes its ring, scribbles a tail, runs again and finishes the ring.
pub fn ring_seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for (vendor, name) in [
        (0u8, "intel-v5"),
        (1, "intel-v2"),
        (2, "amd-perfmonv2"),
        (3, "amd-k7"),
    ] {
        let program = match vendor {
            0 => driver_program(&intel_v5()),
            1 => driver_program(&intel_v2()),
            2 => driver_program(&amd_v2()),
            _ => driver_program(&amd_legacy()),
        };
        let hostile = |kind, a, b, value| Action::Hostile { kind, a, b, value };
        let lvtpc = core::mem::offset_of!(vpmu::abi::Page, lapic_lvtpc) as u16;
        let tail = vpmu::abi::XENPMU_RING_CONSUMER_OFFSET as u16;
        let mut actions = vec![
            Action::Run {
                pcpu: 0,
                vcpu: 0,
                count: 60,
            },
            hostile(0, XENPMU_OP_INIT as u8, 0, 0),
            hostile(2, 0, lvtpc, 0),
            hostile(0, vpmu::abi::XENPMU_OP_LVTPC_SET as u8, 0, 0),
            hostile(0, XENPMU_OP_RING_INIT as u8, 0, 0),
        ];
        actions.extend(program.into_iter().map(Action::Access));
        actions.extend([
            hostile(1, 1, 0, 120),
            hostile(2, 0, 0x8000, 0),
            // 0x81: the ring area's frame 0 (0x81 % 3), the control page.
            hostile(2, 0x81, tail, 0xdead_beef),
            hostile(1, 0, 0, 60),
            Action::Run {
                pcpu: 1,
                vcpu: 0,
                count: 50,
            },
            hostile(2, 0, 0x8000, 0),
            hostile(1, 1, 0, 40),
            hostile(0, XENPMU_OP_RING_INIT as u8, 0x400, 0),
            hostile(1, 0, 0, 30),
            hostile(3, 0, 0, 0),
        ]);
        let sampler = GuestIn {
            page: true,
            counters: vec![CounterIn {
                slot: 0,
                flags: 0b1110,
                period: 20,
                initial: 0,
            }],
            runs: vec![RunIn {
                function: 1,
                len: 30,
                branch_every: 2,
            }],
        };
        let input = CoreInput {
            vendor,
            mode: 1,
            flags: 0,
            guests: vec![
                GuestIn {
                    page: false,
                    counters: Vec::new(),
                    runs: sampler.runs.clone(),
                },
                sampler,
            ],
            actions,
        };
        seeds.push(Seed {
            target: "core_world",
            name: format!("seed-{name}-ring"),
            bytes: input.to_bytes(),
        });
    }
    seeds
}

/// The hostile vCPU's driver writes: counter 0 sampling every 30 instructions.
fn driver_program<S: SimVendor>(shape: &S) -> Vec<Access> {
    let driver = shape.driver();
    let ranges = shape.backend().msr_ranges();
    let setup = vpmu_sim::helpers::sampling(0, 30);
    let mut writes = vec![
        driver.disable(setup.ctr),
        driver.write_counter(setup.ctr, setup.start_value()),
        driver.control(&setup),
    ];
    writes.extend(driver.global_enable(setup.bit()));
    writes
        .into_iter()
        .map(|(msr, value)| Access::to(ranges, msr, value, false))
        .collect()
}
