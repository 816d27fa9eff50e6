//! How long a vCPU was halted inside `KVM_RUN`: with the in-kernel LAPIC, a guest's `hlt`
//! blocks inside the ioctl until an interrupt (or the VMM's kick), so the time `KVM_RUN`
//! lasted is not the time the vCPU ran. KVM's binary statistics of the vCPU
//! (`KVM_GET_STATS_FD`, Linux 5.14+) count the time it spent halted, polling
//! (`halt_poll_success_ns`, `halt_poll_fail_ns`) and waiting (`halt_wait_ns`); the timed
//! event source takes their growth over a run off the cycles it feeds, because unhalted-cycles
//! counters count nothing while the core is halted.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

use kvm_ioctls::VcpuFd;

/// `KVM_GET_STATS_FD`: `_IO(KVMIO, 0xce)`.
const KVM_GET_STATS_FD: libc::c_ulong = 0xae_ce;

/// The statistics that add up to the time a vCPU was halted.
const HALTED: [&str; 3] = ["halt_poll_success_ns", "halt_poll_fail_ns", "halt_wait_ns"];

/// `KVM_STATS_TYPE_CUMULATIVE`, `KVM_STATS_UNIT_SECONDS`, `KVM_STATS_BASE_POW10`, the masks
/// of those fields of a descriptor's flags.
const TYPE_MASK: u32 = 0xf;
const TYPE_CUMULATIVE: u32 = 0;
const UNIT_MASK: u32 = 0xf << 4;
const UNIT_SECONDS: u32 = 2 << 4;
const BASE_MASK: u32 = 0xf << 8;
const BASE_POW10: u32 = 0;

/// The halted-time clock of one vCPU: its statistics file and where the counters are in it.
#[derive(Debug)]
pub(crate) struct HaltClock {
    file: File,
    /// The file offset of the span holding every counter of `HALTED`.
    start: u64,
    /// Each counter's offset inside the span.
    offsets: [usize; 3],
    span: Vec<u8>,
    /// The halted time at the last reading.
    seen: u64,
}

/// Where `names` are in a stats file's descriptors (`desc` is the descriptor block, each
/// descriptor `16 + name_size` bytes: flags, exponent, size, offset, bucket size, name), given
/// as (offset in the data block); None if one is missing or not a cumulative count of
/// nanoseconds.
fn find(desc: &[u8], count: usize, name_size: usize, names: &[&str; 3]) -> Option<[u64; 3]> {
    let size = 16 + name_size;
    let mut found = [None; 3];
    for d in desc.chunks_exact(size).take(count) {
        let word = |i: usize| u32::from_le_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
        let flags = word(0);
        let exponent = i16::from_le_bytes([d[4], d[5]]);
        let len = u16::from_le_bytes([d[6], d[7]]);
        let offset = word(8);
        let name = &d[16..];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        let Some(i) = names.iter().position(|n| n.as_bytes() == name) else {
            continue;
        };
        let nanoseconds = flags & TYPE_MASK == TYPE_CUMULATIVE
            && flags & UNIT_MASK == UNIT_SECONDS
            && flags & BASE_MASK == BASE_POW10
            && exponent == -9
            && len == 1;
        if nanoseconds {
            found[i] = Some(u64::from(offset));
        }
    }
    Some([found[0]?, found[1]?, found[2]?])
}

/// A vCPU's binary statistics file, with its descriptors read.
struct StatsFile {
    file: File,
    desc: Vec<u8>,
    count: usize,
    name_size: usize,
    data_offset: u64,
}

impl StatsFile {
    fn open(vcpu: &VcpuFd) -> Option<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(vcpu.as_raw_fd(), KVM_GET_STATS_FD as _) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is a new file descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut header = [0u8; 24];
        file.read_exact_at(&mut header, 0).ok()?;
        let word = |i: usize| {
            u32::from_le_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]) as usize
        };
        let (name_size, count, desc_offset, data_offset) = (word(4), word(8), word(16), word(20));
        let mut desc = vec![0u8; count.checked_mul(16 + name_size)?.min(1 << 20)];
        file.read_exact_at(&mut desc, desc_offset as u64).ok()?;
        Some(Self {
            file,
            desc,
            count,
            name_size,
            data_offset: data_offset as u64,
        })
    }
}

/// How many instructions KVM's emulator ran for a vCPU (`insn_emulation`): on this host the
/// guest's CPL0 code is emulated and its CPL3 code runs natively, so the count's growth over a
/// `KVM_RUN` tells how much of it was kernel (the timed source splits a run's time by it).
#[derive(Debug)]
pub(crate) struct EmulationCount {
    file: File,
    at: u64,
    seen: u64,
}

impl EmulationCount {
    /// The count of `vcpu`, or None where KVM has no such statistic.
    pub(crate) fn new(vcpu: &VcpuFd) -> Option<Self> {
        let stats = StatsFile::open(vcpu)?;
        let size = 16 + stats.name_size;
        let offset = stats
            .desc
            .chunks_exact(size)
            .take(stats.count)
            .find_map(|d| {
                let name = &d[16..];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                let flags = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                let len = u16::from_le_bytes([d[6], d[7]]);
                (name == b"insn_emulation" && flags & TYPE_MASK == TYPE_CUMULATIVE && len == 1)
                    .then(|| u64::from(u32::from_le_bytes([d[8], d[9], d[10], d[11]])))
            })?;
        let mut count = Self {
            file: stats.file,
            at: stats.data_offset + offset,
            seen: 0,
        };
        count.seen = count.read()?;
        Some(count)
    }

    fn read(&self) -> Option<u64> {
        let mut b = [0u8; 8];
        self.file.read_exact_at(&mut b, self.at).ok()?;
        Some(u64::from_le_bytes(b))
    }

    /// Instructions emulated since the last call (0 if the statistics cannot be read).
    pub(crate) fn since(&mut self) -> u64 {
        let Some(now) = self.read() else {
            return 0;
        };
        let grown = now.saturating_sub(self.seen);
        self.seen = now;
        grown
    }
}

impl HaltClock {
    /// The clock of `vcpu`, or None where KVM has no binary statistics (or not these).
    pub(crate) fn new(vcpu: &VcpuFd) -> Option<Self> {
        let StatsFile {
            file,
            desc,
            count,
            name_size,
            data_offset,
        } = StatsFile::open(vcpu)?;
        let at = find(&desc, count, name_size, &HALTED)?;
        let first = *at.iter().min()?;
        let last = *at.iter().max()?;
        if last - first > 4096 {
            return None;
        }
        let mut clock = Self {
            file,
            start: data_offset + first,
            offsets: at.map(|o| (o - first) as usize),
            span: vec![0u8; (last - first) as usize + 8],
            seen: 0,
        };
        clock.seen = clock.halted_ns()?;
        Some(clock)
    }

    /// Nanoseconds the vCPU was halted since the last call (or since the clock was made);
    /// zero if the statistics cannot be read.
    pub(crate) fn halted_since(&mut self) -> u64 {
        let Some(now) = self.halted_ns() else {
            return 0;
        };
        let halted = now.saturating_sub(self.seen);
        self.seen = now;
        halted
    }

    /// The vCPU's halted time so far, nanoseconds.
    pub(crate) fn halted_ns(&mut self) -> Option<u64> {
        self.file.read_exact_at(&mut self.span, self.start).ok()?;
        let value = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&self.span[o..o + 8]);
            u64::from_le_bytes(b)
        };
        Some(self.offsets.iter().map(|&o| value(o)).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(name: &str, flags: u32, exponent: i16, offset: u32, name_size: usize) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend(flags.to_le_bytes());
        d.extend(exponent.to_le_bytes());
        d.extend(1u16.to_le_bytes());
        d.extend(offset.to_le_bytes());
        d.extend(0u32.to_le_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(name_size, 0);
        d.extend(n);
        d
    }

    #[test]
    fn finds_the_halt_counters_and_refuses_other_units() {
        let ns = UNIT_SECONDS | TYPE_CUMULATIVE;
        let mut desc = Vec::new();
        desc.extend(descriptor("halt_exits", 0, 0, 0, 48));
        desc.extend(descriptor("halt_poll_success_ns", ns, -9, 32, 48));
        desc.extend(descriptor("halt_poll_fail_ns", ns, -9, 40, 48));
        desc.extend(descriptor("halt_wait_ns", ns, -9, 48, 48));
        assert_eq!(find(&desc, 4, 48, &HALTED), Some([32, 40, 48]));
        // One missing: none.
        assert_eq!(find(&desc, 3, 48, &HALTED), None);
        // Microseconds are not nanoseconds.
        let mut other = desc.clone();
        other.truncate(3 * 64);
        other.extend(descriptor("halt_wait_ns", ns, -6, 48, 48));
        assert_eq!(find(&other, 4, 48, &HALTED), None);
    }

    #[test]
    fn a_new_vcpu_has_a_halt_clock_at_zero() {
        let Ok(kvm) = crate::kvm::usable() else {
            eprintln!("SKIPPED: /dev/kvm not available (halt clock test)");
            println!("SKIPPED: /dev/kvm not available (halt clock test)");
            return;
        };
        let vm = kvm.create_vm().expect("VM");
        let vcpu = vm.create_vcpu(0).expect("vCPU");
        let Some(mut clock) = HaltClock::new(&vcpu) else {
            eprintln!("SKIPPED: this KVM has no halt statistics (halt clock test)");
            println!("SKIPPED: this KVM has no halt statistics (halt clock test)");
            return;
        };
        assert_eq!(clock.halted_ns(), Some(0));
        assert_eq!(clock.halted_since(), 0);
    }
}
