//! One module per fuzz target; each has a `run(&[u8])` and names its deep paths as
//! milestone constants (`crate::reached`).

pub mod core_world;
pub mod coverage_profile;
pub mod flush_verify;
pub mod guest_msr;
pub mod page_view;
pub mod profile_batch;
pub mod ring_producer;
pub mod ring_reader;
pub mod snapshot_decode;
