//! The VMM's completions of what this host does not do for a kernel (`quirks`: what they are,
//! the evidence, and how each is detected). Each engages only where its probe found the quirk.

use kvm_bindings::{Msrs, kvm_msr_entry};

use super::runner::Runner;
use crate::error::{MachineError, Result};
use crate::kvm::flat_segment;
use crate::personality::Personality;
use crate::platform::paging_of;
use crate::quirks::{BP_VECTOR, FWAIT, INT3, MF_VECTOR};
use crate::rdpmc::read_frame;

const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
/// RFLAGS.RF.
const RFLAGS_RF: u64 = 1 << 16;
/// A #PF error code's user (U/S) and instruction-fetch (I/D) bits.
const PF_USER_FETCH: u64 = 0x14;
/// CR0.NE and the x87 status word's exception summary (ES).
const CR0_NE: u64 = 1 << 5;
const FSW_ES: u16 = 1 << 7;

/// How often each completion ran (`RunResult::completions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completions {
    /// SYSCALLs finished at the #PF handler.
    pub syscalls: u64,
    /// #PFs that were not a stranded SYSCALL (the handler ran after a step over it).
    pub page_faults_passed: u64,
    /// INT3s turned into #BP.
    pub int3: u64,
    /// FWAITs skipped (or turned into #MF).
    pub fwait: u64,
}

impl<P: Personality> Runner<'_, P> {
    /// `KVM_EXIT_INTERNAL_ERROR`: completes an INT3 or FWAIT the emulator could not run (if the
    /// probes found it cannot). Returns whether it did; anything else ends the run.
    pub(super) fn complete_unemulated(&mut self) -> Result<bool> {
        let rip = self.sync.regs.rip;
        let mut byte = [0u8];
        if !paging_of(&self.sync).read(&self.vm.mem, rip, &mut byte) {
            return Ok(false);
        }
        match byte[0] {
            INT3 if self.quirks.int3_unemulated => {
                // A trap: the handler's frame holds the address after it.
                self.sync.regs.rip = rip + 1;
                self.write_back_regs();
                self.inject_exception(BP_VECTOR, None)?;
                self.completions.int3 += 1;
                Ok(true)
            }
            FWAIT if self.quirks.fwait_unemulated => {
                let fpu = self
                    .vcpu
                    .fd
                    .get_fpu()
                    .map_err(MachineError::kvm("KVM_GET_FPU"))?;
                if fpu.fsw & FSW_ES != 0 && self.sync.sregs.cr0 & CR0_NE != 0 {
                    // A pending unmasked x87 exception: FWAIT faults with #MF.
                    self.inject_exception(MF_VECTOR, None)?;
                } else {
                    self.sync.regs.rip = rip + 1;
                    self.write_back_regs();
                }
                self.completions.fwait += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The breakpoint on the guest's #PF handler: a SYSCALL this host left at CPL3 is finished
    /// (`quirks`, item 1); any other #PF goes to the handler after a step over the breakpoint.
    pub(super) fn syscall_at_pf_handler(&mut self) -> Result<()> {
        if !self.complete_stranded_syscall()? {
            self.completions.page_faults_passed += 1;
            self.stepping_over = true;
        }
        Ok(())
    }

    fn complete_stranded_syscall(&mut self) -> Result<bool> {
        let paging = paging_of(&self.sync);
        let Some(frame) = read_frame(&self.vm.mem, &paging, self.sync.regs.rsp) else {
            return Ok(false);
        };
        if frame.cs & 3 != 3 || frame.error & PF_USER_FETCH != PF_USER_FETCH {
            return Ok(false);
        }
        let [star, lstar] = self.read_msrs([MSR_STAR, MSR_LSTAR])?;
        if frame.rip != lstar || lstar == 0 {
            return Ok(false);
        }
        // The register part of SYSCALL happened (RCX, R11, RFLAGS masked by FMASK, RIP): the
        // frame holds the user RSP and the masked RFLAGS. What is left is the privilege
        // change, and the #PF's delivery made it already: the vCPU is at the handler at CPL0
        // on the kernel's code segment. So the kernel is resumed at LSTAR from here, with the
        // user RSP and RFLAGS, as SYSCALL would have entered it. (Changing the privilege level
        // with KVM_SET_SREGS instead, from a user context, let the next CPL0 fetch of LSTAR
        // fault now and then on this host: a #PF pushed on the user stack, a double fault in
        // a forked child whose stack is copy-on-write.)
        let cs = ((star >> 32) & 0xfffc) as u16;
        self.sync.regs.rip = lstar;
        self.sync.regs.rsp = frame.rsp;
        self.sync.regs.rflags = frame.rflags & !RFLAGS_RF;
        self.write_back_regs();
        if self.sync.sregs.cs.selector & 0xfffc != cs {
            // A kernel whose #PF gate uses another code segment than SYSCALL's: load SYSCALL's.
            let mut sregs = self.sync.sregs;
            sregs.cs = flat_segment(cs, 0xb, true, 0);
            sregs.ss = flat_segment(cs + 8, 0x3, false, 0);
            self.vcpu
                .fd
                .set_sregs(&sregs)
                .map_err(MachineError::kvm("KVM_SET_SREGS"))?;
            self.sync.sregs = sregs;
        }
        self.completions.syscalls += 1;
        Ok(true)
    }

    /// The values of `indices` (KVM-handled MSRs).
    pub(crate) fn read_msrs<const N: usize>(&self, indices: [u32; N]) -> Result<[u64; N]> {
        let entries = indices.map(|index| kvm_msr_entry {
            index,
            ..Default::default()
        });
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| MachineError::Boot("MSR list".into()))?;
        let read = self
            .vcpu
            .fd
            .get_msrs(&mut msrs)
            .map_err(MachineError::kvm("KVM_GET_MSRS"))?;
        if read != N {
            return Err(MachineError::Boot(format!(
                "KVM_GET_MSRS read {read} of {N} MSRs"
            )));
        }
        let got = msrs.as_slice();
        Ok(std::array::from_fn(|i| got[i].data))
    }
}
