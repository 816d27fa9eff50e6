//! # vpmu: the vendor-neutral virtual-PMU core
//!
//! Modes, features, per-vCPU state, context switch, guest MSR intercepts, PMI routing and the
//! control operations of the xenpmu ABI (`vpmu-abi`, specified in `docs/abi.md`).
//!
//! * [`msr`]: MSR numbers and the hardware-access trait [`MsrBus`] (real MSRs behind the
//!   `hw-msr` feature, a software model, or a VMM).
//! * [`backend`]: the trait a vendor backend implements ([`PmuBackend`]).
//! * [`bank`]: the save/load/overflow loops over counter banks that both vendor backends
//!   drive with their own MSR map ([`bank::BankMap`]).
//! * [`platform`]: what the integrating hypervisor provides ([`Platform`]).
//! * [`filter`]: per-domain allow/deny event lists with KVM's PMU-event-filter semantics.
//! * [`snapshot`]: a vCPU's PMU state as data ([`VcpuSnapshot`]), taken on a quiesced vCPU
//!   and restored on another host or pCPU through the backends' WRMSR validators.
//! * [`Vpmu`]: the global state and the entry points: [`Vpmu::rdmsr`]/[`Vpmu::wrmsr`]
//!   (intercepts), [`Vpmu::context_switch`], [`Vpmu::handle_pmi`], [`Vpmu::control_op`],
//!   [`Vpmu::teardown_vcpu`]. Per-vCPU state is a [`VcpuPmu`], per-pCPU state a [`PcpuPmu`],
//!   both owned by the integrator; the core allocates nothing.
#![no_std]
// The only unsafe code is RDMSR/WRMSR in `msr::hardware` (the `hw-msr` feature) and the
// profile runtime's calls in `coverage` (the `coverage` feature).
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod backend;
pub mod bank;
mod callchain;
mod core;
// The profile runtime's entry points are unsafe FFI (the `coverage` feature only).
#[allow(unsafe_code)]
mod coverage;
pub mod filter;
mod intercept;
pub mod msr;
mod ops;
pub mod platform;
mod pmi;
mod rearm;
pub mod request;
mod ring;
mod ring_ops;
pub mod snapshot;
mod state;
mod switch;
mod teardown;

pub use crate::core::{CoreError, DetachRefused, Mode, PolicySnapshot, VcpuTable, Vpmu};
pub use backend::{
    AllowAll, BackendError, ContextError, CounterIndex, CounterSet, EventFilter, GuestPolicy,
    Indices, MsrOutcome, Overflow, PmuBackend, PmuCapabilities, PublishedImages, RawEvent,
    RearmPeriods, Vendor, rearm_value,
};
pub use bank::HwRecord;
pub use filter::{EventList, EventMatch, FilterAction, ListFull};
pub use msr::{CountingBus, Msr, MsrAccessStats, MsrBus, MsrFault};
pub use platform::{
    Diagnostic, Interrupted, Interruption, LvtpcDelivery, MapError, PageSlot, Platform, RingSlot,
    SampledContext, VcpuId,
};
pub use pmi::PmiOutcome;
pub use request::{ChangeRefused, Completion, CrossCpuRequest};
pub use ring::ProducerCounters;
pub use snapshot::{
    DecodeError, EncodeError, RestoreError, SnapshotBackend, SnapshotState, TakeError, VcpuSnapshot,
};
pub use state::{PcpuPmu, RingStatus, SampleSource, SystemContext, VcpuPmu, VcpuState, VcpuStats};
pub use vpmu_abi as abi;
