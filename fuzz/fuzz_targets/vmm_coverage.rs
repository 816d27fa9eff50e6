//! The VMM's raw-profile parser, compiled from its source (the VMM is a binary crate).
#[path = "../../vmm/src/coverage/profraw.rs"]
pub mod profraw;
