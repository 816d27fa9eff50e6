//! What a caller reads back: the backend's capabilities, the MSR ranges to route, a vCPU's
//! state and statistics.

use vpmu_vendor_any::vpmu::{PmuBackend, SampleSource, VcpuState, Vendor};

use crate::error::{VpmuError, guarded};
use crate::handles::{VcpuHandle, VpmuHandle, handle, put};

/// The CPU vendor of the backend in use.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VpmuVendor {
    /// Intel architectural PMU.
    Intel = 0,
    /// AMD (or Hygon) core PMU.
    Amd = 1,
}

/// What the enumerated PMU offers (what a guest's CPUID may show).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuCapabilities {
    /// The vendor, chosen from CPUID at `vpmu_create`.
    pub vendor: VpmuVendor,
    /// Intel: architectural PMU version; AMD: 1, or 2 with PerfMonV2.
    pub version: u32,
    /// General-purpose counters.
    pub gp_counters: u32,
    /// Their width in bits.
    pub gp_width: u32,
    /// Fixed counters present, as a bitmap (Intel; 0 on AMD).
    pub fixed_counters: u32,
    /// Their width in bits (Intel; 0 on AMD).
    pub fixed_width: u32,
    /// Global control and status registers exist (Intel v2+, AMD PerfMonV2).
    pub global_ctrl: bool,
    /// Intel: full-width counter writes (IA32_A_PMCx).
    pub full_width_writes: bool,
}

/// An inclusive range of MSR numbers the vPMU owns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VpmuMsrRange {
    /// The first MSR.
    pub first: u32,
    /// The last MSR (inclusive).
    pub last: u32,
}

/// Where a vCPU's PMU state is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VpmuVcpuState {
    /// Never used: no PMU register touched, no page.
    Allocated = 0,
    /// The context is in memory.
    Saved,
    /// The context is on the hardware of `vpmu_vcpu_info::pcpu`, where the vCPU runs.
    Loaded,
    /// A sample waits in the vCPU's page; counters stopped until the guest flushes.
    Cached,
}

/// A vCPU's PMU state and statistics.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuVcpuInfo {
    /// Where its state is.
    pub state: VpmuVcpuState,
    /// `LOADED`: the pCPU holding it; `CACHED`: the pCPU the sample was taken on; else
    /// `UINT32_MAX`.
    pub pcpu: u32,
    /// Nonzero if a shared page is registered.
    pub has_page: u32,
    /// PMIs routed to it.
    pub pmis_generated: u64,
    /// Of those, delivered (LVTPC or page).
    pub pmis_delivered: u64,
    /// Of those, dropped.
    pub pmis_dropped: u64,
    /// Of those, queued by the platform and not yet reported done.
    pub pmis_in_flight: u64,
    /// Overflows saved with the context before their PMI was handled.
    pub pmis_kept_pending: u64,
    /// Intercepted RDMSRs of PMU registers.
    pub msr_reads: u64,
    /// Intercepted WRMSRs of PMU registers.
    pub msr_writes: u64,
    /// RDPMCs performed.
    pub rdpmcs: u64,
    /// Accesses answered with #GP.
    pub gp_faults: u64,
}

/// The backend's capabilities. Thread safety: any thread.
///
/// # Safety
/// `vpmu` is a live handle; `out` and `err` (may be NULL) are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_capabilities(
    vpmu: *const VpmuHandle,
    out: *mut VpmuCapabilities,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        let caps = handle.vpmu.backend().capabilities();
        let caps = VpmuCapabilities {
            vendor: match caps.vendor {
                Vendor::Intel => VpmuVendor::Intel,
                Vendor::Amd => VpmuVendor::Amd,
            },
            version: caps.version.into(),
            gp_counters: caps.gp_counters.into(),
            gp_width: caps.gp_width.into(),
            fixed_counters: caps.fixed_counters,
            fixed_width: caps.fixed_width.into(),
            global_ctrl: caps.global_ctrl,
            full_width_writes: caps.full_width_writes,
        };
        // SAFETY: `out` is NULL (refused) or writable.
        unsafe { put(out, caps) }
    })
}

/// The MSR ranges the vPMU owns: route every guest RDMSR/WRMSR of them to `vpmu_rdmsr` /
/// `vpmu_wrmsr` (absent counters must fault). Writes up to `capacity` ranges to `out` and the
/// total to `*count`. Thread safety: any thread.
///
/// # Safety
/// `vpmu` is a live handle; `out` has room for `capacity` ranges (NULL with 0); `count` and
/// `err` (may be NULL) are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_msr_ranges(
    vpmu: *const VpmuHandle,
    out: *mut VpmuMsrRange,
    capacity: usize,
    count: *mut usize,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        let ranges = handle.vpmu.backend().msr_ranges();
        for (i, &(first, last)) in ranges.iter().take(capacity).enumerate() {
            // SAFETY: `out` has room for `capacity` ranges and `i < capacity`.
            unsafe { put(out.add(i), VpmuMsrRange { first, last })? };
        }
        // SAFETY: `count` is NULL (refused) or writable.
        unsafe { put(count, ranges.len()) }
    })
}

/// A vCPU's state and statistics. Thread safety: any thread (the vCPU is locked for the call).
///
/// # Safety
/// `vcpu` is a live handle; `out` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_vcpu_info(
    vcpu: *const VcpuHandle,
    out: *mut VpmuVcpuInfo,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let vcpu = unsafe { handle(vcpu)? };
        let state = vcpu.lock();
        let (kind, pcpu) = match state.state() {
            VcpuState::Allocated => (VpmuVcpuState::Allocated, u32::MAX),
            VcpuState::Saved => (VpmuVcpuState::Saved, u32::MAX),
            VcpuState::Loaded { pcpu } => (VpmuVcpuState::Loaded, pcpu),
            VcpuState::Cached {
                from: SampleSource::Own { pcpu } | SampleSource::System { pcpu },
            } => (VpmuVcpuState::Cached, pcpu),
        };
        let stats = state.stats();
        let info = VpmuVcpuInfo {
            state: kind,
            pcpu,
            has_page: state.page().is_some().into(),
            pmis_generated: stats.pmis_generated,
            pmis_delivered: stats.pmis_delivered,
            pmis_dropped: stats.pmis_dropped,
            pmis_in_flight: stats.pmis_in_flight,
            pmis_kept_pending: stats.pmis_kept_pending,
            msr_reads: stats.msr_reads,
            msr_writes: stats.msr_writes,
            rdpmcs: stats.rdpmcs,
            gp_faults: stats.gp_faults,
        };
        // SAFETY: `out` is NULL (refused) or writable.
        unsafe { put(out, info) }
    })
}
