//! Shared helpers for the integration tests: building the C test programs against the
//! generated header, the deterministic pages the cross-language tests exchange, and the
//! deterministic machine simulator ([`sim`]) that drives the vpmu core with both vendors'
//! software PMU models.
#![deny(missing_docs)]

pub mod c_build;
pub mod pattern_page;
pub mod sim;
