//! What a guest may write: one validator per register kind, used by both the WRMSR path and
//! the shared-page flush path, so the two can never disagree (the XSA-269 lesson). Validators
//! reject; they never fix a value up. Where the per-domain event filter makes a legal value
//! not count, the validator returns the value to program into the hardware alongside.

use vpmu::abi::{XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY};
use vpmu::{CounterSet, GuestPolicy, RawEvent};

use crate::caps::IntelCaps;
use crate::events::{ARCH_ONLY_EVENTS, IPC_ONLY_EVENTS, umask_event};
use crate::msrs::{
    EVTSEL_ANY_THREAD, EVTSEL_EN, EVTSEL_PIN_CONTROL, FIXED_OS, FIXED_PMI, FIXED_USR,
    STATUS_COND_CHANGED, STATUS_OVF_BUFFER, at_fixed_nibble, fixed_nibble,
};

/// A guest value the policy refuses: the guest gets #GP (WRMSR) or the flush fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

/// Bits of PERFEVTSELx a guest may set: the architectural low 32 bits without AnyThread
/// (cross-thread counting leaks the sibling's activity, Xen 9f5390441a) and Pin Control
/// (undefined, crashed Haswell/Broadwell hosts, Xen 8bf68dca65). Bits 63:32 (TSX qualifiers,
/// PEBS adaptive) are not virtualised.
pub const EVTSEL_GUEST_BITS: u64 = 0xffff_ffff & !EVTSEL_ANY_THREAD & !EVTSEL_PIN_CONTROL;

/// Bits of a FIXED_CTR_CTRL nibble a guest may set: OS, USR, PMI; not AnyThread.
pub const FIXED_GUEST_BITS: u64 = FIXED_OS | FIXED_USR | FIXED_PMI;

/// The fixed counter that counts topdown slots, an event neither feature whitelist contains.
const TOPDOWN_SLOTS_FIXED: u32 = 3;

/// The guest's register rules for one enumerated PMU: every mask derived from the enumeration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestRules {
    gp_value_mask: u64,
    fixed_value_mask: u64,
    fixed_counters: u32,
    fixed_ctrl_bits: u64,
    global_ctrl_bits: u64,
    status_bits: u64,
    status_set_bits: u64,
    debug_store: bool,
}

fn restricted_events(features: u64) -> Option<&'static [u16]> {
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
        GuestRules {
            gp_value_mask: caps.gp_value_mask(),
            fixed_value_mask: caps.fixed_value_mask(),
            fixed_counters: caps.fixed_counters(),
            fixed_ctrl_bits,
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
    pub fn event_select(&self, value: u64, policy: &GuestPolicy<'_>) -> Result<u64, Refused> {
        if value & !EVTSEL_GUEST_BITS != 0 {
            return Err(Refused);
        }
        if value & EVTSEL_EN == 0 {
            return Ok(value);
        }
        if let Some(allowed) = restricted_events(policy.features) {
            if !allowed.contains(&umask_event(value)) {
                return Err(Refused);
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
    pub fn fixed_ctrl(&self, value: u64, policy: &GuestPolicy<'_>) -> Result<u64, Refused> {
        if value & !self.fixed_ctrl_bits != 0 {
            return Err(Refused);
        }
        let enables = FIXED_OS | FIXED_USR;
        if restricted_events(policy.features).is_some()
            && fixed_nibble(value, TOPDOWN_SLOTS_FIXED) & enables != 0
        {
            return Err(Refused);
        }
        // Only the counters this value enables can be denied: the filter is asked about
        // those alone, walking the set bits (a flush re-judges every nibble of the page).
        let mut candidates = self.fixed_counters;
        let mut denied = 0;
        while candidates != 0 {
            let index = candidates.trailing_zeros();
            candidates &= candidates - 1;
            if fixed_nibble(value, index) & enables != 0 && !policy.filter.allows_fixed(index) {
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

    /// IA32_PERF_GLOBAL_STATUS_SET (v4+): counter bits and OvfBuffer.
    pub fn status_set(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.status_set_bits)
    }

    /// A general-purpose counter value written through IA32_A_PMCx (or restored from the
    /// page): bits above the width are refused, as full-width writes #GP on hardware.
    pub fn full_width_counter(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.gp_value_mask)
    }

    /// A value written through the legacy IA32_PMCx alias: bits 31:0 sign-extended, then
    /// masked to the width. Never refused.
    pub fn legacy_counter(&self, value: u64) -> u64 {
        (value as u32 as i32 as i64 as u64) & self.gp_value_mask
    }

    /// IA32_FIXED_CTRx: bits above the fixed width are refused (Xen).
    pub fn fixed_counter(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, self.fixed_value_mask)
    }

    /// [`GuestRules::full_width_counter`] over a whole bank at once (a flush): the bitmap of
    /// the values it refuses. `union` is every value or-ed together (the caller's pass over the
    /// bank computes it). The rule is a mask, so the bank passes exactly when the union of its
    /// values does: the common case is one test, and only a refused bank is walked.
    #[inline]
    pub fn full_width_counters_within<const N: usize>(&self, values: &[u64; N], union: u64) -> u32 {
        if self.full_width_counter(union).is_ok() {
            return 0;
        }
        refused_indices(values, |value| self.full_width_counter(value).is_err())
    }

    /// [`GuestRules::fixed_counter`] over a whole bank at once, as
    /// [`GuestRules::full_width_counters_within`], with the slots of `absent` counters (that
    /// must hold 0) refused too: the lowest refused index.
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
            Err(Refused)
        }
    }

    /// IA32_PEBS_ENABLE: PEBS is not virtualised and its reserved bits are model specific, so
    /// only 0 is accepted (whitelist, Xen fb424bf6b5).
    pub fn pebs_enable(&self, value: u64) -> Result<u64, Refused> {
        self.within(value, 0)
    }

    /// The counters a GLOBAL_STATUS value names (bits 62/63 dropped).
    pub fn status_counters(&self, status: u64) -> CounterSet {
        CounterSet(status & self.global_ctrl_bits)
    }

    fn within(&self, value: u64, allowed: u64) -> Result<u64, Refused> {
        if value & !allowed == 0 {
            Ok(value)
        } else {
            Err(Refused)
        }
    }
}
