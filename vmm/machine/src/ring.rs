//! Ring areas (ABI 1.4, docs/abi.md "The sample ring"): the guest frames a vCPU registered with
//! `XENPMU_OP_RING_INIT`, mapped for the core by `Platform::map_ring` and reached only through
//! `ring_read`/`ring_write`, which copy to and from guest memory the way the ABI's memory
//! ordering asks: an 8-byte access at an 8-aligned offset is one single-copy-atomic load or
//! store, and each call's writes are visible to the guest before the next call's (the core
//! writes the records, then the producer's line with `head`).
//!
//! Guest memory is shared with the vCPU threads, which write it at any time: like the rest of
//! the machine, nothing here holds a Rust reference into it, every access is a volatile copy
//! (`GuestMem`).

use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use vpmu::{MapError, RingSlot, VcpuId};

use crate::error::{MachineError, Result};
use crate::kvm::GuestMem;
use crate::personality::Personality;
use crate::runner::Runner;

/// How often a pCPU's thread runs the core's ring latency timer (`Vpmu::ring_poll`) for its
/// vCPUs: well under the rings' latency bounds (milliseconds), and under the ~0.5 ms the core
/// asks for. Between entries only, so a vCPU that runs without exits delays it to its next
/// exit: the timed source's slices (1 ms of CPU time) and kicks bound that.
pub(crate) const RING_POLL_EVERY: Duration = Duration::from_micros(250);

/// The vCPUs whose rings a pCPU's thread polls (those it runs), and when it polls next.
#[derive(Debug, Default)]
pub(crate) struct RingPoll {
    pub(crate) vcpus: Vec<VcpuId>,
    next: Option<Instant>,
}

impl<P: Personality> Runner<'_, P> {
    /// The core's latency timer for the rings of this pCPU's vCPUs, at most every
    /// `RING_POLL_EVERY` (cheap when no ring has records waiting: no clock read in the core).
    pub(crate) fn poll_rings(&mut self) -> Result<()> {
        let now = Instant::now();
        let Some(cpu) = self.cpu.as_mut() else {
            return Ok(());
        };
        // No ring anywhere (page mode, the conformance suite): no vCPU lock taken.
        if cpu.ring_poll.next.is_some_and(|next| now < next) || !self.shared.host.rings.any() {
            return Ok(());
        }
        cpu.ring_poll.next = Some(now + RING_POLL_EVERY);
        let vcpus = std::mem::take(&mut cpu.ring_poll.vcpus);
        let mut p = self.parts();
        let mut outcome = Ok(());
        for &vcpu in &vcpus {
            if let Err(error) = p
                .shared
                .vpmu
                .ring_poll(&mut p.platform, &p.shared.vcpus, vcpu)
            {
                outcome = Err(MachineError::Core {
                    call: "ring_poll",
                    error,
                });
                break;
            }
        }
        if let Some(cpu) = self.cpu.as_mut() {
            cpu.ring_poll.vcpus = vcpus;
        }
        outcome
    }
}

/// Bytes of a guest frame.
const FRAME: u64 = 4096;

/// Guest-physical windows of the x86 platform devices (IOAPIC, HPET, LAPIC: 0xFEC0_0000 up to
/// 4 GiB), which are never RAM: a ring over them would reach a device, not memory. The
/// machine's RAM lies below them today; the check keeps it so if RAM ever grows.
const MMIO_START: u64 = 0xFEC0_0000;
const MMIO_END: u64 = 1 << 32;

/// The most frames a ring area spans: the control page and `XENPMU_RING_MAX_DATA_PAGES` data
/// pages.
pub(crate) const MAX_RING_FRAMES: u32 = 1 + vpmu::abi::ring::XENPMU_RING_MAX_DATA_PAGES;

/// A mapped ring area as a table entry: `gfn << 16 | frames` (0: free). Frame numbers fit 32
/// bits (RAM is below 4 GiB) and `frames` at most `MAX_RING_FRAMES` (< 2^16).
fn entry(gfn: u64, frames: u32) -> Option<u64> {
    let gfn = u32::try_from(gfn).ok()?;
    (frames != 0 && frames <= MAX_RING_FRAMES && gfn != 0)
        .then(|| u64::from(gfn) << 16 | u64::from(frames))
}

/// The frames an entry maps: (first frame, count).
fn frames_of(entry: u64) -> (u64, u32) {
    (entry >> 16, (entry & 0xffff) as u32)
}

/// A slot names the domain and the table index: `domain << 32 | index`.
fn slot(domain: u32, index: usize) -> RingSlot {
    RingSlot(u64::from(domain) << 32 | index as u64)
}

fn slot_parts(slot: RingSlot) -> (u32, usize) {
    ((slot.0 >> 32) as u32, (slot.0 & 0xffff_ffff) as usize)
}

/// Whether `frames` frames from `gfn` are all RAM of `mem` and none of them a device window
/// (or frame 0, which no ring may use: the machine's descriptor tables live there).
pub(crate) fn ring_frames_valid(mem: &GuestMem, gfn: u64, frames: u32) -> bool {
    let Some(start) = gfn.checked_mul(FRAME) else {
        return false;
    };
    let Some(len) = u64::from(frames).checked_mul(FRAME) else {
        return false;
    };
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    gfn != 0
        && frames != 0
        && frames <= MAX_RING_FRAMES
        && usize::try_from(len).is_ok_and(|len| mem.contains(start, len))
        && (end <= MMIO_START || start >= MMIO_END)
}

/// The ring areas mapped for each domain: lock-free slots, two per vCPU (one registered ring,
/// and one mapping in flight while a `RING_INIT` is checked), as for the shared pages.
#[derive(Debug)]
pub(crate) struct RingTable {
    domains: Vec<Vec<AtomicU64>>,
}

impl RingTable {
    pub(crate) fn new(counts: &[u32]) -> Self {
        let slots = |n: u32| (0..2 * n.max(1)).map(|_| AtomicU64::new(0)).collect();
        Self {
            domains: counts.iter().map(|&n| slots(n)).collect(),
        }
    }

    /// Maps `frames` frames of `domain` from `gfn` (checked by the caller against its RAM).
    pub(crate) fn map(&self, domain: u32, gfn: u64, frames: u32) -> Result<RingSlot, MapError> {
        let entry = entry(gfn, frames).ok_or(MapError::InvalidFrame)?;
        let slots = self
            .domains
            .get(domain as usize)
            .ok_or(MapError::InvalidFrame)?;
        slots
            .iter()
            .position(|s| {
                s.compare_exchange(0, entry, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            })
            .map(|index| slot(domain, index))
            .ok_or(MapError::NoMemory)
    }

    /// Whether any domain has a ring area mapped (a few atomic loads).
    pub(crate) fn any(&self) -> bool {
        self.domains
            .iter()
            .flatten()
            .any(|s| s.load(Ordering::Acquire) != 0)
    }

    pub(crate) fn unmap(&self, slot: RingSlot) {
        let (domain, index) = slot_parts(slot);
        if let Some(s) = self.domains.get(domain as usize).and_then(|d| d.get(index)) {
            s.store(0, Ordering::Release);
        }
    }

    /// The domain and the guest-physical range (start, bytes) of a mapped slot.
    fn area(&self, slot: RingSlot) -> Option<(u32, u64, u64)> {
        let (domain, index) = slot_parts(slot);
        let entry = self
            .domains
            .get(domain as usize)?
            .get(index)?
            .load(Ordering::Acquire);
        if entry == 0 {
            return None;
        }
        let (gfn, frames) = frames_of(entry);
        Some((domain, gfn * FRAME, u64::from(frames) * FRAME))
    }

    /// The guest-physical address of `len` bytes at `offset` of the area behind `slot`, and its
    /// domain; None if the slot is not mapped or the range leaves the area.
    pub(crate) fn locate(&self, slot: RingSlot, offset: u32, len: usize) -> Option<(u32, u64)> {
        let (domain, start, size) = self.area(slot)?;
        let end = u64::from(offset).checked_add(u64::try_from(len).ok()?)?;
        (end <= size).then_some((domain, start + u64::from(offset)))
    }
}

/// Copies `out.len()` bytes at `gpa` into `out`: one single-copy-atomic load (acquire) for an
/// aligned 8-byte read (the consumer's `tail`), a volatile copy otherwise.
pub(crate) fn read(mem: &GuestMem, gpa: u64, out: &mut [u8]) -> bool {
    if out.len() == 8 && gpa % 8 == 0 {
        let Some(word) = mem.load_u64(gpa, Ordering::Acquire) else {
            return false;
        };
        out.copy_from_slice(&word.to_le_bytes());
        return true;
    }
    mem.read(gpa, out).is_ok()
}

/// Copies `data` to `gpa`, after every earlier write (a release fence: the guest that sees
/// these bytes sees the earlier calls' too), each whole aligned 8-byte word with one
/// single-copy-atomic store. Nothing is written if the range is not RAM.
pub(crate) fn write(mem: &GuestMem, gpa: u64, data: &[u8]) -> bool {
    if !mem.contains(gpa, data.len()) {
        return false;
    }
    fence(Ordering::Release);
    if gpa % 8 == 0 && data.len() % 8 == 0 {
        for (i, word) in data.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            // Inside RAM (checked above) and 8-aligned: cannot fail.
            if mem
                .store_u64(gpa + 8 * i as u64, u64::from_le_bytes(w), Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
        }
        return true;
    }
    mem.write(gpa, data).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMem {
        GuestMem::new(1 << 20).expect("memory")
    }

    #[test]
    fn frames_must_be_ram_and_not_frame_zero() {
        let m = mem();
        assert!(ring_frames_valid(&m, 1, 17));
        assert!(ring_frames_valid(&m, 255, 1));
        assert!(!ring_frames_valid(&m, 255, 2), "runs past the end of RAM");
        assert!(!ring_frames_valid(&m, 0, 2), "frame 0");
        assert!(!ring_frames_valid(&m, 1, 0), "no frames");
        assert!(!ring_frames_valid(&m, 1, MAX_RING_FRAMES + 1), "too many");
        assert!(!ring_frames_valid(&m, u64::MAX / 4096, 2), "overflows");
        assert!(!ring_frames_valid(&m, 0xFEE00, 1), "the LAPIC window");
    }

    #[test]
    fn slots_map_locate_and_unmap() {
        let t = RingTable::new(&[1, 2]);
        let a = t.map(1, 16, 5).expect("free slot");
        let b = t.map(1, 64, 2).expect("free slot");
        assert_ne!(a, b);
        assert_eq!(t.locate(a, 0, 8), Some((1, 16 * 4096)));
        assert_eq!(t.locate(a, 5 * 4096 - 8, 8), Some((1, 21 * 4096 - 8)));
        assert_eq!(t.locate(a, 5 * 4096 - 7, 8), None, "leaves the area");
        assert_eq!(t.locate(b, 4096, 4096), Some((1, 65 * 4096)));
        assert_eq!(t.locate(b, u32::MAX, 8), None);
        // Domain 1 has 2 vCPUs: 4 slots, then none.
        let c = t.map(1, 80, 1).expect("free slot");
        let d = t.map(1, 90, 1).expect("free slot");
        assert_eq!(t.map(1, 100, 1), Err(MapError::NoMemory));
        t.unmap(c);
        assert_eq!(t.locate(c, 0, 8), None, "unmapped");
        assert!(t.map(1, 100, 1).is_ok(), "the slot is free again");
        let _ = d;
        assert_eq!(t.map(7, 16, 1), Err(MapError::InvalidFrame), "no domain");
        assert_eq!(t.map(0, 0, 1), Err(MapError::InvalidFrame), "frame 0");
        assert_eq!(t.map(0, 1 << 32, 1), Err(MapError::InvalidFrame));
    }

    #[test]
    fn reads_and_writes_copy_guest_memory() {
        let m = mem();
        assert!(write(
            &m,
            0x2000,
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        ));
        let mut word = [0u8; 8];
        assert!(read(&m, 0x2008, &mut word));
        assert_eq!(word, [9, 10, 11, 12, 13, 14, 15, 16]);
        // Unaligned and odd sizes take the plain copy.
        assert!(write(&m, 0x3003, &[0xaa; 5]));
        let mut odd = [0u8; 7];
        assert!(read(&m, 0x3002, &mut odd));
        assert_eq!(odd, [0, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0]);
        assert!(!write(&m, (1 << 20) - 4, &[0; 8]), "past the end");
        assert!(!read(&m, (1 << 20) - 4, &mut word));
        assert_eq!(m.read_u64((1 << 20) - 8), Some(0), "nothing written");
    }

    #[test]
    fn an_aligned_word_is_never_seen_torn() {
        // A writer stores words whose halves are equal; a reader loads them with the 8-byte
        // read the core uses for `tail` and must never see two different halves.
        let m = std::sync::Arc::new(mem());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut torn = 0u64;
                let mut w = [0u8; 8];
                while !stop.load(Ordering::Relaxed) {
                    if read(&m, 0x4000, &mut w) && w[..4] != w[4..] {
                        torn += 1;
                    }
                }
                torn
            })
        };
        for i in 0..200_000u32 {
            let v = u64::from(i) << 32 | u64::from(i);
            assert!(write(&m, 0x4000, &v.to_le_bytes()));
        }
        stop.store(true, Ordering::Relaxed);
        assert_eq!(reader.join().expect("reader"), 0);
    }
}
