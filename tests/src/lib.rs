//! Shared helpers for the integration tests.
#![deny(missing_docs)]
