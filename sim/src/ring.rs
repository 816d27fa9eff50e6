//! The sample ring (ABI 1.4) in the simulator: the platform's ring services over guest
//! memory, a check of every write the core makes into a ring against the bytes the consumer
//! has not read, and the guest's side — configuration, a record decoder written from
//! docs/abi.md alone, and a consumer that reads records and stores its tail.

use vpmu::abi::{
    RecordHeader, RingConfig, RingControl, RingInfo, RingLost, RingProducer, RingSample,
    XENPMU_PAGE_SIZE, XENPMU_RECORD_LOST, XENPMU_RECORD_PAD, XENPMU_RECORD_SAMPLE,
    XENPMU_RING_CONSUMER_OFFSET, XENPMU_RING_CONTROL_SIZE, XENPMU_RING_MAX_DATA_PAGES,
    XENPMU_RING_PRODUCER_OFFSET, XENPMU_RING_SAMPLE_SIZE,
};
use vpmu::{MapError, RingSlot};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::platform::SimPlatform;

const PAGE: u64 = XENPMU_PAGE_SIZE as u64;

/// A mapped ring area: `frames` guest frames of `domain` from `gfn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMapping {
    /// The domain.
    pub domain: u32,
    /// The control page's frame.
    pub gfn: u64,
    /// Frames: the control page and the data pages.
    pub frames: u32,
    /// The last `head` the core stored (its 8-byte write at the producer's line), which the
    /// write check measures the unread bytes from.
    pub published_head: u64,
}

impl RingMapping {
    fn data_size(&self) -> u64 {
        u64::from(self.frames - 1) * PAGE
    }
}

impl SimPlatform {
    /// Gives `domain` `count` more zeroed frames of RAM from frame `first` (frames it has
    /// already keep their contents).
    pub fn add_ram(&mut self, domain: u32, first: u64, count: u64) {
        for gfn in first..first + count {
            self.memory
                .entry((domain, gfn))
                .or_insert_with(|| Box::new(vpmu::abi::Page::zeroed()));
        }
    }

    /// Copies guest-physical `address` of `domain` into `out`; false (nothing copied) if any
    /// byte is not the domain's RAM. Allocates nothing (the instruction benchmark measures
    /// the core's ring PMI with this platform and counts every allocation).
    pub fn read_physical(&self, domain: u32, address: u64, out: &mut [u8]) -> bool {
        if !self.all_ram(domain, address, out.len()) {
            return false;
        }
        let mut done = 0;
        for_spans(address, out.len(), |gfn, offset, len| {
            let page = self.memory[&(domain, gfn)].as_bytes();
            out[done..done + len].copy_from_slice(&page[offset..offset + len]);
            done += len;
        });
        true
    }

    /// Copies `data` to guest-physical `address` of `domain`; false (nothing written) if any
    /// byte is not the domain's RAM. Allocates nothing.
    pub fn write_physical(&mut self, domain: u32, address: u64, data: &[u8]) -> bool {
        if !self.all_ram(domain, address, data.len()) {
            return false;
        }
        let mut done = 0;
        for_spans(address, data.len(), |gfn, offset, len| {
            let page = self
                .memory
                .get_mut(&(domain, gfn))
                .expect("checked by all_ram")
                .as_mut_bytes();
            page[offset..offset + len].copy_from_slice(&data[done..done + len]);
            done += len;
        });
        true
    }

    /// Whether the `len` bytes at `address` are all RAM of `domain` (and do not wrap).
    fn all_ram(&self, domain: u32, address: u64, len: usize) -> bool {
        if address.checked_add(len as u64).is_none() {
            return false;
        }
        let mut ram = true;
        for_spans(address, len, |gfn, _, _| {
            ram &= self.memory.contains_key(&(domain, gfn));
        });
        ram
    }

    /// `Platform::map_ring`: every frame must be RAM of `domain`.
    pub(crate) fn map_ring_area(
        &mut self,
        domain: u32,
        gfn: u64,
        frames: u32,
    ) -> Result<RingSlot, MapError> {
        let all_ram = gfn
            .checked_add(u64::from(frames))
            .is_some_and(|end| (gfn..end).all(|f| self.memory.contains_key(&(domain, f))));
        if frames == 0 || !all_ram {
            return Err(MapError::InvalidFrame);
        }
        if self.mappings.len() + self.rings.len() >= self.mapping_limit {
            return Err(MapError::NoMemory);
        }
        let slot = (0..)
            .find(|s| !self.rings.contains_key(s))
            .expect("a free slot");
        self.rings.insert(
            slot,
            RingMapping {
                domain,
                gfn,
                frames,
                published_head: 0,
            },
        );
        Ok(RingSlot(slot))
    }

    /// Where `len` bytes at `offset` of ring `slot` are: (domain, guest-physical address);
    /// `None` if the slot is not mapped or the range leaves the area.
    pub(crate) fn ring_access(
        &self,
        slot: RingSlot,
        offset: u32,
        len: usize,
    ) -> Option<(u32, u64)> {
        let ring = self.rings.get(&slot.0)?;
        let end = u64::from(offset).checked_add(len as u64)?;
        (end <= u64::from(ring.frames) * PAGE)
            .then(|| (ring.domain, ring.gfn * PAGE + u64::from(offset)))
    }

    /// `Platform::ring_write`, checked: a write into the data area must lie wholly before
    /// its end and in the bytes the consumer's tail (as the guest holds it now) leaves free
    /// past the head the core last stored. A core that overwrote an unread byte, or wrote
    /// records while the tail was impossible, panics here.
    pub(crate) fn write_ring_area(&mut self, slot: RingSlot, offset: u32, data: &[u8]) -> bool {
        let Some((domain, address)) = self.ring_access(slot, offset, data.len()) else {
            return false;
        };
        let ring = self.rings[&slot.0];
        if offset as usize >= XENPMU_RING_CONTROL_SIZE {
            let mut tail = [0u8; 8];
            let control = ring.gfn * PAGE;
            let tail = self
                .read_physical(
                    domain,
                    control + XENPMU_RING_CONSUMER_OFFSET as u64,
                    &mut tail,
                )
                .then(|| u64::from_le_bytes(tail));
            let data_size = ring.data_size();
            let at = u64::from(offset) - XENPMU_RING_CONTROL_SIZE as u64;
            let len = data.len() as u64;
            assert!(
                at + len <= data_size,
                "a record straddles the end of the data area"
            );
            let unread = tail.map(|tail| ring.published_head.wrapping_sub(tail));
            let free = match unread {
                Some(unread) if tail.is_some_and(|t| t % 8 == 0) && unread <= data_size => {
                    data_size - unread
                }
                _ => panic!("a record written while the tail {tail:?} is impossible"),
            };
            let past_head = at.wrapping_sub(ring.published_head) % data_size;
            assert!(
                past_head + len <= free,
                "a record at data offset {at} ({len} bytes) overwrites unread bytes: head {}, \
                 tail {tail:?}",
                ring.published_head
            );
        }
        if !self.write_physical(domain, address, data) {
            return false;
        }
        self.ring_write_calls += 1;
        if offset as usize == XENPMU_RING_PRODUCER_OFFSET && data.len() == 8 {
            let head = u64::from_le_bytes(data.try_into().expect("8 bytes"));
            if let Some(ring) = self.rings.get_mut(&slot.0) {
                ring.published_head = head;
            }
        }
        true
    }
}

/// Calls `visit(frame, offset, length)` for each piece of the `len` bytes at `address`, in
/// order (the caller checked that the range does not wrap).
fn for_spans(address: u64, len: usize, mut visit: impl FnMut(u64, usize, usize)) {
    let end = address + len as u64;
    let mut at = address;
    while at < end {
        let offset = (at % PAGE) as usize;
        let take = (PAGE as usize - offset).min((end - at) as usize);
        visit(at / PAGE, offset, take);
        at += take as u64;
    }
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A sample and its call chain.
    Sample(Box<RingSample>, Vec<u64>),
    /// Lost samples.
    Lost(RingLost),
    /// Padding to the end of the data area.
    Pad(u16),
    /// A kind this decoder does not know, skipped by its size.
    Unknown(RecordHeader),
}

/// Why a ring's records could not be decoded (the consumer resynchronizes with tail = head).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptRing(pub String);

/// The guest's side of a ring: where it is, and its consumer's position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingGuest {
    /// The owning domain.
    pub domain: u32,
    /// The control page's frame.
    pub gfn: u64,
    /// Data pages.
    pub data_pages: u32,
    /// The consumer's tail (what it last stored).
    pub tail: u64,
}

impl RingGuest {
    /// A ring of `data_pages` pages at frame `gfn` of `domain`: its RAM is added and zeroed,
    /// and `config` (with `data_pages` set) written into the control page, as a driver does
    /// before `ring_init`.
    pub fn prepare(platform: &mut SimPlatform, domain: u32, gfn: u64, config: &RingConfig) -> Self {
        // RAM for the area the configuration asks for, within what a ring can be (an invalid
        // size gets the largest area: the check that refuses it is the hypervisor's).
        let frames = 1 + u64::from(config.data_pages.clamp(1, XENPMU_RING_MAX_DATA_PAGES));
        platform.add_ram(domain, gfn, frames);
        for frame in gfn..gfn + frames {
            platform.frame_mut(domain, frame).as_mut_bytes().fill(0);
        }
        assert!(platform.write_physical(domain, gfn * PAGE, config.as_bytes()));
        RingGuest {
            domain,
            gfn,
            data_pages: config.data_pages,
            tail: 0,
        }
    }

    /// The control page as the guest sees it now.
    pub fn control(&self, platform: &SimPlatform) -> RingControl {
        let mut control = RingControl::new_zeroed();
        assert!(platform.read_physical(self.domain, self.gfn * PAGE, control.as_mut_bytes()));
        control
    }

    /// `info`, as the hypervisor wrote it.
    pub fn info(&self, platform: &SimPlatform) -> RingInfo {
        self.control(platform).info
    }

    /// The producer's line.
    pub fn producer(&self, platform: &SimPlatform) -> RingProducer {
        self.control(platform).producer
    }

    /// Stores `tail` in the consumer's line (a hostile consumer stores anything).
    pub fn store_tail(&mut self, platform: &mut SimPlatform, tail: u64) {
        let at = self.gfn * PAGE + XENPMU_RING_CONSUMER_OFFSET as u64;
        assert!(platform.write_physical(self.domain, at, &tail.to_le_bytes()));
        self.tail = tail;
    }

    /// Data size in bytes.
    pub fn data_size(&self) -> u64 {
        u64::from(self.data_pages) * PAGE
    }

    /// Decodes the records between the consumer's tail and `head` (unchanged), with their
    /// positions.
    pub fn peek(
        &self,
        platform: &SimPlatform,
        head: u64,
    ) -> Result<Vec<(u64, Record)>, CorruptRing> {
        let data_size = self.data_size();
        let unread = head.wrapping_sub(self.tail);
        if unread > data_size || self.tail % 8 != 0 || head % 8 != 0 {
            return Err(CorruptRing(format!("head {head} tail {}", self.tail)));
        }
        let data = (self.gfn + 1) * PAGE;
        let record_max = self.info(platform).record_max as u64;
        let mut records = Vec::new();
        let mut at = self.tail;
        while at != head {
            let offset = at % data_size;
            let mut header = RecordHeader::new_zeroed();
            assert!(platform.read_physical(self.domain, data + offset, header.as_mut_bytes()));
            let size = u64::from(header.size);
            let corrupt = header.kind == 0
                || size < 8
                || size % 8 != 0
                || size > record_max.max(u64::from(XENPMU_RECORD_PAD_MAX))
                || offset + size > data_size
                || size > head.wrapping_sub(at);
            if corrupt {
                return Err(CorruptRing(format!(
                    "record {header:?} at {at} (head {head})"
                )));
            }
            let mut bytes = vec![0u8; size as usize];
            assert!(platform.read_physical(self.domain, data + offset, &mut bytes));
            let record = match header.kind {
                XENPMU_RECORD_SAMPLE => {
                    let (sample, rest) = RingSample::read_from_prefix(&bytes)
                        .map_err(|_| CorruptRing(format!("short sample at {at}")))?;
                    let chain = <[u64]>::ref_from_bytes(rest)
                        .map_err(|_| CorruptRing(format!("chain at {at}")))?;
                    if sample.chain_len as usize != chain.len()
                        || size != (XENPMU_RING_SAMPLE_SIZE + 8 * chain.len()) as u64
                    {
                        return Err(CorruptRing(format!("sample size {size} at {at}")));
                    }
                    Record::Sample(Box::new(sample), chain.to_vec())
                }
                XENPMU_RECORD_LOST => Record::Lost(
                    RingLost::read_from_bytes(&bytes)
                        .map_err(|_| CorruptRing(format!("lost record of {size} at {at}")))?,
                ),
                XENPMU_RECORD_PAD => {
                    if offset + size != data_size {
                        return Err(CorruptRing(format!("PAD short of the end at {at}")));
                    }
                    Record::Pad(header.size)
                }
                _ => Record::Unknown(header),
            };
            records.push((at, record));
            at = at.wrapping_add(size);
        }
        Ok(records)
    }

    /// Reads every record up to the head it loads now, then stores the tail past them, as a
    /// consumer does.
    pub fn consume(&mut self, platform: &mut SimPlatform) -> Result<Vec<Record>, CorruptRing> {
        let head = self.producer(platform).head;
        let records = self.peek(platform, head)?;
        self.store_tail(platform, head);
        Ok(records.into_iter().map(|(_, r)| r).collect())
    }
}

/// A PAD covers at most what a record needs to move to offset 0: less than the largest
/// record.
const XENPMU_RECORD_PAD_MAX: u32 = vpmu::abi::XENPMU_RECORD_MAX as u32;

/// The configuration a well-behaved driver writes: `data_pages` pages, the given watermark
/// and latency, and the periods `(counter, period)` of general-purpose (`fixed` false) or
/// fixed counters.
pub fn config(
    data_pages: u32,
    wakeup_bytes: u32,
    max_latency_us: u32,
    periods: &[(bool, usize, u64)],
) -> RingConfig {
    let mut config = RingConfig {
        data_pages,
        wakeup_bytes,
        max_latency_us,
        ..RingConfig::default()
    };
    for &(fixed, index, period) in periods {
        if fixed {
            config.period_fixed[index] = period;
        } else {
            config.period_gp[index] = period;
        }
    }
    config
}

/// What a consumer has read from one ring registration: the sample numbers and the lost
/// records, to check that every number is accounted for exactly once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    /// Sequence numbers of the sample records, in order.
    pub samples: Vec<u64>,
    /// (count, last sequence) of each lost record, in order.
    pub lost: Vec<(u64, u64)>,
}

impl Stream {
    /// Takes `records` as read.
    ///
    /// # Panics
    /// On a lost record reporting no sample, an unknown record kind, or sample numbers that
    /// do not grow.
    pub fn take(&mut self, records: Vec<Record>) {
        for record in records {
            match record {
                Record::Sample(sample, _) => {
                    if let Some(&last) = self.samples.last() {
                        assert!(
                            sample.sequence > last,
                            "sample {} after {last}",
                            sample.sequence
                        );
                    }
                    self.samples.push(sample.sequence);
                }
                Record::Lost(lost) => {
                    assert!(lost.lost >= 1, "a lost record reports at least one sample");
                    assert!(lost.sequence >= lost.lost, "{lost:?}");
                    self.lost.push((lost.lost, lost.sequence));
                }
                Record::Pad(_) => {}
                Record::Unknown(header) => panic!("unknown record {header:?}"),
            }
        }
    }

    /// Samples the lost records reported.
    pub fn reported_lost(&self) -> u64 {
        self.lost.iter().map(|&(count, _)| count).sum()
    }

    /// Checks that every number of `numbers` is a sample or inside a lost record's range,
    /// exactly once, but for `unreported` of them (withheld, or lost and not reported yet),
    /// and that nothing outside `numbers` was reported.
    ///
    /// # Panics
    /// If not.
    pub fn accounts_for(&self, numbers: core::ops::RangeInclusive<u64>, unreported: u64) {
        let mut seen = std::collections::BTreeMap::<u64, u32>::new();
        let lost = self
            .lost
            .iter()
            .flat_map(|&(count, last)| last + 1 - count..=last);
        for number in self.samples.iter().copied().chain(lost) {
            assert!(
                numbers.contains(&number),
                "number {number} outside {numbers:?}"
            );
            *seen.entry(number).or_default() += 1;
        }
        let twice: Vec<_> = seen.iter().filter(|&(_, &n)| n > 1).collect();
        assert!(twice.is_empty(), "numbers reported twice: {twice:?}");
        let total = numbers
            .end()
            .saturating_add(1)
            .saturating_sub(*numbers.start());
        assert_eq!(
            total - seen.len() as u64,
            unreported,
            "numbers neither published nor reported lost in {numbers:?}"
        );
    }
}
