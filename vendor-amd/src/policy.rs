//! Write legality: the one validator per register kind.
//!
//! Both a guest WRMSR ([`crate::AmdPmu`]'s `guest_write`) and a flush of a guest-edited
//! page (`context_from_page`) go through these functions and nothing else, so the two paths
//! cannot disagree about what a register may hold (Xen XSA-269: "it is not possible to have two
//! different pieces of code responsible for different parts of value checking").
//!
//! A refused value is a #GP on WRMSR and a `ContextError` at flush; it is never fixed up.

use vpmu::GuestPolicy;
use vpmu::abi::{XENPMU_REFUSED_FORBIDDEN, XENPMU_REFUSED_RESERVED, XENPMU_REFUSED_STATUS};

use crate::msrs::{COUNTER_MASK, ctl};

/// A value the register may not hold, with the reason a flush reports (a `XENPMU_REFUSED_*`
/// value, docs/abi.md "Error codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused(pub u32);

impl Refused {
    /// A reserved bit, or a bit of a counter the PMU does not have.
    pub const RESERVED: Refused = Refused(XENPMU_REFUSED_RESERVED);
    /// HostOnly for a guest that may not count in host context.
    pub const FORBIDDEN: Refused = Refused(XENPMU_REFUSED_FORBIDDEN);
    /// A status bit set that the hypervisor did not set.
    pub const STATUS: Refused = Refused(XENPMU_REFUSED_STATUS);
}

/// A legal PERF_CTL value in its two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// What the guest wrote and reads back.
    pub guest: u64,
    /// What goes to the hardware: GuestOnly forced on for a guest that may not count in host
    /// context, EN cleared for an event the filter denies.
    pub hardware: u64,
}

/// PERF_CTRn as a guest WRMSR sets it, and as a flush takes it from the shared page (one rule
/// for both): the low 48 counter bits are kept and the bits above dropped, never refused, as
/// AMD hardware and Linux KVM (`amd_pmu_set_msr` through `pmc_write_counter`) do. Guests rely
/// on it: kvm-unit-tests x86/pmu writes `-1` and `1 - count` as full 64-bit values, and a
/// profiler re-arms a counter in the page with a 64-bit `-period`.
pub fn counter(value: u64) -> u64 {
    value & COUNTER_MASK
}

/// [`counter`] over a whole bank at once (a flush), in place. `union` is every value or-ed
/// together: when it has no bit above the counter bits nothing changes (one test, the common
/// case). Returns whether a value changed.
#[inline]
pub fn page_counters<const N: usize>(values: &mut [u64; N], union: u64) -> bool {
    if union & !COUNTER_MASK == 0 {
        return false;
    }
    for value in values.iter_mut() {
        *value = counter(*value);
    }
    true
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
#[inline]
pub fn control(value: u64, policy: &GuestPolicy<'_>) -> Result<Control, Refused> {
    // A control that does nothing stays 0 on the hardware: a context that clears a control
    // leaves nothing programmed there.
    if value == 0 {
        return Ok(Control {
            guest: 0,
            hardware: 0,
        });
    }
    if value & ctl::RESERVED != 0 {
        return Err(Refused::RESERVED);
    }
    let mut hardware = value;
    if !policy.may_count_host {
        if value & ctl::HOST_ONLY != 0 {
            return Err(Refused::FORBIDDEN);
        }
        hardware |= ctl::GUEST_ONLY;
    }
    // Only a control that counts is put to the filter (which only ever clears EN).
    if value & ctl::EN != 0 && !policy.filter.allows(ctl::event(value)) {
        hardware &= !ctl::EN;
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
    control(value, policy).map_err(|_| {
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
        return Err(Refused::RESERVED);
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
        return Err(Refused::STATUS);
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
    fn page_counters_are_taken_as_writes_take_them() {
        let mut bank = [0xffff_ffff_ffff, 5, 0];
        assert!(!page_counters(&mut bank, 0xffff_ffff_ffff));
        assert_eq!(bank, [0xffff_ffff_ffff, 5, 0]);
        let mut bank = [1u64.wrapping_sub(10_000), 1 << 48, u64::MAX];
        let union = bank.iter().fold(0, |u, &v| u | v);
        assert!(page_counters(&mut bank, union));
        assert_eq!(bank, bank.map(counter));
        assert_eq!(bank, [(1 << 48) - 9_999, 0, 0xffff_ffff_ffff]);
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
        assert_eq!(
            control(INSTRUCTIONS | ctl::HOST_ONLY, &GUEST),
            Err(Refused::FORBIDDEN)
        );
        assert_eq!(
            control(INSTRUCTIONS | ctl::HOST_ONLY | ctl::GUEST_ONLY, &GUEST),
            Err(Refused::FORBIDDEN)
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

    /// A filter that counts the questions it is asked.
    struct Asked(core::cell::Cell<u32>);

    impl EventFilter for Asked {
        fn allows(&self, _event: RawEvent) -> bool {
            self.0.set(self.0.get() + 1);
            true
        }
        fn allows_fixed(&self, _index: u32) -> bool {
            self.0.set(self.0.get() + 1);
            true
        }
    }

    #[test]
    fn only_a_control_that_counts_is_put_to_the_filter() {
        let asked = Asked(core::cell::Cell::new(0));
        let policy = GuestPolicy {
            filter: &asked,
            ..GUEST
        };
        let disabled = INSTRUCTIONS & !ctl::EN;
        assert_eq!(
            control(disabled, &policy),
            Ok(Control {
                guest: disabled,
                hardware: disabled | ctl::GUEST_ONLY
            })
        );
        assert_eq!(control(0, &policy).map(|c| c.hardware), Ok(0));
        assert_eq!(
            asked.0.get(),
            0,
            "a control that cannot count was put to the filter"
        );
        assert!(control(INSTRUCTIONS, &policy).is_ok());
        assert_eq!(asked.0.get(), 1);
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
        assert_eq!(global_ctl(0b1000, 0b111), Err(Refused::RESERVED));
        assert_eq!(global_status_set(1 << 63, 0x3f), Err(Refused::RESERVED));
        assert_eq!(global_status_clear(u64::MAX, 0x3f), 0x3f);
        assert_eq!(global_status_from_page(0b01, 0b11), Ok(0b01));
        assert_eq!(global_status_from_page(0b100, 0b11), Err(Refused::STATUS));
    }
}
