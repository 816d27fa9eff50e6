//! The Intel part of a vCPU snapshot (`vpmu::snapshot`, docs/snapshot.md): the guest-visible
//! registers of a context as (MSR, value) entries, and a context rebuilt from such entries
//! through the WRMSR validators of [`GuestRules`](crate::GuestRules), each register's one owner.
//!
//! Canonical order, for the enumerated PMU: for each general-purpose counter *i* IA32_PMC*i*
//! (the full-width value, as an RDMSR of it returns it) then IA32_PERFEVTSEL*i*; each present
//! fixed counter IA32_FIXED_CTR*i*; IA32_FIXED_CTR_CTRL; IA32_PERF_GLOBAL_CTRL;
//! IA32_PERF_GLOBAL_STATUS (the virtual status); IA32_DS_AREA. PERF_CAPABILITIES (read-only,
//! from the enumeration), PEBS_ENABLE (always 0) and the write-only registers are not state.

use vpmu::snapshot::{Registers, SnapshotBackend, SnapshotRegister};
use vpmu::{ContextError, GuestPolicy};

use crate::backend::IntelPmu;
use crate::context::{FIXED_SLOTS, IntelContext};
use crate::msrs::{
    IA32_DS_AREA, IA32_FIXED_CTR_CTRL, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_STATUS, IntelMsr,
    event_select, fixed_counter, legacy_counter,
};
use crate::policy::Refused;

/// A validator's refusal of `value` for register `msr`, as the restore reports it.
fn refused(
    register: &'static str,
    index: Option<u32>,
    msr: u32,
    value: u64,
) -> impl Fn(Refused) -> ContextError {
    move |Refused(reason)| ContextError {
        register,
        index,
        value,
        msr,
        reason,
    }
}

impl SnapshotBackend for IntelPmu {
    fn context_registers(&self, ctx: &IntelContext, out: &mut Registers) {
        *out = Registers::new();
        let mut push = |msr: vpmu::Msr, value: u64| {
            // At most 8 + 8 + 4 + 4 = 24 entries: always room.
            let _ = out.push(SnapshotRegister::msr(msr.0, value));
        };
        for index in (0..self.caps.gp_counters()).filter(|&i| self.caps.has_gp(i)) {
            let i = index as usize;
            push(
                legacy_counter(index),
                ctx.gp_counters.get(i).copied().unwrap_or(0),
            );
            push(
                event_select(index),
                ctx.event_selects.get(i).copied().unwrap_or(0),
            );
        }
        for index in (0..FIXED_SLOTS as u32).filter(|&i| self.caps.has_fixed(i)) {
            let value = ctx.fixed_counters.get(index as usize).copied().unwrap_or(0);
            push(fixed_counter(index), value);
        }
        push(vpmu::Msr(IA32_FIXED_CTR_CTRL), ctx.fixed_ctrl);
        push(vpmu::Msr(IA32_PERF_GLOBAL_CTRL), ctx.global_ctrl);
        push(vpmu::Msr(IA32_PERF_GLOBAL_STATUS), ctx.global_status);
        push(vpmu::Msr(IA32_DS_AREA), ctx.ds_area);
    }

    fn context_from_registers(
        &self,
        registers: &Registers,
        policy: &GuestPolicy<'_>,
        out: &mut IntelContext,
    ) -> Result<(), ContextError> {
        let rules = &self.rules;
        let mut ctx = IntelContext::reset(&self.caps);
        for entry in registers.as_slice() {
            let (msr, value) = (entry.number, entry.value);
            let unknown = ContextError {
                register: "unknown register",
                index: None,
                value,
                msr,
                reason: vpmu::abi::XENPMU_REFUSED_ABSENT,
            };
            if entry.kind != vpmu::snapshot::RegisterKind::Msr {
                return Err(unknown);
            }
            let Some(register) = IntelMsr::classify(vpmu::Msr(msr)) else {
                return Err(unknown);
            };
            if !register.is_present(&self.caps) {
                return Err(unknown);
            }
            match register {
                IntelMsr::Counter { index, .. } => {
                    // A counter holds any value within its width (what IA32_A_PMCx accepts);
                    // the legacy alias's sign extension is a way of writing, not a value.
                    let value = rules.full_width_counter(value).map_err(refused(
                        "gp_counter",
                        Some(index),
                        msr,
                        value,
                    ))?;
                    let slot = ctx.gp_counters.get_mut(index as usize).ok_or(unknown)?;
                    *slot = value;
                }
                IntelMsr::EventSelect(index) => {
                    let hardware = rules.event_select(value, policy).map_err(refused(
                        "evtsel",
                        Some(index),
                        msr,
                        value,
                    ))?;
                    let i = index as usize;
                    let (Some(guest), Some(image)) = (
                        ctx.event_selects.get_mut(i),
                        ctx.event_selects_hw.get_mut(i),
                    ) else {
                        return Err(unknown);
                    };
                    (*guest, *image) = (value, hardware);
                }
                IntelMsr::FixedCounter(index) => {
                    let value = rules.fixed_counter(value).map_err(refused(
                        "fixed_counter",
                        Some(index),
                        msr,
                        value,
                    ))?;
                    let slot = ctx.fixed_counters.get_mut(index as usize).ok_or(unknown)?;
                    *slot = value;
                }
                IntelMsr::FixedCtrCtrl => {
                    ctx.fixed_ctrl_hw = rules.fixed_ctrl(value, policy).map_err(refused(
                        "fixed_ctrl",
                        None,
                        msr,
                        value,
                    ))?;
                    ctx.fixed_ctrl = value;
                }
                IntelMsr::GlobalCtrl => {
                    ctx.global_ctrl = rules.global_ctrl(value).map_err(refused(
                        "global_ctrl",
                        None,
                        msr,
                        value,
                    ))?;
                }
                IntelMsr::GlobalStatus => {
                    ctx.global_status = rules.virtual_status(value).map_err(refused(
                        "global_status",
                        None,
                        msr,
                        value,
                    ))?;
                }
                IntelMsr::DsArea => {
                    ctx.ds_area = rules
                        .ds_area(value, policy)
                        .map_err(refused("ds_area", None, msr, value))?;
                }
                IntelMsr::PerfCapabilities
                | IntelMsr::GlobalOvfCtrl
                | IntelMsr::GlobalStatusSet
                | IntelMsr::PebsEnable
                | IntelMsr::Unmodelled(_) => return Err(unknown),
            }
        }
        ctx.recompute_in_use();
        *out = ctx;
        Ok(())
    }
}
