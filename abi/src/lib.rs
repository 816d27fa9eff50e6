//! # vpmu-abi: the xenpmu shared-page ABI
//!
//! One 4 KiB page per vCPU, shared between a hypervisor's virtual PMU and the profiler of the
//! guest that owns the vCPU; plus the parameter block and constants of the control operations.
//! `docs/abi.md` in the repository is the specification; this crate is its Rust form, and
//! `abi/include/xenpmu.h` (generated from it) is its C form.
//!
//! * [`page`]: the page (`Page`) with its version header at offset 0, sample identity, flags,
//!   virtual LVTPC and the full 64-bit register set of the sampled context.
//! * [`vendor`]: the Intel and AMD counter contexts, whose banks are found through offsets the
//!   hypervisor writes.
//! * [`ops`]: control-operation numbers, parameters, mode and feature bits, errors.
//! * [`ring`]: the sample ring (1.4): control page, record layouts and their constants;
//!   [`ring_reader`] checks a ring and reads its records, [`ring_encode`] writes them.
//! * [`consumer`]: a checked view for the guest side; [`writer`]: helpers for the hypervisor.
//! * [`layout`]: every struct and field with its size and offset, for generators and tests.
//!
//! All structs are `#[repr(C)]`, little-endian, with explicit padding; every `u64` is at an
//! 8-aligned offset, so 32-bit and 64-bit consumers see the same layout. The sizes and offsets
//! are asserted at compile time.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!("the xenpmu ABI is little-endian (x86); this crate reads it in native byte order");

mod asserts;
pub mod consumer;
pub mod error;
pub mod layout;
pub mod ops;
pub mod page;
pub mod ring;
pub mod ring_encode;
pub mod ring_reader;
pub mod transport;
pub mod vendor;
pub mod writer;

pub use consumer::{AmdView, IntelView, PageView, PageViewMut};
pub use error::*;
pub use ops::*;
pub use page::*;
pub use ring::*;
pub use ring_encode::{EncodeError, append_record, encode_lost, encode_pad, encode_sample};
pub use ring_reader::*;
pub use vendor::*;
pub use writer::VendorLayout;
