//! The reference VMM's guest programs, built by `build.rs` from the C sources beside this
//! crate into static ELF executables linked at 1 MiB (`runtime/link.ld`), embedded here.
//!
//! * `runtime/`: what every guest shares: the entry (`start.S`), the CPL3 switch (`user.S`),
//!   console, IDT and LAPIC helpers (`rt.c`, `rt.h`), and the guest's vPMU driver (`driver.c`,
//!   `pmu.h`).
//! * `selftest/`: the conformance cases (`PMU`, `COMPAT`) and the MSR-exit benchmark (`BENCH`).
//! * `profile/`: the profiling and workload domains of `vpmu profile` (`PROFILER`, `WORK`) and
//!   an example user guest (`EXAMPLE`) and a hostile one (`HOSTILE`).
//! * `coverage/`: the guest side of `vpmu coverage` (`COVERAGE`).
//! * `ring0/`: an inner hypervisor built from the vpmu crates at guest CPL0 on two vCPUs
//!   (`RING0`, run by `vpmu-ring0`).
#![deny(missing_docs)]

/// The PMU conformance cases (`selftest/pmu.c`): entry argument = case index.
pub static PMU: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pmu.elf"));

/// The compat32 case (`selftest/compat64.c` + the `-m32` consumer `selftest/compat32.c` at
/// 0x200000); empty if the 32-bit consumer could not be built (see `build.rs`).
pub static COMPAT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/compat.elf"));

/// The profiling domain of `vpmu profile` (`profile/profiler.c`).
pub static PROFILER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/profiler.elf"));

/// The built-in workload domains of `vpmu profile` (`profile/work.c`, `profile/work_loops.S`).
pub static WORK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/work.elf"));

/// An example of a user's own guest for `vpmu profile --guest` (`profile/example.c`).
pub static EXAMPLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/example.elf"));

/// A hostile workload domain for `vpmu profile --guest` (`profile/hostile.c`,
/// `profile/hostile_ring.c`): attacks the interface from inside what a guest may do, on every
/// vCPU, and ends its vCPU's run with status 0xbad at the first outcome the ABI rules out.
/// Entry RDI: bits 31-0 the rounds per vCPU (0: until stopped), bits 39-32 a mode that domain
/// 0 sets (the machine-level test; `vpmu profile` passes 0).
pub static HOSTILE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile.elf"));

/// The guest side of `vpmu coverage` (`coverage/coverage.c`).
pub static COVERAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/coverage.elf"));

/// The MSR-exit cost benchmark (`selftest/bench.c`).
pub static BENCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bench.elf"));

/// The ring-0 guest (`ring0/ring0.c` + the inner hypervisor `ring0/hv`, a Rust staticlib over
/// the vpmu crates with the hardware MSR bus); empty if the staticlib could not be built here
/// (see `build.rs`).
pub static RING0: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ring0.elf"));
