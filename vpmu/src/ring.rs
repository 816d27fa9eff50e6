//! The sample ring (ABI 1.4): the producer side.
//!
//! A vCPU with a registered ring gets its samples as records appended to the ring instead of
//! one cached sample in its page. At a PMI the counters keep running: the backend acknowledges
//! the overflow and re-arms every overflowed counter that has a period
//! (`PmuBackend::rearm_overflowed`), then the sample takes the page's next sequence number
//! and is withheld (page LVTPC masked), published (a record, after a pending lost record and a
//! PAD where the data area wraps) or lost (the ring is full, or its tail is impossible). The
//! producer runs under the receiving vCPU's lock, on whichever pCPU took the PMI, and touches
//! guest memory only through `Platform::ring_read` (the tail, one 8-byte read) and
//! `Platform::ring_write` (each record in one write, then the producer's counters, then
//! `head`). Records are built in the pCPU's [`RecordBuffer`]: nothing is allocated.
//!
//! Wakeups (the PMU VIRQ) follow the ring's watermark, its latency bound (checked at each
//! record and by `Vpmu::ring_poll`, the hypervisor's timer) and losses while records wait
//! unread. `docs/abi.md` ("The sample ring") is the specification; `docs/core.md` the
//! integrator's side.

use vpmu_abi::{
    Identity, RecordHeader, Regs, RingLost, RingSample, XENPMU_CALLCHAIN_MAX, XENPMU_CHAIN_NONE,
    XENPMU_RECORD_LOST, XENPMU_RECORD_PAD, XENPMU_RECORD_SAMPLE, XENPMU_RING_CONSUMER_OFFSET,
    XENPMU_RING_CONTROL_SIZE, XENPMU_RING_PRODUCER_OFFSET, XENPMU_RING_SAMPLE_SIZE,
};
use zerocopy::{FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::backend::{Overflow, PmuBackend, RearmPeriods};
use crate::core::{CoreError, VcpuTable, Vpmu};
use crate::msr::{MsrBus, MsrFault};
use crate::platform::{Platform, RingSlot, VcpuId};
use crate::pmi::Sample;
use crate::state::{PcpuPmu, VcpuPmu};

/// A registered ring, as the hypervisor keeps it: everything it needs is here, verified at
/// registration, and nothing is ever read back from the control page but the consumer's tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ring {
    pub(crate) slot: RingSlot,
    /// The control page's guest frame.
    pub(crate) gfn: u64,
    /// Frames of the area: the control page and the data pages.
    pub(crate) frames: u64,
    /// Bytes of the data area: a power of two, 4 KiB to 1 MiB.
    pub(crate) data_size: u32,
    /// The watermark in force (the configuration's, or half the data area).
    pub(crate) wakeup_bytes: u32,
    /// The latency bound in TSC ticks; 0: wake at every record.
    pub(crate) latency_ticks: u64,
    /// The latency bound as configured (what a snapshot carries: another host converts it
    /// with its own clock rate).
    pub(crate) max_latency_us: u32,
    /// Re-arm periods, verified by the backend's WRMSR rule.
    pub(crate) periods: RearmPeriods,
    /// Where the next record goes (the producer's own copy, never read back).
    pub(crate) head: u64,
    /// The producer's counters, as the control page shows them.
    pub(crate) counters: ProducerCounters,
    /// Samples lost since the last lost record, the last one's sequence number and time.
    pub(crate) pending_lost: Option<PendingLost>,
    /// Bytes published since the last wakeup.
    pub(crate) unsignalled_bytes: u64,
    /// The time of the oldest record published since the last wakeup.
    pub(crate) unsignalled_since: Option<u64>,
    /// Whether a loss was signalled since the last record was published (one wakeup per
    /// episode of losses, not one per lost sample).
    pub(crate) loss_signalled: bool,
}

/// `xenpmu_ring_producer`'s counters, in their order there (after `head`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, IntoBytes, Immutable)]
#[repr(C)]
pub struct ProducerCounters {
    /// Sample records published.
    pub records: u64,
    /// Samples lost (ring full, impossible tail, area not writable).
    pub lost: u64,
    /// Samples withheld (page LVTPC masked).
    pub withheld: u64,
    /// PMU VIRQs raised for the ring.
    pub wakeups: u64,
    /// Samples that found the tail impossible.
    pub bad_tail: u64,
}

/// Lost samples not yet reported by a lost record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PendingLost {
    pub(crate) count: u64,
    pub(crate) sequence: u64,
    pub(crate) tsc: u64,
}

/// A pCPU's buffer where a sample record is built (its fixed part, then the call chain walked
/// straight into place) before its one `ring_write`: the largest record, 736 bytes.
#[derive(Clone, Debug, IntoBytes, Immutable, KnownLayout, FromZeros)]
#[repr(C)]
pub(crate) struct RecordBuffer {
    sample: RingSample,
    chain: [u64; XENPMU_CALLCHAIN_MAX],
}

impl RecordBuffer {
    pub(crate) fn new() -> Self {
        Self::new_zeroed()
    }
}

/// What became of a sample offered to a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Produced {
    Published,
    Lost,
    Withheld,
}

/// Byte offset of `producer.records` in the control page.
const COUNTERS_OFFSET: u32 = XENPMU_RING_PRODUCER_OFFSET as u32 + 8;
/// Size of a lost record.
const LOST_SIZE: u32 = core::mem::size_of::<RingLost>() as u32;

/// Where a record of `size` bytes goes when the next free byte is at `position`: the PAD it
/// needs first (0: none) and its own position. A record never straddles the end of the data
/// area.
fn place(position: u64, size: u32, data_size: u32) -> (u32, u64) {
    let offset = (position & u64::from(data_size - 1)) as u32;
    let room = data_size - offset;
    if size > room {
        (room, position.wrapping_add(u64::from(room)))
    } else {
        (0, position)
    }
}

/// The latency bound of `max_latency_us` at `tsc_khz`, in TSC ticks; 0 (wake at every record)
/// when either is 0: without a known clock rate no time can be waited for.
pub(crate) fn latency_ticks(max_latency_us: u32, tsc_khz: u64) -> u64 {
    if max_latency_us == 0 || tsc_khz == 0 {
        return 0;
    }
    // A bound below one tick still waits one.
    (u64::from(max_latency_us).saturating_mul(tsc_khz) / 1000).max(1)
}

impl Ring {
    /// Copies `bytes` to data-area position `position` (taken modulo the data size).
    fn write_data<P: Platform>(&self, platform: &mut P, position: u64, bytes: &[u8]) -> bool {
        let offset = (position & u64::from(self.data_size - 1)) as u32;
        platform.ring_write(self.slot, XENPMU_RING_CONTROL_SIZE as u32 + offset, bytes)
    }

    /// Unread bytes by the consumer's tail, read once (one 8-byte read) and never trusted:
    /// `None` if it cannot be read, is not 8-aligned, is ahead of `head` or more than the data
    /// area behind it.
    fn unread<P: Platform>(&self, platform: &mut P) -> Option<u64> {
        let mut tail = [0u8; 8];
        if !platform.ring_read(self.slot, XENPMU_RING_CONSUMER_OFFSET as u32, &mut tail) {
            return None;
        }
        let tail = u64::from_le_bytes(tail);
        let unread = self.head.wrapping_sub(tail);
        (tail % 8 == 0 && unread <= u64::from(self.data_size)).then_some(unread)
    }

    /// Writes the producer's counters, then `head` if it moved: the head last, each with its
    /// own write, so that a consumer that sees the head sees the records before it.
    fn write_producer<P: Platform>(&self, platform: &mut P, head_moved: bool) {
        // A failed write (the area unmapped under the producer) leaves the guest's view stale;
        // the hypervisor's own copy stays right, and the next write catches up.
        platform.ring_write(self.slot, COUNTERS_OFFSET, self.counters.as_bytes());
        if head_moved {
            platform.ring_write(
                self.slot,
                XENPMU_RING_PRODUCER_OFFSET as u32,
                &self.head.to_le_bytes(),
            );
        }
    }

    /// A sample withheld because the page's LVTPC is masked.
    pub(crate) fn withhold<P: Platform>(&mut self, platform: &mut P) -> Produced {
        self.counters.withheld = self.counters.withheld.wrapping_add(1);
        self.write_producer(platform, false);
        Produced::Withheld
    }

    /// Offers the sample record built in `buffer` (`size` bytes, sequence `sequence` taken at
    /// `tsc`) to the ring; raises the VIRQ on `owner` if a wakeup rule says so.
    fn append<P: Platform>(
        &mut self,
        platform: &mut P,
        owner: VcpuId,
        buffer: &RecordBuffer,
        size: u32,
        sequence: u64,
        tsc: u64,
    ) -> Produced {
        let unread = self.unread(platform);
        let free = unread.map(|unread| u64::from(self.data_size) - unread);
        // Where everything goes: a pending lost record first, then the sample, each after the
        // PAD it needs.
        let lost_at = self
            .pending_lost
            .map(|_| place(self.head, LOST_SIZE, self.data_size));
        let after_lost = lost_at.map_or(self.head, |(_, at)| at.wrapping_add(u64::from(LOST_SIZE)));
        let (sample_pad, sample_at) = place(after_lost, size, self.data_size);
        let end = sample_at.wrapping_add(u64::from(size));
        let fits = free.is_some_and(|free| end.wrapping_sub(self.head) <= free);
        let written = fits
            && self.write_records(
                platform,
                buffer,
                size,
                lost_at,
                (sample_pad, after_lost, sample_at),
            );
        if !written {
            if unread.is_none() {
                self.counters.bad_tail = self.counters.bad_tail.wrapping_add(1);
            }
            return self.lose(platform, owner, sequence, tsc, unread != Some(0));
        }
        self.counters.records = self.counters.records.wrapping_add(1);
        self.pending_lost = None;
        self.loss_signalled = false;
        self.unsignalled_bytes = self
            .unsignalled_bytes
            .saturating_add(end.wrapping_sub(self.head));
        let since = *self.unsignalled_since.get_or_insert(tsc);
        self.head = end;
        let wake = self.unsignalled_bytes >= u64::from(self.wakeup_bytes)
            || tsc.wrapping_sub(since) >= self.latency_ticks;
        if wake {
            self.count_wakeup();
        }
        self.write_producer(platform, true);
        if wake {
            platform.raise_pmu_virq(owner);
        }
        Produced::Published
    }

    /// Writes the PADs, the pending lost record and the sample record; false if the platform
    /// refused any write (the area is no longer mapped): nothing is published then.
    fn write_records<P: Platform>(
        &self,
        platform: &mut P,
        buffer: &RecordBuffer,
        size: u32,
        lost_at: Option<(u32, u64)>,
        (sample_pad, pad_at, sample_at): (u32, u64, u64),
    ) -> bool {
        if let (Some((lost_pad, at)), Some(pending)) = (lost_at, self.pending_lost) {
            if lost_pad != 0 && !self.write_pad(platform, self.head, lost_pad) {
                return false;
            }
            let record = RingLost {
                header: RecordHeader {
                    kind: XENPMU_RECORD_LOST,
                    size: LOST_SIZE as u16,
                    misc: 0,
                },
                lost: pending.count,
                sequence: pending.sequence,
                tsc: pending.tsc,
            };
            if !self.write_data(platform, at, record.as_bytes()) {
                return false;
            }
        }
        if sample_pad != 0 && !self.write_pad(platform, pad_at, sample_pad) {
            return false;
        }
        let bytes = buffer.as_bytes();
        let record = bytes.get(..size as usize).unwrap_or(bytes);
        self.write_data(platform, sample_at, record)
    }

    /// A PAD record of `size` bytes at `position` (only its header is written).
    fn write_pad<P: Platform>(&self, platform: &mut P, position: u64, size: u32) -> bool {
        let header = RecordHeader {
            kind: XENPMU_RECORD_PAD,
            size: size as u16,
            misc: 0,
        };
        self.write_data(platform, position, header.as_bytes())
    }

    /// A sample lost: counted, and reported by the next lost record. `unread`: records may
    /// wait unread (or the tail could not tell), so the owner is woken once for the episode.
    fn lose<P: Platform>(
        &mut self,
        platform: &mut P,
        owner: VcpuId,
        sequence: u64,
        tsc: u64,
        unread: bool,
    ) -> Produced {
        self.counters.lost = self.counters.lost.wrapping_add(1);
        let count = self.pending_lost.map_or(0, |p| p.count).saturating_add(1);
        self.pending_lost = Some(PendingLost {
            count,
            sequence,
            tsc,
        });
        let wake = unread && !self.loss_signalled;
        if wake {
            self.loss_signalled = true;
            self.count_wakeup();
        }
        self.write_producer(platform, false);
        if wake {
            platform.raise_pmu_virq(owner);
        }
        Produced::Lost
    }

    fn count_wakeup(&mut self) {
        self.counters.wakeups = self.counters.wakeups.wrapping_add(1);
        self.unsignalled_bytes = 0;
        self.unsignalled_since = None;
    }

    /// The latency timer: wakes the owner if records published since the last wakeup have
    /// waited the latency bound by `now`. Returns whether it did.
    fn poll<P: Platform>(&mut self, platform: &mut P, owner: VcpuId) -> bool {
        let Some(since) = self.unsignalled_since else {
            return false;
        };
        if platform.timestamp().wrapping_sub(since) < self.latency_ticks {
            return false;
        }
        self.count_wakeup();
        self.write_producer(platform, false);
        platform.raise_pmu_virq(owner);
        true
    }
}

/// The sample to put in a ring: what `Sample` says, under the identity the receiver sees.
struct Offered<'s, 'r> {
    sample: &'s Sample<'r>,
    identity: Identity,
    overflowed: u64,
    sequence: u64,
}

impl<B: PmuBackend> Vpmu<B> {
    /// Ring mode: re-arms what overflowed in `ctx` (loaded on `hw`) with `periods`, and
    /// takes the overflow out of the virtual status (`PmuBackend::rearm_overflowed`).
    #[inline]
    pub(crate) fn rearm_for_ring<H: MsrBus>(
        &self,
        periods: Option<&RearmPeriods>,
        ctx: &mut B::Context,
        hw: &mut H,
        overflow: Overflow,
    ) -> Result<Overflow, MsrFault> {
        match periods {
            Some(periods) if !overflow.counters.is_empty() => {
                self.backend
                    .rearm_overflowed(ctx, hw, overflow.counters, periods)?;
                Ok(overflow)
            }
            _ => Ok(overflow),
        }
    }

    /// A sample of `vcpu`'s own counters (self, hv) for its ring: numbered, then withheld,
    /// published or lost. Returns whether it was published.
    pub(crate) fn ring_publish<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        vcpu: &mut VcpuPmu<B::Context>,
        sample: &Sample,
        overflow: Overflow,
    ) -> bool {
        let Some(page) = vcpu.page.as_mut() else {
            return false;
        };
        page.samples += 1;
        let sequence = page.samples;
        // The sample reports this overflow: it is no longer pending.
        vcpu.pending_pmi = None;
        let identity = self.identity(platform, vcpu.id, pcpu.index, sample);
        let offered = Offered {
            sample,
            identity,
            overflowed: overflow.counters.0,
            sequence,
        };
        let masked = vcpu.page_lvtpc_masked;
        let owner = vcpu.id;
        let Some(ring) = vcpu.ring.as_mut() else {
            return false;
        };
        Self::produce(
            platform,
            ring,
            &mut pcpu.ring_record,
            owner,
            masked,
            &offered,
        ) == Produced::Published
    }

    /// Offers `offered` to `ring`, the ring of `owner` (whose page LVTPC is `masked`),
    /// building the record in `buffer`.
    fn produce<P: Platform>(
        platform: &mut P,
        ring: &mut Ring,
        buffer: &mut RecordBuffer,
        owner: VcpuId,
        masked: bool,
        offered: &Offered,
    ) -> Produced {
        if masked {
            return ring.withhold(platform);
        }
        let tsc = platform.timestamp();
        let regs: &Regs = offered.sample.regs;
        let context = offered.sample.context;
        let (chain_len, chain_end) = if platform.reads_sampled_memory(context) {
            crate::callchain::walk(regs, &mut buffer.chain, |at, out| {
                platform.read_sampled(context, at, out)
            })
        } else {
            (0, XENPMU_CHAIN_NONE)
        };
        let chain_len = chain_len.min(XENPMU_CALLCHAIN_MAX as u32);
        let size = XENPMU_RING_SAMPLE_SIZE as u32 + 8 * chain_len;
        buffer.sample = RingSample {
            header: RecordHeader {
                kind: XENPMU_RECORD_SAMPLE,
                size: size as u16,
                misc: vpmu_abi::writer::sample_flags(regs) as u32,
            },
            sequence: offered.sequence,
            tsc,
            identity: offered.identity,
            overflowed: offered.overflowed,
            chain_len,
            chain_end,
            regs: *regs,
        };
        ring.append(platform, owner, buffer, size, offered.sequence, tsc)
    }

    /// A system-wide sample (all mode) of `pcpu` for `profiler`'s ring: the counters keep
    /// running, the overflow is acknowledged and re-armed, and the sample is numbered, then
    /// withheld, published or lost.
    pub(crate) fn ring_system_sample<P: Platform, H: MsrBus>(
        &self,
        platform: &mut P,
        pcpu: &mut PcpuPmu<B::Context, H>,
        profiler: &mut VcpuPmu<B::Context>,
    ) -> Result<crate::pmi::PmiOutcome, CoreError> {
        let ctx = &mut pcpu.system_ctx;
        let overflow = self.backend.handle_overflow(ctx, &mut pcpu.hw)?;
        let periods = profiler.ring.as_ref().map(|ring| &ring.periods);
        let overflow = self.rearm_for_ring(periods, ctx, &mut pcpu.hw, overflow)?;
        let Some(overflow) = Self::due(overflow) else {
            return Ok(Self::not_due(overflow));
        };
        profiler.stats.pmis_generated += 1;
        let Some(page) = profiler.page.as_mut() else {
            return Ok(self.account(profiler, false, overflow));
        };
        page.samples += 1;
        let sequence = page.samples;
        platform.interrupted_into(pcpu.index, &mut pcpu.interrupted);
        let Some(sample) = Self::system_sample_of(profiler.id, &pcpu.interrupted) else {
            // A sampled domain that cannot be named honestly: the sample is lost (numbered,
            // counted, reported by a lost record), never published under a false identity.
            let tsc = platform.timestamp();
            let owner = profiler.id;
            if let Some(ring) = profiler.ring.as_mut() {
                ring.lose(platform, owner, sequence, tsc, true);
            }
            return Ok(self.account(profiler, false, overflow));
        };
        let offered = Offered {
            identity: self.identity(platform, profiler.id, pcpu.index, &sample),
            sample: &sample,
            overflowed: overflow.counters.0,
            sequence,
        };
        let (owner, masked) = (profiler.id, profiler.page_lvtpc_masked);
        let published = match profiler.ring.as_mut() {
            Some(ring) => {
                Self::produce(
                    platform,
                    ring,
                    &mut pcpu.ring_record,
                    owner,
                    masked,
                    &offered,
                ) == Produced::Published
            }
            None => false,
        };
        Ok(self.account(profiler, published, overflow))
    }

    /// The hypervisor's latency timer for `vcpu`'s ring: raises the PMU VIRQ on it if records
    /// published since its last wakeup have waited the ring's `max_latency_us`, and says
    /// whether it did. Cheap when there is nothing to wait for (no ring, nothing unsignalled:
    /// no clock read). Callable from any pCPU: it takes `vcpu`'s lock and touches its ring
    /// through the platform, no hardware. `CoreError::NoSuchVcpu` if the table has no `vcpu`.
    pub fn ring_poll<P: Platform, T: VcpuTable<B::Context>>(
        &self,
        platform: &mut P,
        vcpus: &T,
        vcpu: VcpuId,
    ) -> Result<bool, CoreError> {
        let mut raised = false;
        let found = vcpus.with_vcpu(vcpu, &mut |v| {
            if let Some(ring) = v.ring.as_mut() {
                raised = ring.poll(platform, vcpu);
            }
        });
        if !found {
            return Err(CoreError::NoSuchVcpu(vcpu));
        }
        Ok(raised)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_that_would_straddle_the_end_is_padded_to_offset_zero() {
        assert_eq!(place(0, 736, 4096), (0, 0));
        assert_eq!(place(4096 - 736, 736, 4096), (0, 4096 - 736));
        assert_eq!(place(4096 - 728, 736, 4096), (728, 4096));
        // Positions are free-running: the offset is the position modulo the data size.
        assert_eq!(place(3 * 4096 + 4088, 32, 4096), (8, 4 * 4096));
        assert_eq!(place(u64::MAX - 7, 16, 4096), (8, 0));
    }

    #[test]
    fn the_latency_bound_is_in_tsc_ticks() {
        assert_eq!(latency_ticks(1000, 2_000_000), 2_000_000);
        assert_eq!(latency_ticks(0, 2_000_000), 0);
        // No clock rate: every record wakes.
        assert_eq!(latency_ticks(1000, 0), 0);
        // A bound below one tick still waits one tick.
        assert_eq!(latency_ticks(1, 1), 1);
        assert_eq!(latency_ticks(u32::MAX, u64::MAX), u64::MAX / 1000);
    }
}
