//! The precise event source: each single-stepped instruction, decoded with iced-x86, is fed
//! to the pCPU's model as `Instructions` (+ `Branches` for any control transfer).

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use super::runner::Runner;
use crate::kvm::GuestMem;
use crate::personality::Personality;

impl<P: Personality> Runner<'_, P> {
    /// One instruction retired (single-step): decode it and feed this pCPU's model.
    pub(super) fn retire(&mut self) {
        let rip = match self.state.injected.take() {
            // The first instruction after an injected interrupt is its handler's.
            Some(vector) => self.handler_address(vector).unwrap_or(self.next_rip),
            None => self.next_rip,
        };
        let branch = self.is_branch(rip);
        let cpl = (self.sync.sregs.cs.selector & 3) as u8;
        let mode = ExecMode { cpl, host: false };
        let model = self.model();
        model.count(HwEvent::Instructions, 1, mode);
        if branch {
            model.count(HwEvent::Branches, 1, mode);
        }
    }

    pub(super) fn is_branch(&self, rip: u64) -> bool {
        // A private copy of the instruction's bytes (the longest x86 instruction).
        let mut bytes = [0u8; 15];
        if self.vm.mem.read(rip, &mut bytes).is_err() {
            return false;
        }
        let mut decoder = Decoder::with_ip(64, &bytes, rip, DecoderOptions::NONE);
        let insn = decoder.decode();
        !matches!(
            insn.flow_control(),
            FlowControl::Next | FlowControl::Exception
        )
    }

    /// The entry point of IDT vector `vector` (64-bit gates).
    pub(super) fn handler_address(&self, vector: u8) -> Option<u64> {
        handler_address(&self.vm.mem, self.sync.sregs.idt.base, vector)
    }
}

/// The entry point of vector `vector`'s 64-bit gate in the IDT at `idt_base` (guest-chosen):
/// None if the gate's address overflows or the gate is not all inside RAM (the handler is
/// unknown; the caller attributes the step as if nothing had been injected).
fn handler_address(mem: &GuestMem, idt_base: u64, vector: u8) -> Option<u64> {
    let gate = idt_base.checked_add(16 * u64::from(vector))?;
    let mut bytes = [0u8; 16];
    mem.read(gate, &mut bytes).ok()?;
    let [lo, hi] = [0, 8].map(|at| u64::from_le_bytes(std::array::from_fn(|i| bytes[at + i])));
    Some((lo & 0xffff) | ((lo >> 32) & 0xffff_0000) | ((hi & 0xffff_ffff) << 32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvm::MEM_SIZE;

    #[test]
    fn idt_gate_address_overflow_or_outside_ram_is_no_handler() {
        let mem = GuestMem::new(MEM_SIZE).expect("memory");
        // A 64-bit interrupt gate for vector 0x40 at IDT 0x1000: offset 0x1234_5678_9abc_def0.
        let gate = 0x1000 + 16 * 0x40;
        mem.write_u64(gate, 0x9abc_8e00_0008_def0).expect("in RAM");
        mem.write_u64(gate + 8, 0x1234_5678).expect("in RAM");
        assert_eq!(
            handler_address(&mem, 0x1000, 0x40),
            Some(0x1234_5678_9abc_def0)
        );
        // The guest chooses the base: base + 16 * vector wraps (no panic, no wrap to low RAM).
        assert_eq!(handler_address(&mem, u64::MAX - 0x3ff, 0x40), None);
        assert_eq!(handler_address(&mem, u64::MAX, 0xff), None);
        // Outside RAM, and a gate straddling the end of RAM.
        assert_eq!(handler_address(&mem, MEM_SIZE as u64, 0), None);
        assert_eq!(handler_address(&mem, MEM_SIZE as u64 - 8, 0), None);
    }
}
