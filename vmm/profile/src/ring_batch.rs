//! Ring shipments (`struct ring_batch` of `profile/profile.h`): in ring mode a sampler ships
//! no samples, it names the unread bytes `[tail, head)` of its sample ring (ABI 1.4) and the
//! VMM copies them out of guest memory during the `outl` (`copy`), after which the guest
//! releases `tail = head`. Decoding (`RingDecoder`) rebuilds the data area from those bytes and
//! reads the records with `vpmu_abi`'s ring reader (`RingRecords`): samples become the same
//! `ProfileSample`s as page samples, lost records are counted, and the sequence numbers are
//! accounted for (`RingTotals`). The VMM stays a transport: it copies, checks and decodes, it
//! never edits or invents a record, and it refuses a malformed shipment with the reason.

use serde::Serialize;
use vpmu::abi::{
    Record, RingError, RingRecords, SampleRecord, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF,
    XENPMU_RECORD_MISC_USER, XENPMU_RING_MAX_DATA_PAGES, XENPMU_RING_PAGE_SIZE,
};
use vpmu_guest_protocol::profile as wire;
use vpmu_machine::GuestMem;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::sample::{CallChain, ChainEnd, Origin, ProfileSample, SampleDetails};

/// `RING_BATCH_MAGIC` ("RNGB").
pub const RING_BATCH_MAGIC: u32 = wire::RING_BATCH_MAGIC;

/// `struct ring_batch`: the shipment's header. The copied bytes follow it in the VMM's record
/// of the shipment.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct RingBatch {
    /// `RING_BATCH_MAGIC`.
    pub magic: u32,
    /// Bytes of the data area (a power of two, one page to 1 MiB).
    pub data_size: u32,
    /// 0, 1, 2, ... per shipping vCPU, shared with `struct sample_batch`.
    pub sequence: u64,
    /// Guest-physical address of the data area.
    pub data_gpa: u64,
    /// The guest's tail: where the unread bytes begin (the previous shipment's head).
    pub tail: u64,
    /// The head the guest acquired: where they end.
    pub head: u64,
    /// The ring's `info.tsc_khz`: the records' TSC frequency.
    pub tsc_khz: u64,
    /// `producer.records` (cumulative since `RING_INIT`).
    pub records: u64,
    /// `producer.lost`.
    pub lost: u64,
    /// `producer.withheld`.
    pub withheld: u64,
    /// `producer.wakeups`.
    pub wakeups: u64,
    /// `producer.bad_tail`.
    pub bad_tail: u64,
    /// PMU VIRQs the guest took.
    pub virqs: u64,
    /// TSC ticks the guest spent in its VIRQ handler.
    pub handler_ticks: u64,
    /// TSC ticks the guest spent shipping.
    pub ship_ticks: u64,
    /// The ring's `info.record_max`.
    pub record_max: u32,
    /// Reserved.
    pub _pad: u32,
    /// Reserved.
    pub _reserved: u64,
}

/// Bytes of a `struct ring_batch`.
pub const RING_BATCH: usize = size_of::<RingBatch>();
static_assertions::const_assert_eq!(RING_BATCH, wire::RING_BATCH_SIZE);

/// The largest data area (`XENPMU_RING_MAX_DATA_PAGES` pages).
const MAX_DATA_SIZE: u64 = XENPMU_RING_MAX_DATA_PAGES as u64 * XENPMU_RING_PAGE_SIZE as u64;

/// What is wrong with a ring shipment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingProblem {
    /// The header is not guest RAM.
    #[error("ring batch header outside guest memory")]
    Outside,
    /// The data size is not a power of two from one page to 1 MiB.
    #[error("ring data area of {0} bytes (a power of two from 4 KiB to 1 MiB)")]
    Geometry(u32),
    /// The data area is not page-aligned guest RAM.
    #[error("ring data area at {gpa:#x} ({size} bytes) is not page-aligned guest RAM")]
    AreaOutside {
        /// Its address.
        gpa: u64,
        /// Its size.
        size: u32,
    },
    /// The data area is not the one the first shipment named.
    #[error("ring data area moved to {gpa:#x} ({size} bytes) from {was:#x} ({was_size} bytes)")]
    AreaMoved {
        /// Its address now.
        gpa: u64,
        /// Its size now.
        size: u32,
        /// The first shipment's address.
        was: u64,
        /// The first shipment's size.
        was_size: u32,
    },
    /// The tail is not where the previous shipment's head left it.
    #[error("ring tail {tail} is not the last shipment's head {expected}")]
    Tail {
        /// The shipment's tail.
        tail: u64,
        /// The previous head (0 before any).
        expected: u64,
    },
    /// The positions are misaligned, or more than the data area apart, or head behind tail.
    #[error("ring positions tail {tail}, head {head} in a {size}-byte area")]
    Positions {
        /// The tail.
        tail: u64,
        /// The head.
        head: u64,
        /// The data size.
        size: u32,
    },
    /// The copied bytes are not `head - tail` long (a damaged record of the shipment).
    #[error("{bytes} bytes shipped for positions {tail}..{head}")]
    Length {
        /// The tail.
        tail: u64,
        /// The head.
        head: u64,
        /// Bytes after the header.
        bytes: usize,
    },
    /// A record the ring reader refused.
    #[error("record at position {position}: {error}")]
    Record {
        /// The record's position.
        position: u64,
        /// The reader's verdict.
        error: RingError,
    },
    /// A sample record whose call chain ends for a reason that is no `XENPMU_CHAIN_*`, or
    /// has entries with no chain walked.
    #[error("sample {sequence}: call chain of {len} entries ending {end}")]
    Chain {
        /// The sample's sequence number.
        sequence: u64,
        /// Its chain length.
        len: u32,
        /// Its end reason.
        end: u32,
    },
    /// Sequence numbers that go backwards, or a lost record that overlaps numbers already
    /// seen.
    #[error("sequence {sequence} after {previous}")]
    SequenceBackwards {
        /// The record's (last) sequence number.
        sequence: u64,
        /// The previous one.
        previous: u64,
    },
    /// Sequence numbers or loss counts no ring can reach: the last number (2^64 − 1, after
    /// which nothing could follow), or more samples lost than a 64-bit total holds.
    #[error("sequence {sequence} with {count} samples: beyond what a ring can number")]
    SequenceRange {
        /// The record's (last) sequence number.
        sequence: u64,
        /// The samples it accounts for.
        count: u64,
    },
}

/// The VMM's side of one vCPU's ring between shipments: the area it named first and the head
/// of its last shipment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingCursor {
    data_gpa: u64,
    data_size: u32,
    head: u64,
}

/// Checks the geometry and positions of `batch` against `cursor` (the vCPU's previous ring
/// shipment, None before its first).
fn check(batch: &RingBatch, cursor: Option<&RingCursor>) -> Result<(), RingProblem> {
    let size = batch.data_size;
    if !size.is_power_of_two()
        || u64::from(size) < XENPMU_RING_PAGE_SIZE as u64
        || u64::from(size) > MAX_DATA_SIZE
    {
        return Err(RingProblem::Geometry(size));
    }
    if let Some(c) = cursor {
        if (c.data_gpa, c.data_size) != (batch.data_gpa, size) {
            return Err(RingProblem::AreaMoved {
                gpa: batch.data_gpa,
                size,
                was: c.data_gpa,
                was_size: c.data_size,
            });
        }
    }
    let expected = cursor.map_or(0, |c| c.head);
    if batch.tail != expected {
        return Err(RingProblem::Tail {
            tail: batch.tail,
            expected,
        });
    }
    let unread = batch.head.wrapping_sub(batch.tail);
    if (batch.tail | batch.head) % 8 != 0 || unread > u64::from(size) {
        return Err(RingProblem::Positions {
            tail: batch.tail,
            head: batch.head,
            size,
        });
    }
    Ok(())
}

/// Copies the ring shipment at `gpa` out of `memory`: the header, then the unread bytes
/// `[tail, head)` of the data area it names (in position order: two pieces if they wrap).
/// Refuses a header or an area outside RAM, a geometry the ABI does not allow, an area other
/// than the first shipment's, and positions that do not continue the last shipment
/// (`cursor`, updated on success).
pub fn copy(
    memory: &GuestMem,
    gpa: u64,
    cursor: &mut Option<RingCursor>,
) -> Result<Vec<u8>, RingProblem> {
    let batch: RingBatch = memory.read_as(gpa).ok_or(RingProblem::Outside)?;
    check(&batch, cursor.as_ref())?;
    let size = u64::from(batch.data_size);
    let in_ram = batch.data_gpa % XENPMU_RING_PAGE_SIZE as u64 == 0
        && memory.contains(batch.data_gpa, batch.data_size as usize);
    if !in_ram {
        return Err(RingProblem::AreaOutside {
            gpa: batch.data_gpa,
            size: batch.data_size,
        });
    }
    let unread = batch.head.wrapping_sub(batch.tail) as usize;
    let offset = batch.tail & (size - 1);
    let first = unread.min((size - offset) as usize);
    let mut out = Vec::with_capacity(RING_BATCH + unread);
    out.extend_from_slice(batch.as_bytes());
    out.resize(RING_BATCH + unread, 0);
    let outside = RingProblem::AreaOutside {
        gpa: batch.data_gpa,
        size: batch.data_size,
    };
    memory
        .read(
            batch.data_gpa + offset,
            &mut out[RING_BATCH..RING_BATCH + first],
        )
        .map_err(|_| outside.clone())?;
    memory
        .read(batch.data_gpa, &mut out[RING_BATCH + first..])
        .map_err(|_| outside)?;
    *cursor = Some(RingCursor {
        data_gpa: batch.data_gpa,
        data_size: batch.data_size,
        head: batch.head,
    });
    Ok(out)
}

/// What a vCPU's ring shipments add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RingTotals {
    /// Ring shipments decoded.
    pub shipments: u64,
    /// Sample records decoded.
    pub samples: u64,
    /// Samples the lost records report.
    pub lost_in_records: u64,
    /// Lost records decoded.
    pub lost_records: u64,
    /// Records of kinds this reader does not know, skipped by their size.
    pub unknown_records: u64,
    /// Sequence numbers between the first and the last record that no record carries and no
    /// lost record covers (withheld samples take numbers without a record).
    pub unaccounted: u64,
    /// The producer's counters at the last shipment.
    pub producer_records: u64,
    /// `producer.lost`.
    pub producer_lost: u64,
    /// `producer.withheld`.
    pub producer_withheld: u64,
    /// `producer.wakeups`.
    pub producer_wakeups: u64,
    /// `producer.bad_tail`.
    pub producer_bad_tail: u64,
    /// PMU VIRQs the guest took.
    pub virqs: u64,
    /// Bytes shipped.
    pub bytes: u64,
}

impl RingTotals {
    /// Samples lost after the last lost record (the ring was full at the end): reported by
    /// `producer.lost` only.
    pub fn lost_pending(&self) -> u64 {
        self.producer_lost.saturating_sub(self.lost_in_records)
    }

    /// Whether the losses are accounted for exactly: every sequence gap covered by a lost
    /// record or a withheld sample, no more lost in records than the producer counted, and
    /// every sample record the producer counted decoded.
    pub fn accounted(&self) -> bool {
        self.unaccounted <= self.producer_withheld
            && self.lost_in_records <= self.producer_lost
            && self.samples == self.producer_records
    }

    /// The sum of two vCPUs' totals.
    pub fn plus(&self, o: &RingTotals) -> RingTotals {
        RingTotals {
            shipments: self.shipments + o.shipments,
            samples: self.samples + o.samples,
            lost_in_records: self.lost_in_records + o.lost_in_records,
            lost_records: self.lost_records + o.lost_records,
            unknown_records: self.unknown_records + o.unknown_records,
            unaccounted: self.unaccounted + o.unaccounted,
            producer_records: self.producer_records + o.producer_records,
            producer_lost: self.producer_lost + o.producer_lost,
            producer_withheld: self.producer_withheld + o.producer_withheld,
            producer_wakeups: self.producer_wakeups + o.producer_wakeups,
            producer_bad_tail: self.producer_bad_tail + o.producer_bad_tail,
            virqs: self.virqs + o.virqs,
            bytes: self.bytes + o.bytes,
        }
    }
}

/// Decodes one vCPU's ring shipments in order, carrying the data area, the positions and the
/// sequence numbering from one to the next.
#[derive(Debug, Default)]
pub struct RingDecoder {
    cursor: Option<RingCursor>,
    /// The data area rebuilt from the shipped bytes (each at its offset).
    area: Vec<u8>,
    /// The next sequence number expected (the previous record's + 1).
    next_sequence: u64,
    /// The totals so far.
    pub totals: RingTotals,
    /// The last shipment's guest time counters (handler, shipping).
    pub guest_ticks: (u64, u64),
}

impl RingDecoder {
    /// A decoder whose first sequence number is `next_sequence` (1 after `XENPMU_OP_INIT`, or
    /// after the last page sample the vCPU shipped).
    pub fn new(next_sequence: u64) -> Self {
        RingDecoder {
            next_sequence: next_sequence.max(1),
            ..RingDecoder::default()
        }
    }

    /// Decodes one shipment as `copy` recorded it (header, then the bytes), appending its
    /// samples to `out`, shipped by domain `shipper`.
    pub fn decode(
        &mut self,
        shipper: u32,
        bytes: &[u8],
        out: &mut Vec<ProfileSample>,
    ) -> Result<(), RingProblem> {
        let (batch, data) = RingBatch::read_from_prefix(bytes).map_err(|_| RingProblem::Outside)?;
        check(&batch, self.cursor.as_ref())?;
        let unread = batch.head.wrapping_sub(batch.tail);
        if data.len() as u64 != unread {
            return Err(RingProblem::Length {
                tail: batch.tail,
                head: batch.head,
                bytes: data.len(),
            });
        }
        let size = batch.data_size as usize;
        if self.area.len() != size {
            self.area = vec![0; size];
        }
        let offset = (batch.tail & (size as u64 - 1)) as usize;
        let first = data.len().min(size - offset);
        self.area[offset..offset + first].copy_from_slice(&data[..first]);
        self.area[..data.len() - first].copy_from_slice(&data[first..]);
        self.cursor = Some(RingCursor {
            data_gpa: batch.data_gpa,
            data_size: batch.data_size,
            head: batch.head,
        });
        // The area is read while the numbering is updated: out of `self` for the walk.
        let area = std::mem::take(&mut self.area);
        let walked = self.walk(&area, &batch, shipper, out);
        self.area = area;
        walked?;
        let t = &mut self.totals;
        t.shipments += 1;
        t.bytes += unread;
        t.producer_records = batch.records;
        t.producer_lost = batch.lost;
        t.producer_withheld = batch.withheld;
        t.producer_wakeups = batch.wakeups;
        t.producer_bad_tail = batch.bad_tail;
        t.virqs = batch.virqs;
        self.guest_ticks = (batch.handler_ticks, batch.ship_ticks);
        Ok(())
    }

    /// Reads the records of `batch` from the rebuilt `area`.
    fn walk(
        &mut self,
        area: &[u8],
        batch: &RingBatch,
        shipper: u32,
        out: &mut Vec<ProfileSample>,
    ) -> Result<(), RingProblem> {
        let mut records = RingRecords::new(area, batch.record_max, batch.tail, batch.head);
        loop {
            let position = records.tail();
            let Some(entry) = records.next() else {
                return Ok(());
            };
            let entry = entry.map_err(|error| RingProblem::Record { position, error })?;
            match entry.record {
                Record::Sample(s) => {
                    self.sequence(s.fixed.sequence, 1)?;
                    out.push(sample(shipper, &s, batch.tsc_khz)?);
                    self.totals.samples += 1;
                }
                Record::Lost(l) => {
                    self.sequence(l.sequence, l.lost.max(1))?;
                    // `sequence` refused a count that reaches past 2^64 − 1, and every lost
                    // sample so far had a number of its own: the total stays below 2^64.
                    self.totals.lost_in_records =
                        self.totals.lost_in_records.checked_add(l.lost).ok_or(
                            RingProblem::SequenceRange {
                                sequence: l.sequence,
                                count: l.lost,
                            },
                        )?;
                    self.totals.lost_records += 1;
                }
                Record::Pad => {}
                Record::Unknown { .. } => self.totals.unknown_records += 1,
            }
        }
    }

    /// Accounts for `count` sequence numbers ending at `last` (a sample: 1; a lost record: its
    /// count): numbers skipped before them are unaccounted, numbers already passed are refused.
    fn sequence(&mut self, last: u64, count: u64) -> Result<(), RingProblem> {
        let first = last.wrapping_sub(count - 1);
        if last < count || first < self.next_sequence {
            return Err(RingProblem::SequenceBackwards {
                sequence: last,
                previous: self.next_sequence.wrapping_sub(1),
            });
        }
        let next = last.checked_add(1).ok_or(RingProblem::SequenceRange {
            sequence: last,
            count,
        })?;
        self.totals.unaccounted += first - self.next_sequence;
        self.next_sequence = next;
        Ok(())
    }
}

/// A sample record as the profile sees it: `XENPMU_DOMID_SELF` is the shipper.
fn sample(shipper: u32, s: &SampleRecord, tsc_khz: u64) -> Result<ProfileSample, RingProblem> {
    let f = &s.fixed;
    let origin = match f.identity.domain_id {
        XENPMU_DOMID_SELF => Origin::Domain(shipper),
        XENPMU_DOMID_HYPERVISOR => Origin::Hypervisor,
        d => Origin::Domain(d),
    };
    let bad_chain = RingProblem::Chain {
        sequence: f.sequence,
        len: f.chain_len,
        end: f.chain_end,
    };
    let end = ChainEnd::from_raw(f.chain_end).ok_or(bad_chain.clone())?;
    let chain = CallChain::new(s.chain(), end).ok_or(bad_chain)?;
    Ok(ProfileSample {
        origin,
        vcpu: f.identity.vcpu_id,
        pcpu: f.identity.pcpu_id,
        rip: f.regs.rip,
        user: f.header.misc & XENPMU_RECORD_MISC_USER != 0,
        regs: f.regs,
        shipped_by: shipper,
        details: SampleDetails {
            tsc: f.tsc,
            tsc_khz,
            sequence: f.sequence,
            overflowed: f.overflowed,
            chain,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu::abi::{RingSample, append_record, encode_lost, encode_sample};

    const SIZE: usize = 4096;

    /// A sample record of `sequence` with a two-entry chain.
    fn sample_record(sequence: u64) -> Vec<u8> {
        let fixed = RingSample {
            sequence,
            tsc: sequence.wrapping_mul(1000),
            identity: vpmu::abi::Identity {
                domain_id: XENPMU_DOMID_SELF,
                vcpu_id: 1,
                pcpu_id: 1,
                _pad0: 0,
            },
            overflowed: 1,
            chain_end: vpmu::abi::XENPMU_CHAIN_COMPLETE,
            header: vpmu::abi::RecordHeader {
                misc: XENPMU_RECORD_MISC_USER,
                ..Default::default()
            },
            ..RingSample::default()
        };
        let mut out = vec![0; 1024];
        let n = encode_sample(&mut out, &fixed, &[0x1000, 0x2000]).expect("encodes");
        out.truncate(n);
        out
    }

    /// The shipment `copy` would record for `[tail, head)` of `area`.
    fn shipment(
        area: &[u8],
        sequence: u64,
        tail: u64,
        head: u64,
        lost: u64,
        records: u64,
    ) -> Vec<u8> {
        let batch = RingBatch {
            magic: RING_BATCH_MAGIC,
            data_size: area.len() as u32,
            sequence,
            data_gpa: 0x10_0000,
            tail,
            head,
            tsc_khz: 1000,
            records,
            lost,
            record_max: vpmu::abi::XENPMU_RECORD_MAX as u32,
            ..RingBatch::default()
        };
        let mut bytes = batch.as_bytes().to_vec();
        bytes.extend((tail..head).map(|p| area[(p % area.len() as u64) as usize]));
        bytes
    }

    #[test]
    fn samples_lost_records_and_a_wrap_decode_and_account() {
        let mut area = vec![0u8; SIZE];
        let mut head = 0;
        for s in 1..=10 {
            head = append_record(&mut area, 0, head, &sample_record(s)).expect("room");
        }
        let first = shipment(&area, 0, 0, head, 0, 10);
        let tail = head;
        let mut lost = vec![0; 32];
        encode_lost(&mut lost, 3, 13, 0).expect("encodes");
        head = append_record(&mut area, tail, head, &lost).expect("room");
        for s in 14..=25 {
            head = append_record(&mut area, tail, head, &sample_record(s)).expect("room");
        }
        assert!(head > SIZE as u64, "wrapped past the end with a PAD");
        let second = shipment(&area, 1, tail, head, 3, 22);
        let mut d = RingDecoder::new(1);
        let mut out = Vec::new();
        d.decode(7, &first, &mut out).expect("valid");
        d.decode(7, &second, &mut out).expect("valid");
        assert_eq!(out.len(), 22);
        assert!(out.iter().all(|s| s.origin == Origin::Domain(7) && s.user));
        assert_eq!(out[0].details.chain.addresses(), [0x1000, 0x2000]);
        let seqs: Vec<u64> = out.iter().map(|s| s.details.sequence).collect();
        assert_eq!(seqs[10], 14, "13..=11 lost in between");
        let t = d.totals;
        assert_eq!(
            (t.samples, t.lost_in_records, t.lost_records, t.unaccounted),
            (22, 3, 1, 0)
        );
        assert!(t.accounted() && t.lost_pending() == 0);
        // A gap no lost record covers is unaccounted: the accounting fails without withheld.
        let mut d = RingDecoder::new(5);
        d.decode(7, &first, &mut Vec::new()).unwrap_err();
    }

    #[test]
    fn malformed_shipments_are_refused() {
        let mut area = vec![0u8; SIZE];
        let head = append_record(&mut area, 0, 0, &sample_record(1)).expect("room");
        let ok = shipment(&area, 0, 0, head, 0, 1);
        let refuse = |bytes: &[u8], want: &str| {
            let e = RingDecoder::new(1)
                .decode(1, bytes, &mut Vec::new())
                .expect_err(want);
            assert!(e.to_string().contains(want), "{e} lacks {want}");
        };
        refuse(
            &shipment(&area, 0, 8, head, 0, 1),
            "is not the last shipment's head 0",
        );
        let mut short = ok.clone();
        short.pop();
        refuse(&short, "bytes shipped");
        let mut geometry = ok.clone();
        geometry[4..8].copy_from_slice(&3000u32.to_le_bytes());
        refuse(&geometry, "ring data area of 3000 bytes");
        let mut corrupt = ok.clone();
        corrupt[RING_BATCH..RING_BATCH + 2].copy_from_slice(&0u16.to_le_bytes());
        refuse(&corrupt, "record at position 0");
        let mut backwards = area.clone();
        let h2 = append_record(&mut backwards, 0, head, &sample_record(1)).expect("room");
        refuse(&shipment(&backwards, 0, 0, h2, 0, 2), "sequence 1 after 1");
        // The last number there is (a fuzzer's find: `last + 1` overflowed) and a lost count
        // reaching it: refused, not a panic or a wrapped total.
        for (sequence, count) in [(u64::MAX, 1), (u64::MAX, u64::MAX)] {
            let mut area = vec![0u8; SIZE];
            let record = if count == 1 {
                sample_record(sequence)
            } else {
                let mut lost = vec![0; 32];
                encode_lost(&mut lost, count, sequence, 0).expect("encodes");
                lost
            };
            let head = append_record(&mut area, 0, 0, &record).expect("room");
            refuse(
                &shipment(&area, 0, 0, head, 0, 1),
                "beyond what a ring can number",
            );
        }
    }

    #[test]
    fn copy_takes_the_named_bytes_out_of_guest_memory_and_follows_the_positions() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        let mut area = vec![0u8; SIZE];
        let mut head = 0;
        for s in 1..=3 {
            head = append_record(&mut area, 0, head, &sample_record(s)).expect("room");
        }
        mem.write(0x8000, &area).expect("in RAM");
        let mut batch = RingBatch::read_from_prefix(&shipment(&area, 0, 0, head, 0, 3))
            .expect("header")
            .0;
        batch.data_gpa = 0x8000;
        mem.write(0x1000, batch.as_bytes()).expect("in RAM");
        let mut cursor = None;
        let bytes = copy(&mem, 0x1000, &mut cursor).expect("valid");
        assert_eq!(&bytes[RING_BATCH..], &area[..head as usize]);
        // The same positions again do not continue the last shipment.
        let again = copy(&mem, 0x1000, &mut cursor).expect_err("tail is the old one");
        assert!(
            matches!(again, RingProblem::Tail { tail: 0, .. }),
            "{again}"
        );
        // An area outside RAM, or moved, is refused.
        batch.tail = head;
        batch.head = head;
        batch.data_gpa = (1 << 20) - 2048;
        mem.write(0x1000, batch.as_bytes()).expect("in RAM");
        let moved = copy(&mem, 0x1000, &mut cursor).expect_err("moved");
        assert!(matches!(moved, RingProblem::AreaMoved { .. }), "{moved}");
        let outside = copy(&mem, 0x1000, &mut None).expect_err("outside");
        assert!(matches!(
            outside,
            RingProblem::Tail { .. } | RingProblem::AreaOutside { .. }
        ));
        assert_eq!(
            copy(&mem, (1 << 20) - 8, &mut None),
            Err(RingProblem::Outside)
        );
    }
}
