//! `vpmu profile`.
pub mod protocol;
pub mod report;
pub mod sample;
pub mod symbols;
