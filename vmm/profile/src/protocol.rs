//! The Rust side of `profile/profile.h`: the configuration the VMM writes into a profile guest
//! and the sample batches the guests ship. Layouts are checked against the C header's
//! `_Static_assert`s by size here; the guest only ever writes, the VMM decodes copies and
//! refuses anything malformed (the guest could be a user's ELF).

use vpmu::VcpuId;
use vpmu::abi::{Regs, XENPMU_DOMID_HYPERVISOR, XENPMU_DOMID_SELF, XENPMU_FLAG_SAMPLE_USER};
use vpmu_machine::{GuestPorts, PortAccess};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::sample::{Origin, ProfileSample};

/// `PORT_BATCH`: `outl` with the guest-physical address of a `struct sample_batch`; the
/// profiler's `BatchPort` copies it out.
pub const PORT_BATCH: u16 = 0x16;
/// `PROFILE_CONFIG_MAGIC` ("PROF").
pub const CONFIG_MAGIC: u32 = 0x464f_5250;
/// `SAMPLE_BATCH_MAGIC` ("BTCH").
pub const BATCH_MAGIC: u32 = 0x4843_5442;
/// `BATCH_CAPACITY`: samples per batch at most.
pub const BATCH_CAPACITY: usize = 256;
/// `ROLE_PROFILER`.
pub const ROLE_PROFILER: u32 = 1;
/// `ROLE_WORKLOAD`.
pub const ROLE_WORKLOAD: u32 = 2;
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
}

/// Bytes of a batch header.
pub const BATCH_HEADER: usize = size_of::<BatchHeader>();
/// Bytes of one sample.
pub const SAMPLE_SIZE: usize = size_of::<BatchSample>();

static_assertions::const_assert_eq!(size_of::<ProfileConfig>(), 40);
static_assertions::const_assert_eq!(BATCH_HEADER, 32);
static_assertions::const_assert_eq!(SAMPLE_SIZE, 16 + 168);

/// What a guest shipped over a run, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shipment {
    /// Every sample, in shipping order.
    pub samples: Vec<ProfileSample>,
    /// The page's dropped-sample count at the last batch.
    pub dropped: u64,
    /// Samples the guest could not buffer, at the last batch.
    pub lost: u64,
    /// Batches received.
    pub batches: u64,
}

/// Decodes the batches `shipper` (a domain) shipped, in order. Errors name the first bad
/// batch: wrong magic, a sequence gap, or a length that disagrees with its count.
pub fn decode(shipper: u32, batches: &[Vec<u8>]) -> Result<Shipment, String> {
    let mut out = Shipment::default();
    for (i, bytes) in batches.iter().enumerate() {
        let bad = |what: String| format!("domain {shipper}, batch {i}: {what}");
        let (header, rest) = BatchHeader::read_from_prefix(bytes)
            .map_err(|_| bad("shorter than a header".into()))?;
        if header.magic != BATCH_MAGIC {
            return Err(bad(format!("magic {:#x}", header.magic)));
        }
        if header.sequence != i as u64 {
            return Err(bad(format!(
                "sequence {} (a batch was lost)",
                header.sequence
            )));
        }
        if header.count as usize > BATCH_CAPACITY
            || rest.len() != header.count as usize * SAMPLE_SIZE
        {
            return Err(bad(format!(
                "{} samples in {} bytes",
                header.count,
                rest.len()
            )));
        }
        for chunk in rest.chunks_exact(SAMPLE_SIZE) {
            let s = BatchSample::read_from_bytes(chunk).map_err(|_| bad("sample size".into()))?;
            out.samples.push(resolve(shipper, &s));
        }
        out.dropped = header.dropped;
        out.lost = header.lost;
        out.batches += 1;
    }
    Ok(out)
}

/// A page sample as the profile report sees it: `XENPMU_DOMID_SELF` is the shipper.
fn resolve(shipper: u32, s: &BatchSample) -> ProfileSample {
    let origin = match s.domain_id {
        XENPMU_DOMID_SELF => Origin::Domain(shipper),
        XENPMU_DOMID_HYPERVISOR => Origin::Hypervisor,
        d => Origin::Domain(d),
    };
    ProfileSample {
        origin,
        vcpu: s.vcpu_id,
        pcpu: s.pcpu_id,
        rip: s.regs.rip,
        user: u64::from(s.flags) & XENPMU_FLAG_SAMPLE_USER != 0,
        regs: s.regs,
        shipped_by: shipper,
    }
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
        };
        let mut b = header.as_bytes().to_vec();
        for s in samples {
            b.extend_from_slice(s.as_bytes());
        }
        b
    }

    fn sample(domain_id: u32, rip: u64, flags: u32) -> BatchSample {
        BatchSample {
            domain_id,
            vcpu_id: 0,
            pcpu_id: 0,
            flags,
            regs: Regs {
                rip,
                ..Regs::default()
            },
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
    }

    #[test]
    fn refuses_gaps_bad_magic_and_bad_lengths() {
        let b = batch(0, &[sample(1, 1, 0)]);
        assert!(
            decode(1, &[batch(1, &[])])
                .unwrap_err()
                .contains("sequence")
        );
        let mut m = b.clone();
        m[0] ^= 1;
        assert!(decode(1, &[m]).unwrap_err().contains("magic"));
        assert!(
            decode(1, &[b[..b.len() - 1].to_vec()])
                .unwrap_err()
                .contains("samples in")
        );
        assert!(decode(1, &[b[..10].to_vec()]).is_err());
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
    shipped: std::sync::atomic::AtomicU64,
}

impl BatchPort {
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
        let bad = |what: &str| format!("sample batch at {gpa:#x}: {what}");
        let header = access
            .memory
            .slice_mut(gpa, BATCH_HEADER)
            .ok_or_else(|| bad("outside guest memory"))?;
        let count = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if count > BATCH_CAPACITY {
            return Err(bad("more samples than a batch holds"));
        }
        let bytes = access
            .memory
            .slice_mut(gpa, BATCH_HEADER + count * SAMPLE_SIZE)
            .ok_or_else(|| bad("outside guest memory"))?
            .to_vec();
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
