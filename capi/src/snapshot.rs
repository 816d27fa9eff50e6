//! A vCPU's PMU state as bytes (docs/snapshot.md): taken from a quiesced vCPU, restored into a
//! fresh vCPU of this or another host of the same PMU shape. The bytes are untrusted input on
//! the way in: decoded with every check of the format, then every register judged by the
//! validator a guest WRMSR of it goes through.

use vpmu_vendor_any::vpmu::{DecodeError, RestoreError, TakeError, VcpuSnapshot};

use crate::error::{
    VPMU_EBUSY, VPMU_EINVAL, VPMU_ENOENT, VPMU_ENOMEM, VPMU_ENOSPC, VPMU_EOPNOTSUPP, VpmuError,
    VpmuReason, check_poison, guarded, null,
};
use crate::handles::{PcpuHandle, VcpuHandle, VpmuHandle, handle, put};

/// `EADDRINUSE`: a frame of the snapshot's page or ring is another vCPU's.
pub const VPMU_EADDRINUSE: i32 = 98;

impl From<TakeError> for VpmuError {
    fn from(error: TakeError) -> Self {
        let errno = match error {
            TakeError::NotQuiesced | TakeError::SystemWide | TakeError::PmiInFlight => VPMU_EBUSY,
            TakeError::Mode(_) => VPMU_EOPNOTSUPP,
            TakeError::TooManyRegisters => VPMU_ENOSPC,
        };
        VpmuError::new(errno, VpmuReason::SnapshotNotTaken)
    }
}

impl From<DecodeError> for VpmuError {
    fn from(_: DecodeError) -> Self {
        VpmuError::new(VPMU_EINVAL, VpmuReason::SnapshotInvalid)
    }
}

impl From<RestoreError> for VpmuError {
    fn from(error: RestoreError) -> Self {
        use vpmu_vendor_any::vpmu::MapError;
        let refused = |errno| VpmuError::new(errno, VpmuReason::SnapshotRefused);
        match error {
            RestoreError::Vendor
            | RestoreError::Shape { .. }
            | RestoreError::Mode(_)
            | RestoreError::Features { .. } => {
                VpmuError::new(VPMU_EOPNOTSUPP, VpmuReason::SnapshotIncompatible)
            }
            RestoreError::Register(register) => VpmuError {
                msr: register.msr,
                ..refused(VPMU_EINVAL)
            },
            RestoreError::RegisterSet { .. }
            | RestoreError::Inconsistent(_)
            | RestoreError::RingConfig
            | RestoreError::Map(MapError::InvalidFrame) => refused(VPMU_EINVAL),
            RestoreError::Map(MapError::NoMemory) => refused(VPMU_ENOMEM),
            RestoreError::FrameInUse => refused(VPMU_EADDRINUSE),
            RestoreError::NoSuchVcpu => VpmuError::new(VPMU_ENOENT, VpmuReason::NoSuchVcpu),
            RestoreError::TargetNotFresh => VpmuError::new(VPMU_EBUSY, VpmuReason::VcpuInUse),
        }
    }
}

/// The most bytes a snapshot takes (a buffer this large always fits). Thread safety: any.
#[unsafe(no_mangle)]
pub extern "C" fn vpmu_snapshot_max_bytes() -> usize {
    VcpuSnapshot::MAX_ENCODED_LEN
}

/// Takes `vcpu`'s PMU state as bytes into `buf` (`capacity` bytes) and writes their number
/// to `*len`. The vCPU must be quiesced: switched out of every pCPU, with no queued PMI
/// delivery outstanding, in self or hv mode.
///
/// Errors (`VPMU_REASON_SNAPSHOT_NOT_TAKEN`): `-EBUSY` (not quiesced, or all-mode state),
/// `-EOPNOTSUPP` (a mode without per-vCPU contexts); `-ENOSPC` with `VPMU_REASON_BAD_ARGUMENT`
/// and `err->needed` (and `*len`) the size needed when `capacity` is too small.
///
/// Thread safety: any thread (the library locks the vCPU).
///
/// # Safety
/// Live handles, `vcpu` one of `vpmu`'s; `buf` has `capacity` writable bytes (NULL with 0);
/// `len` and `err` (may be NULL) writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_vcpu_snapshot(
    vpmu: *const VpmuHandle,
    vcpu: *const VcpuHandle,
    buf: *mut u8,
    capacity: usize,
    len: *mut usize,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (handle, vcpu) = unsafe { (handle(vpmu)?, handle(vcpu)?) };
        check_poison(&handle.poisoned)?;
        let snapshot = handle.vpmu.take_snapshot(&vcpu.lock())?;
        let needed = snapshot.encoded_len();
        // SAFETY: `len` is NULL (refused) or writable.
        unsafe { put(len, needed)? };
        if capacity < needed || buf.is_null() {
            return Err(VpmuError {
                needed: u32::try_from(needed).unwrap_or(u32::MAX),
                ..VpmuError::new(VPMU_ENOSPC, VpmuReason::BadArgument)
            });
        }
        // SAFETY: the caller's contract: `capacity` writable bytes at `buf`, not NULL.
        let out = unsafe { std::slice::from_raw_parts_mut(buf, capacity) };
        let written = snapshot
            .encode(out)
            .map_err(|_| VpmuError::new(VPMU_ENOSPC, VpmuReason::BadArgument))?;
        debug_assert_eq!(written, needed);
        Ok(())
    })
}

/// Restores the snapshot `bytes` (`len` bytes) into `vcpu`, a vCPU made by
/// `vpmu_vcpu_create` and not run since, through `pcpu` (the caller's own pCPU, whose
/// platform callbacks map the snapshot's page and ring in the vCPU's domain: the guest's
/// memory must already hold them). Nothing changes on a refusal.
///
/// Errors: `-EINVAL` `VPMU_REASON_SNAPSHOT_INVALID` (not a snapshot: bad magic, version,
/// length, checksum, field), `-EOPNOTSUPP` `VPMU_REASON_SNAPSHOT_INCOMPATIBLE` (another
/// vendor, PMU shape, features, or a mode without contexts), `VPMU_REASON_SNAPSHOT_REFUSED`
/// (`-EINVAL`: a register refused by its WRMSR validator, with `err->msr`, a register set not
/// this PMU's, an inconsistent state, a ring configuration refused, a frame not mappable;
/// `-ENOMEM`; `-EADDRINUSE`: a frame another vCPU uses), `-EBUSY` `VPMU_REASON_VCPU_IN_USE`
/// (the target is not fresh).
///
/// Thread safety: on `pcpu`'s own CPU, one call at a time (as every call on a pCPU).
///
/// # Safety
/// Live handles of one vPMU; `bytes` has `len` readable bytes; `err` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vpmu_vcpu_restore(
    pcpu: *const PcpuHandle,
    vcpu: *const VcpuHandle,
    bytes: *const u8,
    len: usize,
    err: *mut VpmuError,
) -> i32 {
    guarded(err, || {
        // SAFETY: the caller's contract: NULL or live handles.
        let (this, vcpu) = unsafe { (handle(pcpu)?, handle(vcpu)?) };
        if bytes.is_null() {
            return Err(null());
        }
        // SAFETY: the caller's contract: `len` readable bytes at `bytes`, not NULL.
        let bytes = unsafe { std::slice::from_raw_parts(bytes, len) };
        let snapshot = VcpuSnapshot::decode(bytes)?;
        this.call(|call| {
            let (vpmu, vcpus) = (&call.handle.vpmu, &call.handle.vcpus);
            if !vcpus.is(vcpu) {
                return Err(VpmuError::from(RestoreError::NoSuchVcpu));
            }
            Ok(vpmu.restore_snapshot(&mut call.platform, vcpus, vcpu.id, &snapshot)?)
        })
    })
}
