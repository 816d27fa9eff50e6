//! # vpmu: the vendor-neutral virtual-PMU core
//!
//! Modes, features, per-vCPU state, context switch, guest MSR intercepts, PMI routing and the
//! control operations of the xenpmu ABI (`vpmu-abi`).
//!
//! * [`msr`]: MSR numbers and the hardware-access trait [`MsrBus`] (real MSRs behind the
//!   `hw-msr` feature, a software model, or a VMM).
//! * [`backend`]: the trait a vendor backend implements ([`PmuBackend`]), and the software PMU
//!   model trait ([`SoftwarePmu`]).
#![no_std]
#![deny(missing_docs)]

pub mod backend;
pub mod msr;

pub use backend::{
    AllowAll, ContextError, CounterSet, EventFilter, ExecMode, GuestPolicy, HwEvent, MsrOutcome,
    Overflow, PmuBackend, PmuCapabilities, RawEvent, SoftwarePmu, Vendor,
};
pub use msr::{CountingBus, Msr, MsrAccessStats, MsrBus, MsrFault};
pub use vpmu_abi as abi;
