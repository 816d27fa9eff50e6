//! The core's entry points, each on a pCPU handle (the caller's own pCPU): guest MSR and
//! RDPMC intercepts, the context switch, the PMI, the control operation, cross-CPU request
//! completion, an event filter change, teardown, a queued LVTPC delivery reported.
//!
//! Thread safety, for every function taking a `vpmu_pcpu`: call it on that pCPU's own CPU
//! (thread), one call at a time; a second call on the same pCPU while one runs (from a
//! callback, or a stray thread) is refused with `VPMU_REASON_PCPU_BUSY`. Calls on different
//! pCPUs run concurrently; the library locks each vCPU for the time it needs it.

use std::sync::atomic::Ordering;

use vpmu_abi::ops::Params;
use vpmu_vendor_any::vpmu::{Completion, CoreError, Msr, MsrOutcome, PmiOutcome};

use crate::Outcome;
use crate::callbacks::VpmuRequest;
use crate::error::{VpmuError, bad_argument, check_poison, guarded};
use crate::handles::{PcpuHandle, VcpuHandle, VpmuHandle, handle, put};
use crate::platform::request_from_c;

/// `vpmu_msr_result`: emulated; the value (for a read) is in `*value`.
pub const VPMU_MSR_HANDLED: u32 = 0;
/// `vpmu_msr_result`: illegal for this PMU: inject #GP(0) into the guest.
pub const VPMU_MSR_GP: u32 = 1;
/// `vpmu_msr_result`: not a PMU MSR of this vendor: the hypervisor handles it as before.
pub const VPMU_MSR_NOT_PMU: u32 = 2;

/// An operation that involved other pCPUs: `VPMU_DONE` or `VPMU_PENDING` (call again after
/// they completed the requests they were sent).
pub const VPMU_DONE: u32 = 0;
/// See `VPMU_DONE`.
pub const VPMU_PENDING: u32 = 1;

/// What a PMI was.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VpmuPmiKind {
    /// Nothing overflowed here.
    Spurious = 0,
    /// Counters overflowed with no interrupt enabled.
    NoInterrupt,
    /// Delivered to (`domain`, `vcpu`): LVTPC or sample published.
    Delivered,
    /// Queued by the platform for delivery from the vCPU's context.
    Queued,
    /// Dropped (counted): a sample still cached, the LVTPC masked, no page.
    Dropped,
}

/// What `vpmu_handle_pmi` did.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuPmiOutcome {
    /// What it was.
    pub kind: VpmuPmiKind,
    /// `DELIVERED`, `QUEUED`, `DROPPED`: the receiving vCPU's domain.
    pub domain: u32,
    /// Its index.
    pub vcpu: u32,
    /// The counters that overflowed (bit i: GP counter i; bit 32 + i: fixed counter i).
    pub overflowed: u64,
}

/// The outcome code of an intercept.
fn msr_result<T>(outcome: &MsrOutcome<T>) -> u32 {
    match outcome {
        MsrOutcome::Handled(_) => VPMU_MSR_HANDLED,
        MsrOutcome::GeneralProtection => VPMU_MSR_GP,
        MsrOutcome::NotPmu => VPMU_MSR_NOT_PMU,
    }
}

/// Writes a read's outcome: the value read when it was handled, and its `VPMU_MSR_*`.
///
/// # Safety
/// `value` and `result` are NULL (refused) or writable.
unsafe fn put_read(outcome: MsrOutcome<u64>, value: *mut u64, result: *mut u32) -> Outcome {
    if let MsrOutcome::Handled(read) = outcome {
        // SAFETY: the caller's contract.
        unsafe { put(value, read)? };
    }
    // SAFETY: the caller's contract.
    unsafe { put(result, msr_result(&outcome)) }
}

fn completion(done: Completion) -> u32 {
    match done {
        Completion::Done => VPMU_DONE,
        Completion::Pending => VPMU_PENDING,
    }
}

/// A guest RDMSR of `msr` by `vcpu`, running on `pcpu`: `*result` is `VPMU_MSR_*`, and on
/// `VPMU_MSR_HANDLED` `*value` the value. Errors: `-EIO` (hardware fault), `-EINVAL` (the
/// vCPU is loaded on another pCPU).
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// Live handles; `value`, `result` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_rdmsr(
    pcpu: *const PcpuHandle,
    vcpu: *const VcpuHandle,
    msr: u32,
    value: *mut u64,
    result: *mut u32,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (pcpu, vcpu) = unsafe { (handle(pcpu)?, handle(vcpu)?) };
        let outcome = pcpu.call(|call| {
            let mut state = vcpu.lock();
            Ok(call
                .handle
                .vpmu
                .rdmsr(&mut call.platform, &mut call.pmu, &mut state, Msr(msr))?)
        })?;
        // SAFETY: `value` and `result` are NULL (refused) or writable (the caller's contract).
        unsafe { put_read(outcome, value, result) }
    })
}

/// A guest WRMSR of `value` to `msr` by `vcpu`, running on `pcpu`: `*result` is
/// `VPMU_MSR_*`. Errors as `vpmu_rdmsr`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// Live handles; `result` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_wrmsr(
    pcpu: *const PcpuHandle,
    vcpu: *const VcpuHandle,
    msr: u32,
    value: u64,
    result: *mut u32,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (pcpu, vcpu) = unsafe { (handle(pcpu)?, handle(vcpu)?) };
        let outcome = pcpu.call(|call| {
            let mut state = vcpu.lock();
            let vpmu = &call.handle.vpmu;
            Ok(vpmu.wrmsr(
                &mut call.platform,
                &mut call.pmu,
                &mut state,
                Msr(msr),
                value,
            )?)
        })?;
        // SAFETY: `result` is NULL (refused) or writable.
        unsafe { put(result, msr_result(&outcome)) }
    })
}

/// A guest RDPMC with ECX = `selector` at privilege level `cpl`, with CR4.PCE = `cr4_pce`:
/// `*result` is `VPMU_MSR_HANDLED` (EDX:EAX = `*value`, RIP += 2) or `VPMU_MSR_GP` (inject
/// #GP(0)); never `VPMU_MSR_NOT_PMU`. Intercept RDPMC always (VMX RDPMC exiting, the SVM
/// RDPMC intercept). Errors as `vpmu_rdmsr`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// Live handles; `value`, `result` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_rdpmc(
    pcpu: *const PcpuHandle,
    vcpu: *const VcpuHandle,
    selector: u32,
    cpl: u8,
    cr4_pce: bool,
    value: *mut u64,
    result: *mut u32,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (pcpu, vcpu) = unsafe { (handle(pcpu)?, handle(vcpu)?) };
        let outcome = pcpu.call(|call| {
            let mut state = vcpu.lock();
            let vpmu = &call.handle.vpmu;
            let (platform, pmu) = (&mut call.platform, &mut call.pmu);
            Ok(vpmu.rdpmc(platform, pmu, &mut state, selector, cpl, cr4_pce)?)
        })?;
        // SAFETY: `value` and `result` are NULL (refused) or writable (the caller's contract).
        unsafe { put_read(outcome, value, result) }
    })
}

/// `pcpu` stops running its current vCPU (if any) and runs `next` (NULL: idle or hypervisor
/// work). A vCPU migrates by being switched out where it ran, then in where it goes.
/// Errors: `-ENOENT` (`next` is not this vPMU's; the pCPU then runs none), `-EIO`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// `pcpu` is a live handle; `next` NULL or a live vCPU handle; `err` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_context_switch(
    pcpu: *const PcpuHandle,
    next: *const VcpuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle (`next` may be NULL).
        let (this, next_handle) = unsafe { (handle(pcpu)?, next.as_ref()) };
        this.call(|call| {
            let vcpus = &call.handle.vcpus;
            // A handle of another vPMU (or a destroyed one) is not in this table by identity.
            let next = next_handle.map(|h| h.id);
            if let Some(h) = next_handle {
                if !vcpus.is(h) {
                    return Err(CoreError::NoSuchVcpu(h.id).into());
                }
            }
            let before = call.pmu.current();
            let switched =
                call.handle
                    .vpmu
                    .context_switch(&mut call.platform, &mut call.pmu, vcpus, next);
            let after = call.pmu.current();
            if before != after {
                if let Some(out) = before.and_then(|id| vcpus.handle_of(id)) {
                    out.running_on.store(u32::MAX, Ordering::SeqCst);
                }
                if let Some(h) = next_handle.filter(|_| after.is_some()) {
                    h.running_on.store(this.index, Ordering::SeqCst);
                }
            }
            Ok(switched?)
        })
    })
}

/// The PMU interrupt of `pcpu`: routes the overflow (LVTPC, sample in a page, or dropped and
/// counted) and writes what happened to `*outcome`. Call it from the PMI handler (or where the
/// hypervisor handles the PMI's vector), then unmask the LVTPC if the platform's
/// `set_physical_lvtpc_masked` has not masked it. Errors: `-EIO`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// `pcpu` is a live handle; `outcome` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_handle_pmi(
    pcpu: *const PcpuHandle,
    outcome: *mut VpmuPmiOutcome,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let this = unsafe { handle(pcpu)? };
        let pmi = this.call(|call| {
            let vpmu = &call.handle.vpmu;
            Ok(vpmu.handle_pmi(&mut call.platform, &mut call.pmu, &call.handle.vcpus)?)
        })?;
        let of = |kind, to: vpmu_vendor_any::vpmu::VcpuId, overflowed: u64| VpmuPmiOutcome {
            kind,
            domain: to.domain,
            vcpu: to.vcpu,
            overflowed,
        };
        let nobody = vpmu_vendor_any::vpmu::VcpuId { domain: 0, vcpu: 0 };
        let pmi = match pmi {
            PmiOutcome::Spurious => of(VpmuPmiKind::Spurious, nobody, 0),
            PmiOutcome::NoInterrupt(o) => of(VpmuPmiKind::NoInterrupt, nobody, o.counters.0),
            PmiOutcome::Delivered { to, overflow } => {
                of(VpmuPmiKind::Delivered, to, overflow.counters.0)
            }
            PmiOutcome::Queued { to, overflow } => of(VpmuPmiKind::Queued, to, overflow.counters.0),
            PmiOutcome::Dropped { to, overflow } => {
                of(VpmuPmiKind::Dropped, to, overflow.counters.0)
            }
        };
        // SAFETY: `outcome` is NULL (refused) or writable.
        unsafe { put(outcome, pmi) }
    })
}

/// The xenpmu hypercall `op` (`XENPMU_OP_*`) of `caller`, running on `pcpu`, with the
/// parameter block `*params` (copied in from the guest by the caller): on success (0)
/// `*params` holds the block to copy back. On failure the return value is the hypercall's
/// (`-errno`, reason `VPMU_REASON_OP_REFUSED`) and `*params` is unchanged, except for
/// `-ENOBUFS` (`XENPMU_OP_COVERAGE`), where `err->needed` is the size to copy back in the
/// `vcpu` word. `-EAGAIN`: requests to other pCPUs are in flight: let this pCPU complete its
/// own requests and restart the hypercall.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// Live handles; `params` readable and writable; `err` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_control_op(
    pcpu: *const PcpuHandle,
    caller: *const VcpuHandle,
    op: u32,
    params: *mut Params,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles and a valid block.
        let (this, caller, block) = unsafe { (handle(pcpu)?, handle(caller)?, handle(params)?) };
        let block = *block;
        let answer = this.call(|call| {
            let (vpmu, vcpus) = (&call.handle.vpmu, &call.handle.vcpus);
            let (platform, pmu) = (&mut call.platform, &mut call.pmu);
            Ok(vpmu.control_op(platform, pmu, vcpus, caller.id, op, &block)?)
        })?;
        // SAFETY: `params` is not NULL (checked) and writable.
        unsafe { put(params, answer) }
    })
}

/// Completes, on the target `pcpu`, a request another pCPU sent it (`send_request`). Call it
/// for each queued request, in order, before the pCPU's next guest entry. Errors: `-EINVAL`
/// (unknown kind), `-EIO`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// `pcpu` is a live handle; `request` readable; `err` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_complete_request(
    pcpu: *const PcpuHandle,
    request: *const VpmuRequest,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle and a readable request.
        let (this, request) = unsafe { (handle(pcpu)?, handle(request)?) };
        let request = request_from_c(request).ok_or_else(bad_argument)?;
        this.call(|call| {
            let (vpmu, vcpus) = (&call.handle.vpmu, &call.handle.vcpus);
            Ok(vpmu.complete_request(&mut call.platform, &mut call.pmu, vcpus, request)?)
        })
    })
}

/// After `vpmu_set_event_filter`: counters programmed with an event the new filter denies stop
/// on every pCPU before its next guest entry. `*done` is `VPMU_DONE`, or `VPMU_PENDING` until
/// every pCPU completed its request. Errors: `-EAGAIN` (another change in progress), `-EIO`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// `pcpu` is a live handle; `done` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_event_filter_changed(
    pcpu: *const PcpuHandle,
    done: *mut u32,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let this = unsafe { handle(pcpu)? };
        let answer = this.call(|call| {
            let (vpmu, vcpus) = (&call.handle.vpmu, &call.handle.vcpus);
            Ok(vpmu.event_filter_changed(&mut call.platform, &mut call.pmu, vcpus)?)
        })?;
        // SAFETY: `done` is NULL (refused) or writable.
        unsafe { put(done, completion(answer)) }
    })
}

/// Stops `vcpu`'s vPMU for good (its domain is destroyed): saves and resets its context,
/// unmaps its page and ring. Call it on any pCPU; a vCPU running on another pCPU is torn down
/// there, as that pCPU completes the request it was sent: `*done` is then `VPMU_PENDING`, and
/// the caller calls again after that until `VPMU_DONE`. Errors: `-EIO`.
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (a concurrent or reentrant call
/// on the same pCPU is refused with `VPMU_REASON_PCPU_BUSY`).
///
/// # Safety
/// Live handles; `done` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_teardown_vcpu(
    pcpu: *const PcpuHandle,
    vcpu: *const VcpuHandle,
    done: *mut u32,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (this, vcpu) = unsafe { (handle(pcpu)?, handle(vcpu)?) };
        let answer = this.call(|call| {
            let (vpmu, vcpus) = (&call.handle.vpmu, &call.handle.vcpus);
            Ok(vpmu.teardown_vcpu(&mut call.platform, &mut call.pmu, vcpus, vcpu.id)?)
        })?;
        // SAFETY: `done` is NULL (refused) or writable.
        unsafe { put(done, completion(answer)) }
    })
}

/// The platform reports a delivery it queued (`VPMU_LVTPC_QUEUED`): `delivered` if the PMI
/// reached the guest. `*accepted` is false (and nothing changed) if no delivery was in flight.
/// Thread safety: any thread (the vCPU is locked for the call).
///
/// # Safety
/// Live handles, `vcpu` one of `vpmu`'s; `accepted` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_lvtpc_delivery_done(
    vpmu: *const VpmuHandle,
    vcpu: *const VcpuHandle,
    delivered: bool,
    accepted: *mut bool,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (handle, vcpu) = unsafe { (handle(vpmu)?, handle(vcpu)?) };
        check_poison(&handle.poisoned)?;
        let answer = handle.vpmu.lvtpc_delivery_done(&mut vcpu.lock(), delivered);
        // SAFETY: `accepted` is NULL (refused) or writable.
        unsafe { put(accepted, answer) }
    })
}
