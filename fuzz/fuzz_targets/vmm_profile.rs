//! The VMM's `profile` modules the fuzz targets need, compiled from their sources (the VMM is
//! a binary crate, so they cannot be imported).
#[path = "../../vmm/src/profile/protocol.rs"]
pub mod protocol;
#[path = "../../vmm/src/profile/sample.rs"]
pub mod sample;
#[path = "../../vmm/src/profile/symbols.rs"]
pub mod symbols;
