//! The context in the shared page's vendor area (`IntelCtxt` plus banks), always addressed
//! through the layout this backend computed: the geometry words in the page are written for the
//! guest and never read back.

use vpmu::abi::{IntelCtxt, VendorArea};
use vpmu::{ContextError, GuestPolicy};

use crate::backend::IntelPmu;
use crate::context::IntelContext;
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
    /// validators. The first violation is returned; nothing is repaired. A control (each
    /// PERFEVTSELx, FIXED_CTR_CTRL, DS_AREA) left exactly as `saved` publishes it was legal
    /// when published: it is not refused but given the hardware image [`restrict`] computes
    /// under `policy`, so an unedited page always flushes whatever the policy became since.
    pub(crate) fn read_page(
        &self,
        area: &VendorArea,
        saved: &IntelContext,
        policy: &GuestPolicy<'_>,
    ) -> Result<IntelContext, ContextError> {
        let rules = &self.rules;
        let ctxt = area.intel_ctxt();
        let mut ctx = IntelContext::reset(&self.caps);

        ctx.global_ctrl =
            rules
                .global_ctrl(ctxt.global_ctrl)
                .or_refuse("global_ctrl", None, ctxt.global_ctrl)?;
        ctx.fixed_ctrl_hw = if ctxt.fixed_ctrl == saved.fixed_ctrl {
            unedited(restrict::fixed_ctrl(rules, ctxt.fixed_ctrl, policy))
        } else {
            rules.fixed_ctrl(ctxt.fixed_ctrl, policy).or_refuse(
                "fixed_ctrl",
                None,
                ctxt.fixed_ctrl,
            )?
        };
        ctx.fixed_ctrl = ctxt.fixed_ctrl;
        // Acknowledging is clearing: the owner may drop recorded overflows, never invent one.
        if ctxt.global_status & !saved.global_status != 0 {
            return Err(refused("global_status", None, ctxt.global_status));
        }
        let acknowledged = rules.ovf_ctrl(ctxt.global_ovf_ctrl).or_refuse(
            "global_ovf_ctrl",
            None,
            ctxt.global_ovf_ctrl,
        )?;
        ctx.global_status = ctxt.global_status & !acknowledged;
        ctx.ds_area = if ctxt.ds_area == saved.ds_area {
            unedited(restrict::ds_area(rules, ctxt.ds_area, policy))
        } else {
            rules
                .ds_area(ctxt.ds_area, policy)
                .or_refuse("ds_area", None, ctxt.ds_area)?
        };
        rules
            .pebs_enable(ctxt.pebs_enable)
            .or_refuse("pebs_enable", None, ctxt.pebs_enable)?;

        for (index, slot) in (0..self.page_banks.fixed_count()).zip(&mut ctx.fixed_counters) {
            let value = self
                .page_banks
                .fixed_counter(area, index as usize)
                .map_err(|_| refused("fixed_counter", Some(index), 0))?;
            *slot = if self.caps.has_fixed(index) {
                rules
                    .fixed_counter(value)
                    .or_refuse("fixed_counter", Some(index), value)?
            } else if value == 0 {
                // A sparse v5 bitmap leaves holes in the bank; they must stay 0.
                0
            } else {
                return Err(refused("fixed_counter", Some(index), value));
            };
        }
        let gp_slots = ctx
            .gp_counters
            .iter_mut()
            .zip(ctx.event_selects.iter_mut().zip(&mut ctx.event_selects_hw))
            .zip(&saved.event_selects);
        for (index, ((counter, (control, control_hw)), &published)) in
            (0..self.page_banks.arch_count()).zip(gp_slots)
        {
            let pair = self
                .page_banks
                .pair(area, index as usize)
                .map_err(|_| refused("counter", Some(index), 0))?;
            *counter = rules.full_width_counter(pair.counter).or_refuse(
                "counter",
                Some(index),
                pair.counter,
            )?;
            *control_hw = if pair.control == published {
                unedited(restrict::event_select(rules, pair.control, policy))
            } else {
                rules.event_select(pair.control, policy).or_refuse(
                    "evtsel",
                    Some(index),
                    pair.control,
                )?
            };
            *control = pair.control;
        }
        ctx.recompute_in_use();
        Ok(ctx)
    }
}
