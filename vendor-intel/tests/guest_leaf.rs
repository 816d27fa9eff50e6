//! The CPUID leaf 0xA a guest is shown (`IntelCaps::guest_leaf_0xa`): the fields the SDM
//! defines, and enumerating it again gives the same capabilities.

use raw_cpuid::CpuIdResult;
use vpmu_intel::events::ARCH_EVENTS;
use vpmu_intel::{IntelCaps, PERF_CAP_FW_WRITES};
use vpmu_models::intel::SyntheticCpuid;

/// `shape` with leaf 0xA replaced by `leaf`.
fn with_leaf_0xa(
    shape: SyntheticCpuid,
    leaf: [u32; 4],
) -> impl Fn(u32, u32) -> CpuIdResult + Clone {
    move |function, subleaf| match function {
        0xa => {
            let [eax, ebx, ecx, edx] = leaf;
            CpuIdResult { eax, ebx, ecx, edx }
        }
        _ => shape.leaf(function, subleaf),
    }
}

#[test]
fn guest_leaf_0xa_enumerates_to_the_same_caps() {
    use SyntheticCpuid;
    let shapes = [
        (SyntheticCpuid::v2(4, 3), None),
        (SyntheticCpuid::v2(2, 0), None),
        (SyntheticCpuid::v5(8, 1, 0), Some(PERF_CAP_FW_WRITES)),
        (SyntheticCpuid::v5(8, 0, 0b110), Some(PERF_CAP_FW_WRITES)),
        (SyntheticCpuid::v5(6, 2, 0b1000), Some(0)),
        (
            SyntheticCpuid {
                event_vector_length: 5,
                unavailable_events: 0b10,
                gp_width: 40,
                ..SyntheticCpuid::v5(3, 4, 0)
            },
            None,
        ),
    ];
    for (shape, perf_capabilities) in shapes {
        let caps = IntelCaps::from_cpuid(shape, perf_capabilities).unwrap();
        let leaf = caps.guest_leaf_0xa(0);
        let again = IntelCaps::from_cpuid(with_leaf_0xa(shape, leaf), perf_capabilities);
        assert_eq!(again, Ok(caps), "{shape:?}");

        let hidden = 0b101;
        let leaf = caps.guest_leaf_0xa(hidden);
        let again = IntelCaps::from_cpuid(with_leaf_0xa(shape, leaf), perf_capabilities).unwrap();
        assert_eq!(
            again.unavailable_events(),
            caps.unavailable_events() | hidden
        );
        assert!(!again.event_available(ARCH_EVENTS[0]), "core cycles");
    }
}

#[test]
fn guest_leaf_0xa_states_the_sdm_fields() {
    let v5 = IntelCaps::from_cpuid(SyntheticCpuid::v5(8, 1, 0b100), None).unwrap();
    let [eax, ebx, ecx, edx] = v5.guest_leaf_0xa(0b1000_0001);
    assert_eq!(eax, 5 | 8 << 8 | 48 << 16 | 8 << 24);
    assert_eq!(ebx, 0b1000_0001);
    assert_eq!(ecx, 0b101, "every fixed counter in the v5 bitmap");
    assert_eq!(
        edx,
        1 | 48 << 5 | 1 << 15,
        "the contiguous ones in the count"
    );
    let v2 = IntelCaps::from_cpuid(SyntheticCpuid::v2(4, 3), None).unwrap();
    let [_, ebx, ecx, edx] = v2.guest_leaf_0xa(u32::MAX);
    assert_eq!(
        (ebx, ecx, edx & 0x1f),
        (0x7f, 0, 3),
        "no bits beyond the vector length"
    );
}
