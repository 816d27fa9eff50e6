//! # vpmu-amd: the AMD PMU backend
//!
//! Enumeration (K7, PerfCtrExtCore, PerfMonV2), the MSR map, write legality, save/restore and
//! overflow detection for AMD PMUs. Filled in by the vendor-backend issue.
#![no_std]
#![deny(missing_docs)]
