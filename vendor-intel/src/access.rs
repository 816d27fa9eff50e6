//! Guest RDMSR/WRMSR emulation.
//!
//! While the context is loaded the hardware holds: the live values of the counters in
//! `in_use`; every PERFEVTSELx and FIXED_CTR_CTRL as the context's hardware values (0 for
//! counters not in use); GLOBAL_CTRL as the context's once anything is in use (before that it
//! enables nothing, as no control is programmed); the context's DS_AREA. Counters not in use may hold another vCPU's stale values, so they are
//! never read back: a write that puts such a counter in use first overwrites its value.

use vpmu::bank::{self, BankMap};
use vpmu::{CounterSet, GuestPolicy, Msr, MsrBus, MsrFault, MsrOutcome};

use crate::backend::IntelPmu;
use crate::caps::PERF_CAP_FW_WRITES;
use crate::context::{FIXED_BANK, GP_BANK, IntelContext};
use crate::msrs::{
    CounterAlias, EVTSEL_INT, FIXED_NIBBLE_BITS, IA32_DS_AREA, IA32_FIXED_CTR_CTRL,
    IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IntelMsr,
    event_select, fixed_nibble,
};

const GP: MsrOutcome<()> = MsrOutcome::GeneralProtection;

impl IntelPmu {
    #[inline]
    pub(crate) fn emulate_read<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        register: IntelMsr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        if !register.is_present(&self.caps) {
            return Ok(MsrOutcome::GeneralProtection);
        }
        // Counter values inline, every other register out of line (as for writes).
        let value = match register {
            IntelMsr::Counter { index, .. } => match hw {
                Some(hw) if ctx.in_use.contains(CounterSet::gp(index)) => {
                    Some(self.gp_bank().read_counter(hw, index)?)
                }
                _ => ctx.gp_counters.get(index as usize).copied(),
            },
            IntelMsr::FixedCounter(index) => match hw {
                Some(hw) if ctx.in_use.contains(CounterSet::fixed(index)) => {
                    Some(self.fixed_bank().read_counter(hw, index)?)
                }
                _ => ctx.fixed_counters.get(index as usize).copied(),
            },
            _ => return self.emulate_control_read(ctx, hw, register),
        };
        Ok(value.map_or(MsrOutcome::GeneralProtection, MsrOutcome::Handled))
    }

    /// A guest read of a present register that is not a counter value.
    #[inline(never)]
    fn emulate_control_read<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        register: IntelMsr,
    ) -> Result<MsrOutcome<u64>, MsrFault> {
        let value = match register {
            IntelMsr::Counter { .. } | IntelMsr::FixedCounter(_) => {
                return self.emulate_read(ctx, hw, register);
            }
            IntelMsr::EventSelect(index) => ctx.event_selects.get(index as usize).copied(),
            IntelMsr::FixedCtrCtrl => Some(ctx.fixed_ctrl),
            IntelMsr::GlobalCtrl => Some(ctx.global_ctrl),
            IntelMsr::GlobalStatus => {
                let live = ctx.live_status_bits();
                let hardware = match hw {
                    Some(hw) if live != 0 => hw.read(Msr(IA32_PERF_GLOBAL_STATUS))? & live,
                    _ => 0,
                };
                Some(ctx.global_status | hardware)
            }
            // Write-only in effect: both read as 0 (SDM, KVM).
            IntelMsr::GlobalOvfCtrl | IntelMsr::GlobalStatusSet => Some(0),
            // Only FW_WRITE is exposed: the guest gets no PEBS or LBR format to act on.
            IntelMsr::PerfCapabilities => Some(self.caps.perf_capabilities() & PERF_CAP_FW_WRITES),
            IntelMsr::PebsEnable => Some(0),
            IntelMsr::DsArea => Some(ctx.ds_area),
            IntelMsr::Unmodelled(_) => None,
        };
        Ok(value.map_or(MsrOutcome::GeneralProtection, MsrOutcome::Handled))
    }

    /// Validates and emulates a guest WRMSR of `register`: counter values here, in the
    /// caller's frame; each control register in its own function, so that a control write
    /// takes one dispatch (this match) and one call.
    #[inline(always)]
    pub(crate) fn emulate_write<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        register: IntelMsr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        if !register.is_present(&self.caps) {
            return Ok(GP);
        }
        let rules = &self.rules;
        match register {
            IntelMsr::Counter { index, alias } => {
                let value = match alias {
                    CounterAlias::Legacy => rules.legacy_counter(value),
                    CounterAlias::FullWidth => match rules.full_width_counter(value) {
                        Ok(value) => value,
                        Err(_) => return Ok(GP),
                    },
                };
                self.write_counter_value(ctx, hw, GP_BANK, index, value)
            }
            IntelMsr::FixedCounter(index) => match rules.fixed_counter(value) {
                Ok(value) => self.write_counter_value(ctx, hw, FIXED_BANK, index, value),
                Err(_) => Ok(GP),
            },
            IntelMsr::EventSelect(index) => self.write_event_select(ctx, hw, policy, index, value),
            IntelMsr::FixedCtrCtrl => self.write_fixed_ctrl(ctx, hw, policy, value),
            IntelMsr::GlobalCtrl => self.write_global_ctrl(ctx, hw, value),
            _ => self.emulate_control_write(ctx, hw, policy, register, value),
        }
    }

    /// A guest write of a present register that is neither a counter value nor one of the
    /// controls [`IntelPmu::emulate_write`] dispatches itself.
    #[inline(never)]
    fn emulate_control_write<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        register: IntelMsr,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let rules = &self.rules;
        match register {
            IntelMsr::Counter { .. }
            | IntelMsr::FixedCounter(_)
            | IntelMsr::EventSelect(_)
            | IntelMsr::FixedCtrCtrl
            | IntelMsr::GlobalCtrl => self.emulate_write(ctx, hw, policy, register, value),
            IntelMsr::GlobalOvfCtrl => match rules.ovf_ctrl(value) {
                Ok(value) => {
                    ctx.global_status &= !value;
                    let live = value & ctx.live_status_bits();
                    if let Some(hw) = hw {
                        if live != 0 {
                            hw.write(Msr(IA32_PERF_GLOBAL_OVF_CTRL), live)?;
                        }
                    }
                    Ok(MsrOutcome::Handled(()))
                }
                Err(_) => Ok(GP),
            },
            // The virtual status is the context's; setting it needs no hardware access.
            IntelMsr::GlobalStatusSet => match rules.status_set(value) {
                Ok(value) => {
                    ctx.global_status |= value;
                    Ok(MsrOutcome::Handled(()))
                }
                Err(_) => Ok(GP),
            },
            IntelMsr::GlobalStatus | IntelMsr::PerfCapabilities | IntelMsr::Unmodelled(_) => Ok(GP),
            IntelMsr::PebsEnable => match rules.pebs_enable(value) {
                Ok(_) => Ok(MsrOutcome::Handled(())),
                Err(_) => Ok(GP),
            },
            IntelMsr::DsArea => match rules.ds_area(value, policy) {
                Ok(value) => {
                    let previous = core::mem::replace(&mut ctx.ds_area, value);
                    if let Some(hw) = hw {
                        // A non-zero value passed validation only with a debug store, and a
                        // non-zero previous value was one of those.
                        if value != previous {
                            hw.write(Msr(IA32_DS_AREA), value)?;
                        }
                    }
                    Ok(MsrOutcome::Handled(()))
                }
                Err(_) => Ok(GP),
            },
        }
    }

    /// IA32_PERF_GLOBAL_CTRL. While the context is loaded with a counter in use the hardware
    /// holds the context's value (see the module doc), so only a change is written.
    #[inline(never)]
    fn write_global_ctrl<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Ok(value) = self.rules.global_ctrl(value) else {
            return Ok(GP);
        };
        let previous = core::mem::replace(&mut ctx.global_ctrl, value);
        if let Some(hw) = hw {
            if value != previous && !ctx.in_use.is_empty() {
                hw.write(Msr(IA32_PERF_GLOBAL_CTRL), value)?;
            }
        }
        Ok(MsrOutcome::Handled(()))
    }

    /// General-purpose counter values go to the hardware through the alias that stores them
    /// exactly: full-width when available, else the legacy one (exact for every value a guest
    /// can write through it; see the crate doc for restored values).
    fn gp_bank(&self) -> &BankMap {
        &self.msr_banks[GP_BANK]
    }

    fn fixed_bank(&self) -> &BankMap {
        &self.msr_banks[FIXED_BANK]
    }

    /// Puts `counters` in use on the hardware: writes their context values over whatever the
    /// previous owner left. Returns whether they are the first counters in use, in which case
    /// the caller enables GLOBAL_CTRL once it has programmed their controls.
    /// The usual case, nothing new to claim, stays in the caller.
    #[inline(always)]
    fn claim<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
        counters: CounterSet,
    ) -> Result<bool, MsrFault> {
        let new = CounterSet(counters.0 & !ctx.in_use.0);
        if new.is_empty() {
            return Ok(false);
        }
        self.claim_new(ctx, hw, new)
    }

    /// [`IntelPmu::claim`] of `new`, none of them in use yet.
    #[inline(never)]
    fn claim_new<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
        new: CounterSet,
    ) -> Result<bool, MsrFault> {
        let first = ctx.in_use.is_empty();
        bank::write_counters(&self.msr_banks, ctx, new, hw)?;
        ctx.in_use = ctx.in_use.union(new);
        Ok(first)
    }

    /// Written even when 0: the hardware value before the first counter is in use is whatever
    /// the CPU was left with (power-on sets the GP enables), not necessarily 0.
    fn enable_globally<B: MsrBus>(&self, ctx: &IntelContext, hw: &mut B) -> Result<(), MsrFault> {
        hw.write(Msr(IA32_PERF_GLOBAL_CTRL), ctx.global_ctrl)
    }

    /// A counter value (`bank` GP_BANK or FIXED_BANK) into the context, and through to the
    /// hardware while the counter is in use: the common case stays inline (always, so that
    /// `bank` is a constant there).
    #[inline(always)]
    fn write_counter_value<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        bank: usize,
        index: u32,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let values = if bank == GP_BANK {
            &mut ctx.gp_counters[..]
        } else {
            &mut ctx.fixed_counters[..]
        };
        let Some(slot) = values.get_mut(index as usize) else {
            return Ok(GP);
        };
        *slot = value;
        let Some(map) = self.msr_banks.get(bank) else {
            return Ok(GP);
        };
        let counter = map.counter(index);
        match hw {
            Some(hw) if ctx.in_use.contains(counter) => map.write_counter(hw, index, value)?,
            hw => self.counter_not_in_use(ctx, hw, bank, index, counter, value)?,
        }
        Ok(MsrOutcome::Handled(()))
    }

    /// After a value was written into the context for `counter`, not in use: off the
    /// hardware, the in-use set follows the context; on it, a non-zero value puts the counter
    /// in use (a zero one leaves the context to answer its reads).
    #[inline(never)]
    fn counter_not_in_use<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        bank: usize,
        index: u32,
        counter: CounterSet,
        value: u64,
    ) -> Result<(), MsrFault> {
        match hw {
            None => {
                let control = match bank {
                    GP_BANK => ctx.event_selects.get(index as usize).copied().unwrap_or(0),
                    _ => fixed_nibble(ctx.fixed_ctrl, index),
                };
                set_in_use(ctx, counter, value != 0 || control != 0);
            }
            Some(hw) if value != 0 => {
                if self.claim(ctx, hw, counter)? {
                    self.enable_globally(ctx, hw)?;
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// IA32_PERFEVTSELx, validated by [`GuestRules::event_select`] (its one owner).
    #[inline(always)]
    fn write_event_select<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        index: u32,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Ok(hardware) = self.rules.event_select(value, policy) else {
            return Ok(GP);
        };
        let i = index as usize;
        let (Some(&previous), true) = (ctx.event_selects.get(i), i < ctx.event_selects_hw.len())
        else {
            return Ok(GP);
        };
        let counter = CounterSet::gp(index);
        let Some(hw) = hw else {
            ctx.event_selects[i] = value;
            ctx.event_selects_hw[i] = hardware;
            // Off the hardware a counter is in use exactly while its value or control is
            // non-zero (`IntelContext::recompute_in_use`); only this counter's can change.
            let in_use = value != 0 || ctx.gp_counters.get(i).is_some_and(|&v| v != 0);
            set_in_use(ctx, counter, in_use);
            return Ok(MsrOutcome::Handled(()));
        };
        // An overflow before this write raised no PMI, and must not raise one later.
        if value & EVTSEL_INT != 0 && previous & EVTSEL_INT == 0 {
            self.retire_silent_overflows(ctx, hw, counter)?;
        }
        ctx.event_selects[i] = value;
        ctx.event_selects_hw[i] = hardware;
        if ctx.in_use.contains(counter) {
            hw.write(event_select(index), hardware)?;
        } else if value != 0 {
            let first = self.claim(ctx, hw, counter)?;
            hw.write(event_select(index), hardware)?;
            if first {
                self.enable_globally(ctx, hw)?;
            }
        }
        Ok(MsrOutcome::Handled(()))
    }

    /// IA32_FIXED_CTR_CTRL, validated by [`GuestRules::fixed_ctrl`] (its one owner). The
    /// counters concerned are found from the nibbles by bit arithmetic, walking only the set
    /// ones.
    #[inline(always)]
    fn write_fixed_ctrl<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: Option<&mut B>,
        policy: &GuestPolicy<'_>,
        value: u64,
    ) -> Result<MsrOutcome<()>, MsrFault> {
        let Ok(hardware) = self.rules.fixed_ctrl(value, policy) else {
            return Ok(GP);
        };
        let previous = core::mem::replace(&mut ctx.fixed_ctrl, value);
        ctx.fixed_ctrl_hw = hardware;
        let Some(hw) = hw else {
            // Rare (a fixed control written while the context is saved): every fixed
            // counter's nibble may have changed.
            ctx.recompute_in_use();
            return Ok(MsrOutcome::Handled(()));
        };
        // An overflow before this write raised no PMI, and must not raise one later: the
        // counters whose PMI bit this write sets (a validated value has nibbles of present
        // counters only).
        let interrupt_on = fixed_counters_at(!previous & value & NIBBLE_BIT3);
        if !interrupt_on.is_empty() {
            self.retire_silent_overflows(ctx, hw, interrupt_on)?;
        }
        // The counters with a non-zero nibble.
        let programmed =
            fixed_counters_at((value | value >> 1 | value >> 2 | value >> 3) & NIBBLE_BIT0);
        let first = self.claim(ctx, hw, programmed)?;
        if ctx.in_use.fixed_bits() != 0 {
            hw.write(Msr(IA32_FIXED_CTR_CTRL), hardware)?;
        }
        if first {
            self.enable_globally(ctx, hw)?;
        }
        Ok(MsrOutcome::Handled(()))
    }
}

/// Bit 0 of every FIXED_CTR_CTRL nibble.
const NIBBLE_BIT0: u64 = 0x1111_1111_1111_1111;
/// Bit 3 (PMI) of every FIXED_CTR_CTRL nibble.
const NIBBLE_BIT3: u64 = NIBBLE_BIT0 << 3;

/// The fixed counters whose nibble has a bit of `bits` (at most one bit per nibble).
#[inline]
fn fixed_counters_at(mut bits: u64) -> CounterSet {
    let mut set = CounterSet::EMPTY;
    while bits != 0 {
        set = set.union(CounterSet::fixed(bits.trailing_zeros() / FIXED_NIBBLE_BITS));
        bits &= bits - 1;
    }
    set
}

/// Puts `counter` in or out of the in-use set of a context off the hardware, where a counter
/// is in use exactly while its value or control is non-zero: what
/// `IntelContext::recompute_in_use` gives after a write changed that one counter's value or
/// control, without scanning the others.
#[inline]
fn set_in_use(ctx: &mut IntelContext, counter: CounterSet, in_use: bool) {
    if in_use {
        ctx.in_use = ctx.in_use.union(counter);
    } else {
        ctx.in_use.0 &= !counter.0;
    }
    #[cfg(debug_assertions)]
    {
        let mut check = ctx.clone();
        check.recompute_in_use();
        debug_assert_eq!(check.in_use, ctx.in_use, "in_use of a saved context");
    }
}
