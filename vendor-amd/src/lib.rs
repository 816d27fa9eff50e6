//! # vpmu-amd: the AMD PMU backend
//!
//! [`AmdPmu`] implements the core's [`vpmu::PmuBackend`] for AMD and Hygon core PMUs:
//! enumeration ([`AmdCaps`], from CPUID: legacy K7, PerfCtrExtCore, PerfMonV2), the MSR map
//! ([`msrs`]), write legality ([`policy`]), save/restore and overflow detection, and the shared
//! page's vendor area; [`AmdCaps::guest_leaves`] gives the CPUID bits that describe the PMU to a
//! guest. (A software AMD PMU that behaves like the hardware is in the `vpmu-models` crate.)
//!
//! ```
//! use vpmu_amd::raw_cpuid::CpuIdResult;
//! use vpmu_amd::{AmdCaps, AmdPmu, PmuShape};
//!
//! // The CPUID to enumerate: on the host, `raw_cpuid::CpuIdReaderNative`; here a closure over
//! // (leaf, subleaf) describing an "AuthenticAMD" CPU with no extended leaves: neither
//! // PerfMonV2 nor PerfCtrExtCore, so the four legacy K7 counters.
//! let reader = |leaf: u32, _subleaf: u32| match leaf {
//!     0 => CpuIdResult { eax: 0x10, ebx: 0x6874_7541, edx: 0x6974_6e65, ecx: 0x444d_4163 },
//!     _ => CpuIdResult { eax: 0, ebx: 0, ecx: 0, edx: 0 },
//! };
//! let caps = AmdCaps::from_cpuid(reader)?;
//! assert_eq!(caps.shape(), PmuShape::LegacyK7);
//! let pmu = AmdPmu::new(caps)?;
//! assert_eq!(pmu.caps().gp_counters(), 4);
//! # Ok::<(), vpmu_amd::BackendError>(())
//! ```
//!
//! A hypervisor that picks Intel or AMD at boot uses the `vpmu-vendor-any` crate instead,
//! which reads the vendor string and calls this enumeration for an AMD or Hygon CPU.
//!
//! ## CPUID leaves read
//!
//! [`AmdCaps::from_cpuid`] reads, through the given reader (raw-cpuid's `CpuIdReader`, which
//! this crate re-exports as [`raw_cpuid`]), subleaf 0 of each of these leaves, and nothing
//! else (no MSR either):
//!
//! | leaf | bits | what for |
//! |---|---|---|
//! | 0 | EAX | the highest basic leaf (read by raw-cpuid as it starts) |
//! | 0 | EBX, EDX, ECX | the vendor string: `AuthenticAMD` or `HygonGenuine`, else refused (`EnumerationError::NotAmd`) |
//! | 0x8000_0000 | EAX | the highest extended leaf: 0x8000_0001 and 0x8000_0022 are read only if it reaches them (raw-cpuid) |
//! | 0x8000_0022 | EAX bit 0 (PerfMonV2), EBX bits 3:0 (NumPerfCtrCore) | PerfMonV2 and its core counters (clipped to 6; 0 refused) |
//! | 0x8000_0001 | ECX bit 23 (PerfCtrExtCore) | without PerfMonV2: six counters through the interleaved MSRs, else the four K7 ones |
//!
//! [`AmdCaps::guest_leaves`] gives the same bits back for a guest's CPUID.
//!
//! ## Policy
//!
//! **What faults (#GP).** Every MSR of the AMD core-PMU architecture is routed here
//! ([`vpmu::PmuBackend::msr_ranges`]: `0xC000_0300–303`, `0xC001_0000–007`,
//! `0xC001_0200–20B`), present or not, so absent ones fault rather than being answered by
//! someone else. A guest access faults when:
//! * the MSR is absent for the enumerated PMU: the interleaved block without PerfCtrExtCore,
//!   the global block without PerfMonV2, any counter index at or beyond the counter count
//!   (through either alias);
//! * a PERF_CTL write has a reserved bit (63:42, 39:36, 21, 19) or HostOnly (see below);
//! * a GlobalCtl or GlobalStatusSet write has a bit of an absent counter;
//! * GlobalStatus (read-only) is written.
//!
//! **Reserved bits: refuse, never fix up.** The three existing behaviours are:
//! AMD hardware (the APM asks software to preserve reserved fields; KVM's reading is "AMD
//! ignores writes to reserved bits"), KVM (drops reserved bits silently: the guest reads back
//! something else than it wrote), and Xen (snapshots the boot value of each control's reserved
//! bits and requires every write to match it). This backend refuses any write with a reserved
//! bit set, because:
//! * Linux, the guest that matters, builds its controls from defined fields only and writes
//!   zeros in the reserved ones, so refusing costs real guests nothing;
//! * fail-closed: a value that reaches the hardware is exactly a value that was checked, never
//!   an edited one whose meaning depends on a mask being right — the reserved set of a future
//!   part may acquire a meaning (bits 35:32 and 41:40 did);
//! * single owner: [`policy`] has one validator per register, used by both the WRMSR path and
//!   the flush of a guest-edited page, so a refused value is refused on every path (XSA-269).
//!
//! The one exception is PerfCntrGlobalStatusClr: Linux acknowledges PerfMonV2 overflows by
//! writing `~status` (every bit set), so any value is accepted and only the counter bits act.
//! Clearing can only drop the guest's own status.
//!
//! Counter writes are the exception the other way: a PERF_CTR write never faults; the bits
//! above the 48 counter bits are dropped, not refused, because the hardware and KVM drop them
//! and guests depend on it (kvm-unit-tests x86/pmu writes `-1` and `1 - count` as 64-bit
//! values). Nothing above bit 47 has a meaning that could be enabled by accident. A shared
//! page's counters follow the same rule ([`policy::counter`], the one validator of both
//! paths): a profiler that re-arms a counter in the page with a 64-bit `-period` gets the
//! counter a WRMSR of that value would give, `-period` masked to 48 bits (docs/abi.md, "What the
//! owner may change in the cached window").
//!
//! **Host-only / Guest-only (bits 41/40).** A guest may not count while the hypervisor runs.
//! Unless the policy allows host counting ([`vpmu::GuestPolicy::may_count_host`], the
//! privileged profiler), a PERF_CTL write with HostOnly faults, and the value programmed on the
//! hardware always has GuestOnly set, so a counter stops at VM exit even when the guest wrote
//! neither bit. A guest with host counting gets its value on the hardware as written. Either
//! way the guest reads back exactly what it wrote. Refusing HostOnly rather than stripping it
//! keeps the guest-visible value honest; Linux sets HostOnly only for `exclude_guest` events
//! and masks it out of the hardware value unless it runs SVM guests itself, so in practice only
//! a nested hypervisor would see the #GP.
//!
//! **Event filter.** An event the per-domain filter denies is programmed with EN clear; the
//! guest reads back EN (KVM's filter semantics). `XENPMU_FEATURE_*` (IPC_ONLY, ARCH_ONLY,
//! INTEL_BTS) describe Intel facilities and are ignored on AMD.
//!
//! **Save/load.** At rest nothing counts: with PerfMonV2 GlobalCtl is 0 (the controls stay
//! programmed) and no status bit is set; before it every control of the last context is 0
//! ([`AmdPmu::clean_hardware`] cleans a CPU once). The pCPU's `vpmu::bank::HwRecord` says what
//! the hardware holds. Only counters *in use* (those programmed to count) are saved: `save`
//! stops them (one GlobalCtl write with PerfMonV2, each control cleared before it), reads them
//! and collects their overflows as a PMI would (PerfMonV2's status folded; before it the
//! top-bit rule), returning those not already recorded so that a PMI raised but not yet
//! handled at the switch is not lost; `load` writes the counters and controls the record does
//! not know the hardware holds (clearing controls other contexts left on counters not in use),
//! then GlobalCtl if it differs. A context that never counted costs no access. PerfMonV2's GlobalCtl resets to
//! all counters enabled, as KVM emulates the hardware RESET value. The virtual PerfMonV2 status
//! stays in the context and is never put back on the hardware: guest reads combine it with the
//! hardware's, and a counter that overflows again while its bit is pending is still seen.
//!
//! **Policy changes.** `restrict` re-judges every control of a saved context with the WRMSR
//! validator ([`policy::restricted_control`]): a control it now refuses (HostOnly once host
//! counting is withdrawn) keeps its guest value but goes to the hardware with HostOnly dropped,
//! GuestOnly forced and EN clear. A page flush treats a control the guest left as published
//! the same way, so an unedited page always flushes; an edited one is validated as a WRMSR.
//!
//! **Overflow.** With PerfMonV2 from GlobalStatus; before it from the counter's top bit
//! (Linux's rule; limits in [`AmdPmu`]'s `handle_overflow`). AMD does not mask the LVTPC on
//! PMI delivery.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod backend;
mod caps;
mod context;
pub mod msrs;
pub mod policy;
mod rearm;
pub mod snapshot;

/// The CPUID reader crate [`AmdCaps::from_cpuid`] takes (`raw_cpuid::CpuIdReaderNative` on the
/// host, `raw_cpuid::CpuIdResult` for a table), re-exported so that an integrator uses the same
/// version.
pub use raw_cpuid;

pub use backend::{AmdPmu, BackendError};
pub use caps::{
    AmdCaps, AmdGuestLeaves, CPUID_PERF_CTR_EXT_CORE, CPUID_PERFMON_LEAF, CPUID_PERFMON_V2,
    EnumerationError, Lookup, PmuShape,
};
pub use context::AmdContext;
