//! [`RingWorld`]: a [`Machine`] whose profilers sample through rings (ABI 1.4), driven by
//! [`RingStep`]s — bursts of instructions (so that each PMI finds its counter past the wrap),
//! consumers that read some records or none, hostile tails, page LVTPC masking, ring
//! re-registration, frames taken away under the producer, the latency timer — with the ring's
//! invariants checked after every step:
//!
//! * every write into a ring lies in the bytes the consumer's tail leaves free (the platform's
//!   own check, `ring::write_ring_area`), so no unread byte is ever overwritten;
//! * every sample the core generates for a profiler while its ring is registered is exactly
//!   one of published, lost or withheld: the producer's counters add up to the PMIs
//!   generated, the records and lost records the consumer read account for every sequence
//!   number of the registration once, but for the withheld ones and the losses not reported
//!   yet;
//! * the producer's line in guest memory is what the hypervisor keeps, and every wakeup is one
//!   PMU VIRQ;
//! * the counters are re-armed so that the periods add up to what they counted: one PMI per
//!   whole period, and (self mode) the counter reads `(counted mod p) - p`;
//! * PMIs are conserved (`Machine::assert_conservation`).
//!
//! Self mode: each subject is a vCPU of domain 1 sampling its own instructions; all mode: each
//! subject is the privileged vCPU profiling one pCPU, on which domain 1's vCPUs run.

use vpmu::abi::ops::Params;
use vpmu::abi::{
    PageViewMut, XENPMU_MODE_ALL, XENPMU_OP_LVTPC_SET, XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT,
    XENPMU_RING_MAGIC,
};
use vpmu::{PmiOutcome, VcpuId};
use zerocopy::IntoBytes;

use super::helpers::sampling;
use super::machine::Machine;
use super::platform::guest_frame;
use super::ring::{Record, RingGuest, Stream, config};
use super::snapshot::Snapshot;
use super::vendor::SimVendor;
use super::workload::{Instruction, function_base};

/// Subjects (profilers) of a world.
pub const SUBJECTS: usize = 2;

/// What happens next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingStep {
    /// `bursts` bursts of `burst` instructions (each at least 1, below the period) on
    /// `pcpu`: self mode runs subject `pcpu` there, all mode a vCPU of domain 1.
    Run {
        /// pCPU (modulo the pCPU count).
        pcpu: u8,
        /// Bursts.
        bursts: u8,
        /// Instructions per burst (taken modulo the period).
        burst: u16,
    },
    /// Subject `subject`'s consumer reads at most `limit` records (all of them: 255).
    Consume {
        /// Subject.
        subject: u8,
        /// Records at most.
        limit: u8,
    },
    /// Subject `subject`'s consumer stores a tail it should not: `kind` 0 misaligned, 1
    /// ahead of the head, 2 more than the data area behind it, 3 behind the tail it last
    /// stored (records it read, claimed unread again: valid, the ring only looks fuller), 4
    /// `amount` itself, whatever it is (a valid one past the last tail skips records: the
    /// stream's exact accounting stops until the ring is registered again).
    HostileTail {
        /// Subject.
        subject: u8,
        /// Which kind of tail.
        kind: u8,
        /// How far, or the value itself.
        amount: u64,
    },
    /// Subject `subject`'s page LVTPC is masked or unmasked (withheld samples).
    Mask {
        /// Subject.
        subject: u8,
        /// Masked.
        masked: bool,
    },
    /// Subject `subject` finishes its ring and registers it again (a fresh stream).
    Reregister {
        /// Subject.
        subject: u8,
    },
    /// Frame `frame` of subject `subject`'s ring area goes away for `bursts` bursts of
    /// instructions on its pCPU, then comes back.
    Unmapped {
        /// Subject.
        subject: u8,
        /// Frame of the area (modulo its size).
        frame: u8,
        /// Bursts meanwhile.
        bursts: u8,
    },
    /// The clock moves on by `ticks`, and the latency timer runs for every subject.
    Timer {
        /// TSC ticks.
        ticks: u32,
    },
    /// Subject `subject` finishes its ring and tries RING_INIT with a configuration patched
    /// at four places (`(offset, value)`: the 8 bytes at `offset % 256`, 8-aligned): a refusal
    /// must change nothing at all, an acceptance must describe the ring it accepted; then its
    /// own ring is registered again.
    HostileConfig {
        /// Subject.
        subject: u8,
        /// The patches.
        patches: [(u8, u64); 4],
    },
}

/// One profiler and its ring.
#[derive(Clone, Debug)]
pub struct Subject {
    /// The profiling vCPU.
    pub id: VcpuId,
    /// Its sampling period (and the ring's re-arm period).
    pub period: u64,
    /// Its ring, as the guest knows it.
    pub ring: RingGuest,
    /// What its consumer read since the ring was registered.
    pub stream: Stream,
    /// `pmis_generated` when the ring was registered.
    pub generated_at_init: u64,
    /// PMU VIRQs it received since the ring was registered.
    pub virqs: u64,
    /// Events its counter counted since it was programmed.
    pub counted: u64,
    /// PMIs it took since it was programmed.
    pub pmis: u64,
    /// Whether the producer's line in guest memory may be stale (its control page was taken
    /// away since the last PMI wrote it).
    pub stale_line: bool,
    /// The last tail the consumer stored itself (a hostile step may have scribbled another).
    pub good_tail: u64,
    /// Whether the stream accounts for every number exactly (no records were skipped).
    pub exact: bool,
}

/// The world.
#[derive(Debug)]
pub struct RingWorld<V: SimVendor> {
    /// The machine.
    pub m: Machine<V>,
    /// The mode (self or all).
    pub mode: u64,
    /// The profilers.
    pub subjects: Vec<Subject>,
    /// Sample records read in all.
    pub records_read: u64,
    /// Lost records read in all.
    pub lost_read: u64,
    /// PAD records read in all.
    pub pads_read: u64,
}

impl<V: SimVendor> RingWorld<V> {
    /// Two pCPUs in `mode` (`XENPMU_MODE_SELF` or `_ALL`); subject *i* samples every
    /// `periods[i]` into a ring of `data_pages[i]` pages with the watermark and latency bound
    /// given.
    pub fn new(
        vendor: V,
        mode: u64,
        periods: [u64; SUBJECTS],
        data_pages: [u32; SUBJECTS],
        wakeup_bytes: u32,
        max_latency_us: u32,
    ) -> Self {
        let all = mode == XENPMU_MODE_ALL;
        let domains = if all { [2, 2] } else { [1, 2] };
        let mut m = Machine::new(vendor, 2, &domains, mode);
        let mut subjects = Vec::new();
        for (k, (&period, &pages)) in periods.iter().zip(&data_pages).enumerate() {
            let id = VcpuId {
                domain: u32::from(!all),
                vcpu: k as u32,
            };
            let period = period.max(2);
            m.schedule(k as u32, Some(id));
            m.register_page(id);
            let gfn = guest_frame(id.domain, 0x100 + 0x200 * k as u64);
            let config = config(pages, wakeup_bytes, max_latency_us, &[(false, 0, period)]);
            let ring = RingGuest::prepare(&mut m.platform, id.domain, gfn, &config);
            m.program(id, &[sampling(0, period)]);
            subjects.push(Subject {
                id,
                period,
                ring,
                stream: Stream::default(),
                generated_at_init: 0,
                virqs: 0,
                counted: 0,
                pmis: 0,
                stale_line: false,
                good_tail: 0,
                exact: true,
            });
        }
        let mut world = Self {
            m,
            mode,
            subjects,
            records_read: 0,
            lost_read: 0,
            pads_read: 0,
        };
        for k in 0..SUBJECTS {
            world.register(k);
        }
        if all {
            for pcpu in 0..2 {
                world.m.schedule(
                    pcpu,
                    Some(VcpuId {
                        domain: 1,
                        vcpu: pcpu,
                    }),
                );
            }
        }
        world
    }

    fn register(&mut self, k: usize) {
        let s = &mut self.subjects[k];
        let init = self.m.op(
            s.id,
            XENPMU_OP_RING_INIT,
            &Params::new(s.ring.gfn, s.id.vcpu),
        );
        assert!(init.is_ok(), "{:?} ring_init: {init:?}", s.id);
        s.ring.tail = 0;
        s.good_tail = 0;
        s.exact = true;
        s.stream = Stream::default();
        s.generated_at_init = self.m.vcpu(s.id).stats().pmis_generated;
        s.virqs = 0;
        s.stale_line = false;
    }

    /// Executes `step`, then checks every invariant.
    pub fn step(&mut self, step: RingStep) {
        match step {
            RingStep::Run {
                pcpu,
                bursts,
                burst,
            } => self.run(usize::from(pcpu) % SUBJECTS, bursts, burst, true),
            RingStep::Consume { subject, limit } => self.consume(subject, limit),
            RingStep::HostileTail {
                subject,
                kind,
                amount,
            } => self.hostile_tail(usize::from(subject) % SUBJECTS, kind, amount),
            RingStep::Mask { subject, masked } => self.mask(subject, masked),
            RingStep::Reregister { subject } => {
                let k = usize::from(subject) % SUBJECTS;
                self.collect_virqs();
                self.check_subject(k);
                let id = self.subjects[k].id;
                let finish = self
                    .m
                    .op(id, XENPMU_OP_RING_FINISH, &Params::new(0, id.vcpu));
                assert!(finish.is_ok(), "{id:?} ring_finish: {finish:?}");
                self.register(k);
            }
            RingStep::Unmapped {
                subject,
                frame,
                bursts,
            } => {
                let k = usize::from(subject) % SUBJECTS;
                let ring = self.subjects[k].ring;
                let key = (
                    ring.domain,
                    ring.gfn + u64::from(frame) % (1 + u64::from(ring.data_pages)),
                );
                let taken = self
                    .m
                    .platform
                    .memory
                    .remove(&key)
                    .expect("a frame of the area");
                self.subjects[k].stale_line |= key.1 == ring.gfn;
                self.run(k, bursts, u16::MAX, false);
                self.m.platform.memory.insert(key, taken);
            }
            RingStep::HostileConfig { subject, patches } => {
                self.hostile_config(usize::from(subject) % SUBJECTS, patches);
            }
            RingStep::Timer { ticks } => {
                self.m.platform.clock += u64::from(ticks);
                for k in 0..SUBJECTS {
                    let id = self.subjects[k].id;
                    self.m
                        .vpmu
                        .ring_poll(&mut self.m.platform, &self.m.vcpus, id)
                        .expect("a vCPU of the table");
                }
            }
        }
        self.check();
    }

    fn hostile_config(&mut self, k: usize, patches: [(u8, u64); 4]) {
        self.collect_virqs();
        self.check_subject(k);
        let id = self.subjects[k].id;
        let finish = self
            .m
            .op(id, XENPMU_OP_RING_FINISH, &Params::new(0, id.vcpu));
        assert!(finish.is_ok(), "{id:?} ring_finish: {finish:?}");
        let mut bytes = config(1, 0, 0, &[(false, 0, 1000)]);
        let raw = bytes.as_mut_bytes();
        for (offset, value) in patches {
            let at = usize::from(offset) & !7;
            raw[at..at + 8].copy_from_slice(&value.to_le_bytes());
        }
        let gfn = guest_frame(id.domain, 0x180 + 0x200 * k as u64);
        let scratch = RingGuest::prepare(&mut self.m.platform, id.domain, gfn, &bytes);
        let before = Snapshot::take(&self.m);
        match self
            .m
            .op(id, XENPMU_OP_RING_INIT, &Params::new(gfn, id.vcpu))
        {
            Err(_) => assert_eq!(before, Snapshot::take(&self.m), "a refused RING_INIT"),
            Ok(_) => {
                let info = scratch.info(&self.m.platform);
                assert_eq!(info.magic, XENPMU_RING_MAGIC);
                assert_eq!(u64::from(info.data_size), scratch.data_size());
                let expected = if bytes.wakeup_bytes == 0 {
                    info.data_size / 2
                } else {
                    bytes.wakeup_bytes
                };
                assert_eq!(info.wakeup_bytes, expected);
                let finish = self
                    .m
                    .op(id, XENPMU_OP_RING_FINISH, &Params::new(0, id.vcpu));
                assert!(finish.is_ok(), "{id:?} ring_finish: {finish:?}");
            }
        }
        self.register(k);
    }

    fn hostile_tail(&mut self, k: usize, kind: u8, amount: u64) {
        let s = &mut self.subjects[k];
        let head = self.m.vcpu(s.id).ring().expect("a registered ring").head;
        let size = s.ring.data_size();
        let good = s.good_tail;
        let near = 8 * (amount % 1024);
        let tail = match kind % 5 {
            0 => good.wrapping_add(1 + 2 * (amount % 4)),
            1 => head.wrapping_add(8 + near),
            2 => head.wrapping_sub(size + 8 + near),
            3 => {
                let room = (size - head.wrapping_sub(good)) / 8;
                good.wrapping_sub(8 * (amount % (room + 1)))
            }
            _ => amount,
        };
        let behind = head.wrapping_sub(tail);
        if tail % 8 == 0 && behind <= size && behind < head.wrapping_sub(good) {
            // Valid and past the consumer's own tail: the records in between are skipped.
            s.good_tail = tail;
            s.exact = false;
        }
        s.ring.store_tail(&mut self.m.platform, tail);
    }

    /// Bursts on pCPU `pcpu` (subject `pcpu`'s counters, or in all mode its pCPU's);
    /// `mapped`: the whole ring area is there, so every PMI writes the producer's line.
    fn run(&mut self, pcpu: usize, bursts: u8, burst: u16, mapped: bool) {
        let s = &self.subjects[pcpu];
        let (id, period) = (s.id, s.period);
        let running = if self.mode == XENPMU_MODE_ALL {
            VcpuId {
                domain: 1,
                vcpu: pcpu as u32,
            }
        } else {
            id
        };
        if self.m.running_on(running) != Some(pcpu as u32) {
            self.m.schedule(pcpu as u32, Some(running));
        }
        let burst = 1 + u64::from(burst) % (period - 1);
        for k in 0..bursts {
            let insn = Instruction {
                rip: function_base(running.domain, 0) + 4 * u64::from(k),
                cpl: if k % 3 == 0 { 3 } else { 0 },
                branch: false,
            };
            let record = self.m.retire_burst(pcpu as u32, &insn, burst);
            let s = &mut self.subjects[pcpu];
            s.counted += burst;
            if let Some(record) = record {
                let to = match record.outcome {
                    Some(PmiOutcome::Delivered { to, .. } | PmiOutcome::Dropped { to, .. }) => to,
                    other => panic!("{id:?}: PMI {other:?}"),
                };
                assert_eq!(to, id, "the PMI reaches the profiler");
                s.pmis += 1;
                s.stale_line &= !mapped;
            }
            if s.counted / s.period != s.pmis {
                panic!(
                    "{id:?}: {} PMIs for {} events at period {}: the periods do not add up",
                    s.pmis, s.counted, s.period
                );
            }
        }
    }

    fn consume(&mut self, subject: u8, limit: u8) {
        let k = usize::from(subject) % SUBJECTS;
        let s = &mut self.subjects[k];
        // The consumer reads from the tail it stored itself, whatever was scribbled since,
        // up to the head the hypervisor keeps (a taken-away control page may have left the
        // line in memory stale).
        s.ring.tail = s.good_tail;
        let head = self.m.vcpu(s.id).ring().expect("a registered ring").head;
        let records = match s.ring.peek(&self.m.platform, head) {
            Ok(records) => records,
            // A tail the consumer itself moved into the middle of a record: it resynchronizes
            // (docs/abi.md, "Records").
            Err(_) if !s.exact => {
                s.ring.store_tail(&mut self.m.platform, head);
                s.good_tail = head;
                return;
            }
            Err(corrupt) => panic!("{:?}: a corrupt ring: {corrupt:?}", s.id),
        };
        let take = if limit == u8::MAX {
            records.len()
        } else {
            records.len().min(usize::from(limit))
        };
        let tail = records.get(take).map_or(head, |&(position, _)| position);
        let read: Vec<Record> = records.into_iter().take(take).map(|(_, r)| r).collect();
        for record in &read {
            match record {
                Record::Sample(..) => self.records_read += 1,
                Record::Lost(_) => self.lost_read += 1,
                Record::Pad(_) => self.pads_read += 1,
                Record::Unknown(_) => {}
            }
        }
        s.stream.take(read);
        s.ring.store_tail(&mut self.m.platform, tail);
        s.good_tail = tail;
    }

    fn mask(&mut self, subject: u8, masked: bool) {
        let id = self.subjects[usize::from(subject) % SUBJECTS].id;
        PageViewMut::new(
            self.m
                .platform
                .frame_mut(id.domain, guest_frame(id.domain, u64::from(id.vcpu))),
        )
        .expect("an initialised page")
        .set_lvtpc_masked(masked);
        let set = self.m.op(id, XENPMU_OP_LVTPC_SET, &Params::new(0, 0));
        assert!(set.is_ok(), "{id:?} lvtpc_set: {set:?}");
    }

    /// VIRQs raised so far, counted for their subjects.
    fn collect_virqs(&mut self) {
        for id in std::mem::take(&mut self.m.platform.virqs) {
            let s = self
                .subjects
                .iter_mut()
                .find(|s| s.id == id)
                .expect("VIRQs only for profilers");
            s.virqs += 1;
        }
    }

    /// Every invariant, now.
    pub fn check(&mut self) {
        self.collect_virqs();
        for k in 0..SUBJECTS {
            self.check_subject(k);
        }
        self.m.assert_conservation();
    }

    fn check_subject(&self, k: usize) {
        let s = &self.subjects[k];
        let status = self.m.vcpu(s.id).ring().expect("a registered ring");
        let counters = status.counters;
        if !s.stale_line {
            let line = s.ring.producer(&self.m.platform);
            let kept = (
                status.head,
                counters.records,
                counters.lost,
                counters.withheld,
                counters.wakeups,
                counters.bad_tail,
            );
            let shown = (
                line.head,
                line.records,
                line.lost,
                line.withheld,
                line.wakeups,
                line.bad_tail,
            );
            assert_eq!(shown, kept, "{:?}: the producer's line", s.id);
        }
        assert_eq!(counters.wakeups, s.virqs, "{:?}: one VIRQ per wakeup", s.id);
        let generated = self.m.vcpu(s.id).stats().pmis_generated - s.generated_at_init;
        assert_eq!(
            counters.records + counters.lost + counters.withheld,
            generated,
            "{:?}: every sample published, lost or withheld",
            s.id
        );
        if !s.exact {
            return;
        }
        let reported = s.stream.reported_lost();
        assert!(reported <= counters.lost, "{:?}", s.id);
        let unread = counters.records - s.stream.samples.len() as u64;
        // Records not read yet, losses not reported yet (pending, or in unread lost records).
        let unreported = counters.withheld + (counters.lost - reported) + unread;
        s.stream.accounts_for(
            s.generated_at_init + 1..=s.generated_at_init + generated,
            unreported,
        );
    }

    /// Self mode: every counter reads `(counted mod p) - p`.
    pub fn check_counters(&mut self) {
        if self.mode == XENPMU_MODE_ALL {
            return;
        }
        for k in 0..SUBJECTS {
            let (id, counted, period) = {
                let s = &self.subjects[k];
                (s.id, s.counted, s.period)
            };
            let msr = self.m.vendor.driver().read_counter(0);
            let value = self.m.read(id, msr);
            assert_eq!(
                value,
                (counted % period).wrapping_sub(period) & ((1 << 48) - 1),
                "{id:?}: counted {counted} at period {period}"
            );
        }
    }

    /// Ends a run: every consumer repairs its tail and reads everything; the invariants and
    /// the counters are checked.
    pub fn finish(&mut self) {
        for k in 0..SUBJECTS {
            self.consume(k as u8, u8::MAX);
        }
        self.check();
        self.check_counters();
    }
}
