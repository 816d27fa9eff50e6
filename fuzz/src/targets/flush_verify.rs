//! The flush path: a context a guest programmed and ran (its sample), published into a vendor
//! area, edited by the guest, copied out of the page, verified by the backend against the
//! saved context and — when accepted — loaded onto the hardware. Nothing may panic; the
//! in-place and by-value verdicts agree, with the published images taken unjudged or judged
//! again; an unedited area always flushes, to the context it was published from; an accepted
//! context loads without a fault and no forbidden bit reaches the hardware.
//!
//! Input: `[vendor, shape, policy, program, step..., edit...]`: `program % 32` steps of
//! `guest_msr` ([`crate::targets::guest_msr::play`]: guest accesses and counted events) build
//! the saved context on a model, which `context_to_page` publishes; then each edit
//! (a 16-bit little-endian byte offset in the area and a 64-bit little-endian value,
//! [`EDIT_BYTES`] in all) overwrites 8 bytes of the published area. With bit 1 of `vendor`
//! set, the bytes after the steps are the whole area instead (any bytes a guest can leave).

use vpmu::{HwRecord, PmuBackend, PublishedImages};
use vpmu_abi::VendorArea;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::shapes::{ACCESS_BYTES, Access, FuzzShape, OnShape, cleaned, on_shape, policy};
use crate::targets::guest_msr::play;

/// Milestone: an edited area was accepted, and the context it gave can count.
pub const ACCEPTED_EDITED: &str = "flush_verify: an edited area with a counter enabled accepted";
/// Milestone: an edited area was refused.
pub const REFUSED_EDITED: &str = "flush_verify: an edited area refused";

/// Bytes of one edit.
pub const EDIT_BYTES: usize = 10;

/// The target.
pub fn run(data: &[u8]) {
    let [vendor, shape, policy, program, rest @ ..] = data else {
        return;
    };
    let steps = (usize::from(*program) % 32 * ACCESS_BYTES).min(rest.len());
    let (steps, edits) = rest.split_at(steps);
    on_shape(
        *vendor,
        *shape,
        Flush {
            policy: *policy,
            raw: vendor & 2 != 0,
            steps,
            edits,
        },
    );
}

/// An edit's bytes.
pub fn edit_bytes(offset: u16, value: u64) -> [u8; EDIT_BYTES] {
    let mut out = [0u8; EDIT_BYTES];
    out[..2].copy_from_slice(&offset.to_le_bytes());
    out[2..].copy_from_slice(&value.to_le_bytes());
    out
}

struct Flush<'a> {
    policy: u8,
    raw: bool,
    steps: &'a [u8],
    edits: &'a [u8],
}

impl OnShape for Flush<'_> {
    fn on<S: FuzzShape>(self, shape: S) {
        let policy = policy(self.policy);
        let (pmu, mut model) = cleaned(&shape);
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        let mut saved = pmu.new_context();
        pmu.load(&saved, &mut model, &mut record)
            .expect("a new context loads");
        for step in Access::parse(self.steps) {
            play::<S>(&pmu, &mut saved, &mut model, &mut record, &policy, step);
        }
        pmu.save(&mut saved, &mut model, &mut record)
            .expect("no hardware fault");
        let mut published = VendorArea::new_zeroed();
        pmu.context_to_page(&saved, &mut published);
        let area = if self.raw {
            let mut bytes = [0u8; size_of::<VendorArea>()];
            let len = self.edits.len().min(bytes.len());
            bytes[..len].copy_from_slice(&self.edits[..len]);
            VendorArea::read_from_bytes(&bytes).expect("the area's size")
        } else {
            let mut area = published.clone();
            let bytes = area.as_mut_bytes();
            for edit in self.edits.chunks_exact(EDIT_BYTES) {
                let at = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % (bytes.len() - 7);
                bytes[at..at + 8].copy_from_slice(&edit[2..]);
            }
            area
        };
        let verdict = verified_in_place(&pmu, &area, &saved, &policy);
        let edited = area != published;
        match verdict {
            Some(ctx) => {
                if !edited {
                    // Bookkeeping the page does not carry (AMD's pre-PerfMonV2 `armed` set,
                    // derived again from the counters' top bits) may differ; what the guest
                    // sees may not.
                    let mut again = VendorArea::new_zeroed();
                    pmu.context_to_page(&ctx, &mut again);
                    assert_eq!(again, published, "an unedited area flushes to itself");
                }
                pmu.load(&ctx, &mut model, &mut record)
                    .expect("an accepted context loads without a fault");
                S::assert_clean(&model, &policy);
                if edited && !S::nothing_can_count(&model) {
                    crate::reached(ACCEPTED_EDITED);
                }
            }
            None => {
                assert!(edited, "an unedited area always flushes");
                crate::reached(REFUSED_EDITED);
            }
        }
    }
}

/// The flush's form, verified into a context that holds something else (a new context): the
/// by-value verdict, every register written when accepted, none when refused; the images of
/// `saved` were judged under `policy` (its controls were written under it), so taking them
/// unjudged (`PublishedImages::Current`) must give the same result as judging them again.
fn verified_in_place<B: PmuBackend>(
    pmu: &B,
    area: &VendorArea,
    saved: &B::Context,
    policy: &vpmu::GuestPolicy<'_>,
) -> Option<B::Context> {
    let by_value = pmu.context_from_page(area, saved, policy);
    let mut accepted = None;
    for images in [PublishedImages::Stale, PublishedImages::Current] {
        let target = pmu.new_context();
        let mut ctx = target.clone();
        match (
            pmu.context_from_page_into(area, saved, images, policy, &mut ctx),
            &by_value,
        ) {
            (Ok(()), Ok(expected)) => {
                assert_eq!(&ctx, expected, "verified in place as by value ({images:?})");
                accepted = Some(ctx);
            }
            (Err(error), Err(expected)) => {
                assert_eq!(&error, expected, "the same register refused ({images:?})");
                assert_eq!(ctx, target, "a refused area leaves the target as it was");
            }
            (verdict, expected) => panic!(
                "in place {verdict:?} ({images:?}), by value {:?}",
                expected.as_ref().map(|_| ())
            ),
        }
    }
    accepted
}
