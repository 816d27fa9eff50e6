//! The AMD part of a vCPU snapshot (`vpmu::snapshot`, docs/snapshot.md): the guest-visible
//! registers of a context as (MSR, value) entries, and a context rebuilt from such entries
//! through the WRMSR validators of [`policy`], each register's one owner.
//!
//! Canonical order, for the enumerated PMU: for each counter *i* PERF_CTR*i* then PERF_CTL*i*
//! (through the PerfCtrExtCore MSRs where the PMU has them, else the K7 ones); with PerfMonV2
//! PerfCntrGlobalCtl and PerfCntrGlobalStatus (the virtual status); then one state entry,
//! [`STATE_ARMED`]: the counters armed for overflow detection by the top-bit rule (those last
//! written with bit 47 set and not yet seen wrapped), which decides whether a future wrap
//! interrupts and which no MSR shows.

use vpmu::abi::{XENPMU_REFUSED_ABSENT, XENPMU_REFUSED_RESERVED};
use vpmu::snapshot::{RegisterKind, Registers, SnapshotBackend, SnapshotRegister};
use vpmu::{ContextError, CounterSet, GuestPolicy, Msr};

use crate::backend::AmdPmu;
use crate::caps::Lookup;
use crate::context::AmdContext;
use crate::msrs::{GLOBAL_CTL, GLOBAL_STATUS, Register};
use crate::policy::{self, Refused};

/// The state entry of the armed counters (a `CounterSet` of general-purpose counters).
pub const STATE_ARMED: u32 = 1;

impl SnapshotBackend for AmdPmu {
    fn context_registers(&self, ctx: &AmdContext, out: &mut Registers) {
        *out = Registers::new();
        let caps = self.caps();
        // At most 6 + 6 + 2 + 1 = 15 entries: always room.
        for index in 0..caps.gp_counters() {
            let counter = ctx.counter(index).unwrap_or(0);
            let control = ctx.control(index).unwrap_or(0);
            let _ = out.push(SnapshotRegister::msr(caps.counter_msr(index).0, counter));
            let _ = out.push(SnapshotRegister::msr(caps.control_msr(index).0, control));
        }
        if caps.has_perfmon_v2() {
            let _ = out.push(SnapshotRegister::msr(GLOBAL_CTL, ctx.global_ctl));
            let _ = out.push(SnapshotRegister::msr(GLOBAL_STATUS, ctx.global_status));
        }
        let _ = out.push(SnapshotRegister::state(STATE_ARMED, ctx.armed.0));
    }

    fn context_from_registers(
        &self,
        registers: &Registers,
        guest_policy: &GuestPolicy<'_>,
        out: &mut AmdContext,
    ) -> Result<(), ContextError> {
        let caps = self.caps();
        let present = caps.counter_mask();
        let mut ctx = AmdContext::reset(caps);
        let mut armed = None;
        for entry in registers.as_slice() {
            let (msr, value) = (entry.number, entry.value);
            let error = |register, index, Refused(reason)| ContextError {
                register,
                index,
                value,
                msr,
                reason,
            };
            let absent = error("unknown register", None, Refused(XENPMU_REFUSED_ABSENT));
            if entry.kind == RegisterKind::State {
                if msr != STATE_ARMED || armed.is_some() {
                    return Err(absent);
                }
                // Any set of present counters is a state the top-bit rule can be in.
                if value & !present != 0 {
                    return Err(error("armed", None, Refused::RESERVED));
                }
                armed = Some(CounterSet(value));
                continue;
            }
            let Lookup::Present(register) = caps.lookup(Msr(msr)) else {
                return Err(absent);
            };
            match register {
                Register::Counter(index) => {
                    // The WRMSR's rule keeps 48 bits; a value it would change is no value a
                    // counter held.
                    if policy::counter(value) != value {
                        return Err(error("counter", Some(index), Refused::RESERVED));
                    }
                    let slot = ctx.counters.get_mut(index as usize).ok_or(absent)?;
                    *slot = value;
                }
                Register::Control(index) => {
                    let control = policy::control(value, guest_policy)
                        .map_err(|why| error("ctrl", Some(index), why))?;
                    let i = index as usize;
                    let (Some(guest), Some(hardware)) =
                        (ctx.guest_ctl.get_mut(i), ctx.hw_ctl.get_mut(i))
                    else {
                        return Err(absent);
                    };
                    (*guest, *hardware) = (control.guest, control.hardware);
                }
                Register::GlobalCtl => {
                    ctx.global_ctl = policy::global_ctl(value, present)
                        .map_err(|why| error("global_ctrl", None, why))?;
                }
                Register::GlobalStatus => {
                    // The status a guest could have raised itself (PerfCntrGlobalStatusSet).
                    ctx.global_status = policy::global_status_set(value, present)
                        .map_err(|why| error("global_status", None, why))?;
                }
                Register::GlobalStatusClr | Register::GlobalStatusSet => return Err(absent),
            }
        }
        let Some(armed) = armed else {
            return Err(ContextError {
                register: "armed",
                index: None,
                value: 0,
                msr: STATE_ARMED,
                reason: XENPMU_REFUSED_RESERVED,
            });
        };
        ctx.armed = armed;
        // At rest the counters in use are those with EN on the hardware.
        ctx.in_use = ctx.enabled_on_hardware();
        *out = ctx;
        Ok(())
    }
}
