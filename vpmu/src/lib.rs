//! # vpmu: the vendor-neutral virtual-PMU core
//!
//! Modes, features, per-vCPU state, context switch, guest MSR intercepts, PMI routing and the
//! control operations of the xenpmu ABI (`vpmu-abi`). The machinery arrives with the issues
//! that build it; for now the crate re-exports the ABI it is built on.
#![no_std]
#![deny(missing_docs)]

pub use vpmu_abi as abi;
