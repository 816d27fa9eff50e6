//! The I/O ports through which a guest talks to the machine (CPL0 only on this host's KVM).
//! The numbers come from `vpmu-guest-protocol` (the guests' `guest_protocol.h` is generated
//! from the same constants). The machine serves the ports below; every other `outl` goes to
//! the consumer's `GuestPorts` extension (`vpmu_guest_protocol::port::BATCH`,
//! `vpmu_guest_protocol::port::RESULT`, ...).

pub use vpmu_guest_protocol::port::{
    CONSOLE, CONTROL, EXIT, HYPERCALL, MIGRATE, PMI_CONTEXT, SLICES, START, YIELD,
};
