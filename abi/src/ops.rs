//! Control operations: the parameter block, operation numbers, mode and feature bits, and the
//! error codes the operations return (as negative errno values).
//!
//! `docs/abi.md` specifies, per operation, the check order (version, then privilege, then
//! arguments) and which error each failure gives.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Read the global mode (`Params::val`) and the hypervisor's ABI version (`Params::version`).
pub const XENPMU_OP_MODE_GET: u32 = 0;
/// Set the global mode (privileged domain only).
pub const XENPMU_OP_MODE_SET: u32 = 1;
/// Read the global feature bits.
pub const XENPMU_OP_FEATURE_GET: u32 = 2;
/// Set the global feature bits (privileged domain only).
pub const XENPMU_OP_FEATURE_SET: u32 = 3;
/// Register the shared page (`Params::val` = guest frame number) of vCPU `Params::vcpu`.
pub const XENPMU_OP_INIT: u32 = 4;
/// Unregister the shared page of vCPU `Params::vcpu`.
pub const XENPMU_OP_FINISH: u32 = 5;
/// Apply the mask bit of the calling vCPU's `Page::lapic_lvtpc`.
pub const XENPMU_OP_LVTPC_SET: u32 = 6;
/// End the cached window: verify and load the calling vCPU's page's vendor context.
pub const XENPMU_OP_FLUSH: u32 = 7;
/// The vPMU's own code coverage (privileged; version 1.1): the sub-operation in
/// `CoverageParams::subop`. `-EOPNOTSUPP` when the hypervisor was built without it.
pub const XENPMU_OP_COVERAGE: u32 = 8;
/// Register a sample ring (version 1.4) for vCPU `Params::vcpu`: `Params::val` = guest frame
/// number of the ring area's control page (`ring::RingControl`), whose configuration the caller
/// wrote; the data pages follow it.
pub const XENPMU_OP_RING_INIT: u32 = 9;
/// Unregister the sample ring (version 1.4) of vCPU `Params::vcpu`; samples go to the page
/// again.
pub const XENPMU_OP_RING_FINISH: u32 = 10;
/// Number of operations version 1.4 defines; higher numbers are reserved.
pub const XENPMU_OP_COUNT: u32 = 11;

/// Coverage sub-operation: OUT `size` = the bytes of the raw profile a read would return.
pub const XENPMU_COVERAGE_GET_SIZE: u32 = 0;
/// Coverage sub-operation: write the raw profile (LLVM's `.profraw` format) into the caller's
/// buffer at guest-physical `buffer` of IN `size` bytes; OUT `size` = the bytes written, or
/// with `-ENOBUFS` the bytes needed.
pub const XENPMU_COVERAGE_READ: u32 = 1;
/// Coverage sub-operation: zero every counter.
pub const XENPMU_COVERAGE_RESET: u32 = 2;

/// Mode: no vPMU; guests see no PMU.
pub const XENPMU_MODE_OFF: u64 = 0;
/// Mode: each guest profiles itself.
pub const XENPMU_MODE_SELF: u64 = 1 << 0;
/// Mode: as self, and the privileged domain also receives samples of the hypervisor.
pub const XENPMU_MODE_HV: u64 = 1 << 1;
/// Mode: only the privileged domain has a vPMU; it samples the whole machine.
pub const XENPMU_MODE_ALL: u64 = 1 << 2;
/// Every mode bit; a mode value has at most one of them.
pub const XENPMU_MODE_MASK: u64 = XENPMU_MODE_SELF | XENPMU_MODE_HV | XENPMU_MODE_ALL;

/// Feature: Intel branch trace store through DS_AREA (not safe for production).
pub const XENPMU_FEATURE_INTEL_BTS: u64 = 1 << 0;
/// Feature: guests may count only core cycles, reference cycles and retired instructions.
pub const XENPMU_FEATURE_IPC_ONLY: u64 = 1 << 1;
/// Feature: guests may count only Intel's architectural events.
pub const XENPMU_FEATURE_ARCH_ONLY: u64 = 1 << 2;
/// Every feature bit.
pub const XENPMU_FEATURE_MASK: u64 =
    XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_IPC_ONLY | XENPMU_FEATURE_ARCH_ONLY;

/// errno: the caller is not the privileged domain.
pub const XENPMU_EPERM: i32 = 1;
/// errno: no vPMU for that vCPU, or no page registered.
pub const XENPMU_ENOENT: i32 = 2;
/// errno: the guest-edited vendor context failed verification at flush; the sample stays cached.
pub const XENPMU_EIO: i32 = 5;
/// errno: a mode or feature change is still being applied on other physical CPUs, or an
/// operation waits for another physical CPU to stop the target's counters: nothing is wrong,
/// call again (the change, once begun, completes on its own).
pub const XENPMU_EAGAIN: i32 = 11;
/// errno: the frame is already registered as the shared page of another vCPU.
pub const XENPMU_EADDRINUSE: i32 = 98;
/// errno: the hypervisor could not map the page.
pub const XENPMU_ENOMEM: i32 = 12;
/// errno: the caller's buffer could not be written (coverage read).
pub const XENPMU_EFAULT: i32 = 14;
/// errno: the mode or features cannot change while unprivileged vPMUs exist.
pub const XENPMU_EBUSY: i32 = 16;
/// errno: a page is already registered for that vCPU.
pub const XENPMU_EEXIST: i32 = 17;
/// errno: an argument is invalid (unknown bits, bad vCPU, bad frame, non-zero padding).
pub const XENPMU_EINVAL: i32 = 22;
/// errno: the enumerated counters do not fit the page's vendor area.
pub const XENPMU_ENOSPC: i32 = 28;
/// errno: the caller's `Params::version.major` differs from the hypervisor's.
pub const XENPMU_EPROTONOSUPPORT: i32 = 93;
/// errno: the caller's buffer is too small (coverage read); OUT `size` = the bytes needed.
pub const XENPMU_ENOBUFS: i32 = 105;
/// errno: unknown operation, or no vPMU in this hypervisor at all.
pub const XENPMU_EOPNOTSUPP: i32 = 95;

/// An ABI version pair as carried in `Params`.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Version {
    /// Major version (IN: the caller's; OUT from mode_get: the hypervisor's).
    pub major: u32,
    /// Minor version (IN: the caller's, informational; OUT from mode_get: the hypervisor's).
    pub minor: u32,
}

/// The parameter block every control operation takes.
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Params {
    /// ABI version (IN/OUT).
    pub version: Version,
    /// IN/OUT: the mode, the features, or the guest frame number of the page, per operation.
    pub val: u64,
    /// IN: target vCPU of init and finish; must be zero for other operations.
    pub vcpu: u32,
    /// Reserved, must be zero.
    pub _pad0: u32,
}

/// The parameter block of `XENPMU_OP_COVERAGE`: the same 24 bytes as `Params`, read as
/// `buffer` (`Params::val`), `size` (`Params::vcpu`) and `subop` (`Params::_pad0`).
#[repr(C)]
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct CoverageParams {
    /// ABI version (IN; the major version must match).
    pub version: Version,
    /// IN: guest-physical address of the read buffer; zero for the other sub-operations.
    pub buffer: u64,
    /// IN: the buffer's size in bytes (read; zero otherwise). OUT: the profile's size
    /// (get_size), the bytes written (read), or the bytes needed (read failing `-ENOBUFS`).
    pub size: u32,
    /// IN: `XENPMU_COVERAGE_*`.
    pub subop: u32,
}

impl From<Params> for CoverageParams {
    fn from(p: Params) -> Self {
        Self {
            version: p.version,
            buffer: p.val,
            size: p.vcpu,
            subop: p._pad0,
        }
    }
}

impl From<CoverageParams> for Params {
    fn from(c: CoverageParams) -> Self {
        Self {
            version: c.version,
            val: c.buffer,
            vcpu: c.size,
            _pad0: c.subop,
        }
    }
}

impl Params {
    /// A parameter block carrying this crate's ABI version.
    pub fn new(val: u64, vcpu: u32) -> Self {
        Self {
            version: Version {
                major: u32::from(crate::XENPMU_VERSION_MAJOR),
                minor: u32::from(crate::XENPMU_VERSION_MINOR),
            },
            val,
            vcpu,
            _pad0: 0,
        }
    }
}

/// A control operation, decoded from its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `XENPMU_OP_MODE_GET`.
    ModeGet,
    /// `XENPMU_OP_MODE_SET`.
    ModeSet,
    /// `XENPMU_OP_FEATURE_GET`.
    FeatureGet,
    /// `XENPMU_OP_FEATURE_SET`.
    FeatureSet,
    /// `XENPMU_OP_INIT`.
    Init,
    /// `XENPMU_OP_FINISH`.
    Finish,
    /// `XENPMU_OP_LVTPC_SET`.
    LvtpcSet,
    /// `XENPMU_OP_FLUSH`.
    Flush,
    /// `XENPMU_OP_COVERAGE`.
    Coverage,
    /// `XENPMU_OP_RING_INIT`.
    RingInit,
    /// `XENPMU_OP_RING_FINISH`.
    RingFinish,
}

impl Op {
    /// Every operation, in number order.
    pub const ALL: [Op; 11] = [
        Op::ModeGet,
        Op::ModeSet,
        Op::FeatureGet,
        Op::FeatureSet,
        Op::Init,
        Op::Finish,
        Op::LvtpcSet,
        Op::Flush,
        Op::Coverage,
        Op::RingInit,
        Op::RingFinish,
    ];

    /// Decodes an operation number; unknown numbers give `OpError::NotSupported` (`-EOPNOTSUPP`).
    pub fn from_number(number: u32) -> Result<Self, OpError> {
        usize::try_from(number)
            .ok()
            .and_then(|index| Self::ALL.get(index).copied())
            .ok_or(OpError::NotSupported)
    }

    /// The operation's number.
    pub fn number(self) -> u32 {
        match self {
            Op::ModeGet => XENPMU_OP_MODE_GET,
            Op::ModeSet => XENPMU_OP_MODE_SET,
            Op::FeatureGet => XENPMU_OP_FEATURE_GET,
            Op::FeatureSet => XENPMU_OP_FEATURE_SET,
            Op::Init => XENPMU_OP_INIT,
            Op::Finish => XENPMU_OP_FINISH,
            Op::LvtpcSet => XENPMU_OP_LVTPC_SET,
            Op::Flush => XENPMU_OP_FLUSH,
            Op::Coverage => XENPMU_OP_COVERAGE,
            Op::RingInit => XENPMU_OP_RING_INIT,
            Op::RingFinish => XENPMU_OP_RING_FINISH,
        }
    }

    /// Whether only the privileged domain may issue this operation.
    pub fn is_privileged(self) -> bool {
        matches!(self, Op::ModeSet | Op::FeatureSet | Op::Coverage)
    }
}

/// Why a control operation failed; each maps to one negative errno value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpError {
    /// `-EPERM`.
    NotPrivileged,
    /// `-ENOENT`.
    NoVpmu,
    /// `-EIO`.
    InvalidContext,
    /// `-ENOMEM`.
    MapFailed,
    /// `-EBUSY`.
    Busy,
    /// `-EEXIST`.
    AlreadyRegistered,
    /// `-EINVAL`.
    InvalidArgument,
    /// `-ENOSPC`.
    NoSpace,
    /// `-EPROTONOSUPPORT`.
    VersionMismatch,
    /// `-EOPNOTSUPP`.
    NotSupported,
    /// `-EFAULT`.
    BadAddress,
    /// `-EAGAIN`: in progress on other physical CPUs; call again.
    Again,
    /// `-EADDRINUSE`: the frame is another vCPU's shared page.
    FrameInUse,
    /// `-ENOBUFS`, with the size the caller's buffer needs (returned in the OUT `size`).
    BufferTooSmall {
        /// Bytes needed.
        needed: u32,
    },
}

impl OpError {
    /// Every error.
    pub const ALL: [OpError; 14] = [
        OpError::NotPrivileged,
        OpError::NoVpmu,
        OpError::InvalidContext,
        OpError::MapFailed,
        OpError::Busy,
        OpError::AlreadyRegistered,
        OpError::InvalidArgument,
        OpError::NoSpace,
        OpError::VersionMismatch,
        OpError::NotSupported,
        OpError::BadAddress,
        OpError::Again,
        OpError::FrameInUse,
        OpError::BufferTooSmall { needed: 0 },
    ];

    /// The positive errno value (`XENPMU_E*`).
    pub fn errno(self) -> i32 {
        match self {
            OpError::NotPrivileged => XENPMU_EPERM,
            OpError::NoVpmu => XENPMU_ENOENT,
            OpError::InvalidContext => XENPMU_EIO,
            OpError::MapFailed => XENPMU_ENOMEM,
            OpError::Busy => XENPMU_EBUSY,
            OpError::AlreadyRegistered => XENPMU_EEXIST,
            OpError::InvalidArgument => XENPMU_EINVAL,
            OpError::NoSpace => XENPMU_ENOSPC,
            OpError::VersionMismatch => XENPMU_EPROTONOSUPPORT,
            OpError::NotSupported => XENPMU_EOPNOTSUPP,
            OpError::BadAddress => XENPMU_EFAULT,
            OpError::Again => XENPMU_EAGAIN,
            OpError::FrameInUse => XENPMU_EADDRINUSE,
            OpError::BufferTooSmall { .. } => XENPMU_ENOBUFS,
        }
    }

    /// The value an operation returns for this error: `-errno`.
    pub fn return_value(self) -> i64 {
        -i64::from(self.errno())
    }

    /// Decodes an operation's return value: `Ok(())` for 0, the error for a known `-errno`,
    /// `None` for anything else (`-ENOBUFS` decodes with `needed: 0`: the needed size is in
    /// the OUT parameter block).
    pub fn from_return_value(value: i64) -> Option<Result<(), OpError>> {
        if value == 0 {
            return Some(Ok(()));
        }
        Self::ALL
            .iter()
            .find(|e| e.return_value() == value)
            .map(|e| Err(*e))
    }
}

impl core::fmt::Display for OpError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let text = match self {
            OpError::NotPrivileged => "operation needs the privileged domain",
            OpError::NoVpmu => "no vPMU or no registered page for this vCPU",
            OpError::InvalidContext => "vendor context in the shared page failed verification",
            OpError::MapFailed => "shared page could not be mapped",
            OpError::Busy => "mode or features cannot change while unprivileged vPMUs exist",
            OpError::AlreadyRegistered => "a shared page is already registered for this vCPU",
            OpError::InvalidArgument => "invalid argument",
            OpError::NoSpace => "counters do not fit the shared page's vendor area",
            OpError::VersionMismatch => "ABI major version differs from the hypervisor's",
            OpError::NotSupported => "operation not supported",
            OpError::BadAddress => "the caller's buffer could not be written",
            OpError::Again => "in progress on other physical CPUs: call again",
            OpError::FrameInUse => "the frame is already another vCPU's shared page",
            OpError::BufferTooSmall { .. } => "the caller's buffer is too small",
        };
        f.write_str(text)
    }
}

/// Whether `mode` is a valid mode value: no unknown bits and at most one mode bit.
pub fn is_valid_mode(mode: u64) -> bool {
    mode & !XENPMU_MODE_MASK == 0 && mode.count_ones() <= 1
}

/// Whether `features` has no unknown bits.
pub fn is_valid_features(features: u64) -> bool {
    features & !XENPMU_FEATURE_MASK == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_numbers_round_trip_and_unknown_ones_are_not_supported() {
        for (number, op) in Op::ALL.iter().enumerate() {
            assert_eq!(op.number(), number as u32);
            assert_eq!(Op::from_number(number as u32), Ok(*op));
        }
        for number in [XENPMU_OP_COUNT, 20, u32::MAX] {
            assert_eq!(Op::from_number(number), Err(OpError::NotSupported));
        }
    }

    #[test]
    fn only_the_setters_are_privileged() {
        for op in [Op::ModeSet, Op::FeatureSet, Op::Coverage] {
            assert!(op.is_privileged(), "{op:?}");
        }
        for op in [
            Op::ModeGet,
            Op::FeatureGet,
            Op::Init,
            Op::Finish,
            Op::LvtpcSet,
            Op::Flush,
        ] {
            assert!(!op.is_privileged(), "{op:?}");
        }
    }

    #[test]
    fn errors_have_distinct_errnos_that_decode_back() {
        for (i, a) in OpError::ALL.iter().enumerate() {
            for b in &OpError::ALL[i + 1..] {
                assert_ne!(a.errno(), b.errno());
            }
            assert_eq!(OpError::from_return_value(a.return_value()), Some(Err(*a)));
        }
        assert_eq!(OpError::from_return_value(0), Some(Ok(())));
        assert_eq!(OpError::from_return_value(-4), None);
        assert_eq!(OpError::from_return_value(5), None);
    }

    #[test]
    fn mode_and_feature_validity() {
        for mode in [
            XENPMU_MODE_OFF,
            XENPMU_MODE_SELF,
            XENPMU_MODE_HV,
            XENPMU_MODE_ALL,
        ] {
            assert!(is_valid_mode(mode));
        }
        assert!(!is_valid_mode(XENPMU_MODE_SELF | XENPMU_MODE_HV));
        assert!(!is_valid_mode(1 << 3));
        assert!(is_valid_features(XENPMU_FEATURE_MASK));
        assert!(!is_valid_features(1 << 3));
    }

    #[test]
    fn params_carry_this_version() {
        let params = Params::new(0x1234, 2);
        assert_eq!(params.version.major, u32::from(crate::XENPMU_VERSION_MAJOR));
        assert_eq!(params.version.minor, u32::from(crate::XENPMU_VERSION_MINOR));
        assert_eq!((params.val, params.vcpu, params._pad0), (0x1234, 2, 0));
    }
}
