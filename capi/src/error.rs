//! The error model: every entry point returns 0 or a negative errno (Linux's numbers, which
//! Xen uses too), and fills the caller's [`VpmuError`] (if it passed one) with the same errno
//! and a typed [`VpmuReason`]. No panic crosses the boundary: every entry point catches it,
//! reports [`VpmuReason::Panic`], and poisons the vPMU so that every later call says so.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use vpmu_abi::ops::OpError;
use vpmu_vendor_any::SelectError;
use vpmu_vendor_any::vpmu::{ChangeRefused, CoreError};

/// `EPERM`.
pub const VPMU_EPERM: i32 = 1;
/// `ENOENT`.
pub const VPMU_ENOENT: i32 = 2;
/// `EIO`.
pub const VPMU_EIO: i32 = 5;
/// `ENOMEM`.
pub const VPMU_ENOMEM: i32 = 12;
/// `EAGAIN`.
pub const VPMU_EAGAIN: i32 = 11;
/// `EFAULT`.
pub const VPMU_EFAULT: i32 = 14;
/// `EBUSY`.
pub const VPMU_EBUSY: i32 = 16;
/// `EEXIST`.
pub const VPMU_EEXIST: i32 = 17;
/// `ENODEV`.
pub const VPMU_ENODEV: i32 = 19;
/// `EINVAL`.
pub const VPMU_EINVAL: i32 = 22;
/// `ENOSPC`.
pub const VPMU_ENOSPC: i32 = 28;
/// `EOPNOTSUPP`.
pub const VPMU_EOPNOTSUPP: i32 = 95;
/// `ENOTRECOVERABLE`: a panic was caught; the vPMU is poisoned.
pub const VPMU_ENOTRECOVERABLE: i32 = 131;

/// Why a call failed (or `None`). The errno says what kind of failure it is; the reason says
/// which, so that a caller never has to guess from the errno.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VpmuReason {
    /// No error.
    None = 0,
    /// A required pointer argument was NULL (`-EINVAL`).
    NullArgument,
    /// A required callback of a table was NULL (`-EINVAL`).
    MissingCallback,
    /// An argument is out of range: an unknown mode, request kind, filter action, a buffer
    /// of the wrong size (`-EINVAL`).
    BadArgument,
    /// CPUID names a vendor neither backend drives (`-ENODEV`).
    UnknownVendor,
    /// The CPU advertises no PMU (`-ENODEV`).
    NoPmu,
    /// The vendor backend does not drive this PMU (`-EOPNOTSUPP`).
    UnsupportedPmu,
    /// An MSR access through the bus faulted: a hypervisor or backend bug (`-EIO`);
    /// [`VpmuError::msr`] names the MSR.
    HardwareFault,
    /// The vCPU's context is loaded on another pCPU than the caller's (`-EINVAL`);
    /// [`VpmuError::pcpu`] names it. Switch it out there first.
    WrongPcpu,
    /// The pCPU index is not below the count the vPMU was made for (`-ENODEV`).
    NoSuchPcpu,
    /// The pCPU is attached already (`-EBUSY`).
    PcpuAlreadyAttached,
    /// The pCPU still runs a vCPU (`-EBUSY`): switch it to none before detaching it.
    PcpuRunsVcpu,
    /// The pCPU handle is in use by another call: a call made from one of its own callbacks,
    /// or from another thread (`-EBUSY`). A pCPU is driven by one thread at a time.
    PcpuBusy,
    /// The vCPU is not in the vPMU's table (`-ENOENT`).
    NoSuchVcpu,
    /// A vCPU of that id exists already (`-EEXIST`).
    VcpuExists,
    /// The vCPU still has PMU state or runs on a pCPU (`-EBUSY`): switch it out and tear it
    /// down before destroying it.
    VcpuInUse,
    /// The domain id is in the reserved range (0x7FF0 and up: the page's special
    /// identities) (`-EINVAL`).
    ReservedDomain,
    /// pCPUs are still attached or vCPUs still exist (`-EBUSY`): detach and destroy them first.
    StillInUse,
    /// A policy change (mode, features, event filter) is still being applied on other pCPUs
    /// (`-EAGAIN`): complete their requests and call again.
    ChangeInProgress,
    /// Unprivileged vPMUs are in use, so the change is refused (`-EBUSY`).
    VpmusInUse,
    /// An event filter has more entries than [`crate::VPMU_FILTER_MAX_ENTRIES`] (`-ENOSPC`).
    FilterTooLong,
    /// The control operation failed with the xenpmu error whose errno is returned (the
    /// hypercall's return value); for `-ENOBUFS` [`VpmuError::needed`] is the size needed.
    OpRefused,
    /// A Rust panic was caught at the boundary (`-ENOTRECOVERABLE`): a bug in the library.
    /// The vPMU is poisoned: every later call on it fails with [`VpmuReason::Poisoned`].
    Panic,
    /// An earlier call panicked; the vPMU's state can no longer be trusted
    /// (`-ENOTRECOVERABLE`). Only `vpmu_destroy` and the detach/destroy calls still work.
    Poisoned,
    /// `vpmu_vcpu_snapshot` refused: the vCPU is not quiesced (`-EBUSY`), or the mode keeps
    /// no per-vCPU contexts (`-EOPNOTSUPP`).
    SnapshotNotTaken,
    /// The bytes given to `vpmu_vcpu_restore` are not a snapshot this library reads (magic,
    /// version, length, checksum, a field) (`-EINVAL`).
    SnapshotInvalid,
    /// The snapshot is of another vendor or PMU shape, other features, or a mode without
    /// per-vCPU contexts (`-EOPNOTSUPP`).
    SnapshotIncompatible,
    /// The snapshot's contents are refused: a register by its WRMSR validator
    /// ([`VpmuError::msr`] names it), a register set not this PMU's, an inconsistent state, a
    /// ring configuration, a frame (`-EINVAL`, `-ENOMEM`, `-EADDRINUSE`).
    SnapshotRefused,
}

/// An error's details, filled by every entry point that is given one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VpmuError {
    /// The negative errno the call returned (0 on success).
    pub errno: i32,
    /// Why.
    pub reason: VpmuReason,
    /// For [`VpmuReason::HardwareFault`]: the MSR whose access faulted.
    pub msr: u32,
    /// For [`VpmuReason::WrongPcpu`]: the pCPU holding the vCPU; for the pCPU reasons: the
    /// pCPU index.
    pub pcpu: u32,
    /// For the vCPU reasons: the vCPU's domain.
    pub domain: u32,
    /// For the vCPU reasons: the vCPU's index in its domain.
    pub vcpu: u32,
    /// For a control operation refused with `-ENOBUFS`: the bytes the buffer needs.
    pub needed: u32,
}

impl VpmuError {
    /// No error.
    pub const NONE: VpmuError = VpmuError {
        errno: 0,
        reason: VpmuReason::None,
        msr: 0,
        pcpu: 0,
        domain: 0,
        vcpu: 0,
        needed: 0,
    };

    /// An error of `errno` (positive) and `reason`, no details.
    pub(crate) fn new(errno: i32, reason: VpmuReason) -> Self {
        VpmuError {
            errno: -errno,
            reason,
            ..VpmuError::NONE
        }
    }

    /// The same error naming vCPU `domain`.`vcpu`.
    pub(crate) fn with_vcpu(mut self, domain: u32, vcpu: u32) -> Self {
        (self.domain, self.vcpu) = (domain, vcpu);
        self
    }

    /// The same error naming pCPU `pcpu`.
    pub(crate) fn with_pcpu(mut self, pcpu: u32) -> Self {
        self.pcpu = pcpu;
        self
    }
}

/// What an entry point's body returns.
pub(crate) type Outcome = Result<(), VpmuError>;

/// A NULL pointer argument.
pub(crate) fn null() -> VpmuError {
    VpmuError::new(VPMU_EINVAL, VpmuReason::NullArgument)
}

/// An argument out of range.
pub(crate) fn bad_argument() -> VpmuError {
    VpmuError::new(VPMU_EINVAL, VpmuReason::BadArgument)
}

impl From<CoreError> for VpmuError {
    fn from(error: CoreError) -> Self {
        match error {
            CoreError::Fault(fault) => VpmuError {
                msr: fault.msr.0,
                ..VpmuError::new(VPMU_EIO, VpmuReason::HardwareFault)
            },
            CoreError::WrongPcpu { loaded_on, .. } => {
                VpmuError::new(VPMU_EINVAL, VpmuReason::WrongPcpu).with_pcpu(loaded_on)
            }
            CoreError::NoSuchPcpu(pcpu) => {
                VpmuError::new(VPMU_ENODEV, VpmuReason::NoSuchPcpu).with_pcpu(pcpu)
            }
            CoreError::PcpuAlreadyAttached(pcpu) => {
                VpmuError::new(VPMU_EBUSY, VpmuReason::PcpuAlreadyAttached).with_pcpu(pcpu)
            }
            CoreError::PcpuRunsVcpu { pcpu, vcpu } => {
                VpmuError::new(VPMU_EBUSY, VpmuReason::PcpuRunsVcpu)
                    .with_pcpu(pcpu)
                    .with_vcpu(vcpu.domain, vcpu.vcpu)
            }
            CoreError::NoSuchVcpu(id) => {
                VpmuError::new(VPMU_ENOENT, VpmuReason::NoSuchVcpu).with_vcpu(id.domain, id.vcpu)
            }
            CoreError::ReservedDomain(domain) => {
                VpmuError::new(VPMU_EINVAL, VpmuReason::ReservedDomain).with_vcpu(domain, 0)
            }
        }
    }
}

impl From<ChangeRefused> for VpmuError {
    fn from(refused: ChangeRefused) -> Self {
        match refused {
            ChangeRefused::InProgress => VpmuError::new(VPMU_EAGAIN, VpmuReason::ChangeInProgress),
            ChangeRefused::InUse => VpmuError::new(VPMU_EBUSY, VpmuReason::VpmusInUse),
            ChangeRefused::Fault(error) => error.into(),
        }
    }
}

impl From<OpError> for VpmuError {
    fn from(error: OpError) -> Self {
        let needed = match error {
            OpError::BufferTooSmall { needed } => needed,
            _ => 0,
        };
        VpmuError {
            needed,
            ..VpmuError::new(error.errno(), VpmuReason::OpRefused)
        }
    }
}

impl From<SelectError> for VpmuError {
    fn from(error: SelectError) -> Self {
        match error {
            SelectError::UnknownVendor(_) => VpmuError::new(VPMU_ENODEV, VpmuReason::UnknownVendor),
            SelectError::NoPmu { .. } => VpmuError::new(VPMU_ENODEV, VpmuReason::NoPmu),
            SelectError::Intel(_) | SelectError::Amd(_) => {
                VpmuError::new(VPMU_EOPNOTSUPP, VpmuReason::UnsupportedPmu)
            }
        }
    }
}

/// Sets `flag` if dropped while a panic unwinds: the vPMU whose state a panicking call was
/// changing is poisoned.
pub(crate) struct PoisonOnUnwind<'a>(pub(crate) &'a AtomicBool);

impl Drop for PoisonOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// The error of a call on a poisoned vPMU.
pub(crate) fn check_poison(flag: &AtomicBool) -> Outcome {
    if flag.load(Ordering::SeqCst) {
        return Err(VpmuError::new(VPMU_ENOTRECOVERABLE, VpmuReason::Poisoned));
    }
    Ok(())
}

/// Runs an entry point's `body`, catching any panic, and reports: returns 0 or the negative
/// errno, and writes the details to `out` unless it is NULL.
pub(crate) fn guarded(out: *mut VpmuError, body: impl FnOnce() -> Outcome) -> i32 {
    let error = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => VpmuError::NONE,
        Ok(Err(error)) => error,
        Err(payload) => {
            report_panic(payload.as_ref());
            VpmuError::new(VPMU_ENOTRECOVERABLE, VpmuReason::Panic)
        }
    };
    if !out.is_null() {
        // SAFETY: the caller passed `out` as NULL or as a pointer to a writable `vpmu_error`
        // (each entry point's contract); NULL was excluded above.
        unsafe { out.write(error) };
    }
    error.errno
}

/// A caught panic's message on standard error: the one trace of a library bug the caller
/// cannot otherwise see (the default hook already printed where it happened).
fn report_panic(payload: &(dyn Any + Send)) {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    eprintln!("vpmu-capi: a panic was caught at the C boundary: {message}");
}

/// The reason's name, as a static NUL-terminated string.
pub(crate) fn reason_name(reason: u32) -> &'static std::ffi::CStr {
    const NAMES: [&std::ffi::CStr; 29] = [
        c"none",
        c"null argument",
        c"missing callback",
        c"bad argument",
        c"unknown CPU vendor",
        c"no PMU",
        c"unsupported PMU",
        c"hardware (MSR) fault",
        c"vCPU loaded on another pCPU",
        c"no such pCPU",
        c"pCPU already attached",
        c"pCPU runs a vCPU",
        c"pCPU busy (reentrant or concurrent call)",
        c"no such vCPU",
        c"vCPU exists",
        c"vCPU in use",
        c"reserved domain id",
        c"still in use",
        c"policy change in progress",
        c"vPMUs in use",
        c"event filter too long",
        c"control operation refused",
        c"panic caught",
        c"poisoned by an earlier panic",
        c"snapshot not taken",
        c"not a snapshot",
        c"snapshot of another PMU or policy",
        c"snapshot refused",
        c"unknown reason",
    ];
    NAMES[(reason as usize).min(NAMES.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::VpmuReason::*;
    use super::reason_name;

    /// Every reason has a name of its own, at its discriminant; anything beyond is unknown.
    #[test]
    fn every_reason_has_its_own_name() {
        let all = [
            None,
            NullArgument,
            MissingCallback,
            BadArgument,
            UnknownVendor,
            NoPmu,
            UnsupportedPmu,
            HardwareFault,
            WrongPcpu,
            NoSuchPcpu,
            PcpuAlreadyAttached,
            PcpuRunsVcpu,
            PcpuBusy,
            NoSuchVcpu,
            VcpuExists,
            VcpuInUse,
            ReservedDomain,
            StillInUse,
            ChangeInProgress,
            VpmusInUse,
            FilterTooLong,
            OpRefused,
            Panic,
            Poisoned,
            SnapshotNotTaken,
            SnapshotInvalid,
            SnapshotIncompatible,
            SnapshotRefused,
        ];
        let names: Vec<_> = all.iter().map(|&r| reason_name(r as u32)).collect();
        for (i, (reason, name)) in all.iter().zip(&names).enumerate() {
            assert_eq!(*reason as usize, i);
            assert_ne!(name.to_bytes(), b"unknown reason", "{reason:?}");
            assert_eq!(names.iter().filter(|n| *n == name).count(), 1, "{reason:?}");
        }
        assert_eq!(reason_name(all.len() as u32).to_bytes(), b"unknown reason");
        assert_eq!(reason_name(u32::MAX).to_bytes(), b"unknown reason");
        assert_eq!(
            reason_name(HardwareFault as u32).to_bytes(),
            b"hardware (MSR) fault"
        );
    }
}
