//! Port I/O, the x2APIC, interrupts, and the traced hardware bus of an inner pCPU.

use core::arch::asm;

use vpmu::msr::hardware::HardwareMsrBus;
use vpmu::{Msr, MsrBus, MsrFault};
use vpmu_guest_protocol::port;
use vpmu_guest_protocol::ring0::{self as proto, trace};

// ---------------------------------------------------------------------------------------------
// Port I/O, x2APIC, interrupts.

pub(crate) fn outl(port: u16, value: u32) {
    // SAFETY: a port write to the VMM; CPL0; no memory is touched.
    unsafe { asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack)) };
}

pub(crate) fn trace_word(kind: u32, op: u32, pcpu: u32, vcpu: u32) {
    outl(port::TRACE, trace(kind, op, pcpu, vcpu));
}

/// RDMSR/WRMSR of the local APIC's x2APIC registers (never PMU MSRs: KVM's in-kernel LAPIC
/// answers them).
pub(crate) fn apic_write(msr: u32, value: u64) {
    // SAFETY: an x2APIC register of this CPU (x2APIC mode is on: ring0.c), CPL0.
    unsafe { x86::msr::wrmsr(msr, value) };
}

pub(crate) const X2APIC_EOI: u32 = 0x80b;
pub(crate) const X2APIC_LVTPC: u32 = 0x834;
pub(crate) const X2APIC_ICR: u32 = 0x830;
pub(crate) const PMI_VECTOR: u64 = 0x40;
pub(crate) const LVT_MASKED: u64 = 1 << 16;

/// Runs `f` with interrupts off, restoring IF after.
pub(crate) fn without_interrupts<R>(f: impl FnOnce() -> R) -> R {
    let flags: u64;
    // SAFETY: reads RFLAGS and clears IF; CPL0.
    unsafe { asm!("pushfq", "pop {}", "cli", out(reg) flags, options(nomem)) };
    let r = f();
    if flags & 0x200 != 0 {
        // SAFETY: sets IF again as it was; CPL0.
        unsafe { asm!("sti", options(nomem, nostack)) };
    }
    r
}

/// Lets pending interrupts in (IPIs, PMIs) and waits a little.
pub(crate) fn relax() {
    // SAFETY: `sti; pause` at CPL0: interrupts may run their handlers here.
    unsafe { asm!("sti", "pause", "pause", options(nomem, nostack)) };
}

/// The measured loop: `n` × (`dec; jnz`), 2n instructions (n ≥ 1).
#[inline(never)]
pub(crate) fn spin(n: u64) {
    // SAFETY: a register-only loop.
    unsafe {
        asm!("2:", "dec {0}", "jnz 2b", inout(reg) n => _, options(nomem, nostack));
    }
}

pub(crate) fn x2apic_id() -> u32 {
    // SAFETY: the x2APIC ID register of this CPU (x2APIC mode is on), CPL0.
    (unsafe { x86::msr::rdmsr(0x802) }) as u32
}

// ---------------------------------------------------------------------------------------------
// The hardware bus of an inner pCPU, traced.

/// `HardwareMsrBus` of inner pCPU `pcpu`, which tells the VMM before each access which inner
/// pCPU's bus makes it (the VMM compares with the vCPU the MSR exit comes from) and counts its
/// accesses.
#[derive(Debug)]
pub struct TracedBus {
    pub(crate) pcpu: u32,
    pub(crate) hw: HardwareMsrBus,
    pub(crate) accesses: u64,
}

impl MsrBus for TracedBus {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        trace_word(proto::TRACE_OWNER, 0, self.pcpu, 0);
        self.accesses += 1;
        self.hw.read(msr)
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        trace_word(proto::TRACE_OWNER, 0, self.pcpu, 0);
        self.accesses += 1;
        self.hw.write(msr, value)
    }
}
