//! `XENPMU_OP_COVERAGE` against docs/abi.md (issue 26, item 5): step 1 of the check order
//! ("the hypervisor has a vPMU at all") holds for it as for every operation, and a read never
//! hands the platform a write range that wraps past 2^64.
//!
//! The read tests exist only in builds with the `coverage` feature (`--all-features`, as CI
//! runs; `cargo test -p vpmu-tests --features coverage`); a default build checks that the
//! operation is not there.

use vpmu::Vpmu;
use vpmu::abi::XENPMU_OP_COVERAGE;
use vpmu::abi::ops::{
    CoverageParams, OpError, Params, XENPMU_COVERAGE_GET_SIZE, XENPMU_COVERAGE_READ,
    XENPMU_COVERAGE_RESET,
};
use vpmu::{Mode, VcpuId};
use vpmu_sim::{Machine, SimVendor, amd_v2, intel_v5};

const PRIVILEGED: VcpuId = VcpuId { domain: 0, vcpu: 0 };

fn coverage(subop: u32, buffer: u64, size: u32) -> Params {
    let version = Params::new(0, 0).version;
    Params::from(CoverageParams {
        version,
        buffer,
        size,
        subop,
    })
}

fn unavailable<V: SimVendor>(vendor: V) {
    let backend = vendor.backend();
    let mut m = Machine::with_vpmu(vendor, Vpmu::unavailable(backend, 1), 1, &[1, 1]);
    for params in [
        coverage(XENPMU_COVERAGE_GET_SIZE, 0, 0),
        coverage(XENPMU_COVERAGE_RESET, 0, 0),
        coverage(XENPMU_COVERAGE_READ, 0x1_0000 << 12, 4096),
    ] {
        assert_eq!(
            m.op(PRIVILEGED, XENPMU_OP_COVERAGE, &params),
            Err(OpError::NotSupported),
            "{params:?}"
        );
    }
    assert!(m.platform.guest_writes.is_empty());
}

#[test]
fn a_hypervisor_without_a_vpmu_answers_coverage_with_eopnotsupp() {
    unavailable(intel_v5());
    unavailable(amd_v2());
}

#[cfg(not(feature = "coverage"))]
#[test]
fn a_build_without_coverage_answers_eopnotsupp() {
    let mut m = Machine::new(intel_v5(), 1, &[1], Mode::Off.to_abi());
    assert_eq!(
        m.op(
            PRIVILEGED,
            XENPMU_OP_COVERAGE,
            &coverage(XENPMU_COVERAGE_GET_SIZE, 0, 0)
        ),
        Err(OpError::NotSupported)
    );
}

#[cfg(feature = "coverage")]
mod built_in {
    use super::*;
    use vpmu_sim::guest_frame;

    /// The raw profile's size, from GET_SIZE.
    fn profile_size<V: SimVendor>(m: &mut Machine<V>) -> u32 {
        let out = m
            .op(
                PRIVILEGED,
                XENPMU_OP_COVERAGE,
                &coverage(XENPMU_COVERAGE_GET_SIZE, 0, 0),
            )
            .expect("get_size");
        CoverageParams::from(out).size
    }

    #[test]
    fn a_read_into_a_wrapping_buffer_is_refused_before_any_write() {
        let mut m = Machine::new(intel_v5(), 1, &[1], Mode::Off.to_abi());
        let size = profile_size(&mut m);
        assert!(size > 16, "a raw profile has a header: {size}");
        for buffer in [u64::MAX - 7, u64::MAX - u64::from(size) + 1, u64::MAX] {
            let read = coverage(XENPMU_COVERAGE_READ, buffer, size);
            assert_eq!(
                m.op(PRIVILEGED, XENPMU_OP_COVERAGE, &read),
                Err(OpError::BadAddress),
                "{buffer:#x}"
            );
            assert_eq!(
                m.platform.guest_writes,
                [],
                "{buffer:#x}: no range handed to write_guest"
            );
        }
        // The last buffer that fits below 2^64 is asked for (the platform refuses it: no RAM).
        let last = u64::MAX - u64::from(size);
        let read = coverage(XENPMU_COVERAGE_READ, last, size);
        assert_eq!(
            m.op(PRIVILEGED, XENPMU_OP_COVERAGE, &read),
            Err(OpError::BadAddress)
        );
        assert_eq!(m.platform.guest_writes.len(), 1);
        for &(_, address, len) in &m.platform.guest_writes {
            assert!(address.checked_add(len as u64).is_some());
        }
    }

    #[test]
    fn a_read_writes_the_profile_within_the_buffer() {
        let mut m = Machine::new(intel_v5(), 1, &[1], Mode::Off.to_abi());
        let size = profile_size(&mut m);
        let gfn = guest_frame(0, 1);
        let buffer = (gfn << 12) + 8;
        assert!(u64::from(size) + 8 <= 3 * 4096, "fits frames 1..3: {size}");
        let out = m
            .op(
                PRIVILEGED,
                XENPMU_OP_COVERAGE,
                &coverage(XENPMU_COVERAGE_READ, buffer, size),
            )
            .expect("read");
        assert_eq!(CoverageParams::from(out).size, size);
        let end = buffer + u64::from(size);
        for &(caller, address, len) in &m.platform.guest_writes {
            assert_eq!(caller, PRIVILEGED);
            assert!(address >= buffer && address + len as u64 <= end);
        }
        // LLVM's raw-profile magic, little-endian, at the start of the buffer.
        let bytes = zerocopy::IntoBytes::as_bytes(m.platform.frame(0, gfn));
        assert_eq!(
            u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            0xff6c_7072_6f66_7281
        );
    }
}
