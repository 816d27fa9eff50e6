//! RDPMC completed by the VMM. With KVM's own PMU off, a guest RDPMC raises #GP inside KVM,
//! and no MSR filter routes it to user space, so the machine finds the RDPMCs itself and
//! performs them through `Vpmu::rdpmc`:
//!
//! * while single-stepping (the precise source counts), the VMM sees every CPL0 instruction
//!   before it runs: an RDPMC at the RIP of a step exit is performed at once (EDX:EAX, RIP past
//!   it) and counted as retired, or #GP(0) is injected if the core refuses it;
//! * otherwise, a hardware execution breakpoint (`KVM_SET_GUEST_DEBUG`, DR0) sits on the entry
//!   of the guest's #GP handler (IDT vector 13, long mode). When it is hit, the VMM reads the
//!   exception frame: for a #GP(0) raised by an RDPMC at the same privilege level (the frame's
//!   CS is the handler's), the core's value completes the RDPMC and the frame is unwound (RIP
//!   past the RDPMC, RSP and RFLAGS from the frame), as if no #GP had happened. For anything
//!   else, or if the core refuses the RDPMC, the handler runs: the breakpoint is stepped over
//!   (one single step without it) and re-armed.
//!
//! Limits: an RDPMC at CPL3 (CR4.PCE set) faults into a CPL0 handler on another stack; that
//! frame is not unwound, so such an RDPMC keeps its #GP. The IDT, the frame and the
//! instruction are read through the guest's own page tables (`translate::Paging`): a kernel
//! such as Linux keeps them at virtual addresses (Linux's `x86_perf_event_update` reads every
//! counter with RDPMC).

use iced_x86::{Code, Decoder, DecoderOptions};
use kvm_bindings::kvm_sync_regs;
use kvm_ioctls::SyncReg;
use vpmu::MsrOutcome;

use super::runner::Runner;
use crate::error::{MachineError, Result};
use crate::kvm::{GuestDebug, GuestMem};
use crate::personality::Personality;
use crate::platform::paging_of;
use crate::translate::Paging;

/// The #GP vector.
const GP_VECTOR: u8 = 13;
/// Consecutive RDPMCs performed at one step exit at most (the next one runs in the guest).
const MAX_CONSECUTIVE: usize = 64;
/// EFER.LMA.
const EFER_LMA: u64 = 1 << 10;
/// CR4.PCE.
const CR4_PCE: u64 = 1 << 8;

/// The length of the RDPMC at `rip` (None: not an RDPMC, or not readable), decoded in the code
/// size of `sync`'s CS.
pub(crate) fn rdpmc_at(mem: &GuestMem, sync: &kvm_sync_regs, rip: u64) -> Option<u64> {
    let mut bytes = [0u8; 15];
    // The instruction may end right before an unmapped page: read what its page holds first.
    let paging = paging_of(sync);
    let in_page = (0x1000 - (rip & 0xfff)).min(15) as usize;
    if !paging.read(mem, rip, &mut bytes[..in_page]) {
        return None;
    }
    if in_page < 15 {
        let _ = paging.read(mem, rip + in_page as u64, &mut bytes[in_page..]);
    }
    let bitness = if sync.sregs.cs.l != 0 && sync.sregs.efer & EFER_LMA != 0 {
        64
    } else if sync.sregs.cs.db != 0 {
        32
    } else {
        16
    };
    let insn = Decoder::with_ip(bitness, &bytes, rip, DecoderOptions::NONE).decode();
    (insn.code() == Code::Rdpmc).then(|| insn.len() as u64)
}

/// The exception frame of a long-mode handler entered with an error code, at its RSP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) error: u64,
    pub(crate) rip: u64,
    pub(crate) cs: u64,
    pub(crate) rflags: u64,
    pub(crate) rsp: u64,
}

/// The frame at linear address `rsp`, read through `paging`.
pub(crate) fn read_frame(mem: &GuestMem, paging: &Paging, rsp: u64) -> Option<Frame> {
    let mut bytes = [0u8; 40];
    if !paging.read(mem, rsp, &mut bytes) {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(std::array::from_fn(|b| bytes[8 * i + b]));
    Some(Frame {
        error: word(0),
        rip: word(1),
        cs: word(2),
        rflags: word(3),
        rsp: word(4),
    })
}

impl<P: Personality> Runner<'_, P> {
    /// The core's answer to an RDPMC with `ecx` at `cpl` (the vCPU at hand, this pCPU).
    fn core_rdpmc(&mut self, ecx: u32, cpl: u8) -> Result<MsrOutcome<u64>> {
        let pce = self.sync.sregs.cr4 & CR4_PCE != 0;
        let me = self.me;
        let mut p = self.parts();
        let Some(mut vcpu) = p.shared.vcpus.lock(me) else {
            return Ok(MsrOutcome::GeneralProtection);
        };
        p.shared
            .vpmu
            .rdpmc(&mut p.platform, p.pmu, &mut vcpu, ecx, cpl, pce)
            .map_err(|error| MachineError::Core {
                call: "rdpmc",
                error,
            })
    }

    /// Writes the general registers of `self.sync` back to the vCPU at its next entry (sync
    /// regs, marked dirty).
    pub(super) fn write_back_regs(&mut self) {
        *self.vcpu.fd.sync_regs_mut() = self.sync;
        self.vcpu.fd.set_sync_dirty_reg(SyncReg::Register);
    }

    /// Single-stepping, at a step exit: performs the RDPMCs at the RIP (each counted as a
    /// retired instruction), until another instruction is next or the core refuses one
    /// (#GP(0) injected). Returns how many were performed.
    pub(super) fn rdpmc_at_step(&mut self) -> Result<usize> {
        let mut done = 0;
        while done < MAX_CONSECUTIVE {
            let rip = self.sync.regs.rip;
            let Some(len) = rdpmc_at(&self.vm.mem, &self.sync, rip) else {
                break;
            };
            let cpl = (self.sync.sregs.cs.selector & 3) as u8;
            match self.core_rdpmc(self.sync.regs.rcx as u32, cpl)? {
                MsrOutcome::Handled(value) => {
                    self.sync.regs.rax = value & 0xffff_ffff;
                    self.sync.regs.rdx = value >> 32;
                    self.sync.regs.rip = rip + len;
                    self.write_back_regs();
                    // It retired (after its read, as on hardware): counted once, here; no
                    // step exit will report it.
                    self.retire_completed(rip);
                    self.next_rip = rip + len;
                    done += 1;
                }
                _ => {
                    self.inject_gp()?;
                    break;
                }
            }
        }
        Ok(done)
    }

    /// Injects #GP(0) at the next entry; the next step retires the handler's first instruction.
    fn inject_gp(&mut self) -> Result<()> {
        self.inject_exception(GP_VECTOR, Some(0))
    }

    /// Injects exception `vector` (with `error_code`, if it has one) at the next entry.
    pub(super) fn inject_exception(&mut self, vector: u8, error_code: Option<u32>) -> Result<()> {
        let mut events = self
            .vcpu
            .fd
            .get_vcpu_events()
            .map_err(MachineError::kvm("KVM_GET_VCPU_EVENTS"))?;
        events.exception.injected = 1;
        events.exception.nr = vector;
        events.exception.has_error_code = u8::from(error_code.is_some());
        events.exception.error_code = error_code.unwrap_or(0);
        self.vcpu
            .fd
            .set_vcpu_events(&events)
            .map_err(MachineError::kvm("KVM_SET_VCPU_EVENTS"))?;
        self.state.injected = Some(vector);
        Ok(())
    }

    /// What to install for an entry without single-stepping: the breakpoint on the #GP
    /// handler (long mode, an IDT that has vector 13) in DR0, and the host quirk's on the #PF
    /// handler in DR1 (`quirks`), else nothing.
    pub(super) fn unstepped_debug(&self) -> GuestDebug {
        let gp = self.long_mode_handler(GP_VECTOR);
        let pf = self
            .quirks
            .syscall_lands_at_cpl3
            .then(|| self.long_mode_handler(crate::quirks::PF_VECTOR))
            .flatten();
        if gp.is_none() && pf.is_none() {
            GuestDebug::Off
        } else {
            GuestDebug::Breakpoints([gp, pf])
        }
    }

    /// The handler of `vector` in a long-mode IDT that has it.
    pub(super) fn long_mode_handler(&self, vector: u8) -> Option<u64> {
        let s = &self.sync.sregs;
        if s.efer & EFER_LMA == 0 || u64::from(s.idt.limit) < 16 * u64::from(vector) + 15 {
            return None;
        }
        self.handler_address(vector).filter(|&h| h != 0)
    }

    /// The breakpoint on the #GP handler was hit: completes a faulting RDPMC (module docs), or
    /// arranges for the handler to run (one step over the breakpoint). Returns whether an
    /// RDPMC was completed.
    pub(super) fn rdpmc_at_gp_handler(&mut self) -> Result<bool> {
        let completed = self.complete_faulted_rdpmc()?;
        if !completed {
            self.stepping_over = true;
        }
        Ok(completed)
    }

    fn complete_faulted_rdpmc(&mut self) -> Result<bool> {
        let Some(frame) = read_frame(&self.vm.mem, &paging_of(&self.sync), self.sync.regs.rsp)
        else {
            return Ok(false);
        };
        let same_level = frame.cs == u64::from(self.sync.sregs.cs.selector);
        if frame.error != 0 || !same_level {
            return Ok(false);
        }
        let Some(len) = rdpmc_at(&self.vm.mem, &self.sync, frame.rip) else {
            return Ok(false);
        };
        let cpl = (frame.cs & 3) as u8;
        let MsrOutcome::Handled(value) = self.core_rdpmc(self.sync.regs.rcx as u32, cpl)? else {
            return Ok(false);
        };
        self.sync.regs.rax = value & 0xffff_ffff;
        self.sync.regs.rdx = value >> 32;
        self.sync.regs.rip = frame.rip + len;
        self.sync.regs.rsp = frame.rsp;
        self.sync.regs.rflags = frame.rflags;
        self.write_back_regs();
        self.retire_completed(frame.rip);
        self.next_rip = frame.rip + len;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_mode() -> kvm_sync_regs {
        let mut s = kvm_sync_regs::default();
        s.sregs.efer = 0x500;
        s.sregs.cs.l = 1;
        s
    }

    #[test]
    fn rdpmc_is_recognised_with_its_length() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        let s = long_mode();
        mem.write(0x1000, &[0x0f, 0x33, 0x90]).expect("in RAM");
        assert_eq!(rdpmc_at(&mem, &s, 0x1000), Some(2));
        assert_eq!(rdpmc_at(&mem, &s, 0x1001), None, "xor, not rdpmc");
        // RDMSR (0f 32) and WRMSR (0f 30) are not RDPMC.
        mem.write(0x2000, &[0x0f, 0x32, 0x0f, 0x30])
            .expect("in RAM");
        assert_eq!(rdpmc_at(&mem, &s, 0x2000), None);
        assert_eq!(rdpmc_at(&mem, &s, 0x2002), None);
        // Outside RAM: not readable, not an RDPMC.
        assert_eq!(rdpmc_at(&mem, &s, 1 << 20), None);
    }

    #[test]
    fn the_frame_is_read_in_order() {
        let mem = GuestMem::new(1 << 20).expect("memory");
        for (i, v) in [0u64, 0x40_1234, 0x8, 0x246, 0x7_fff0, 0x10]
            .iter()
            .enumerate()
        {
            mem.write_u64(0x5000 + 8 * i as u64, *v).expect("in RAM");
        }
        assert_eq!(
            read_frame(&mem, &Paging::default(), 0x5000),
            Some(Frame {
                error: 0,
                rip: 0x40_1234,
                cs: 0x8,
                rflags: 0x246,
                rsp: 0x7_fff0
            })
        );
        assert_eq!(read_frame(&mem, &Paging::default(), u64::MAX - 8), None);
    }
}
