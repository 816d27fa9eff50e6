//! The I/O ports through which a guest talks to the machine (CPL0 only on this host's KVM;
//! see the guest runtime's `rt.h`). Ports not listed here go to the consumer's
//! `GuestPorts` extension.

/// Console: one byte per `outb`.
pub const CONSOLE: u16 = 0xE9;
/// Exit status: `outl` ends the run with that status.
pub const EXIT: u16 = 0x10;
/// Control-operation hypercall: `inl` with EDI = op, RSI = parameter block GPA; EAX = result.
pub const HYPERCALL: u16 = 0x11;
/// VMM control (benchmark): `outl` 1 = answer PMU MSRs with the null handler, 0 = the vpmu.
pub const CONTROL: u16 = 0x12;
/// Migration (SMP cases): `inl` waits for every vCPU, moves each to the next pCPU, and
/// returns the new pCPU index.
pub const MIGRATE: u16 = 0x13;
/// Slices: `inl` returns how many times this vCPU has been scheduled in (on a shared pCPU,
/// one per time slice; 1 on its own thread).
pub const SLICES: u16 = 0x14;
/// PMI context: `inl` returns the interrupted context the VMM recorded for the last PMI
/// it delivered to this vCPU (`Platform::interrupted`, from sync regs): RIP bits 0..29 |
/// CPL << 30; `u32::MAX` before any.
pub const PMI_CONTEXT: u16 = 0x15;
/// Yield: `outl` gives the pCPU up until the vCPU's next turn (on a shared pCPU the slice
/// ends; on its own thread nothing happens). A hypervisor's "block until an event".
pub const YIELD: u16 = 0x17;
