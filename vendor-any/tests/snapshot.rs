//! `VendorPmu` as a `SnapshotBackend` is the vendor backend it wraps: on the four test shapes,
//! a context programmed by random guest writes lists the same registers through the erased
//! backend as through the bare one, and the list rebuilds the same context (or is refused
//! for the same register) through both; the other vendor's context lists nothing and is
//! never rebuilt.

use proptest::prelude::*;
use vpmu::snapshot::{Registers, SnapshotBackend, SnapshotRegister};
use vpmu::{GuestPolicy, PmuBackend};
use vpmu_models::intel::IntelPmuModel;
use vpmu_models::shapes::{ALL_EVENTS, Shape, VendorShape};
use vpmu_vendor_any::{VendorContext, VendorPmu};

/// A guest's writes (the `n`-th MSR of the ranges, modulo their size) into a saved context.
fn programmed<B: PmuBackend>(backend: &B, writes: &[(usize, u64)]) -> B::Context {
    let msrs: Vec<u32> = backend
        .msr_ranges()
        .iter()
        .flat_map(|&(first, last)| first..=last)
        .collect();
    let mut ctx = backend.new_context();
    let policy = GuestPolicy::guest_default();
    for &(n, value) in writes {
        let msr = vpmu::Msr(msrs[n % msrs.len()]);
        backend
            .guest_write(&mut ctx, None::<&mut IntelPmuModel>, &policy, msr, value)
            .expect("no hardware");
    }
    ctx
}

/// `erased` makes the erased backend's context of a bare one's.
fn same_as_bare<B>(
    bare: B,
    erased: fn(B::Context) -> VendorContext,
    writes: &[(usize, u64)],
    damage: Option<(usize, u64)>,
) where
    B: SnapshotBackend + Clone + Into<VendorPmu>,
{
    let any: VendorPmu = bare.clone().into();
    let ctx = programmed(&bare, writes);
    let mut listed = Registers::new();
    bare.context_registers(&ctx, &mut listed);
    let mut through_any = Registers::new();
    any.context_registers(&erased(ctx.clone()), &mut through_any);
    assert_eq!(listed, through_any);

    let mut registers = Registers::new();
    for (i, register) in listed.as_slice().iter().enumerate() {
        let value = match damage {
            Some((at, value)) if at % listed.len() == i => value,
            _ => register.value,
        };
        registers
            .push(SnapshotRegister { value, ..*register })
            .expect("room");
    }
    let policy = GuestPolicy::guest_default();
    let mut rebuilt = bare.new_context();
    let bare_result = bare.context_from_registers(&registers, &policy, &mut rebuilt);
    let mut rebuilt_any = any.new_context();
    let any_result = any.context_from_registers(&registers, &policy, &mut rebuilt_any);
    assert_eq!(bare_result, any_result);
    match bare_result {
        Ok(()) => assert_eq!(erased(rebuilt), rebuilt_any),
        Err(_) => assert_eq!(rebuilt_any, any.new_context(), "a refusal wrote nothing"),
    }
    if damage.is_none() {
        assert_eq!(
            rebuilt_any,
            erased(ctx),
            "an undamaged list rebuilds the context"
        );
    }
}

fn check(shape: Shape, writes: &[(usize, u64)], damage: Option<(usize, u64)>) {
    match (shape.intel(ALL_EVENTS), shape.amd()) {
        (Some(intel), _) => same_as_bare(intel.backend(), VendorContext::Intel, writes, damage),
        (_, Some(amd)) => same_as_bare(amd.backend(), VendorContext::Amd, writes, damage),
        _ => unreachable!("every shape is one vendor's"),
    }
}

/// `PROPTEST_CASES`, or 128.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn erased_snapshots_are_the_bare_backends(
        shape in prop::sample::select(Shape::ALL.to_vec()),
        writes in prop::collection::vec((any::<usize>(), any::<u64>()), 0..24),
        damage in prop::option::of((any::<usize>(), any::<u64>())),
    ) {
        check(shape, &writes, damage);
    }
}

#[test]
fn the_other_vendors_context_lists_nothing_and_is_never_rebuilt() {
    let intel: VendorPmu = Shape::IntelV5
        .intel(ALL_EVENTS)
        .expect("intel")
        .backend()
        .into();
    let amd: VendorPmu = Shape::AmdPerfMonV2.amd().expect("amd").backend().into();
    let mut listed = Registers::new();
    listed.push(SnapshotRegister::msr(0x186, 0)).expect("room");
    intel.context_registers(&amd.new_context(), &mut listed);
    assert!(listed.is_empty());
    // Rebuilding always yields this backend's context: the other vendor's `out` is replaced.
    let mut reset = Registers::new();
    intel.context_registers(&intel.new_context(), &mut reset);
    let mut out = amd.new_context();
    let policy = GuestPolicy::guest_default();
    assert_eq!(
        intel.context_from_registers(&reset, &policy, &mut out),
        Ok(())
    );
    assert_eq!(out, intel.new_context());
}
