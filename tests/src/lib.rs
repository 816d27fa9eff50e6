//! Shared helpers for the integration tests: building the C test programs against the
//! generated header, and the deterministic pages the cross-language tests exchange.
#![deny(missing_docs)]

pub mod c_build;
pub mod pattern_page;
