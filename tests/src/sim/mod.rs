//! A deterministic machine simulator for the vpmu core.
//!
//! * [`vendor`]: the vendor shapes ([`SimVendor`]: backend, one software PMU model per pCPU) and
//!   the guest perf driver ([`Driver`]: MSR numbers and values, page access).
//! * [`platform`]: [`SimPlatform`], the hypervisor services the core calls.
//! * [`machine`]: [`Machine`], the core over P pCPUs with its vCPU table; retires one guest
//!   instruction at a time and takes the PMIs the models raise.
//! * [`workload`]: domains with named functions, synthetic instruction streams.
//! * [`truth`]: the ground-truth counter model, independent of the core and the backends.
//! * [`plan`]: what a guest's perf driver programs, vendor-independent and resolved.
//! * [`guest`], [`world`]: the guests (perf driver set-up, PMI handlers through the page or the
//!   virtual LVTPC, counter reads) and [`World`], which runs a [`Scenario`] (a schedule of
//!   vCPUs on pCPUs interleaved with guest actions), predicts every PMI from the ground truth
//!   and checks the machine against the prediction.
//! * [`helpers`]: guest actions on a bare [`Machine`] for step-by-step suites.
//! * [`corrupt`]: vendor areas each vendor's rules certainly refuse.
//! * [`snapshot`]: the observable state an operation that fails must leave unchanged.
//! * [`strategies`]: proptest strategies for scenarios.

pub mod corrupt;
pub mod guest;
pub mod helpers;
pub mod machine;
pub mod plan;
pub mod platform;
pub mod snapshot;
pub mod strategies;
pub mod truth;
pub mod vendor;
pub mod workload;
pub mod world;

pub use guest::Guest;
pub use machine::{Machine, PmiRecord, SimVcpus};
pub use plan::{CounterSpec, GuestPlan, PlanSpec};
pub use platform::{SimFilter, SimPlatform, guest_frame};
pub use snapshot::Snapshot;
pub use truth::{CounterSetup, SimEvent, TruthPmu};
pub use vendor::{AmdSetup, Driver, IntelSetup, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};
pub use workload::{Instruction, Run};
pub use world::{Sample, Scenario, Step, Timing, World};
