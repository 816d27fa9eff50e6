//! `XENPMU_OP_COVERAGE`: the vPMU's own code coverage, for the privileged domain (ABI 1.1).
//!
//! Built only with the `coverage` feature, which links the `minicov` profiler runtime (LLVM's
//! raw-profile writer, `no_std`). The counters exist only in code compiled with
//! `-C instrument-coverage` (`scripts/coverage.sh` instruments the vPMU crates and minicov and
//! nothing else); a build with the feature but without instrumentation answers with a valid,
//! empty profile. Without the feature the operation is `-EOPNOTSUPP` and only that answer is
//! compiled: the default build carries no coverage code.
//!
//! Check order, as for every operation (docs/abi.md): a vPMU at all (`Vpmu::control_op` answers
//! `-EOPNOTSUPP` for a `Vpmu::unavailable` before this runs) and built in, version, privilege,
//! arguments, then the buffer. A read into a buffer smaller than the profile fails with `-ENOBUFS`
//! carrying the size needed; a buffer the platform cannot write fails with `-EFAULT` (bytes
//! before the fault may have been written: the buffer is the caller's own memory). A buffer
//! whose `size` bytes would wrap past 2^64 fails with `-EFAULT` before anything is written:
//! every range handed to `Platform::write_guest` lies within `buffer .. buffer + size`, and
//! that range fits in 64 bits.

#[cfg(feature = "coverage")]
use vpmu_abi::XENPMU_VERSION_MAJOR;
use vpmu_abi::ops::{CoverageParams, OpError};
#[cfg(feature = "coverage")]
use vpmu_abi::ops::{XENPMU_COVERAGE_GET_SIZE, XENPMU_COVERAGE_READ, XENPMU_COVERAGE_RESET};

use crate::backend::PmuBackend;
use crate::core::Vpmu;
use crate::platform::{Platform, VcpuId};

impl<B: PmuBackend> Vpmu<B> {
    /// `XENPMU_OP_COVERAGE` for `caller`. The runtime is not thread-safe: the control lock
    /// serializes the callers.
    pub(crate) fn coverage_op<P: Platform>(
        &self,
        platform: &mut P,
        caller: VcpuId,
        params: &CoverageParams,
    ) -> Result<CoverageParams, OpError> {
        #[cfg(not(feature = "coverage"))]
        {
            let _ = (platform, caller, params);
            Err(OpError::NotSupported)
        }
        #[cfg(feature = "coverage")]
        {
            if params.version.major != u32::from(XENPMU_VERSION_MAJOR) {
                return Err(OpError::VersionMismatch);
            }
            if caller.domain != platform.privileged_domain() {
                return Err(OpError::NotPrivileged);
            }
            let mut out = *params;
            let _control = self.control.lock();
            match params.subop {
                XENPMU_COVERAGE_GET_SIZE | XENPMU_COVERAGE_RESET
                    if params.buffer != 0 || params.size != 0 =>
                {
                    return Err(OpError::InvalidArgument);
                }
                XENPMU_COVERAGE_GET_SIZE => out.size = runtime::size()?,
                XENPMU_COVERAGE_RESET => runtime::reset(),
                XENPMU_COVERAGE_READ => {
                    let needed = runtime::size()?;
                    if params.size < needed {
                        return Err(OpError::BufferTooSmall { needed });
                    }
                    out.size = runtime::read(platform, caller, params.buffer, params.size)?;
                }
                _ => return Err(OpError::InvalidArgument),
            }
            Ok(out)
        }
    }
}

#[cfg(feature = "coverage")]
mod runtime {
    use minicov::{CoverageWriteError, CoverageWriter};
    use vpmu_abi::ops::OpError;

    use crate::platform::{Platform, VcpuId};

    unsafe extern "C" {
        /// LLVM's profile runtime (compiled into minicov): the exact size of the raw profile
        /// a capture writes now.
        fn __llvm_profile_get_size_for_buffer() -> u64;
    }

    /// The raw profile's size; `-ENOSPC` past 4 GiB (the ABI's size field is 32 bits).
    pub(super) fn size() -> Result<u32, OpError> {
        // SAFETY: a pure function of the profile sections' bounds, which the linker fixed.
        let size = unsafe { __llvm_profile_get_size_for_buffer() };
        u32::try_from(size).map_err(|_| OpError::NoSpace)
    }

    pub(super) fn reset() {
        minicov::reset_coverage();
    }

    /// Streams the profile into the caller's buffer (`at`, `limit` bytes) through the
    /// platform; never past its end, whatever the runtime writes.
    struct GuestBuffer<'p, P> {
        platform: &'p mut P,
        caller: VcpuId,
        at: u64,
        limit: u64,
        written: u64,
    }

    impl<P: Platform> CoverageWriter for GuestBuffer<'_, P> {
        fn write(&mut self, data: &[u8]) -> Result<(), CoverageWriteError> {
            let end = self.written + data.len() as u64;
            // `at + limit` fits in 64 bits (`read` checked it), so no range here wraps.
            let ok = end <= self.limit
                && self.at.checked_add(end).is_some()
                && self
                    .platform
                    .write_guest(self.caller, self.at + self.written, data);
            if !ok {
                return Err(CoverageWriteError);
            }
            self.written = end;
            Ok(())
        }
    }

    /// Writes the profile into the caller's `size`-byte buffer at `buffer`; the bytes
    /// written. A write the platform refuses (or one past `size`) is `-EFAULT`, and so is a
    /// buffer that wraps past 2^64, refused before anything is written.
    pub(super) fn read<P: Platform>(
        platform: &mut P,
        caller: VcpuId,
        buffer: u64,
        size: u32,
    ) -> Result<u32, OpError> {
        if buffer.checked_add(u64::from(size)).is_none() {
            return Err(OpError::BadAddress);
        }
        let mut sink = GuestBuffer {
            platform,
            caller,
            at: buffer,
            limit: u64::from(size),
            written: 0,
        };
        // SAFETY: minicov's capture is not reentrant or thread-safe; the caller holds the
        // core exclusively (`&mut Vpmu`), and the writer does not call back into the core.
        let captured = unsafe { minicov::capture_coverage(&mut sink) };
        match captured {
            Ok(()) => u32::try_from(sink.written).map_err(|_| OpError::NoSpace),
            Err(_) => Err(OpError::BadAddress),
        }
    }
}
