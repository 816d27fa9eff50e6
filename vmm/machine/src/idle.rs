//! vCPUs of a shared pCPU that do not need it now (`sched`): workload domains HELD until
//! the privileged domain starts them, and a Linux domain's vCPU IDLE in `hlt`.
//!
//! **Hold.** A mixed machine (`Machine::linux_with_images`) can hold its workload domains
//! (every domain but 0) while the Linux domain boots, so that the boot does not share the
//! pCPU with them: they are released when domain 0 first writes `port::START` (non-zero) or
//! `port::BATCH` (an `outl` or the MMIO port window), or ends, and held again when it
//! writes `port::START` with 0 (its sampling is over).
//!
//! **Idle.** With the in-kernel LAPIC, a guest's `hlt` blocks inside `KVM_RUN` until an
//! interrupt, or the VMM's kick at the end of the slice: on a shared pCPU every turn of an
//! idle Linux would be a slice lost in the kernel's wait. So after a slice of a Linux vCPU
//! that ended halted, the scheduler reads when its LAPIC timer fires (`KVM_GET_LAPIC`: the
//! LVT timer's mode and mask, the current count and divider; in TSC-deadline mode the
//! `IA32_TSC_DEADLINE` MSR against the guest's TSC) and passes its turns over while another
//! vCPU can run, until then, or until the vCPU is sent an interrupt by the VMM (the PMU VIRQ
//! or an LVTPC delivery wakes it as it wakes any vCPU: `Host::wake`). At that time the idle
//! vCPU runs next and the running one's slice is cut short to it, so the guest's timer
//! interrupt comes about as late as on a pCPU of its own; KVM delivers the timer that
//! expired while the vCPU was out of `KVM_RUN` at its next entry (the interrupt is pending in
//! its LAPIC), and the guest leaves `hlt`. An interrupt the LAPIC does not show in advance
//! (none of the machine's devices raises one while the vCPU is halted; the serial port's is
//! raised at the guest's own write) is looked for at least every [`IDLE_POLL`]. When no other
//! vCPU can run, the idle one is entered and KVM blocks it as usual.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::PRIVILEGED_DOMAIN;
use crate::personality::Personality;
use crate::runner::Runner;

/// The longest an idle vCPU's turns are passed over without a timer due (an interrupt the
/// LAPIC did not announce, a guest halted with interrupts off that the power-off check must
/// see).
pub(crate) const IDLE_POLL: Duration = Duration::from_millis(10);
/// How often a Linux vCPU's slice looks whether it halted, while another vCPU could run.
/// Each look is an exit of the vCPU: about 60 µs of a Linux vCPU's time on this host
/// (CPL0 emulated), so looks are made only while it idles (`sched`).
pub(crate) const HALT_CHECK: Duration = Duration::from_micros(200);
/// The shortest slice a vCPU gets when an idle vCPU's timer is about to fire.
pub(crate) const MIN_SLICE: Duration = Duration::from_micros(100);

/// LAPIC registers (offsets in the 1 KiB register page `KVM_GET_LAPIC` returns).
const APIC_IRR: usize = 0x200;
const APIC_LVTT: usize = 0x320;
const APIC_TMCCT: usize = 0x390;
const APIC_TDCR: usize = 0x3e0;
/// LVT mask bit; the timer's mode field (bits 17-18: one-shot, periodic, TSC-deadline).
const LVT_MASKED: u32 = 1 << 16;
const LVTT_MODE_SHIFT: u32 = 17;
const LVTT_TSC_DEADLINE: u32 = 2;
/// KVM's APIC bus cycle: 1 ns (its default; `KVM_CAP_X86_APIC_BUS_CYCLES_NS` would change
/// it, and the machine never sets it).
const APIC_BUS_CYCLE_NS: u64 = 1;
/// `IA32_TSC` and `IA32_TSC_DEADLINE`.
const MSR_TSC: u32 = 0x10;
const MSR_TSC_DEADLINE: u32 = 0x6e0;
/// RFLAGS.IF.
const RFLAGS_IF: u64 = 1 << 9;

/// Whether the workload domains are held (module docs).
#[derive(Debug, Default)]
pub(crate) struct Hold {
    held: AtomicBool,
}

impl Hold {
    /// Holds the workload domains until `release`.
    pub(crate) fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Whether `domain`'s vCPUs wait.
    pub(crate) fn holds(&self, domain: u32) -> bool {
        domain != PRIVILEGED_DOMAIN && self.held.load(Ordering::Acquire)
    }

    /// Lets the workload domains run.
    pub(crate) fn release(&self) {
        self.held.store(false, Ordering::Release);
    }
}

/// When a halted vCPU's LAPIC wakes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// An interrupt is already requested.
    Now,
    /// Its timer fires after this long.
    After(Duration),
    /// No timer is armed: only another interrupt wakes it.
    NoTimer,
}

fn word(regs: &[u8], at: usize) -> u32 {
    regs.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// Whether the LVT timer of the register page `regs` is in TSC-deadline mode (and unmasked).
pub(crate) fn tsc_deadline_mode(regs: &[u8]) -> bool {
    let lvtt = word(regs, APIC_LVTT);
    lvtt & LVT_MASKED == 0 && (lvtt >> LVTT_MODE_SHIFT) & 3 == LVTT_TSC_DEADLINE
}

/// When the LAPIC whose register page is `regs` wakes its halted vCPU: an interrupt
/// requested (IRR), else its timer: in TSC-deadline mode from `tsc` (the guest's TSC now and
/// the deadline, 0 = disarmed) at `tsc_khz`; in one-shot or periodic mode from the current
/// count and the divider.
pub(crate) fn lapic_wake(regs: &[u8], tsc: Option<(u64, u64)>, tsc_khz: u64) -> Wake {
    if (0..8).any(|i| word(regs, APIC_IRR + 0x10 * i) != 0) {
        return Wake::Now;
    }
    if word(regs, APIC_LVTT) & LVT_MASKED != 0 {
        return Wake::NoTimer;
    }
    if tsc_deadline_mode(regs) {
        return match tsc {
            Some((_, 0)) | None => Wake::NoTimer,
            Some((now, deadline)) if deadline <= now => Wake::Now,
            Some((now, deadline)) => {
                let ns = u128::from(deadline - now) * 1_000_000 / u128::from(tsc_khz.max(1));
                Wake::After(Duration::from_nanos(ns.min(u128::from(u64::MAX)) as u64))
            }
        };
    }
    let count = u64::from(word(regs, APIC_TMCCT));
    if count == 0 {
        return Wake::NoTimer;
    }
    // The divide configuration: bits 0, 1 and 3 give 2^(n + 1), 0b111 = 1.
    let tdcr = word(regs, APIC_TDCR);
    let n = ((tdcr & 3) | ((tdcr & 8) >> 1)) + 1;
    let divide = 1u64 << (n & 7);
    Wake::After(Duration::from_nanos(
        count
            .saturating_mul(divide)
            .saturating_mul(APIC_BUS_CYCLE_NS),
    ))
}

impl<P: Personality> Runner<'_, P> {
    /// After a slice: whether this vCPU is halted, and if so until when its turns can be
    /// passed over (module docs): None if its LAPIC cannot be read or its timer is due.
    pub(crate) fn idle_until(&self) -> (Option<Instant>, bool) {
        let halted = self
            .vcpu
            .fd
            .get_mp_state()
            .is_ok_and(|s| s.mp_state == kvm_bindings::KVM_MP_STATE_HALTED);
        if !halted {
            return (None, false);
        }
        (self.halted_until(), true)
    }

    /// `idle_until` of a halted vCPU.
    fn halted_until(&self) -> Option<Instant> {
        let now = Instant::now();
        if self.sync.regs.rflags & RFLAGS_IF == 0 {
            // Only an NMI would wake it (a powered-off guest): looked at now and then.
            return Some(now + IDLE_POLL);
        }
        let lapic = self.vcpu.fd.get_lapic().ok()?;
        let regs: Vec<u8> = lapic.regs.iter().map(|&b| b as u8).collect();
        let tsc = if tsc_deadline_mode(&regs) {
            let [now, deadline] = self.read_msrs([MSR_TSC, MSR_TSC_DEADLINE]).ok()?;
            Some((now, deadline))
        } else {
            None
        };
        match lapic_wake(&regs, tsc, self.tsc_khz) {
            Wake::Now => None,
            Wake::After(d) => Some(now + d.min(IDLE_POLL)),
            Wake::NoTimer => Some(now + IDLE_POLL),
        }
    }

    /// An `outl` of this vCPU to `port` with `value`: the privileged domain's START with a
    /// non-zero value or BATCH releases the held workload domains; its START with 0 holds
    /// them again (its sampling is over: what it still does alone, unloading its driver and
    /// shutting down, does not share the pCPU with them).
    pub(crate) fn release_on(&self, port: u16, value: u32) {
        use vpmu_guest_protocol::port::{BATCH, START};
        if self.me.domain != PRIVILEGED_DOMAIN {
            return;
        }
        match (port, value) {
            (START, 0) => self.shared.hold.hold(),
            (START, _) | (BATCH, _) => self.shared.hold.release(),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(set: &[(usize, u32)]) -> Vec<u8> {
        let mut regs = vec![0u8; 1024];
        for &(at, v) in set {
            regs[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        regs
    }

    #[test]
    fn the_lapic_timer_says_when_a_halted_vcpu_wakes() {
        // One-shot, vector 0xec, count 1,000,000 divided by 16 (TDCR 0b0011): 16 ms.
        let oneshot = page(&[(APIC_LVTT, 0xec), (APIC_TMCCT, 1_000_000), (APIC_TDCR, 3)]);
        assert_eq!(
            lapic_wake(&oneshot, None, 2_000_000),
            Wake::After(Duration::from_millis(16))
        );
        // Divide by 1 (0b1011), periodic mode.
        let periodic = page(&[
            (APIC_LVTT, 1 << 17 | 0xec),
            (APIC_TMCCT, 5000),
            (APIC_TDCR, 0b1011),
        ]);
        assert_eq!(
            lapic_wake(&periodic, None, 2_000_000),
            Wake::After(Duration::from_micros(5))
        );
        // Masked, or a count run out: no timer.
        let masked = page(&[(APIC_LVTT, LVT_MASKED | 0xec), (APIC_TMCCT, 5000)]);
        assert_eq!(lapic_wake(&masked, None, 2_000_000), Wake::NoTimer);
        assert_eq!(
            lapic_wake(&page(&[(APIC_LVTT, 0xec)]), None, 2_000_000),
            Wake::NoTimer
        );
        // TSC-deadline at 2 GHz: 3 M ticks ahead is 1.5 ms; passed is now; 0 is disarmed.
        let deadline = page(&[(APIC_LVTT, 2 << 17 | 0xec)]);
        assert!(tsc_deadline_mode(&deadline));
        assert_eq!(
            lapic_wake(&deadline, Some((1_000, 3_001_000)), 2_000_000),
            Wake::After(Duration::from_micros(1500))
        );
        assert_eq!(
            lapic_wake(&deadline, Some((5_000, 4_000)), 2_000_000),
            Wake::Now
        );
        assert_eq!(
            lapic_wake(&deadline, Some((5_000, 0)), 2_000_000),
            Wake::NoTimer
        );
        // A requested interrupt wakes it whatever the timer says.
        let pending = page(&[(APIC_LVTT, LVT_MASKED), (APIC_IRR + 0x70, 1 << 3)]);
        assert_eq!(lapic_wake(&pending, None, 2_000_000), Wake::Now);
    }

    #[test]
    fn only_workload_domains_are_held_until_released() {
        let hold = Hold::default();
        assert!(!hold.holds(1));
        hold.hold();
        assert!(hold.holds(1) && hold.holds(7));
        assert!(!hold.holds(PRIVILEGED_DOMAIN));
        hold.release();
        assert!(!hold.holds(1));
    }
}
