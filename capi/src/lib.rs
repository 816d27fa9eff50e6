//! # vpmu-capi: the vPMU for hypervisors written in C
//!
//! A static library (`libvpmu_capi.a`) and a shared one (`libvpmu_capi.so`) with the header
//! `capi/include/vpmu.h` (generated from this crate by cbindgen:
//! `cargo run -p vpmu-capi --example gen_header`; the `header` test fails when the committed
//! header is stale). It wraps the same vendor-erased core a Rust integrator uses
//! (`Vpmu<VendorPmu>` of `vpmu-vendor-any`: the vendor chosen at run time from CPUID), so a
//! C caller never meets a generic. The C integrator's guide is `docs/integrating-c.md`.
//!
//! * [`handles`]: the opaque handles and their lifecycle: `vpmu` (one per host, made from
//!   CPUID and the platform's callback table), `vpmu_pcpu` (one per attached physical CPU,
//!   with its MSR bus), `vpmu_vcpu` (one per vCPU); the per-domain event filters.
//! * [`callbacks`]: the callback tables (MSR bus, CPUID, platform) and the data crossing them.
//! * [`entry`]: every entry point of the core: `vpmu_rdmsr`, `vpmu_wrmsr`, `vpmu_rdpmc`,
//!   `vpmu_context_switch`, `vpmu_handle_pmi`, `vpmu_control_op`, `vpmu_complete_request`,
//!   `vpmu_event_filter_changed`, `vpmu_teardown_vcpu`, `vpmu_lvtpc_delivery_done`.
//! * [`info`]: what a caller reads back: capabilities, MSR ranges, a vCPU's state.
//! * [`snapshot`]: a vCPU's PMU state as bytes: `vpmu_vcpu_snapshot` of a quiesced vCPU,
//!   `vpmu_vcpu_restore` into a fresh one (same PMU shape; every value validated).
//! * [`error`]: errors as a negative errno plus a typed reason ([`error::VpmuError`]); a panic
//!   never crosses the boundary: it is caught, reported, and poisons the vPMU.
//! * [`testing`]: a software machine (CPUID and PMUs of the four test shapes) for C tests.
//!
//! Every function states its thread-safety rule; in short, the `vpmu` handle is shared by all
//! threads, a `vpmu_pcpu` is driven only by its own CPU, one call at a time, and the library
//! locks each vCPU itself.
//!
//! Build with unwinding panics (the default): a panic is then caught at the boundary. Built
//! with `panic = "abort"`, a panic aborts the process instead (it still never unwinds into C).
#![deny(missing_docs)]

pub mod callbacks;
pub mod entry;
pub mod error;
pub mod handles;
pub mod info;
mod platform;
pub mod snapshot;
pub mod testing;

pub use callbacks::*;
pub use entry::*;
pub use error::*;
pub use handles::*;
pub use info::*;
pub use snapshot::*;
pub use testing::*;
