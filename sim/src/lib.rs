//! # vpmu-sim: a deterministic machine simulator for the vpmu core
//!
//! The core over P pCPUs with both vendors' software PMU models (`vpmu-models`), guests with
//! perf drivers, and a ground truth to check every count and PMI against. The suites that use it
//! are the `sim_*` tests of `vpmu-tests`, and its concurrent stress runner (`vpmu_tests::smp`).
//!
//! * [`vendor`]: the vendor shapes ([`SimVendor`], implemented by the test shapes of
//!   `vpmu_models::shapes`: backend, one software PMU model per pCPU) and the guest perf
//!   driver ([`Driver`]: MSR numbers and values, page access).
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
//! * [`ring`]: the sample ring (ABI 1.4): the platform's ring services over guest memory, a
//!   check of every record write against the unread bytes, and the guest's consumer.
//! * [`ring_world`]: [`ring_world::RingWorld`], profilers sampling through rings under
//!   consumers slow, hostile or absent, with the ring's invariants checked at every step.
//! * [`migrate`]: a vCPU moved between machines as a VMM does (the vPMU snapshot and the
//!   VMM's own state), and the guest's view of its PMU.
//! * [`snapshot`]: the observable state an operation that fails must leave unchanged.
//! * [`strategies`]: proptest strategies for scenarios.
#![deny(missing_docs)]

pub mod corrupt;
pub mod guest;
pub mod helpers;
pub mod machine;
pub mod migrate;
pub mod plan;
pub mod platform;
pub mod ring;
pub mod ring_world;
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
pub use vendor::{Driver, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};
pub use vpmu_models::shapes::{AmdShape, IntelShape, Shape};
pub use workload::{Instruction, Run};
pub use world::{Sample, Scenario, Step, Timing, World};
