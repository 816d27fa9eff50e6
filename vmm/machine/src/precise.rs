//! The precise event source: each single-stepped instruction, decoded with iced-x86, is fed
//! to the pCPU's model as `Instructions` (+ `Branches` for any control transfer).

use iced_x86::{Decoder, DecoderOptions, FlowControl};
use vpmu::{ExecMode, HwEvent, SoftwarePmu};

use super::runner::Runner;
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
        let Some(bytes) = self.vm.mem.slice_mut(rip, 15) else {
            return false;
        };
        let mut decoder = Decoder::with_ip(64, bytes, rip, DecoderOptions::NONE);
        let insn = decoder.decode();
        !matches!(
            insn.flow_control(),
            FlowControl::Next | FlowControl::Exception
        )
    }

    /// The entry point of IDT vector `vector` (64-bit gates).
    pub(super) fn handler_address(&self, vector: u8) -> Option<u64> {
        let gate = self.sync.sregs.idt.base + 16 * u64::from(vector);
        let lo = self.vm.mem.read_u64(gate)?;
        let hi = self.vm.mem.read_u64(gate + 8)?;
        Some((lo & 0xffff) | ((lo >> 32) & 0xffff_0000) | ((hi & 0xffff_ffff) << 32))
    }
}
