//! # vpmu-intel: the Intel architectural-PMU backend
//!
//! CPUID leaf 0xA enumeration, the MSR map, write legality, save/restore and overflow detection
//! for Intel PMUs. Filled in by the vendor-backend issue.
#![no_std]
#![deny(missing_docs)]
