//! The flush path: a guest-edited vendor area, copied out of the page, verified by the backend,
//! and — when accepted — loaded onto the hardware. Nothing may panic, an accepted context must
//! load without a fault, and no forbidden bit may reach the hardware.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vpmu::{PmuBackend, PublishedImages};
use vpmu_abi::VendorArea;
use zerocopy::FromBytes;

fuzz_target!(|data: &[u8]| {
    let [vendor, shape, policy, rest @ ..] = data else { return };
    let mut bytes = [0u8; 1024];
    let len = rest.len().min(bytes.len());
    bytes[..len].copy_from_slice(&rest[..len]);
    let Ok(area) = VendorArea::read_from_bytes(&bytes) else { return };
    let policy = vpmu_fuzz::policy(*policy);
    if vendor % 2 == 0 {
        let (pmu, mut model) = vpmu_fuzz::intel(*shape);
        let saved = pmu.new_context();
        if let Some(ctx) = verified_in_place(&pmu, &area, &saved, &policy) {
            pmu.load(&ctx, &mut model, &mut vpmu::HwRecord::unknown()).expect("an accepted context loads without a fault");
            vpmu_fuzz::assert_intel_clean(&model);
        }
    } else {
        let (pmu, mut model) = vpmu_fuzz::amd(*shape);
        let saved = pmu.new_context();
        if let Some(ctx) = verified_in_place(&pmu, &area, &saved, &policy) {
            pmu.load(&ctx, &mut model, &mut vpmu::HwRecord::unknown()).expect("an accepted context loads without a fault");
            vpmu_fuzz::assert_amd_clean(&model, policy.may_count_host);
        }
    }
});

/// The flush's form, verified into a context that holds something else (the saved one):
/// the by-value verdict, every register written when accepted, none when refused. `saved` is a
/// new context, whose images (all controls 0) are those of every policy: taking them unjudged
/// (`PublishedImages::Current`) must give the same result as judging them again.
fn verified_in_place<B: PmuBackend>(
    pmu: &B,
    area: &VendorArea,
    saved: &B::Context,
    policy: &vpmu::GuestPolicy<'_>,
) -> Option<B::Context> {
    let by_value = pmu.context_from_page(area, saved, policy);
    let mut accepted = None;
    for images in [PublishedImages::Stale, PublishedImages::Current] {
        let mut ctx = saved.clone();
        match (pmu.context_from_page_into(area, saved, images, policy, &mut ctx), &by_value) {
            (Ok(()), Ok(expected)) => {
                assert_eq!(&ctx, expected, "verified in place as by value ({images:?})");
                accepted = Some(ctx);
            }
            (Err(error), Err(expected)) => {
                assert_eq!(&error, expected, "the same register refused ({images:?})");
                assert_eq!(&ctx, saved, "a refused page leaves the target as it was");
            }
            (verdict, expected) => panic!(
                "in place {verdict:?} ({images:?}), by value {:?}",
                expected.as_ref().map(|_| ())
            ),
        }
    }
    accepted
}
