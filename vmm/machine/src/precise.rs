//! The precise event source: each single-stepped instruction, decoded with iced-x86, is fed
//! to the pCPU's model as `Instructions` (+ `Branches` for any control transfer) and as one
//! unhalted core cycle: the source's cycle model is one cycle per retired instruction (time
//! measured in instructions, as QEMU's `-icount` measures it). Deterministic, and never a
//! cycle for a vCPU that is halted (it retires nothing). Reference cycles stay unavailable:
//! they tick at the TSC's rate, which this model has no honest value for.

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use super::runner::Runner;
use crate::kvm::GuestMem;
use crate::personality::{Personality, Source};
use crate::translate::Paging;

impl<P: Personality> Runner<'_, P> {
    /// A step exit at `pc`: the instruction at the previous step's `pc` (`next_rip`) retired;
    /// decode it and feed this pCPU's model.
    ///
    /// This host's KVM does not report every retired instruction with its own step exit: the
    /// step of an MFENCE is lost (kvm-unit-tests' `clflush; mfence; mov` loop prologue: one
    /// instruction fewer than ran, every time), so a step exit can follow two instructions.
    /// The exit's `pc` tells: when the instruction at `next_rip` falls through to another
    /// instruction and a straight line of at most `MAX_UNREPORTED + 1` instructions leads from
    /// `next_rip` to `pc`, every one of them retired and each is counted once. Anything else (a
    /// taken branch, an exception or interrupt entering its handler, a REP iteration) counts
    /// the one instruction, as before.
    pub(super) fn retire(&mut self, pc: u64) {
        let rip = match self.state.injected.take() {
            // The first instruction after an injected interrupt is its handler's.
            Some(vector) => self.handler_address(vector).unwrap_or(self.next_rip),
            None => self.next_rip,
        };
        let (retired, count) = straight_line(&self.vm.mem, rip, pc);
        let cpl = (self.sync.sregs.cs.selector & 3) as u8;
        let mode = ExecMode { cpl, host: false };
        let model = self.model();
        for &(_, branch) in &retired[..count] {
            count_retired(model, branch, mode);
        }
    }

    /// An instruction at `rip` that the VMM completed on the guest's behalf (it never ran, so
    /// no step exit reports it) retired: counted here, once, as `retire` counts the others.
    pub(super) fn retire_completed(&mut self, rip: u64) {
        if self.personality.source() != Source::Precise {
            // The timed source counts no instructions.
            return;
        }
        let branch = self.is_branch(rip);
        let mode = ExecMode {
            cpl: (self.sync.sregs.cs.selector & 3) as u8,
            host: false,
        };
        count_retired(self.model(), branch, mode);
    }

    pub(super) fn is_branch(&self, rip: u64) -> bool {
        decode(&self.vm.mem, rip).is_some_and(|(_, branch)| branch)
    }

    /// The entry point of IDT vector `vector` (64-bit gates), the IDT read through the
    /// guest's page tables (a kernel's IDT is at a virtual address).
    pub(super) fn handler_address(&self, vector: u8) -> Option<u64> {
        let paging = super::platform::paging_of(&self.sync);
        handler_address(&self.vm.mem, &paging, self.sync.sregs.idt.base, vector)
    }
}

/// One retired instruction, as the precise source counts it: an instruction, a branch if it is
/// a control transfer, and one unhalted core cycle.
fn count_retired<M: SoftwarePmu>(model: &mut M, branch: bool, mode: ExecMode) {
    model.count(HwEvent::Instructions, 1, mode);
    if branch {
        model.count(HwEvent::Branches, 1, mode);
    }
    model.count(HwEvent::CoreCycles, 1, mode);
}

/// Instructions a step exit may follow without their own step exit (`Runner::retire`).
const MAX_UNREPORTED: usize = 1;

/// The instructions that retired from `rip` to a step exit at `pc` (`Runner::retire`): the
/// straight line of non-branch instructions from `rip` whose last falls through to `pc` (its last
/// may be a branch not taken), of at most `MAX_UNREPORTED + 1`; else the one at `rip`. Each
/// with whether it is a control transfer; the count of valid entries.
fn straight_line(mem: &GuestMem, rip: u64, pc: u64) -> ([(u64, bool); MAX_UNREPORTED + 1], usize) {
    let mut line = [(rip, false); MAX_UNREPORTED + 1];
    let mut at = rip;
    for i in 0..=MAX_UNREPORTED {
        let Some((len, branch)) = decode(mem, at) else {
            break;
        };
        line[i] = (at, branch);
        if at + len == pc {
            return (line, i + 1);
        }
        if branch {
            break;
        }
        at += len;
    }
    line[0].1 = decode(mem, rip).is_some_and(|(_, branch)| branch);
    (line, 1)
}

/// The length of the 64-bit instruction at `rip` and whether it is a control transfer (None:
/// not readable or not an instruction).
fn decode(mem: &GuestMem, rip: u64) -> Option<(u64, bool)> {
    // A private copy of the instruction's bytes (the longest x86 instruction).
    let mut bytes = [0u8; 15];
    mem.read(rip, &mut bytes).ok()?;
    let insn = Decoder::with_ip(64, &bytes, rip, DecoderOptions::NONE).decode();
    if insn.is_invalid() {
        return None;
    }
    let branch = !matches!(
        insn.flow_control(),
        FlowControl::Next | FlowControl::Exception
    );
    Some((insn.len() as u64, branch))
}

/// The entry point of vector `vector`'s 64-bit gate in the IDT at `idt_base` (guest-chosen):
/// None if the gate's address overflows or the gate is not all inside RAM (the handler is
/// unknown; the caller attributes the step as if nothing had been injected).
fn handler_address(mem: &GuestMem, paging: &Paging, idt_base: u64, vector: u8) -> Option<u64> {
    let gate = idt_base.checked_add(16 * u64::from(vector))?;
    let mut bytes = [0u8; 16];
    if !paging.read(mem, gate, &mut bytes) {
        return None;
    }
    let [lo, hi] = [0, 8].map(|at| u64::from_le_bytes(std::array::from_fn(|i| bytes[at + i])));
    Some((lo & 0xffff) | ((lo >> 32) & 0xffff_0000) | ((hi & 0xffff_ffff) << 32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::MEM_SIZE;

    #[test]
    fn a_step_exit_after_two_straight_instructions_retires_both() {
        let mem = GuestMem::new(MEM_SIZE).expect("memory");
        // 0x1000: mfence (0f ae f0); 0x1003: mov (%rsi),%r12 (4c 8b 26); 0x1006: jz +1 (74 01);
        // 0x1008: nop; 0x1009: nop.
        mem.write(
            0x1000,
            &[0x0f, 0xae, 0xf0, 0x4c, 0x8b, 0x26, 0x74, 0x01, 0x90, 0x90],
        )
        .expect("in RAM");
        let count = |rip, pc| straight_line(&mem, rip, pc).1;
        assert_eq!(count(0x1000, 0x1003), 1, "the step of each");
        assert_eq!(count(0x1000, 0x1006), 2, "mfence's step lost: both retired");
        assert_eq!(count(0x1000, 0x1008), 1, "too far: one, as before");
        // A taken branch whose target is the next instruction's successor: only the branch.
        assert_eq!(count(0x1006, 0x1009), 1);
        let (line, n) = straight_line(&mem, 0x1003, 0x1008);
        assert_eq!(
            (n, line[1]),
            (2, (0x1006, true)),
            "a branch not taken ends the line"
        );
        // An exception or interrupt entering a handler: the one instruction.
        assert_eq!(count(0x1000, 0x5000), 1);
    }

    #[test]
    fn idt_gate_address_overflow_or_outside_ram_is_no_handler() {
        let mem = GuestMem::new(MEM_SIZE).expect("memory");
        // A 64-bit interrupt gate for vector 0x40 at IDT 0x1000: offset 0x1234_5678_9abc_def0.
        let gate = 0x1000 + 16 * 0x40;
        mem.write_u64(gate, 0x9abc_8e00_0008_def0).expect("in RAM");
        mem.write_u64(gate + 8, 0x1234_5678).expect("in RAM");
        assert_eq!(
            handler_address(&mem, &Paging::default(), 0x1000, 0x40),
            Some(0x1234_5678_9abc_def0)
        );
        // The guest chooses the base: base + 16 * vector wraps (no panic, no wrap to low RAM).
        assert_eq!(
            handler_address(&mem, &Paging::default(), u64::MAX - 0x3ff, 0x40),
            None
        );
        assert_eq!(
            handler_address(&mem, &Paging::default(), u64::MAX, 0xff),
            None
        );
        // Outside RAM, and a gate straddling the end of RAM.
        assert_eq!(
            handler_address(&mem, &Paging::default(), MEM_SIZE as u64, 0),
            None
        );
        assert_eq!(
            handler_address(&mem, &Paging::default(), MEM_SIZE as u64 - 8, 0),
            None
        );
    }
}
