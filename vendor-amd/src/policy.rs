//! Write legality: the one validator per register kind.
//!
//! Both a guest WRMSR ([`crate::AmdPmu`]'s `guest_write`) and a flush of a guest-edited
//! page (`context_from_page`) go through these functions and nothing else, so the two paths
//! cannot disagree about what a register may hold (Xen XSA-269: "it is not possible to have two
//! different pieces of code responsible for different parts of value checking").
//!
//! A refused value is a #GP on WRMSR and a `ContextError` at flush; it is never fixed up.

use vpmu::GuestPolicy;

use crate::msrs::{COUNTER_MASK, ctl};

/// A value the register may not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

/// A legal PERF_CTL value in its two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// What the guest wrote and reads back.
    pub guest: u64,
    /// What goes to the hardware: GuestOnly forced on for a guest that may not count in host
    /// context, EN cleared for an event the filter denies.
    pub hardware: u64,
}

/// PERF_CTRn as a guest WRMSR sets it: the low 48 counter bits are kept and the bits above
/// dropped, as AMD hardware and Linux KVM (`amd_pmu_set_msr` through `pmc_write_counter`) do.
/// Guests rely on it: kvm-unit-tests x86/pmu writes `-1` and `1 - count` as full 64-bit values.
pub fn counter(value: u64) -> u64 {
    value & COUNTER_MASK
}

/// PERF_CTRn as a shared page carries it: the hypervisor only ever writes 48-bit values there,
/// so bits above them are corruption of the page, refused rather than silently dropped.
pub fn page_counter(value: u64) -> Result<u64, Refused> {
    if value & !COUNTER_MASK != 0 {
        return Err(Refused);
    }
    Ok(value)
}

/// [`page_counter`] over a whole bank at once (a flush): the bitmap of the values it refuses.
/// `union` is every value or-ed together (the caller's pass over the bank computes it). The
/// rule is a mask, so the bank passes exactly when the union of its values does: the common
/// case is one test, and only a refused bank is walked.
pub fn page_counters_within<const N: usize>(values: &[u64; N], union: u64) -> u32 {
    if page_counter(union).is_ok() {
        return 0;
    }
    refused_counters(values)
}

#[cold]
#[inline(never)]
fn refused_counters<const N: usize>(values: &[u64; N]) -> u32 {
    (0u32..)
        .zip(values)
        .filter(|&(_, &value)| page_counter(value).is_err())
        .fold(0, |bits, (index, _)| bits | 1 << index)
}

/// PERF_CTLn under `policy`.
///
/// * Reserved bits ([`ctl::RESERVED`]) are refused.
/// * HostOnly is refused unless `policy.may_count_host`: a guest may not count while the
///   hypervisor runs. Without host counting the hardware value always carries GuestOnly (so
///   even a guest that wrote neither bit stops counting at VM exit); with it the value goes to
///   the hardware as written.
/// * An event the filter denies is programmed with EN clear; the guest still reads back EN.
/// * `XENPMU_FEATURE_*` are Intel features (IPC_ONLY/ARCH_ONLY whitelist Intel architectural
///   encodings, BTS is Intel's) and do not restrict AMD controls.
pub fn control(value: u64, policy: &GuestPolicy<'_>) -> Result<Control, Refused> {
    if value & ctl::RESERVED != 0 {
        return Err(Refused);
    }
    if value & ctl::HOST_ONLY != 0 && !policy.may_count_host {
        return Err(Refused);
    }
    let mut hardware = value;
    if !policy.may_count_host {
        hardware |= ctl::GUEST_ONLY;
    }
    if !policy.filter.allows(ctl::event(value)) {
        hardware &= !ctl::EN;
    }
    // A control that does nothing stays 0 on the hardware: a context that clears a control
    // leaves nothing programmed there.
    if value == 0 {
        hardware = 0;
    }
    Ok(Control {
        guest: value,
        hardware,
    })
}

/// PERF_CTLn re-judged under `policy`, for a control that was accepted under an earlier policy
/// (a saved context after a policy change, or a page control the guest left as published).
///
/// `Ok` is [`control`]'s answer when it still accepts the value. When it refuses it, `Err`
/// holds the guest value unchanged with a hardware image that cannot count: the value without
/// reserved bits and HostOnly, judged again (so GuestOnly is forced and the filter applied as
/// for any control), with EN cleared. Depends only on `value` and `policy`, so applying it
/// again gives the same image.
pub fn restricted_control(value: u64, policy: &GuestPolicy<'_>) -> Result<Control, Control> {
    control(value, policy).map_err(|Refused| {
        // Without reserved bits and HostOnly nothing in `control` refuses.
        let hardware = control(value & !(ctl::RESERVED | ctl::HOST_ONLY), policy)
            .map_or(0, |legal| legal.hardware & !ctl::EN);
        Control {
            guest: value,
            hardware,
        }
    })
}

/// PerfCntrGlobalCtl: enable bits of existing counters only (`present` is the counter mask).
/// KVM drops the other bits; refusing them is the same fail-closed rule as for PERF_CTL.
pub fn global_ctl(value: u64, present: u64) -> Result<u64, Refused> {
    if value & !present != 0 {
        return Err(Refused);
    }
    Ok(value)
}

/// PerfCntrGlobalStatusSet: status bits of existing counters only.
pub fn global_status_set(value: u64, present: u64) -> Result<u64, Refused> {
    global_ctl(value, present)
}

/// PerfCntrGlobalStatusClr: every value is accepted and only the bits of existing counters act.
///
/// This is the one exception to refusing undefined bits, and it is forced: Linux's PerfMonV2
/// PMI handler acknowledges with `wrmsrl(GLOBAL_STATUS_CLR, ~status)`, i.e. with every bit set,
/// and AMD documents that writes to the other bits are ignored. Clearing can only lose the
/// guest's own status, so accepting extra bits gives the guest nothing.
pub fn global_status_clear(value: u64, present: u64) -> u64 {
    value & present
}

/// PerfCntrGlobalStatus from a guest-edited page: the guest may acknowledge (clear) bits of
/// the status it was shown, never raise new ones.
pub fn global_status_from_page(value: u64, shown: u64) -> Result<u64, Refused> {
    if value & !shown != 0 {
        return Err(Refused);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use vpmu::{AllowAll, EventFilter, RawEvent};

    use super::*;

    struct Deny(u16);

    impl EventFilter for Deny {
        fn allows(&self, event: RawEvent) -> bool {
            event.select != self.0
        }
        fn allows_fixed(&self, _index: u32) -> bool {
            true
        }
    }

    const GUEST: GuestPolicy<'static> = GuestPolicy::guest_default();
    const HOST: GuestPolicy<'static> = GuestPolicy {
        features: 0,
        filter: &AllowAll,
        may_count_host: true,
    };
    const INSTRUCTIONS: u64 = ctl::EN | ctl::OS | ctl::USR | 0xc0;

    #[test]
    fn counter_writes_keep_48_bits() {
        assert_eq!(counter(0xffff_ffff_ffff), 0xffff_ffff_ffff);
        assert_eq!(counter(0), 0);
        assert_eq!(counter(1 << 48), 0);
        assert_eq!(counter(u64::MAX), 0xffff_ffff_ffff);
        assert_eq!(counter(1u64.wrapping_sub(10_000)), (1 << 48) - 9_999);
    }

    #[test]
    fn page_counters_hold_48_bits() {
        assert_eq!(page_counter(0xffff_ffff_ffff), Ok(0xffff_ffff_ffff));
        assert_eq!(page_counter(1 << 48), Err(Refused));
        assert_eq!(page_counter(u64::MAX), Err(Refused));
    }

    #[test]
    fn every_reserved_bit_is_refused_alone() {
        for bit in 0..64 {
            let value = INSTRUCTIONS | (1 << bit);
            let refused = ctl::RESERVED & (1 << bit) != 0;
            assert_eq!(control(value, &HOST).is_err(), refused, "bit {bit}");
        }
    }

    #[test]
    fn guest_only_is_forced_and_host_only_refused_without_host_counting() {
        let c = control(INSTRUCTIONS, &GUEST).unwrap();
        assert_eq!(c.guest, INSTRUCTIONS);
        assert_eq!(c.hardware, INSTRUCTIONS | ctl::GUEST_ONLY);
        let both = INSTRUCTIONS | ctl::GUEST_ONLY;
        assert_eq!(control(both, &GUEST).unwrap().hardware, both);
        assert_eq!(control(INSTRUCTIONS | ctl::HOST_ONLY, &GUEST), Err(Refused));
        assert_eq!(
            control(INSTRUCTIONS | ctl::HOST_ONLY | ctl::GUEST_ONLY, &GUEST),
            Err(Refused)
        );
    }

    #[test]
    fn host_counting_guest_writes_go_through_unchanged() {
        for extra in [
            0,
            ctl::HOST_ONLY,
            ctl::GUEST_ONLY,
            ctl::HOST_ONLY | ctl::GUEST_ONLY,
        ] {
            let value = INSTRUCTIONS | extra;
            assert_eq!(
                control(value, &HOST),
                Ok(Control {
                    guest: value,
                    hardware: value
                })
            );
        }
    }

    #[test]
    fn denied_events_lose_en_on_the_hardware_only() {
        let deny = Deny(0xc0);
        let policy = GuestPolicy {
            filter: &deny,
            ..GUEST
        };
        let c = control(INSTRUCTIONS, &policy).unwrap();
        assert_eq!(c.guest, INSTRUCTIONS);
        assert_eq!(c.hardware, (INSTRUCTIONS | ctl::GUEST_ONLY) & !ctl::EN);
        // The filter sees the 12-bit select: 0x1c0 is another event.
        let high = INSTRUCTIONS | (1 << 32);
        assert_eq!(control(high, &policy).unwrap().hardware & ctl::EN, ctl::EN);
    }

    #[test]
    fn restricted_controls_keep_the_guest_value_and_cannot_count() {
        let host_only = INSTRUCTIONS | ctl::HOST_ONLY;
        assert_eq!(
            restricted_control(host_only, &HOST),
            Ok(Control {
                guest: host_only,
                hardware: host_only
            })
        );
        let restricted = restricted_control(host_only, &GUEST);
        assert_eq!(
            restricted,
            Err(Control {
                guest: host_only,
                hardware: (INSTRUCTIONS | ctl::GUEST_ONLY) & !ctl::EN
            })
        );
        let again = restricted_control(host_only, &GUEST);
        assert_eq!(again, restricted, "idempotent");
        assert_eq!(
            restricted_control(INSTRUCTIONS, &GUEST),
            Ok(control(INSTRUCTIONS, &GUEST).unwrap())
        );
        // Only HostOnly: nothing left to program.
        let bare = restricted_control(ctl::HOST_ONLY, &GUEST);
        assert_eq!(bare.map_err(|c| c.hardware), Err(0));
    }

    #[test]
    fn a_zero_control_stays_zero_on_the_hardware() {
        assert_eq!(
            control(0, &GUEST),
            Ok(Control {
                guest: 0,
                hardware: 0
            })
        );
    }

    #[test]
    fn intel_features_do_not_restrict_amd_controls() {
        let policy = GuestPolicy {
            features: vpmu::abi::XENPMU_FEATURE_MASK,
            ..GUEST
        };
        // 0x76 (cycles) is no Intel architectural encoding; still fine on AMD.
        let value = ctl::EN | ctl::OS | 0x76;
        assert_eq!(
            control(value, &policy).unwrap().hardware,
            value | ctl::GUEST_ONLY
        );
    }

    #[test]
    fn global_registers_hold_counter_bits_only() {
        assert_eq!(global_ctl(0b111, 0b111), Ok(0b111));
        assert_eq!(global_ctl(0b1000, 0b111), Err(Refused));
        assert_eq!(global_status_set(1 << 63, 0x3f), Err(Refused));
        assert_eq!(global_status_clear(u64::MAX, 0x3f), 0x3f);
        assert_eq!(global_status_from_page(0b01, 0b11), Ok(0b01));
        assert_eq!(global_status_from_page(0b100, 0b11), Err(Refused));
    }
}
