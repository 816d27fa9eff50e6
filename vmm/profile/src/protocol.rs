//! The Rust side of `profile/profile.h`: the configuration the VMM writes into a profile guest
//! and the sample batches the guests ship. The constants (port, magics, capacity, roles, the
//! layouts' sizes) are `vpmu-guest-protocol`'s, from which the guests' `guest_protocol.h` is
//! generated; the C header asserts its structs against those sizes, and this module asserts
//! its own. The guest only ever writes, the VMM decodes copies and refuses anything malformed
//! (the guest could be a user's ELF).

use vpmu::VcpuId;
use vpmu::abi::{Regs, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF, XENPMU_FLAG_SAMPLE_USER};
use vpmu_guest_protocol::profile as wire;
use vpmu_machine::{GuestPorts, PortAccess};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::ring_batch::{RING_BATCH_MAGIC, RingCursor, RingDecoder, RingProblem, RingTotals};
use super::sample::{CallChain, ChainEnd, Origin, ProfileSample, SampleDetails};

/// `PORT_BATCH`: `outl` with the guest-physical address of a `struct sample_batch`; the
/// profiler's `BatchPort` copies it out.
pub const PORT_BATCH: u16 = vpmu_guest_protocol::port::BATCH;
/// `PROFILE_CONFIG_MAGIC` ("PROF").
pub const CONFIG_MAGIC: u32 = wire::PROFILE_CONFIG_MAGIC;
/// `SAMPLE_BATCH_MAGIC` ("BTCH").
pub const BATCH_MAGIC: u32 = wire::SAMPLE_BATCH_MAGIC;
/// `BATCH_CAPACITY`: samples per batch at most (the guest's `struct sample_batch` holds this
/// many; a batch claiming more is refused).
pub const BATCH_CAPACITY: usize = wire::BATCH_CAPACITY;
/// `ROLE_PROFILER`.
pub const ROLE_PROFILER: u32 = wire::ROLE_PROFILER;
/// `ROLE_WORKLOAD`.
pub const ROLE_WORKLOAD: u32 = wire::ROLE_WORKLOAD;
/// The symbol of the configuration in a profile guest.
pub const CONFIG_SYMBOL: &str = "profile_config";

/// `struct profile_config`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct ProfileConfig {
    /// `CONFIG_MAGIC`.
    pub magic: u32,
    /// `ROLE_*`.
    pub role: u32,
    /// The `XENPMU_MODE_*` the run measures.
    pub mode: u32,
    /// The built-in workload (1..3) of a workload domain.
    pub workload: u32,
    /// Mean cycles between samples; 0: no sampling (the baseline).
    pub period: u64,
    /// The period varies by -jitter/2..+jitter/2 (`jitter + 1` a power of two).
    pub jitter: u64,
    /// TSC ticks to sample for.
    pub duration: u64,
    /// `DELIVERY_PAGE` or `DELIVERY_RING`.
    pub delivery: u32,
    /// Ring mode: the ring's `max_latency_us`.
    pub ring_latency_us: u32,
}

/// `struct batch_sample`.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BatchSample {
    /// The page's `identity.domain_id` (`XENPMU_DOMID_SELF`/`_HYPERVISOR` included).
    pub domain_id: u32,
    /// `identity.vcpu_id`.
    pub vcpu_id: u32,
    /// `identity.pcpu_id`.
    pub pcpu_id: u32,
    /// `pmu_flags` when read.
    pub flags: u32,
    /// The sampled registers.
    pub regs: Regs,
    /// The page's `sample.tsc`.
    pub tsc: u64,
    /// `sample.tsc_khz`.
    pub tsc_khz: u64,
    /// `sample.sequence`.
    pub sequence: u64,
    /// `sample.overflowed`.
    pub overflowed: u64,
    /// `sample.chain_len`: valid entries of `callchain` (at most `BATCH_CHAIN_MAX`).
    pub chain_len: u32,
    /// `sample.chain_end` (`XENPMU_CHAIN_*`).
    pub chain_end: u32,
    /// `sample.callchain[..chain_len]`; later entries are stale and never read.
    pub callchain: [u64; wire::BATCH_CHAIN_MAX],
}

/// `struct sample_batch`'s header.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct BatchHeader {
    /// `BATCH_MAGIC`.
    pub magic: u32,
    /// Samples that follow.
    pub count: u32,
    /// 0, 1, 2, ... per shipping guest.
    pub sequence: u64,
    /// The page's `dropped_samples` when shipped (cumulative).
    pub dropped: u64,
    /// Samples the guest read but could not buffer (cumulative).
    pub lost: u64,
    /// TSC ticks the guest spent in its VIRQ handler (cumulative).
    pub handler_ticks: u64,
    /// TSC ticks the guest spent shipping (cumulative).
    pub ship_ticks: u64,
}

/// Bytes of a batch header.
pub const BATCH_HEADER: usize = size_of::<BatchHeader>();
/// Bytes of one sample.
pub const SAMPLE_SIZE: usize = size_of::<BatchSample>();

static_assertions::const_assert_eq!(size_of::<ProfileConfig>(), wire::PROFILE_CONFIG_SIZE);
static_assertions::const_assert_eq!(BATCH_HEADER, wire::BATCH_HEADER_SIZE);
static_assertions::const_assert_eq!(SAMPLE_SIZE, wire::BATCH_SAMPLE_SIZE);
static_assertions::const_assert_eq!(
    core::mem::offset_of!(BatchSample, tsc),
    wire::BATCH_SAMPLE_IDENTITY_SIZE + size_of::<Regs>()
);
static_assertions::const_assert_eq!(
    core::mem::offset_of!(BatchSample, callchain),
    wire::BATCH_SAMPLE_IDENTITY_SIZE + size_of::<Regs>() + wire::BATCH_SAMPLE_DETAILS_SIZE
);
static_assertions::const_assert_eq!(wire::BATCH_CHAIN_MAX, vpmu::abi::XENPMU_CALLCHAIN_MAX);
static_assertions::const_assert_eq!(size_of::<Regs>(), 168);

/// What is wrong with a batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchProblem {
    /// Fewer bytes than a header.
    #[error("shorter than a header")]
    Short,
    /// Not `BATCH_MAGIC`.
    #[error("magic {0:#x}")]
    Magic(u32),
    /// Not the next sequence number.
    #[error("sequence {0} (a batch was lost)")]
    Sequence(u64),
    /// The count is above `BATCH_CAPACITY` or disagrees with the length.
    #[error("{count} samples in {bytes} bytes")]
    Length {
        /// The header's count.
        count: u32,
        /// Bytes after the header.
        bytes: usize,
    },
    /// A sample's call chain is malformed: longer than the chain holds, an unknown end
    /// reason, or entries with no chain walked.
    #[error("sample {index}: call chain of {len} entries ending {end}")]
    Chain {
        /// The sample's index in the batch.
        index: usize,
        /// Its `chain_len`.
        len: u32,
        /// Its `chain_end`.
        end: u32,
    },
    /// The batch is not guest RAM (`BatchPort`).
    #[error("outside guest memory")]
    Outside,
    /// The header claims more samples than a batch holds (`BatchPort`).
    #[error("more samples than a batch holds ({0} > {BATCH_CAPACITY})")]
    OverCapacity(usize),
    /// A ring shipment (`struct ring_batch`) is malformed.
    #[error("ring shipment: {0}")]
    Ring(#[from] RingProblem),
}

/// A batch the VMM refused: who shipped it, which one, and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("domain {shipper}, batch {batch}: {problem}")]
pub struct DecodeError {
    /// The shipping domain.
    pub shipper: u32,
    /// The batch's index in its shipper's order.
    pub batch: usize,
    /// What is wrong.
    pub problem: BatchProblem,
}

/// What a guest shipped over a run, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shipment {
    /// Every sample, in shipping order.
    pub samples: Vec<ProfileSample>,
    /// The page's dropped-sample count at the last batch.
    pub dropped: u64,
    /// Samples the guest could not buffer, at the last batch.
    pub lost: u64,
    /// Batches received (of both kinds).
    pub batches: u64,
    /// What the ring shipments add up to (None: the vCPU shipped none).
    pub ring: Option<RingTotals>,
    /// The guest's TSC ticks in its VIRQ handler and in shipping, at its last batch.
    pub guest_ticks: (u64, u64),
}

/// Decodes the batches `shipper` (a domain) shipped, in order. Errors name the first bad
/// batch: wrong magic, a sequence gap, or a length that disagrees with its count.
pub fn decode(shipper: u32, batches: &[Vec<u8>]) -> Result<Shipment, DecodeError> {
    let mut out = Shipment::default();
    let mut ring: Option<RingDecoder> = None;
    for (i, bytes) in batches.iter().enumerate() {
        let bad = |problem| DecodeError {
            shipper,
            batch: i,
            problem,
        };
        let magic = bytes
            .get(..4)
            .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
        if magic == Some(RING_BATCH_MAGIC) {
            let sequence = bytes
                .get(8..16)
                .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0xff; 8])));
            if sequence != i as u64 {
                return Err(bad(BatchProblem::Sequence(sequence)));
            }
            let last_page = out.samples.last().map_or(0, |s| s.details.sequence);
            let decoder = ring.get_or_insert_with(|| RingDecoder::new(last_page + 1));
            decoder
                .decode(shipper, bytes, &mut out.samples)
                .map_err(|p| bad(p.into()))?;
            out.ring = Some(decoder.totals);
            out.guest_ticks = decoder.guest_ticks;
            out.batches += 1;
            continue;
        }
        let (header, rest) =
            BatchHeader::read_from_prefix(bytes).map_err(|_| bad(BatchProblem::Short))?;
        if header.magic != BATCH_MAGIC {
            return Err(bad(BatchProblem::Magic(header.magic)));
        }
        if header.sequence != i as u64 {
            return Err(bad(BatchProblem::Sequence(header.sequence)));
        }
        if header.count as usize > BATCH_CAPACITY
            || rest.len() != header.count as usize * SAMPLE_SIZE
        {
            return Err(bad(BatchProblem::Length {
                count: header.count,
                bytes: rest.len(),
            }));
        }
        for (index, chunk) in rest.chunks_exact(SAMPLE_SIZE).enumerate() {
            // Exactly SAMPLE_SIZE bytes, any bit pattern: cannot fail.
            let Ok(s) = BatchSample::read_from_bytes(chunk) else {
                continue;
            };
            let sample = resolve(shipper, &s).ok_or_else(|| {
                bad(BatchProblem::Chain {
                    index,
                    len: s.chain_len,
                    end: s.chain_end,
                })
            })?;
            out.samples.push(sample);
        }
        out.dropped = header.dropped;
        out.lost = header.lost;
        out.guest_ticks = (header.handler_ticks, header.ship_ticks);
        out.batches += 1;
    }
    Ok(out)
}

/// A page sample as the profile report sees it: `XENPMU_DOMID_SELF` is the shipper. None if
/// its call chain is malformed (see `BatchProblem::Chain`).
fn resolve(shipper: u32, s: &BatchSample) -> Option<ProfileSample> {
    let origin = match s.domain_id {
        XENPMU_DOMID_SELF => Origin::Domain(shipper),
        XENPMU_DOMID_HYPERVISOR => Origin::Hypervisor,
        d => Origin::Domain(d),
    };
    let end = ChainEnd::from_raw(s.chain_end)?;
    let addresses = s.callchain.get(..s.chain_len as usize)?;
    let chain = CallChain::new(addresses, end)?;
    Some(ProfileSample {
        origin,
        vcpu: s.vcpu_id,
        pcpu: s.pcpu_id,
        rip: s.regs.rip,
        user: u64::from(s.flags) & XENPMU_FLAG_SAMPLE_USER != 0,
        regs: s.regs,
        shipped_by: shipper,
        details: SampleDetails {
            tsc: s.tsc,
            tsc_khz: s.tsc_khz,
            sequence: s.sequence,
            overflowed: s.overflowed,
            chain,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sequence: u64, samples: &[BatchSample]) -> Vec<u8> {
        let header = BatchHeader {
            magic: BATCH_MAGIC,
            count: samples.len() as u32,
            sequence,
            dropped: 3,
            lost: 1,
            handler_ticks: 0,
            ship_ticks: 0,
        };
        let mut b = header.as_bytes().to_vec();
        for s in samples {
            b.extend_from_slice(s.as_bytes());
        }
        b
    }

    fn sample(domain_id: u32, rip: u64, flags: u32) -> BatchSample {
        let mut callchain = [0; wire::BATCH_CHAIN_MAX];
        callchain[..2].copy_from_slice(&[rip + 0x40, rip + 0x80]);
        // Stale entries after chain_len are ignored.
        callchain[2] = 0xdead;
        BatchSample {
            domain_id,
            vcpu_id: 0,
            pcpu_id: 0,
            flags,
            regs: Regs {
                rip,
                ..Regs::default()
            },
            tsc: 2_445_000 * rip,
            tsc_khz: 2_445_000,
            sequence: rip,
            overflowed: 1,
            chain_len: 2,
            chain_end: vpmu::abi::XENPMU_CHAIN_COMPLETE,
            callchain,
        }
    }

    #[test]
    fn decodes_and_resolves_origins() {
        let b0 = batch(
            0,
            &[
                sample(XENPMU_DOMID_SELF, 1, 0),
                sample(2, 2, XENPMU_FLAG_SAMPLE_USER as u32),
            ],
        );
        let b1 = batch(1, &[sample(XENPMU_DOMID_HYPERVISOR, 3, 0)]);
        let s = decode(0, &[b0, b1]).expect("valid");
        let origins: Vec<_> = s.samples.iter().map(|s| s.origin).collect();
        assert_eq!(
            origins,
            [Origin::Domain(0), Origin::Domain(2), Origin::Hypervisor]
        );
        assert!(s.samples[1].user && !s.samples[0].user);
        assert_eq!((s.dropped, s.lost, s.batches), (3, 1, 2));
        let d = &s.samples[2].details;
        assert_eq!(d.chain.addresses(), [0x43, 0x83]);
        assert_eq!(d.chain.end(), ChainEnd::Complete);
        assert_eq!((d.sequence, d.overflowed, d.tsc_khz), (3, 1, 2_445_000));
        assert_eq!(d.time_ns(), Some(3_000_000));
    }

    #[test]
    fn refuses_malformed_chains() {
        let mut long = sample(1, 1, 0);
        long.chain_len = wire::BATCH_CHAIN_MAX as u32 + 1;
        let mut unknown = sample(1, 1, 0);
        unknown.chain_end = 5;
        let mut none_with_entries = sample(1, 1, 0);
        none_with_entries.chain_end = vpmu::abi::XENPMU_CHAIN_NONE;
        for (bad, len, end) in [(long, 65, 1), (unknown, 2, 5), (none_with_entries, 2, 0)] {
            let e = decode(1, &[batch(0, &[sample(1, 1, 0), bad])]).unwrap_err();
            assert_eq!(e.problem, BatchProblem::Chain { index: 1, len, end }, "{e}");
        }
        let mut full = sample(1, 1, 0);
        full.chain_len = wire::BATCH_CHAIN_MAX as u32;
        full.chain_end = vpmu::abi::XENPMU_CHAIN_TRUNCATED;
        let s = decode(1, &[batch(0, &[full])]).expect("a full chain is valid");
        assert_eq!(s.samples[0].details.chain.addresses().len(), 64);
    }

    #[test]
    fn refuses_gaps_bad_magic_and_bad_lengths() {
        let b = batch(0, &[sample(1, 1, 0)]);
        let e = decode(1, &[batch(1, &[])]).unwrap_err();
        assert_eq!(e.problem, BatchProblem::Sequence(1));
        assert_eq!(
            e.to_string(),
            "domain 1, batch 0: sequence 1 (a batch was lost)"
        );
        let mut m = b.clone();
        m[0] ^= 1;
        assert!(decode(1, &[m]).unwrap_err().to_string().contains("magic"));
        assert!(
            decode(1, &[b[..b.len() - 1].to_vec()])
                .unwrap_err()
                .to_string()
                .contains("samples in")
        );
        assert_eq!(
            decode(1, &[b[..10].to_vec()]).unwrap_err().problem,
            BatchProblem::Short
        );
    }

    proptest::proptest! {
        /// The batches come from a guest: any bytes decode to samples or an error, never a
        /// panic.
        #[test]
        fn arbitrary_batches_never_panic(
            batches in proptest::collection::vec(
                proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..600),
                0..4,
            ),
            shipper in proptest::arbitrary::any::<u32>(),
        ) {
            let _ = decode(shipper, &batches);
        }

        /// A valid batch with one byte changed or cut short still decodes or fails cleanly.
        #[test]
        fn damaged_batches_never_panic(
            at in 0usize..(BATCH_HEADER + 2 * SAMPLE_SIZE),
            byte in proptest::arbitrary::any::<u8>(),
            cut in 0usize..(BATCH_HEADER + 2 * SAMPLE_SIZE + 1),
        ) {
            let mut b = batch(0, &[sample(1, 1, 0), sample(2, 2, 0)]);
            b[at] = byte;
            let _ = decode(0, &[b.clone()]);
            b.truncate(cut);
            let _ = decode(0, &[b]);
        }
    }
}

/// The profiler's port on the machine (`vpmu_machine::GuestPorts`): each `outl(PORT_BATCH,
/// gpa)` copies the `struct sample_batch` at `gpa` (its header and `count` samples) out of
/// the writer's memory, kept per vCPU. A batch that does not fit guest memory or claims more
/// samples than `BATCH_CAPACITY` ends the writer's run with an error.
#[derive(Debug, Default)]
pub struct BatchPort {
    batches: std::sync::Mutex<std::collections::BTreeMap<VcpuId, Vec<Vec<u8>>>>,
    /// Each vCPU's ring between its shipments (ring mode).
    rings: std::sync::Mutex<std::collections::BTreeMap<VcpuId, Option<RingCursor>>>,
    shipped: std::sync::atomic::AtomicU64,
}

impl BatchPort {
    /// A ring shipment at `gpa`: copies the bytes it names out of the ring (`ring_batch::copy`),
    /// in order after the vCPU's other batches.
    fn ring_shipment(&self, access: PortAccess<'_>, gpa: u64) -> Result<(), String> {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let cursor = rings.entry(access.vcpu).or_default();
        let bytes = super::ring_batch::copy(access.memory, gpa, cursor)
            .map_err(|problem| format!("ring shipment at {gpa:#x}: {problem}"))?;
        drop(rings);
        // A rough count for the progress display: a short-chain record is ~256 bytes.
        let records = (bytes.len() - super::ring_batch::RING_BATCH) as u64 / 256;
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(access.vcpu)
            .or_default()
            .push(bytes);
        self.shipped
            .fetch_add(records, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Samples shipped so far by every vCPU (for a progress display on another thread).
    pub fn shipped(&self) -> u64 {
        self.shipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The raw batches each vCPU shipped, in order.
    pub fn take(&self) -> std::collections::BTreeMap<VcpuId, Vec<Vec<u8>>> {
        std::mem::take(&mut *self.batches.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl GuestPorts for BatchPort {
    fn out(&self, access: PortAccess<'_>, port: u16, gpa: u32) -> Result<(), String> {
        if port != PORT_BATCH {
            return Ok(());
        }
        let gpa = u64::from(gpa);
        let magic = access.memory.read_as::<u32>(gpa);
        if magic == Some(RING_BATCH_MAGIC) {
            return self.ring_shipment(access, gpa);
        }
        let bad = |problem: BatchProblem| format!("sample batch at {gpa:#x}: {problem}");
        // One copy of the whole `struct sample_batch` (the guest's struct always has room for
        // `BATCH_CAPACITY` samples): the count is read from the copy, so the guest cannot
        // change it between a check and the copy it guards.
        let mut bytes = access
            .memory
            .to_vec(gpa, BATCH_HEADER + BATCH_CAPACITY * SAMPLE_SIZE)
            .ok_or_else(|| bad(BatchProblem::Outside))?;
        let (header, _) =
            BatchHeader::read_from_prefix(&bytes).map_err(|_| bad(BatchProblem::Outside))?;
        let count = header.count as usize;
        if count > BATCH_CAPACITY {
            return Err(bad(BatchProblem::OverCapacity(count)));
        }
        bytes.truncate(BATCH_HEADER + count * SAMPLE_SIZE);
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(access.vcpu)
            .or_default()
            .push(bytes);
        self.shipped
            .fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}
