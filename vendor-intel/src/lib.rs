//! # vpmu-intel: the Intel architectural-PMU backend
//!
//! [`IntelPmu`] implements the core's [`vpmu::PmuBackend`] for Intel architectural performance
//! monitoring versions 2–5: enumeration ([`IntelCaps`], from CPUID leaf 0xA through raw-cpuid
//! and IA32_PERF_CAPABILITIES), the MSR map ([`msrs`]), what a guest may write ([`GuestRules`]),
//! save/restore and overflow collection, and the shared page's vendor area.
//! [`IntelCaps::guest_leaf_0xa`] gives the CPUID leaf that describes the PMU to a guest. (A
//! software PMU that behaves like the hardware, and a synthetic CPUID for any PMU shape, are in
//! the `vpmu-models` crate.)
//!
//! ```
//! use vpmu_intel::raw_cpuid::CpuIdResult;
//! use vpmu_intel::{IntelCaps, IntelPmu};
//!
//! // The CPUID to enumerate: on the host, `raw_cpuid::CpuIdReaderNative`; here a closure over
//! // (leaf, subleaf) describing a "GenuineIntel" CPU whose highest basic leaf is 0xA, with
//! // architectural PMU version 2: 4 general-purpose and 3 fixed counters, all 48 bits wide.
//! let reader = |leaf: u32, _subleaf: u32| match leaf {
//!     0 => CpuIdResult { eax: 0xa, ebx: 0x756e_6547, edx: 0x4965_6e69, ecx: 0x6c65_746e },
//!     0xa => CpuIdResult { eax: 0x0730_0402, ebx: 0, ecx: 0, edx: 0x603 },
//!     _ => CpuIdResult { eax: 0, ebx: 0, ecx: 0, edx: 0 },
//! };
//! // IA32_PERF_CAPABILITIES, when the caller could read it: only if CPUID.1:ECX.PDCM says it
//! // exists (here leaf 1 is all zero, so it does not, and `None` is all there is to give).
//! let caps = IntelCaps::from_cpuid(reader, None)?;
//! let pmu = IntelPmu::new(caps)?;
//! assert_eq!((pmu.caps().gp_counters(), pmu.caps().fixed_counters()), (4, 0b111));
//! # Ok::<(), vpmu_intel::BackendError>(())
//! ```
//!
//! A hypervisor that picks Intel or AMD at boot uses the `vpmu-vendor-any` crate instead,
//! which reads the vendor string and calls this enumeration for an Intel CPU.
//!
//! ## CPUID leaves read
//!
//! [`IntelCaps::from_cpuid`] reads, through the given reader (raw-cpuid's `CpuIdReader`, which
//! this crate re-exports as [`raw_cpuid`]), subleaf 0 of each of these leaves, and nothing
//! else:
//!
//! | leaf | bits | what for |
//! |---|---|---|
//! | 0 | EAX | the highest basic leaf: leaves 1 and 0xA are read only if it reaches them (raw-cpuid) |
//! | 0 | EBX, EDX, ECX | the vendor string: raw-cpuid takes leaves 8–0xA of an AMD CPU for reserved, so an AMD CPU has no architectural PMU here |
//! | 0x8000_0000 | EAX | read by raw-cpuid as it starts (the highest extended leaf); not used |
//! | 1 | ECX bit 15 (PDCM) | IA32_PERF_CAPABILITIES exists: its value is consulted only then |
//! | 1 | EDX bit 21 (DS), ECX bit 2 (DTES64) | the CPU has a 64-bit debug store: a guest may own DS_AREA (with `XENPMU_FEATURE_INTEL_BTS`) |
//! | 0xA | EAX bits 7:0 | the version: 2–5 driven, above 5 driven as 5, 0 and 1 refused |
//! | 0xA | EAX bits 15:8, 23:16 | the number of general-purpose counters (clipped to 8) and their width (32–64) |
//! | 0xA | EAX bits 31:24, EBX | the length of the architectural-event vector and the events unavailable |
//! | 0xA | ECX | version 5: the fixed counters present, as a bitmap |
//! | 0xA | EDX bits 4:0, 12:5, 15 | the contiguous fixed counters, their width, AnyThread deprecated |
//!
//! Besides CPUID, IA32_PERF_CAPABILITIES (MSR 0x345), whose value the caller passes: only its
//! FW_WRITE bit (13), full-width counter writes through IA32_A_PMCx.
//!
//! ## Enumeration
//!
//! * Version 1 (no GLOBAL_CTRL/STATUS) is refused, like Xen does; versions above 5 are driven
//!   as version 5, whose registers are a subset of theirs.
//! * At most 8 general-purpose counters (the MSR map's room) and fixed counters 0–3 (from
//!   `EDX[4:0]` and, from v5, the ECX bitmap) are exposed. Counter widths must be 32..=64.
//! * IA32_PERF_CAPABILITIES is consulted only with CPUID.1:ECX.PDCM, and only its FW_WRITE bit
//!   (13) is used and shown to the guest.
//!
//! ## What is a #GP, and why
//!
//! Every mask is derived from the enumeration (Xen 31af0d7675). One validator per register
//! serves both WRMSR and the shared-page flush, and it refuses rather than repairs.
//!
//! | register | refused | origin |
//! |---|---|---|
//! | any register of a counter beyond the enumerated ones | always | SDM |
//! | IA32_PMCx (legacy) | never: bits 31:0 are sign-extended, then masked to the width | SDM, KVM |
//! | IA32_A_PMCx | without FW_WRITE; bits above the width | SDM, kvm-unit-tests |
//! | IA32_FIXED_CTRx | bits above the fixed width | Xen |
//! | PERFEVTSELx | bits 63:32; AnyThread (21); Pin Control (19) | Xen 9f5390441a (sibling-thread leak), 8bf68dca65 (host crash) |
//! | FIXED_CTR_CTRL | nibbles of absent counters; AnyThread (nibble bit 2) | Xen 9f5390441a |
//! | GLOBAL_CTRL | bits of absent counters | Xen 31af0d7675, KVM selftests |
//! | GLOBAL_STATUS | any write (read-only) | SDM |
//! | GLOBAL_OVF_CTRL | bits other than counters, OvfBuffer (62), CondChgd (63) | Xen 31af0d7675 |
//! | GLOBAL_STATUS_SET | before v4; bits other than counters and OvfBuffer | SDM |
//! | PERF_CAPABILITIES | any write; any access without PDCM | SDM, KVM |
//! | PEBS_ENABLE | anything but 0 | Xen fb424bf6b5 (model-specific reserved bits: whitelist) |
//! | DS_AREA | non-zero without `XENPMU_FEATURE_INTEL_BTS`, without DS+DTES64, under IPC/ARCH-only, or non-canonical | Xen 5d0683a4f5 |
//! | PERFEVTSELx under `XENPMU_FEATURE_IPC_ONLY` / `_ARCH_ONLY` | enabled with a `umask:event` outside Xen's tables | Xen e3cce1799d |
//! | FIXED_CTR_CTRL under those features | enabling fixed counter 3 (topdown slots, in neither table) | Xen e3cce1799d |
//!
//! A general-purpose counter in the shared page has no alias of its own: a flush takes its
//! value as the WRMSR of the counter that accepts it takes it ([`GuestRules::page_counter`]):
//! with FW_WRITE a value within the width whole (IA32_A_PMCx, and what the hypervisor
//! publishes), any other value, and every value without FW_WRITE, as IA32_PMCx takes it (bits
//! 31:0 sign-extended). So it is never refused, and a profiler that re-arms it with a 64-bit
//! `-period` gets what `wrmsr(IA32_PMCx, -period)` gives, with or without FW_WRITE. Fixed counters in the page follow IA32_FIXED_CTRx (bits above the width
//! refused). A refused flush reports the register's MSR and the validator's reason
//! ([`Refused`], `XENPMU_REFUSED_*`) in the page's `flush_refusal` (docs/abi.md).
//!
//! Deliberate differences from Xen, so that WRMSR and flush share one rule: a DS_AREA or
//! PEBS_ENABLE write of 0 (their reset value, which enables nothing) is always accepted, and
//! the feature whitelists judge only enabled selectors (guests clear selectors with arbitrary
//! event bits). The per-domain [`vpmu::EventFilter`] is not a fault: a denied event reads back as
//! written but its hardware enable is cleared.
//!
//! `GuestPolicy::may_count_host` has no effect here: Intel counters have no host/guest
//! qualifiers. An integrator that must not count hypervisor time switches GLOBAL_CTRL at VM
//! exit/entry (VMX MSR load lists), outside the backend.
//!
//! IA32_DEBUGCTL (0x1D9) is not a register of this backend: it must have a single validating
//! owner (XSA-269), outside the vPMU.
//!
//! ## Context switch
//!
//! At rest nothing counts: GLOBAL_CTRL is 0 and no status bit is set, while PERFEVTSELx and
//! FIXED_CTR_CTRL keep what the last context left; call [`IntelPmu::clean_hardware`] once per
//! CPU before its first load. The pCPU's `vpmu::bank::HwRecord` says what the hardware holds.
//! Save writes GLOBAL_CTRL ← 0 first (unless the context's is 0), folds GLOBAL_STATUS into the
//! context's virtual status (acknowledging it only if set) and reports the overflows it newly
//! recorded (a PMI raised but not yet handled), and reads the counters in use; load writes the
//! values and controls the record does not know the hardware holds (clearing the controls
//! other contexts left on counters not in use), then GLOBAL_CTRL if it differs. A context that
//! never used a counter costs no access.
//!
//! ## Policy changes
//!
//! `restrict` re-judges a saved context's controls with the WRMSR validators: a PERFEVTSELx the
//! policy now refuses goes to the hardware with EN clear, a refused FIXED_CTR_CTRL nibble as 0
//! (each nibble judged alone), and a refused DS_AREA is dropped (it has no hardware image of its
//! own, so the guest reads 0); guest-visible selectors stay as written. A page flush treats a
//! control the guest left as published the same way, so an unedited page always flushes; an
//! edited control is validated as a WRMSR.
//!
//! Known limitation: without FW_WRITE the only way to write a counter is the legacy alias, so a
//! saved value in `[2^31, 2^width − 2^31)` comes back sign-extended from bit 31 (Xen has the
//! same limitation; every CPU with FW_WRITE is exact). A flush of the page takes such a value
//! the same way, so the context holds what the hardware is loaded with.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod access;
mod backend;
mod caps;
mod context;
pub mod events;
pub mod msrs;
mod page;
mod policy;
mod rearm;
mod restrict;
mod snapshot;
mod switch;

/// The CPUID reader crate [`IntelCaps::from_cpuid`] takes (`raw_cpuid::CpuIdReaderNative` on
/// the host, `raw_cpuid::CpuIdResult` for a table), re-exported so that an integrator uses the
/// same version.
pub use raw_cpuid;

pub use backend::{BackendError, IntelPmu};
pub use caps::{
    EnumerationError, FIXED_COUNTER_LIMIT, IntelCaps, MAX_GP_COUNTERS, MAX_SUPPORTED_VERSION,
    MIN_SUPPORTED_VERSION, PERF_CAP_FW_WRITES,
};
pub use context::IntelContext;
pub use policy::{EVTSEL_GUEST_BITS, FIXED_GUEST_BITS, GuestRules, Refused};
