//! The opaque handles and their lifecycle: `vpmu` (one per host), `vpmu_pcpu` (one per
//! attached physical CPU), `vpmu_vcpu` (one per vCPU); and the per-domain event filters.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, TryLockError};

use vpmu_vendor_any::raw_cpuid::CpuIdResult;
use vpmu_vendor_any::vpmu::{
    EventList, EventMatch, FilterAction, Mode, PcpuPmu, VcpuId, VcpuPmu, VcpuTable, Vpmu,
};
use vpmu_vendor_any::{VendorContext, VendorPmu};

use crate::callbacks::{VpmuCpuidOps, VpmuMsrOps, VpmuPlatformOps};
use crate::error::{
    Outcome, PoisonOnUnwind, VPMU_EBUSY, VPMU_EEXIST, VPMU_EINVAL, VPMU_ENOSPC,
    VPMU_ENOTRECOVERABLE, VpmuError, VpmuReason, bad_argument, check_poison, guarded, null,
};
use crate::platform::{CMsrBus, CPlatform};

/// The most entries one domain's event filter holds (KVM's masked-event lists are longer;
/// 64 covers every list the project's tests and tools use).
pub const VPMU_FILTER_MAX_ENTRIES: usize = 64;

/// The event filters, by domain.
pub(crate) type Filters = BTreeMap<u32, EventList<VPMU_FILTER_MAX_ENTRIES>>;

/// `vpmu_pcpu` / `vpmu_vcpu`'s "runs on no pCPU".
const NOWHERE: u32 = u32::MAX;

/// One vCPU's PMU state (C: `vpmu_vcpu`), shared by the C caller's handle and the table.
#[derive(Debug)]
pub struct VcpuHandle {
    pub(crate) id: VcpuId,
    pub(crate) pmu: Mutex<VcpuPmu<VendorContext>>,
    /// The pCPU whose last `vpmu_context_switch` made this vCPU its current one.
    pub(crate) running_on: AtomicU32,
}

impl VcpuHandle {
    /// Locks the state. A poisoned lock was poisoned by a panic, which poisoned the vPMU
    /// too, and every entry point checks that first.
    pub(crate) fn lock(&self) -> MutexGuard<'_, VcpuPmu<VendorContext>> {
        self.pmu.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The vCPU table: each vCPU behind its own lock, as the core's locking rule asks.
#[derive(Debug, Default)]
pub(crate) struct VcpuRegistry(RwLock<BTreeMap<VcpuId, Arc<VcpuHandle>>>);

impl VcpuRegistry {
    fn map(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<VcpuId, Arc<VcpuHandle>>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// vCPUs of `domain`.
    pub(crate) fn count(&self, domain: u32) -> u32 {
        let first = VcpuId { domain, vcpu: 0 };
        let map = self.map();
        let n = map
            .range(first..)
            .take_while(|(id, _)| id.domain == domain)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn get(&self, id: VcpuId) -> Option<Arc<VcpuHandle>> {
        self.map().get(&id).cloned()
    }

    /// The handle of `id`, if it exists.
    pub(crate) fn handle_of(&self, id: VcpuId) -> Option<Arc<VcpuHandle>> {
        self.get(id)
    }

    /// Whether `vcpu` is this table's handle of its id (not another vPMU's, nor a stale one).
    pub(crate) fn is(&self, vcpu: &VcpuHandle) -> bool {
        self.map()
            .get(&vcpu.id)
            .is_some_and(|registered| std::ptr::eq(Arc::as_ptr(registered), vcpu))
    }
}

impl VcpuTable<VendorContext> for VcpuRegistry {
    fn with_vcpu(&self, id: VcpuId, visit: &mut dyn FnMut(&mut VcpuPmu<VendorContext>)) -> bool {
        // The table's lock is not held while the vCPU is: a vCPU held by an intercept may ask
        // for vCPU counts meanwhile.
        let Some(vcpu) = self.get(id) else {
            return false;
        };
        visit(&mut vcpu.lock());
        true
    }

    fn for_each_in_domain(&self, domain: u32, visit: &mut dyn FnMut(&mut VcpuPmu<VendorContext>)) {
        let first = VcpuId { domain, vcpu: 0 };
        let vcpus: Vec<_> = {
            let map = self.map();
            let of_domain = map.range(first..).take_while(|(id, _)| id.domain == domain);
            of_domain.map(|(_, vcpu)| Arc::clone(vcpu)).collect()
        };
        for vcpu in vcpus {
            visit(&mut vcpu.lock());
        }
    }
}

/// The vPMU of a host (C: `vpmu`): the core, the platform table, the vCPUs, the filters.
#[derive(Debug)]
pub struct VpmuHandle {
    pub(crate) vpmu: Vpmu<VendorPmu>,
    pub(crate) ops: VpmuPlatformOps,
    pub(crate) privileged: u32,
    pub(crate) vcpus: VcpuRegistry,
    filters: RwLock<Arc<Filters>>,
    pub(crate) poisoned: AtomicBool,
}

impl VpmuHandle {
    /// The platform of a call on the pCPU whose context is `ctx`.
    pub(crate) fn platform(&self, ctx: *mut c_void) -> CPlatform<'_> {
        let filters = self.filters.read().unwrap_or_else(PoisonError::into_inner);
        CPlatform {
            ops: &self.ops,
            ctx,
            privileged: self.privileged,
            vcpus: &self.vcpus,
            filters: Arc::clone(&filters),
        }
    }
}

/// One attached physical CPU (C: `vpmu_pcpu`): the core's per-pCPU state over the C MSR bus.
#[derive(Debug)]
pub struct PcpuHandle {
    pub(crate) vpmu: Arc<VpmuHandle>,
    pub(crate) index: u32,
    pub(crate) ctx: *mut c_void,
    /// Locked for the duration of every call on this pCPU, never waited for: a second call
    /// meanwhile (from a callback, or another thread) is refused as busy.
    pub(crate) pmu: Mutex<PcpuPmu<VendorContext, CMsrBus>>,
}

/// The core's view of one call on a pCPU.
pub(crate) struct OnPcpu<'a> {
    pub(crate) handle: &'a VpmuHandle,
    pub(crate) platform: CPlatform<'a>,
    pub(crate) pmu: MutexGuard<'a, PcpuPmu<VendorContext, CMsrBus>>,
}

impl PcpuHandle {
    /// Runs `body` as a call on this pCPU: refused if the vPMU is poisoned or the pCPU busy;
    /// a panic in `body` poisons the vPMU.
    pub(crate) fn call<R>(
        &self,
        body: impl FnOnce(&mut OnPcpu<'_>) -> Result<R, VpmuError>,
    ) -> Result<R, VpmuError> {
        let handle = &*self.vpmu;
        check_poison(&handle.poisoned)?;
        let _poison = PoisonOnUnwind(&handle.poisoned);
        let pmu = match self.pmu.try_lock() {
            Ok(pmu) => pmu,
            Err(TryLockError::WouldBlock) => {
                return Err(VpmuError::new(VPMU_EBUSY, VpmuReason::PcpuBusy).with_pcpu(self.index));
            }
            Err(TryLockError::Poisoned(_)) => {
                return Err(VpmuError::new(VPMU_ENOTRECOVERABLE, VpmuReason::Poisoned));
            }
        };
        let mut call = OnPcpu {
            handle,
            platform: handle.platform(self.ctx),
            pmu,
        };
        body(&mut call)
    }
}

/// A reference from a handle pointer, or the NULL-argument error.
///
/// # Safety
/// `ptr` is NULL or a live handle of type `T` made by this library.
pub(crate) unsafe fn handle<'a, T>(ptr: *const T) -> Result<&'a T, VpmuError> {
    // SAFETY: the caller's contract: NULL or a live handle.
    unsafe { ptr.as_ref() }.ok_or_else(null)
}

/// Writes `value` to the caller's `out`, or the NULL-argument error.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Outcome {
    if out.is_null() {
        return Err(null());
    }
    // SAFETY: the caller's contract; NULL was excluded.
    unsafe { out.write(value) };
    Ok(())
}

/// What `vpmu_create` makes the vPMU for.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VpmuConfig {
    /// Physical CPUs of the host (indices 0..pcpus may be attached).
    pub pcpus: u32,
    /// The starting mode: `XENPMU_MODE_OFF`, `_SELF`, `_HV` or `_ALL`.
    pub mode: u32,
    /// The privileged (profiling, control) domain.
    pub privileged_domain: u32,
}

/// Creates the vPMU of a host: reads CPUID through `cpuid` (with `cpuid_ctx`; used during
/// the call only) and picks the backend of the CPU's vendor; `platform` (copied) serves every
/// pCPU. Writes the handle to `*out`.
///
/// Errors: `-EINVAL` (NULL argument, missing callback, unknown mode), `-ENODEV` (unknown
/// vendor, no PMU), `-EOPNOTSUPP` (a PMU the backend does not drive).
///
/// Thread safety: any thread. The handle is shared by every pCPU's thread.
///
/// # Safety
/// `config`, `cpuid` and `platform` point to valid tables; `out` and `err` (which may be NULL)
/// are writable. The platform's callbacks stay callable until `vpmu_destroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_create(
    config: *const VpmuConfig,
    cpuid: *const VpmuCpuidOps,
    cpuid_ctx: *mut c_void,
    platform: *const VpmuPlatformOps,
    out: *mut *const VpmuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: valid tables or NULL.
        let (config, cpuid, platform) =
            unsafe { (handle(config)?, handle(cpuid)?, handle(platform)?) };
        let missing = VpmuError::new(VPMU_EINVAL, VpmuReason::MissingCallback);
        let read_cpuid = cpuid.cpuid.ok_or(missing)?;
        if !platform.complete() {
            return Err(missing);
        }
        let mode = Mode::from_abi(u64::from(config.mode)).ok_or_else(bad_argument)?;
        let reader = |leaf: u32, subleaf: u32| {
            let mut regs = [0u32; 4];
            // SAFETY: the caller's CPUID table and context, valid for this call; `regs` is
            // four writable words.
            unsafe { read_cpuid(cpuid_ctx, leaf, subleaf, regs.as_mut_ptr()) };
            CpuIdResult {
                eax: regs[0],
                ebx: regs[1],
                ecx: regs[2],
                edx: regs[3],
            }
        };
        let perf_capabilities = || {
            let read = cpuid.read_perf_capabilities?;
            let mut value = 0;
            // SAFETY: the caller's CPUID table and context; `value` is a live local.
            (unsafe { read(cpuid_ctx, &mut value) } == 0).then_some(value)
        };
        let backend = VendorPmu::from_cpuid(reader, perf_capabilities)?;
        let handle = Arc::new(VpmuHandle {
            vpmu: Vpmu::new(backend, mode, config.pcpus),
            ops: *platform,
            privileged: config.privileged_domain,
            vcpus: VcpuRegistry::default(),
            filters: RwLock::default(),
            poisoned: AtomicBool::new(false),
        });
        // SAFETY: `out` is NULL (refused) or writable (the caller's contract).
        unsafe { put(out, Arc::into_raw(handle)) }
    })
}

/// Destroys the vPMU. Refused (`-EBUSY`, `VPMU_REASON_STILL_IN_USE`) while a pCPU is attached
/// or a vCPU exists; the handle then stays valid.
///
/// Thread safety: no other call on the vPMU, its pCPUs or vCPUs may run meanwhile.
///
/// # Safety
/// `vpmu` is NULL or a live handle from `vpmu_create`; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_destroy(vpmu: *const VpmuHandle, err: *mut VpmuError) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        let empty = handle.vcpus.map().is_empty();
        // SAFETY: `vpmu` is a live `Arc` made by `vpmu_create`; the caller's own reference is
        // the one given back here, and a pCPU holds a reference of its own.
        let arc = unsafe { Arc::from_raw(vpmu) };
        if !empty || Arc::strong_count(&arc) > 1 {
            // The caller's reference stays: the handle remains valid.
            let _ = Arc::into_raw(arc);
            return Err(VpmuError::new(VPMU_EBUSY, VpmuReason::StillInUse));
        }
        drop(arc);
        Ok(())
    })
}

/// Creates vCPU `vcpu` of `domain` (its PMU state, reset) and writes its handle to `*out`.
///
/// Errors: `-EINVAL` (reserved domain id 0x7FF0 and up), `-EEXIST` (that vCPU exists).
///
/// Thread safety: any thread, concurrently with any call but `vpmu_destroy`.
///
/// # Safety
/// `vpmu` is a live handle; `out` and `err` (may be NULL) are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_vcpu_create(
    vpmu: *const VpmuHandle,
    domain: u32,
    vcpu: u32,
    out: *mut *const VcpuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        check_poison(&handle.poisoned)?;
        if out.is_null() {
            return Err(null());
        }
        let id = VcpuId { domain, vcpu };
        let pmu = handle.vpmu.new_vcpu(id)?;
        let mut map = handle
            .vcpus
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&id) {
            return Err(VpmuError::new(VPMU_EEXIST, VpmuReason::VcpuExists).with_vcpu(domain, vcpu));
        }
        let cell = Arc::new(VcpuHandle {
            id,
            pmu: Mutex::new(pmu),
            running_on: AtomicU32::new(NOWHERE),
        });
        map.insert(id, Arc::clone(&cell));
        // SAFETY: `out` is not NULL and writable (the caller's contract).
        unsafe { put(out, Arc::into_raw(cell)) }
    })
}

/// Destroys a vCPU's PMU state. Refused (`-EBUSY`, `VPMU_REASON_VCPU_IN_USE`) while it is a
/// pCPU's current vCPU or has PMU state (tear it down first: `vpmu_teardown_vcpu`).
///
/// Thread safety: any thread; no other call may use this vCPU meanwhile.
///
/// # Safety
/// `vpmu` and `vcpu` are live handles, `vcpu` one of `vpmu`'s; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_vcpu_destroy(
    vpmu: *const VpmuHandle,
    vcpu: *const VcpuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (handle, cell) = unsafe { (handle(vpmu)?, handle(vcpu)?) };
        let id = cell.id;
        let in_use =
            VpmuError::new(VPMU_EBUSY, VpmuReason::VcpuInUse).with_vcpu(id.domain, id.vcpu);
        let poisoned = handle.poisoned.load(Ordering::SeqCst);
        if !poisoned
            && (cell.running_on.load(Ordering::SeqCst) != NOWHERE
                || cell.lock().state() != vpmu_vendor_any::vpmu::VcpuState::Allocated)
        {
            return Err(in_use);
        }
        let mut map = handle
            .vcpus
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match map.get(&id) {
            Some(registered) if Arc::as_ptr(registered) == vcpu => map.remove(&id),
            _ => return Err(bad_argument().with_vcpu(id.domain, id.vcpu)),
        };
        // SAFETY: `vcpu` is the live `Arc` `vpmu_vcpu_create` gave the caller, given back.
        drop(unsafe { Arc::from_raw(vcpu) });
        Ok(())
    })
}

/// Attaches physical CPU `index`: takes over its PMU through `msr` (copied) with `ctx`, which
/// every MSR and platform callback of calls on this pCPU gets, cleans the PMU, and writes the
/// handle to `*out`. Call it on that CPU, before it first enters a guest.
///
/// Errors: `-ENODEV` (index out of range), `-EBUSY` (attached already), `-EIO` (an MSR access
/// faulted), `-EINVAL` (NULL argument or missing callback).
///
/// Thread safety: on the pCPU being attached; concurrently with calls on other pCPUs.
///
/// # Safety
/// `vpmu` is a live handle; `msr` a valid table whose callbacks, with `ctx`, stay callable
/// until detach; `out` and `err` (may be NULL) are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_pcpu_attach(
    vpmu: *const VpmuHandle,
    index: u32,
    msr: *const VpmuMsrOps,
    ctx: *mut c_void,
    out: *mut *mut PcpuHandle,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle and a valid table.
        let (handle, ops) = unsafe { (handle(vpmu)?, handle(msr)?) };
        check_poison(&handle.poisoned)?;
        if out.is_null() {
            return Err(null());
        }
        if ops.rdmsr.is_none() || ops.wrmsr.is_none() {
            return Err(VpmuError::new(VPMU_EINVAL, VpmuReason::MissingCallback));
        }
        let _poison = PoisonOnUnwind(&handle.poisoned);
        let bus = CMsrBus { ops: *ops, ctx };
        let pmu = handle.vpmu.attach_pcpu(index, bus)?;
        // SAFETY: `vpmu` is a live `Arc` from `vpmu_create`: this pCPU takes a reference of
        // its own, released at detach.
        let vpmu = unsafe {
            Arc::increment_strong_count(vpmu);
            Arc::from_raw(vpmu)
        };
        let pcpu = Box::new(PcpuHandle {
            vpmu,
            index,
            ctx,
            pmu: Mutex::new(pmu),
        });
        // SAFETY: `out` is not NULL and writable (the caller's contract).
        unsafe { put(out, Box::into_raw(pcpu)) }
    })
}

/// Detaches a pCPU: catches it up, drops its system-wide context, and frees the handle. It
/// must run no vCPU (`-EBUSY`, `VPMU_REASON_PCPU_RUNS_VCPU`: switch it to none first; the
/// handle stays valid). On a poisoned vPMU the handle is freed without touching the hardware,
/// and the call answers `-ENOTRECOVERABLE`.
///
/// Thread safety: on that pCPU, with no other call on it.
///
/// # Safety
/// `pcpu` is NULL or a live handle from `vpmu_pcpu_attach`; `err` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_pcpu_detach(pcpu: *mut PcpuHandle, err: *mut VpmuError) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let this = unsafe { handle(pcpu.cast_const())? };
        let poisoned = check_poison(&this.vpmu.poisoned);
        if poisoned.is_ok() {
            this.call(|call| {
                if let Some(vcpu) = call.pmu.current() {
                    let refused = VpmuError::new(VPMU_EBUSY, VpmuReason::PcpuRunsVcpu);
                    return Err(refused
                        .with_pcpu(this.index)
                        .with_vcpu(vcpu.domain, vcpu.vcpu));
                }
                Ok(())
            })?;
        }
        // SAFETY: the caller gives back the `Box` `vpmu_pcpu_attach` gave it, and no other
        // call uses it (the contract above).
        let owned = unsafe { Box::from_raw(pcpu) };
        let PcpuHandle { vpmu, ctx, pmu, .. } = *owned;
        poisoned?;
        let _poison = PoisonOnUnwind(&vpmu.poisoned);
        let pmu = pmu.into_inner().unwrap_or_else(PoisonError::into_inner);
        let mut platform = vpmu.platform(ctx);
        // The pCPU runs no vCPU (checked above), so the core's refusal is a catch-up fault:
        // the handle is gone either way, and the fault is reported.
        match vpmu.vpmu.detach_pcpu(&mut platform, pmu, &vpmu.vcpus) {
            Ok(_bus) => Ok(()),
            Err(refused) => Err(refused.error.into()),
        }
    })
}

/// `vpmu_set_event_filter`'s action: only the listed events count.
pub const VPMU_FILTER_ALLOW: u32 = 0;
/// `vpmu_set_event_filter`'s action: the listed events do not count.
pub const VPMU_FILTER_DENY: u32 = 1;
/// `vpmu_set_event_filter`'s action: remove the domain's filter (everything counts).
pub const VPMU_FILTER_NONE: u32 = 2;

/// One entry of an event filter (KVM's PMU event filter model, masked entries included).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VpmuEventMatch {
    /// Event select (12 bits on AMD, 8 on Intel).
    pub select: u16,
    /// Unit-mask bits that take part in the match.
    pub umask_mask: u8,
    /// Required value of those bits.
    pub umask_match: u8,
    /// Nonzero: an exclude entry, carving events out of what the include entries match.
    pub exclude: u8,
}

/// Installs `domain`'s event filter: `action` (`VPMU_FILTER_*`) over `count` entries, and the
/// bitmap of fixed counters the action applies to. Counters already programmed keep counting
/// until `vpmu_event_filter_changed` is called on a pCPU (which makes every pCPU judge them
/// again); new programming sees the new filter at once.
///
/// Errors: `-EINVAL` (unknown action, NULL entries with a count), `-ENOSPC` (more than
/// `VPMU_FILTER_MAX_ENTRIES` entries).
///
/// Thread safety: any thread, concurrently with any call but `vpmu_destroy`.
///
/// # Safety
/// `vpmu` is a live handle; `entries` points to `count` entries (or is NULL with 0); `err` is
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_set_event_filter(
    vpmu: *const VpmuHandle,
    domain: u32,
    action: u32,
    fixed_counters: u32,
    entries: *const VpmuEventMatch,
    count: usize,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or a live handle.
        let handle = unsafe { handle(vpmu)? };
        check_poison(&handle.poisoned)?;
        let action = match action {
            VPMU_FILTER_ALLOW => Some(FilterAction::Allow),
            VPMU_FILTER_DENY => Some(FilterAction::Deny),
            VPMU_FILTER_NONE => None,
            _ => return Err(bad_argument()),
        };
        let entries: &[VpmuEventMatch] = match (entries.is_null(), count) {
            (_, 0) => &[],
            (true, _) => return Err(null()),
            // SAFETY: the caller's contract: `count` readable entries.
            (false, _) => unsafe { std::slice::from_raw_parts(entries, count) },
        };
        if entries.len() > VPMU_FILTER_MAX_ENTRIES {
            return Err(VpmuError::new(VPMU_ENOSPC, VpmuReason::FilterTooLong));
        }
        let matches: Vec<_> = entries
            .iter()
            .map(|e| EventMatch::masked(e.select, e.umask_mask, e.umask_match, e.exclude != 0))
            .collect();
        let list = match action {
            Some(action) => Some(
                EventList::from_entries(action, fixed_counters, &matches)
                    .map_err(|_| VpmuError::new(VPMU_ENOSPC, VpmuReason::FilterTooLong))?,
            ),
            None => None,
        };
        let mut filters = handle
            .filters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut next = Filters::clone(&filters);
        match list {
            Some(list) => next.insert(domain, list),
            None => next.remove(&domain),
        };
        *filters = Arc::new(next);
        Ok(())
    })
}

/// The name of a `VPMU_REASON_*`, as a static NUL-terminated string ("unknown reason" for a
/// value that is none). Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn vpmu_reason_name(reason: u32) -> *const c_char {
    crate::error::reason_name(reason).as_ptr()
}
