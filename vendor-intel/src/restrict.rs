//! Restriction of a saved context after a policy change (`PmuBackend::restrict`), and the
//! hardware images the shared-page flush gives a control the guest left as published.
//!
//! Every control is re-judged by the same validator a WRMSR uses ([`GuestRules`]). A control
//! the validator still accepts gets the validator's hardware image (the filter applied); one it
//! now refuses keeps its guest-visible value but gets a hardware image that cannot count:
//! PERFEVTSELx with EN cleared, a FIXED_CTR_CTRL nibble 0 (each nibble is judged alone, so the
//! other counters keep counting), and DS_AREA 0 (it has no separate hardware image, so the guest
//! reads 0 too). The images depend only on the guest values and the policy, so restricting
//! twice changes nothing.

use vpmu::{ContextError, GuestPolicy};

use crate::backend::IntelPmu;
use crate::context::IntelContext;
use crate::msrs::{
    EVTSEL_EN, IA32_DS_AREA, IA32_FIXED_CTR_CTRL, IA32_PERFEVTSEL0, at_fixed_nibble, fixed_nibble,
};
use crate::policy::{EVTSEL_GUEST_BITS, GuestRules, Refused};
use vpmu::abi::XENPMU_REFUSED_RESERVED;

/// A control's hardware image under a policy: `Ok` when the validator accepts the guest value
/// (its own hardware image), `Err` with the image that cannot count when it refuses it.
pub(crate) type Restricted = Result<u64, u64>;

/// PERFEVTSELx: the validator's image, or the guest value with EN (and any bit a guest may not
/// set) cleared. Inlined: a flush runs it for every unedited live control.
#[inline]
pub(crate) fn event_select(rules: &GuestRules, value: u64, policy: &GuestPolicy<'_>) -> Restricted {
    rules
        .event_select(value, policy)
        .map_err(|_| value & EVTSEL_GUEST_BITS & !EVTSEL_EN)
}

/// IA32_FIXED_CTR_CTRL, nibble by nibble: each nibble's image is the validator's for that
/// nibble alone, or 0 if the validator refuses it. `Err` if any nibble was refused.
#[inline]
pub(crate) fn fixed_ctrl(rules: &GuestRules, value: u64, policy: &GuestPolicy<'_>) -> Restricted {
    // The common case of a flush (no fixed counter programmed): every nibble is 0, and the
    // nibble walk is not called at all.
    if value == 0 {
        return Ok(0);
    }
    fixed_ctrl_nibbles(rules, value, policy)
}

/// [`fixed_ctrl`] of a non-zero value.
#[inline(never)]
fn fixed_ctrl_nibbles(rules: &GuestRules, value: u64, policy: &GuestPolicy<'_>) -> Restricted {
    let mut image = 0;
    let mut refused = false;
    // A zero nibble is accepted with a zero image: only the non-zero ones are judged.
    let mut nibbles = nibble_mask(value);
    while nibbles != 0 {
        let index = nibbles.trailing_zeros();
        nibbles &= nibbles - 1;
        let nibble = at_fixed_nibble(fixed_nibble(value, index), index);
        match rules.fixed_ctrl(nibble, policy) {
            Ok(hardware) => image |= hardware,
            Err(_) => refused = true,
        }
    }
    if refused { Err(image) } else { Ok(image) }
}

/// Bit `i` set for each non-zero nibble `i` of a FIXED_CTR_CTRL value. Branch-free: a flush
/// computes it for every unedited page.
pub(crate) fn nibble_mask(value: u64) -> u32 {
    // Bit 4i of `any` is set when nibble i has any bit set; then gather those bits.
    let mut any = (value | value >> 1 | value >> 2 | value >> 3) & 0x1111_1111_1111_1111;
    any = (any | any >> 3) & 0x0303_0303_0303_0303;
    any = (any | any >> 6) & 0x000f_000f_000f_000f;
    any = (any | any >> 12) & 0x0000_00ff_0000_00ff;
    any = (any | any >> 24) & 0xffff;
    any as u32
}

/// IA32_DS_AREA: the value if the validator accepts it, else 0 (no DS area loaded).
#[inline]
pub(crate) fn ds_area(rules: &GuestRules, value: u64, policy: &GuestPolicy<'_>) -> Restricted {
    rules.ds_area(value, policy).map_err(|_| 0)
}

/// The image either way, and the error naming the register (and the MSR a WRMSR of it would
/// name) if it had to be restricted, with the reason `judge` (the register's WRMSR validator)
/// gives.
pub(crate) fn split(
    restricted: Restricted,
    (register, index, msr): (&'static str, Option<u32>, u32),
    value: u64,
    judge: impl FnOnce() -> Result<u64, Refused>,
) -> (u64, Option<ContextError>) {
    match restricted {
        Ok(image) => (image, None),
        Err(image) => (
            image,
            Some(ContextError {
                register,
                index,
                value,
                msr,
                reason: judge()
                    .err()
                    .map_or(XENPMU_REFUSED_RESERVED, |Refused(r)| r),
            }),
        ),
    }
}

impl IntelPmu {
    /// Recomputes every hardware image of the saved `ctx` under `policy` (see the module
    /// documentation). Returns the first register restricted, in the page's order: fixed_ctrl,
    /// ds_area, then each evtsel.
    pub(crate) fn restrict_context(
        &self,
        ctx: &mut IntelContext,
        policy: &GuestPolicy<'_>,
    ) -> Option<ContextError> {
        let rules = &self.rules;
        let (fixed_hw, fixed_error) = split(
            fixed_ctrl(rules, ctx.fixed_ctrl, policy),
            ("fixed_ctrl", None, IA32_FIXED_CTR_CTRL),
            ctx.fixed_ctrl,
            || rules.fixed_ctrl(ctx.fixed_ctrl, policy),
        );
        ctx.fixed_ctrl_hw = fixed_hw;
        let (ds, ds_error) = split(
            ds_area(rules, ctx.ds_area, policy),
            ("ds_area", None, IA32_DS_AREA),
            ctx.ds_area,
            || rules.ds_area(ctx.ds_area, policy),
        );
        ctx.ds_area = ds;
        let mut first = fixed_error.or(ds_error);
        let selects = ctx.event_selects.iter().zip(&mut ctx.event_selects_hw);
        for (index, (&guest, hardware)) in (0u32..).zip(selects) {
            let (image, error) = split(
                event_select(rules, guest, policy),
                ("evtsel", Some(index), IA32_PERFEVTSEL0 + index),
                guest,
                || rules.event_select(guest, policy),
            );
            *hardware = image;
            first = first.or(error);
        }
        // Guest values and counters are unchanged, so this is the same set; recomputed so the
        // bookkeeping follows the context whatever it held.
        ctx.recompute_in_use();
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msrs::FIXED_NIBBLE_BITS;

    #[test]
    fn the_nibble_mask_names_every_non_zero_nibble() {
        let naive = |value: u64| {
            (0..u64::BITS / FIXED_NIBBLE_BITS)
                .filter(|&index| fixed_nibble(value, index) != 0)
                .fold(0u32, |mask, index| mask | 1 << index)
        };
        let mut value = 0x9e37_79b9_7f4a_7c15u64;
        for shift in 0..64 {
            for probe in [
                0,
                u64::MAX,
                1 << shift,
                value,
                value & 0x8421_8421_8421_8421,
            ] {
                assert_eq!(nibble_mask(probe), naive(probe), "{probe:#x}");
            }
            value = value.rotate_left(7).wrapping_mul(0x2545_f491_4f6c_dd1d);
        }
    }
}
