//! Context switch and overflow collection, with the fewest MSR accesses.
//!
//! Invariant between contexts ("nothing counts"): GLOBAL_CTRL is 0 and no GLOBAL_STATUS bit the
//! guests can own is set. PERFEVTSELx and FIXED_CTR_CTRL keep what the last context left, and
//! the pCPU's [`HwRecord`] says what that is, with the counter values read at its save. Save
//! stops everything with one GLOBAL_CTRL write, reads the status and the counters in use, and
//! leaves the controls; load writes each value and control the record does not know the
//! hardware holds (clearing a control another context left on a counter this one does not
//! use, so that it can never count when the guest enables that counter globally), and
//! GLOBAL_CTRL last, if it differs. A vCPU switched out and back in with nothing in between
//! costs k + 3 accesses for k counters in use. A context that uses none costs nothing.
//!
//! While a context is loaded the hardware holds its hardware images (write-through, see
//! `access.rs`): every control of a counter in `in_use`, FIXED_CTR_CTRL once a fixed counter
//! is in use, GLOBAL_CTRL once anything is in use; 0 in the controls of counters not in use
//! (load cleared them, and a guest write programs a control only after putting its counter in
//! use, which only grows while loaded). Save records from the context on that ground.
//!
//! The virtual GLOBAL_STATUS lives in the context at all times. Save and PMIs fold the
//! hardware's bits into it and acknowledge them; load never writes status back (no
//! GLOBAL_STATUS_SET), so it works the same on v2–v5 and never re-raises an overflow the guest
//! was already told about. Guest reads combine the virtual status with the live one.
//!
//! A PMI is due for exactly the overflows that happen while their interrupt is enabled. The
//! hardware status bits of a loaded context are the overflows since it was loaded or since they
//! were last acknowledged (at a PMI, by the guest, or when a control write enables the
//! interrupt of an overflowed counter), so judged by the controls in force they are exactly
//! the PMIs raised and not yet handled, whether or not the virtual status already holds them.
//! Only a guest that disables the interrupt, or acknowledges the overflow, after an overflow
//! but before its PMI is taken loses that PMI (real hardware has raised it already); the guest
//! runs in that window only for the PMI's skid.

use vpmu::bank::{self, BankMap, HwRecord, MsrSeries, SaveControls, StatusMsrs};
use vpmu::{CounterSet, Msr, MsrBus, MsrFault, Overflow};

use crate::backend::IntelPmu;
use crate::caps::{FIXED_BANK_MAP, GP_BANK_MAP};
use crate::context::IntelContext;
use crate::msrs::{
    IA32_DS_AREA, IA32_FIXED_CTR_CTRL, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL,
    IA32_PERF_GLOBAL_STATUS, event_select,
};

const STATUS: StatusMsrs = StatusMsrs {
    status: Msr(IA32_PERF_GLOBAL_STATUS),
    acknowledge: Msr(IA32_PERF_GLOBAL_OVF_CTRL),
};

impl IntelPmu {
    /// `msr_banks` for a save, with every field the enumeration does not decide a constant
    /// (the bank loops inlined into the switch then fold the MSR numbers, the bank positions
    /// and the kind of control instead of reading them from the map at every step), and the
    /// counter aliases written too: a save never writes a counter, so only the value masks
    /// are read from the backend.
    #[inline(always)]
    fn save_banks(&self) -> [BankMap; 2] {
        let [gp, fixed] = &self.msr_banks;
        [
            BankMap {
                value_mask: gp.value_mask,
                ..GP_BANK_MAP
            },
            BankMap {
                value_mask: fixed.value_mask,
                ..FIXED_BANK_MAP
            },
        ]
    }

    /// The same for a load, which never reads a counter: the value masks are the constant
    /// maps' own, and the base of the general-purpose counter alias written is the one field
    /// read from the backend (the fixed counters have one alias). Reading fewer fields keeps
    /// fewer registers live across the load's pass, which compares and writes each counter.
    #[inline(always)]
    fn load_banks(&self) -> [BankMap; 2] {
        let [gp, _] = &self.msr_banks;
        // Both aliases (IA32_PMCx, IA32_A_PMCx) run in steps of 1: only the base is read, so
        // that each counter's MSR is the base plus its index, not a multiplication.
        debug_assert_eq!(gp.counter_writes.stride, GP_BANK_MAP.counter_writes.stride);
        [
            BankMap {
                counter_writes: MsrSeries::new(
                    gp.counter_writes.base,
                    GP_BANK_MAP.counter_writes.stride,
                ),
                ..GP_BANK_MAP
            },
            FIXED_BANK_MAP,
        ]
    }

    /// Stops and saves the context; returns every overflow this save found on the hardware: a
    /// PMI raised and not yet handled. Whether the virtual status already held the counter's
    /// bit does not matter: a counter that overflows again before the guest acknowledged the
    /// previous overflow raises a PMI as well.
    ///
    /// Inlined into the core's save (its one hot caller): as a call of its own it cost a
    /// second prologue, spills around the bank loops and a returned `Result<Overflow>` through
    /// memory (about 40 instructions of a switch pair).
    #[inline(always)]
    pub(crate) fn save_context<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<Overflow, MsrFault> {
        let live = ctx.in_use;
        if live.is_empty() && ctx.ds_area == 0 {
            return Ok(Overflow::default());
        }
        // One write stops every counter, so the values read below are final. With something
        // in use the hardware GLOBAL_CTRL is the context's: already 0, it needs no write.
        // With nothing in use it was not touched since the load (the record still holds).
        if !live.is_empty() {
            // No `set_global(None)` first: a faulting save makes the record forget
            // everything (`Vpmu::save_on`, the one caller).
            if ctx.global_ctrl != 0 {
                hw.write(Msr(IA32_PERF_GLOBAL_CTRL), 0)?;
            }
            record.set_global(Some(0));
        }
        let overflow = self.collect_overflow(ctx, hw)?;
        let banks = self.save_banks();
        let read_zero = bank::save(&banks, ctx, live, SaveControls::Keep, hw, record)?;
        if ctx.ds_area != 0 {
            hw.write(Msr(IA32_DS_AREA), 0)?;
        }
        ctx.shrink_in_use(read_zero);
        Ok(overflow)
    }

    #[inline]
    pub(crate) fn load_context<B: MsrBus>(
        &self,
        ctx: &IntelContext,
        hw: &mut B,
        record: &mut HwRecord,
    ) -> Result<(), MsrFault> {
        let live = ctx.in_use;
        let present = self.present;
        bank::load(&self.load_banks(), ctx, live, present, hw, record)?;
        if ctx.ds_area != 0 {
            hw.write(Msr(IA32_DS_AREA), ctx.ds_area)?;
        }
        // Global enables last: nothing counts until everything above is in place. Written
        // unless known to hold the value already, even when 0, so that a CPU nobody cleaned
        // (power-on enables the GP counters) cannot count for a context that disabled them.
        if !live.is_empty() && record.global() != Some(ctx.global_ctrl) {
            // A faulting load makes the record forget everything (`Vpmu::load_on`).
            hw.write(Msr(IA32_PERF_GLOBAL_CTRL), ctx.global_ctrl)?;
            record.set_global(Some(ctx.global_ctrl));
        }
        Ok(())
    }

    /// Folds GLOBAL_STATUS into the virtual status and reports the counters recorded, with
    /// whether any has its interrupt enabled as the guest programmed it (EVTSEL INT, the fixed
    /// nibble's PMI bit; OvfBuffer and CondChgd are no counters). The controls now stand for
    /// the controls at the overflow: a control write that enables the interrupt retires the
    /// overflows found before it ([`IntelPmu::retire_silent_overflows`]).
    #[inline]
    pub(crate) fn collect_overflow<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
    ) -> Result<Overflow, MsrFault> {
        // Every guest-ownable bit is acknowledged, not only this context's, so that none is
        // left for the next owner.
        let record = ctx.live_status_bits();
        let recorded = STATUS.fold(hw, record, self.rules.status_bits(), &mut ctx.global_status)?;
        let counters = self.rules.status_counters(recorded);
        // Only the banks' positions matter here: the constant maps.
        Ok(bank::overflow(
            &[GP_BANK_MAP, FIXED_BANK_MAP],
            ctx,
            counters,
        ))
    }

    /// Called, with `ctx` loaded, before a control write turns the interrupt on for `counters`.
    /// An overflow already on the hardware for one of them happened with the interrupt off and
    /// raised no PMI: it is recorded in the virtual status (the guest still sees it) and
    /// acknowledged now, so that a hardware status bit of a counter whose interrupt is enabled
    /// always means an overflow that raised a PMI (what `save` and `collect_overflow` rely
    /// on).
    pub(crate) fn retire_silent_overflows<B: MsrBus>(
        &self,
        ctx: &mut IntelContext,
        hw: &mut B,
        counters: CounterSet,
    ) -> Result<(), MsrFault> {
        // A counter not in use has not counted for this context since it was loaded, and the
        // hardware status is clean between contexts.
        let live = counters.intersection(ctx.in_use).0;
        if live == 0 {
            return Ok(());
        }
        STATUS.fold(hw, live, live, &mut ctx.global_status)?;
        Ok(())
    }

    /// Cleans a CPU whose PMU state is unknown (bring-up, or after someone else used the PMU):
    /// stops and clears every control of the enumerated PMU and acknowledges pending
    /// overflows. Counter values are left alone; loads overwrite the ones they use. A
    /// [`HwRecord`] of this CPU then knows every control 0 and nothing else
    /// ([`HwRecord::controls_cleared`]).
    pub fn clean_hardware<B: MsrBus>(&self, hw: &mut B) -> Result<(), MsrFault> {
        hw.write(Msr(IA32_PERF_GLOBAL_CTRL), 0)?;
        for index in 0..self.caps.gp_counters() {
            hw.write(event_select(index), 0)?;
        }
        if self.caps.fixed_counters() != 0 {
            hw.write(Msr(IA32_FIXED_CTR_CTRL), 0)?;
        }
        // Nobody's status: acknowledged, recorded nowhere.
        STATUS.fold(hw, 0, self.rules.status_bits(), &mut 0)?;
        Ok(())
    }
}
