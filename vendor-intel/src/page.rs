//! The context in the shared page's vendor area (`IntelCtxt` plus banks), always addressed
//! through the layout this backend computed: the geometry words in the page are written for the
//! guest and never read back.

use vpmu::abi::{IntelCtxt, VendorArea};
use vpmu::{ContextError, CounterSet, GuestPolicy};

use crate::backend::IntelPmu;
use crate::context::{FIXED_SLOTS, GP_SLOTS, IntelContext};
use crate::policy::Refused;
use crate::restrict::{self, Restricted};

/// The hardware image of a control the guest did not edit: restricted, never refused.
fn unedited(restricted: Restricted) -> u64 {
    restricted.unwrap_or_else(|image| image)
}

fn refused(register: &'static str, index: Option<u32>, value: u64) -> ContextError {
    ContextError {
        register,
        index,
        value,
    }
}

/// Turns a validator's refusal into the flush error naming the register.
trait OrRefuse<T> {
    fn or_refuse(
        self,
        register: &'static str,
        index: Option<u32>,
        value: u64,
    ) -> Result<T, ContextError>;
}

impl<T> OrRefuse<T> for Result<T, Refused> {
    fn or_refuse(
        self,
        register: &'static str,
        index: Option<u32>,
        value: u64,
    ) -> Result<T, ContextError> {
        self.map_err(|Refused| refused(register, index, value))
    }
}

impl IntelPmu {
    #[inline]
    pub(crate) fn write_page(&self, ctx: &IntelContext, area: &mut VendorArea) {
        let mut ctxt = IntelCtxt {
            global_ctrl: ctx.global_ctrl,
            global_status: ctx.global_status,
            global_ovf_ctrl: 0,
            fixed_ctrl: ctx.fixed_ctrl,
            ds_area: ctx.ds_area,
            pebs_enable: 0,
            ..IntelCtxt::default()
        };
        self.page_banks.describe_in(&mut ctxt);
        area.set_intel_ctxt(&ctxt);
        self.page_banks.set_banks(
            area,
            &ctx.fixed_counters,
            &ctx.gp_counters,
            &ctx.event_selects,
        );
    }

    /// Rebuilds every register from the (already copied) area and verifies it with the WRMSR
    /// validators. The first violation is returned and `out` is left as it was: every check
    /// runs before the first write to it. Nothing is repaired. A control (each PERFEVTSELx,
    /// FIXED_CTR_CTRL, DS_AREA) left exactly as `saved` publishes it was legal when published:
    /// it is not refused but given the hardware image [`restrict`] computes under `policy`, so
    /// an unedited page always flushes whatever the policy became since.
    pub(crate) fn read_page_into(
        &self,
        area: &VendorArea,
        saved: &IntelContext,
        policy: &GuestPolicy<'_>,
        out: &mut IntelContext,
    ) -> Result<(), ContextError> {
        let rules = &self.rules;
        let ctxt = area.intel_ctxt();

        let global_ctrl =
            rules
                .global_ctrl(ctxt.global_ctrl)
                .or_refuse("global_ctrl", None, ctxt.global_ctrl)?;
        let fixed_ctrl_hw = if ctxt.fixed_ctrl == saved.fixed_ctrl {
            unedited(restrict::fixed_ctrl(rules, ctxt.fixed_ctrl, policy))
        } else {
            rules.fixed_ctrl(ctxt.fixed_ctrl, policy).or_refuse(
                "fixed_ctrl",
                None,
                ctxt.fixed_ctrl,
            )?
        };
        // Acknowledging is clearing: the owner may drop recorded overflows, never invent one.
        if ctxt.global_status & !saved.global_status != 0 {
            return Err(refused("global_status", None, ctxt.global_status));
        }
        let acknowledged = rules.ovf_ctrl(ctxt.global_ovf_ctrl).or_refuse(
            "global_ovf_ctrl",
            None,
            ctxt.global_ovf_ctrl,
        )?;
        let ds_area = if ctxt.ds_area == saved.ds_area {
            unedited(restrict::ds_area(rules, ctxt.ds_area, policy))
        } else {
            rules
                .ds_area(ctxt.ds_area, policy)
                .or_refuse("ds_area", None, ctxt.ds_area)?
        };
        rules
            .pebs_enable(ctxt.pebs_enable)
            .or_refuse("pebs_enable", None, ctxt.pebs_enable)?;

        // Entries whose value and control are both 0 pass every validator as 0, and so do the
        // slots past the banks: only the others ("live") are judged, lowest index first.
        let fixed = self
            .page_banks
            .fixed_bank(area)
            .map_err(|_| refused("fixed_counter", Some(0), 0))?;
        let pairs = self
            .page_banks
            .arch_bank(area)
            .map_err(|_| refused("counter", Some(0), 0))?;
        let mut fixed_live = 0u64;
        for (index, &value) in (0..FIXED_SLOTS).zip(fixed) {
            fixed_live |= u64::from(value != 0) << index;
        }
        let mut gp_live = 0u64;
        for (index, pair) in (0..GP_SLOTS).zip(pairs) {
            gp_live |= u64::from(pair.counter | pair.control != 0) << index;
        }
        let mut live = fixed_live;
        while live != 0 {
            let index = live.trailing_zeros();
            live &= live - 1;
            let value = fixed.get(index as usize).map_or(0, |&value| value);
            if !self.caps.has_fixed(index) {
                // A sparse v5 bitmap leaves holes in the bank; they must stay 0.
                return Err(refused("fixed_counter", Some(index), value));
            }
            let accepted =
                rules
                    .fixed_counter(value)
                    .or_refuse("fixed_counter", Some(index), value)?;
            // Counter validators take a value as it is or refuse it: the commit below copies
            // the page's.
            debug_assert_eq!(accepted, value);
        }
        let mut event_selects_hw = [0u64; GP_SLOTS];
        let mut live = gp_live;
        while live != 0 {
            let index = live.trailing_zeros();
            live &= live - 1;
            let i = index as usize;
            let (Some(pair), Some(&published), Some(image)) = (
                pairs.get(i),
                saved.event_selects.get(i),
                event_selects_hw.get_mut(i),
            ) else {
                continue;
            };
            let accepted = rules.full_width_counter(pair.counter).or_refuse(
                "counter",
                Some(index),
                pair.counter,
            )?;
            debug_assert_eq!(accepted, pair.counter);
            *image = if pair.control == published {
                unedited(restrict::event_select(rules, pair.control, policy))
            } else {
                rules.event_select(pair.control, policy).or_refuse(
                    "evtsel",
                    Some(index),
                    pair.control,
                )?
            };
        }

        // Verified: from here on nothing fails.
        out.fixed_counters = [0; FIXED_SLOTS];
        for (slot, &value) in out.fixed_counters.iter_mut().zip(fixed) {
            *slot = value;
        }
        out.gp_counters = [0; GP_SLOTS];
        out.event_selects = [0; GP_SLOTS];
        for ((counter, control), pair) in out
            .gp_counters
            .iter_mut()
            .zip(out.event_selects.iter_mut())
            .zip(pairs)
        {
            *counter = pair.counter;
            *control = pair.control;
        }
        out.event_selects_hw = event_selects_hw;
        out.fixed_ctrl = ctxt.fixed_ctrl;
        out.fixed_ctrl_hw = fixed_ctrl_hw;
        out.global_ctrl = global_ctrl;
        out.global_status = ctxt.global_status & !acknowledged;
        out.ds_area = ds_area;
        // In use: a non-zero value or control (`IntelContext::recompute_in_use`).
        let fixed_ctrl_live =
            u64::from(restrict::nibble_mask(ctxt.fixed_ctrl)) & ((1 << FIXED_SLOTS) - 1);
        out.in_use = CounterSet(gp_live | (fixed_live | fixed_ctrl_live) << CounterSet::FIXED_BASE);
        #[cfg(debug_assertions)]
        {
            let mut check = out.clone();
            check.recompute_in_use();
            debug_assert_eq!(check.in_use, out.in_use, "in_use of a flushed page");
        }
        Ok(())
    }
}
