//! What a guest may write: one validator per register kind, used by both the WRMSR path and
//! the shared-page flush path, so the two can never disagree (the XSA-269 lesson). Validators
//! reject; they never fix a value up. Where the per-domain event filter makes a legal value
//! not count, the validator returns the value to program into the hardware alongside.

use vpmu::abi::{
    XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY,
    XENPMU_REFUSED_EVENT, XENPMU_REFUSED_FORBIDDEN, XENPMU_REFUSED_RESERVED, XENPMU_REFUSED_WIDTH,
};
use vpmu::{CounterSet, GuestPolicy, RawEvent};

use crate::caps::IntelCaps;
use crate::events::{ARCH_ONLY_EVENTS, IPC_ONLY_EVENTS, umask_event};
use crate::msrs::{
    EVTSEL_ANY_THREAD, EVTSEL_EN, EVTSEL_PIN_CONTROL, FIXED_ANY_THREAD, FIXED_NIBBLE_BITS,
    FIXED_OS, FIXED_PMI, FIXED_USR, STATUS_COND_CHANGED, STATUS_OVF_BUFFER, at_fixed_nibble,
    fixed_nibble,
};

/// A guest value the policy refuses: the guest gets #GP (WRMSR) or the flush fails, and the
/// flush reports the reason, a `XENPMU_REFUSED_*` value (docs/abi.md, "Error codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused(pub u32);

impl Refused {
    /// A bit the register does not have: reserved, or naming an absent counter.
    pub const RESERVED: Refused = Refused(XENPMU_REFUSED_RESERVED);
    /// Counter bits above the counter's width.
    pub const WIDTH: Refused = Refused(XENPMU_REFUSED_WIDTH);
    /// A defined bit or value a guest may not use (AnyThread, PinControl, DS area, PEBS).
    pub const FORBIDDEN: Refused = Refused(XENPMU_REFUSED_FORBIDDEN);
    /// An event the IPC_ONLY/ARCH_ONLY feature does not allow.
    pub const EVENT: Refused = Refused(XENPMU_REFUSED_EVENT);
}

/// Bits of PERFEVTSELx a guest may set: the architectural low 32 bits without AnyThread
/// (cross-thread counting leaks the sibling's activity, Xen 9f5390441a) and Pin Control
/// (undefined, crashed Haswell/Broadwell hosts, Xen 8bf68dca65). Bits 63:32 (TSX qualifiers,
/// PEBS adaptive) are not virtualised.
pub const EVTSEL_GUEST_BITS: u64 = 0xffff_ffff & !EVTSEL_ANY_THREAD & !EVTSEL_PIN_CONTROL;

/// Bits of a FIXED_CTR_CTRL nibble a guest may set: OS, USR, PMI; not AnyThread.
pub const FIXED_GUEST_BITS: u64 = FIXED_OS | FIXED_USR | FIXED_PMI;

/// Bit 0 (OS) of every FIXED_CTR_CTRL nibble.
const NIBBLE_BIT0: u64 = 0x1111_1111_1111_1111;

/// The fixed counter that counts topdown slots, an event neither feature whitelist contains.
const TOPDOWN_SLOTS_FIXED: u32 = 3;

/// The guest's register rules for one enumerated PMU: every mask derived from the enumeration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRules {
    gp_value_mask: u64,
    /// IA32_A_PMCx exists (PERF_CAPABILITIES.FW_WRITE).
    full_width_writes: bool,
    fixed_value_mask: u64,
    fixed_counters: u32,
    fixed_ctrl_bits: u64,
    /// AnyThread of each present fixed counter: defined, but forbidden to guests.
    fixed_any_thread_bits: u64,
    global_ctrl_bits: u64,
    status_bits: u64,
    status_set_bits: u64,
    debug_store: bool,
}

#[inline]
fn restricted_events(features: u64) -> Option<&'static [u16]> {
    if features & (XENPMU_FEATURE_ARCH_ONLY | XENPMU_FEATURE_IPC_ONLY) == 0 {
        return None;
    }
    if features & XENPMU_FEATURE_ARCH_ONLY != 0 {
        Some(&ARCH_ONLY_EVENTS)
    } else if features & XENPMU_FEATURE_IPC_ONLY != 0 {
        Some(&IPC_ONLY_EVENTS)
    } else {
        None
    }
}

/// The bitmap of the indices of `values` that `refuses` refuses (a refused bank only).
#[cold]
#[inline(never)]
fn refused_indices<const N: usize>(values: &[u64; N], refuses: impl Fn(u64) -> bool) -> u32 {
    (0u32..)
        .zip(values)
        .filter(|&(_, &value)| refuses(value))
        .fold(0, |bits, (index, _)| bits | 1 << index)
}

fn is_canonical_48(address: u64) -> bool {
    (((address << 16) as i64) >> 16) as u64 == address
}

impl GuestRules {
    /// The rules for the PMU `caps` describes.
    pub fn new(caps: &IntelCaps) -> Self {
        let counters = caps.all_counters().0;
        let fixed_ctrl_bits = (0..u32::BITS)
            .filter(|&i| caps.has_fixed(i))
            .fold(0, |bits, i| bits | at_fixed_nibble(FIXED_GUEST_BITS, i));
        let fixed_any_thread_bits = (0..u32::BITS)
            .filter(|&i| caps.has_fixed(i))
            .fold(0, |bits, i| bits | at_fixed_nibble(FIXED_ANY_THREAD, i));
        GuestRules {
            gp_value_mask: caps.gp_value_mask(),
            full_width_writes: caps.full_width_writes(),
            fixed_value_mask: caps.fixed_value_mask(),
            fixed_counters: caps.fixed_counters(),
            fixed_ctrl_bits,
            fixed_any_thread_bits,
            global_ctrl_bits: counters,
            // Counter overflows plus OvfBuffer and CondChgd, as KVM and Xen allow; never the
            // uncore (61) or freeze bits, which would reach state the guest does not own.
            status_bits: counters | STATUS_OVF_BUFFER | STATUS_COND_CHANGED,
            status_set_bits: if caps.version() >= 4 {
                counters | STATUS_OVF_BUFFER
            } else {
                0
            },
            debug_store: caps.debug_store(),
        }
    }

    /// GLOBAL_STATUS bits the virtual status can hold; also what OVF_CTRL may clear.
    pub fn status_bits(&self) -> u64 {
        self.status_bits
    }

    /// PERFEVTSELx. Reserved or forbidden bits, or (under IPC_ONLY/ARCH_ONLY) an enabled
    /// event outside the whitelist, are refused. The features judge only enabled selectors: a
    /// disabled one cannot count, and guests clear selectors with arbitrary event bits.
    /// Returns the hardware value: EN cleared if the per-domain filter denies the event.
    #[inline]
    pub fn event_select(&self, value: u64, policy: &GuestPolicy<'_>) -> Result<u64, Refused> {
        if value & !EVTSEL_GUEST_BITS != 0 {
            return Err(
                if value & !(EVTSEL_GUEST_BITS | EVTSEL_ANY_THREAD | EVTSEL_PIN_CONTROL) != 0 {
                    Refused::RESERVED
                } else {
                    Refused::FORBIDDEN
                },
            );
        }
        if value & EVTSEL_EN == 0 {
            return Ok(value);
        }
        if let Some(allowed) = restricted_events(policy.features) {
            if !allowed.contains(&umask_event(value)) {
                return Err(Refused::EVENT);
            }
        }
        let event = RawEvent {
            select: (value & 0xff) as u16,
            umask: ((value >> 8) & 0xff) as u8,
        };
        if policy.filter.allows(event) {
            Ok(value)
        } else {
            Ok(value & !EVTSEL_EN)
        }
    }

    /// IA32_FIXED_CTR_CTRL. Nibbles of absent counters, AnyThread, and (under
    /// IPC_ONLY/ARCH_ONLY) enabling topdown slots are refused. Returns the hardware value: the
    /// OS/USR enables of counters the filter denies cleared.
    #[inline]
    pub fn fixed_ctrl(&self, value: u64, policy: &GuestPolicy<'_>) -> Result<u64, Refused> {
        let outside = value & !self.fixed_ctrl_bits;
        if outside != 0 {
            return Err(if outside & !self.fixed_any_thread_bits != 0 {
                Refused::RESERVED
            } else {
                Refused::FORBIDDEN
            });
        }
        let enables = FIXED_OS | FIXED_USR;
        if restricted_events(policy.features).is_some()
            && fixed_nibble(value, TOPDOWN_SLOTS_FIXED) & enables != 0
        {
            return Err(Refused::EVENT);
        }
        // Only the counters this value enables can be denied: the filter is asked about
        // those alone, walking the set bits of the enables (bit 4i: OS or USR of counter i;
        // the value holds nibbles of present counters only).
        let mut enabled = (value | value >> 1) & NIBBLE_BIT0;
        let mut denied = 0;
        while enabled != 0 {
            let index = enabled.trailing_zeros() / FIXED_NIBBLE_BITS;
            enabled &= enabled - 1;
            if !policy.filter.allows_fixed(index) {
                denied |= at_fixed_nibble(enables, index);
            }
        }
        Ok(value & !denied)
    }

    /// IA32_PERF_GLOBAL_CTRL: enable bits of present counters only.
    pub fn global_ctrl(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.global_ctrl_bits)
    }

    /// IA32_PERF_GLOBAL_OVF_CTRL: the bits the virtual status can hold.
    pub fn ovf_ctrl(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.status_bits)
    }

    /// The virtual IA32_PERF_GLOBAL_STATUS a context can hold (a restored snapshot's): the
    /// overflow bits of present counters and OvfBuffer, what a save folds in from the hardware
    /// and GLOBAL_STATUS_SET can set; never CondChgd, which nothing puts there (OVF_CTRL may
    /// clear it, as [`GuestRules::status_bits`] says, but clearing invents nothing).
    pub fn virtual_status(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.global_ctrl_bits | STATUS_OVF_BUFFER)
    }

    /// IA32_PERF_GLOBAL_STATUS_SET (v4+): counter bits and OvfBuffer.
    pub fn status_set(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.status_set_bits)
    }

    /// A general-purpose counter value written through IA32_A_PMCx: bits above the width are
    /// refused, as full-width writes #GP on hardware.
    pub fn full_width_counter(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.gp_value_mask)
            .map_err(|_| Refused::WIDTH)
    }

    /// A general-purpose counter value in the shared page, judged as the guest's WRMSR of the
    /// counter judges it, through whichever of its MSRs takes the value: with full-width
    /// writes a value within the width is taken whole, as IA32_A_PMCx takes it (and as the
    /// hypervisor publishes it); any other value, and every value on a PMU without full-width
    /// writes, as IA32_PMCx takes it ([`GuestRules::legacy_counter`]: bits 31:0 sign-extended,
    /// then masked to the width; that is also all such a PMU's hardware can be loaded with).
    /// So a 64-bit `-period` re-arms the counter exactly as `wrmsr(IA32_PMCx, -period)` does.
    /// Never refused, as IA32_PMCx never refuses.
    #[inline]
    pub fn page_counter(&self, value: u64) -> u64 {
        match self.full_width_counter(value) {
            Ok(value) if self.full_width_writes => value,
            _ => self.legacy_counter(value),
        }
    }

    /// [`GuestRules::page_counter`] over a whole bank at once (a flush), in place. `union` is
    /// every value or-ed together: with full-width writes and `union` within the width every
    /// value is taken whole (one test, the common case); otherwise each value is taken as the
    /// rule says. Returns whether a value changed.
    #[inline]
    pub fn page_counters<const N: usize>(&self, values: &mut [u64; N], union: u64) -> bool {
        if self.full_width_writes && self.full_width_counter(union).is_ok() {
            return false;
        }
        self.page_counters_slow(values)
    }

    #[cold]
    #[inline(never)]
    fn page_counters_slow<const N: usize>(&self, values: &mut [u64; N]) -> bool {
        let mut changed = false;
        for value in values {
            let taken = self.page_counter(*value);
            changed |= taken != *value;
            *value = taken;
        }
        changed
    }

    /// A value written through the legacy IA32_PMCx alias: bits 31:0 sign-extended, then
    /// masked to the width. Never refused.
    pub fn legacy_counter(&self, value: u64) -> u64 {
        (value as u32 as i32 as i64 as u64) & self.gp_value_mask
    }

    /// IA32_FIXED_CTRx, in a WRMSR and in the shared page alike: bits above the fixed width
    /// are refused (Xen), so a fixed counter is re-armed with `-period` masked to the width.
    pub fn fixed_counter(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.fixed_value_mask)
            .map_err(|_| Refused::WIDTH)
    }

    /// [`GuestRules::fixed_counter`] over a whole bank at once (a flush), with the slots of
    /// `absent` counters (that must hold 0) refused too: the lowest refused index. `union` is
    /// every value or-ed together (the caller's pass over the bank computes it). The rule is a
    /// mask, so the bank passes exactly when the union of its values does: the common case is
    /// one test, and only a refused bank is walked.
    #[inline]
    pub fn fixed_counters_within<const N: usize>(
        &self,
        values: &[u64; N],
        union: u64,
        absent: u32,
    ) -> Result<(), u32> {
        if absent == 0 && self.fixed_counter(union).is_ok() {
            return Ok(());
        }
        let refused = absent | refused_indices(values, |value| self.fixed_counter(value).is_err());
        match refused {
            0 => Ok(()),
            _ => Err(refused.trailing_zeros()),
        }
    }

    /// IA32_DS_AREA. 0 (the reset value, which enables nothing) is always accepted, so that a
    /// context the guest never gave a DS area verifies at flush under any feature set. Anything
    /// else needs `XENPMU_FEATURE_INTEL_BTS`, a CPU with the 64-bit debug store, no event
    /// restriction feature, and a canonical address (Xen 5d0683a4f5).
    pub fn ds_area(&self, value: u64, policy: &GuestPolicy<'_>) -> Result<u64, Refused> {
        if value == 0 {
            return Ok(0);
        }
        let bts = policy.features & XENPMU_FEATURE_INTEL_BTS != 0;
        let restricted = restricted_events(policy.features).is_some();
        if bts && !restricted && self.debug_store && is_canonical_48(value) {
            Ok(value)
        } else {
            Err(Refused::FORBIDDEN)
        }
    }

    /// IA32_PEBS_ENABLE: PEBS is not virtualised and its reserved bits are model specific, so
    /// only 0 is accepted (whitelist, Xen fb424bf6b5).
    pub fn pebs_enable(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, 0).map_err(|_| Refused::FORBIDDEN)
    }

    /// The counters a GLOBAL_STATUS value names (bits 62/63 dropped).
    pub fn status_counters(&self, status: u64) -> CounterSet {
        CounterSet(status & self.global_ctrl_bits)
    }

    fn within(&self, value: u64, allowed: u64) -> Result<u64, Refused> {
        if value & !allowed == 0 {
            Ok(value)
        } else {
            Err(Refused::RESERVED)
        }
    }
}
