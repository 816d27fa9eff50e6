//! Guest RDMSR/WRMSR sequences through a backend whose context is loaded on a software model,
//! interleaved with events the model counts (overflows and PMIs included) and context-switch
//! round trips: nothing panics, the backend never makes the hardware fault, no forbidden bit
//! reaches it, a save leaves nothing able to count (the simulator's predicate: controls may
//! stay programmed, nothing is enabled both locally and globally), and a save/load round trip
//! changes nothing a guest can read.
//!
//! Input: `[vendor, shape, policy, step...]`, each step an [`Access`] of
//! [`ACCESS_BYTES`](crate::shapes::ACCESS_BYTES). A
//! step whose `range & 0x7f` is [`MACHINE`] is no access but a machine event: `offset` < 128
//! counts `value & 0xffff` events of kind `offset % 6` at CPL `offset & 0x40 ? 3 : 0` and takes
//! the PMI they raise as the core does (`handle_overflow`); `offset` >= 128 saves the context
//! and loads it again.

use vpmu::{HwRecord, MsrOutcome, PmuBackend};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

use crate::shapes::{Access, FuzzShape, OnShape, cleaned, on_shape, policy};

/// Milestone: a guest-programmed counter could count on the hardware.
pub const COUNTING: &str = "guest_msr: a guest-programmed counter enabled on the hardware";
/// Milestone: a guest-programmed counter overflowed and its PMI was taken.
pub const OVERFLOWED: &str = "guest_msr: a guest-programmed counter overflowed";

/// `range & 0x7f` of a machine event.
pub const MACHINE: u8 = 0x7f;

/// The events a machine step counts, by `offset % 6`.
pub const EVENTS: [HwEvent; 6] = [
    HwEvent::Instructions,
    HwEvent::Branches,
    HwEvent::CoreCycles,
    HwEvent::RefCycles,
    HwEvent::LlcReferences,
    HwEvent::LlcMisses,
];

/// The target.
pub fn run(data: &[u8]) {
    let [vendor, shape, policy, steps @ ..] = data else {
        return;
    };
    on_shape(
        *vendor,
        *shape,
        Sequence {
            policy: *policy,
            steps,
        },
    );
}

/// Plays one step on a context loaded on `model` (see the module's documentation), checking
/// the invariants after it.
pub fn play<S: FuzzShape>(
    pmu: &S::Backend,
    ctx: &mut <S::Backend as PmuBackend>::Context,
    model: &mut S::Model,
    record: &mut HwRecord,
    policy: &vpmu::GuestPolicy<'_>,
    step: Access,
) {
    if step.range & 0x7f == MACHINE {
        if step.offset < 0x80 {
            let event = EVENTS[usize::from(step.offset) % EVENTS.len()];
            let cpl = if step.offset & 0x40 != 0 { 3 } else { 0 };
            model.count(event, step.value & 0xffff, ExecMode { cpl, host: false });
            if model.take_pmi() {
                let overflow = pmu.handle_overflow(ctx, model).expect("no hardware fault");
                if !overflow.counters.is_empty() {
                    crate::reached(OVERFLOWED);
                }
            }
        } else {
            round_trip(pmu, ctx, model, record);
            assert!(S::nothing_can_count(model) || pmu.is_active(ctx));
        }
        return;
    }
    let msr = step.msr(pmu.msr_ranges());
    if step.is_read() {
        pmu.guest_read(ctx, Some(&mut *model), msr)
            .expect("no hardware fault");
    } else {
        pmu.guest_write(ctx, Some(&mut *model), policy, msr, step.value)
            .expect("no hardware fault");
    }
    S::assert_clean(model, policy);
    if !S::nothing_can_count(model) {
        crate::reached(COUNTING);
    }
}

struct Sequence<'a> {
    policy: u8,
    steps: &'a [u8],
}

impl OnShape for Sequence<'_> {
    fn on<S: FuzzShape>(self, shape: S) {
        let policy = policy(self.policy);
        let (pmu, mut model) = cleaned(&shape);
        let mut record = HwRecord::unknown();
        record.controls_cleared();
        let mut ctx = pmu.new_context();
        pmu.load(&ctx, &mut model, &mut record)
            .expect("a new context loads");
        for step in Access::parse(self.steps) {
            play::<S>(&pmu, &mut ctx, &mut model, &mut record, &policy, step);
        }
        pmu.save(&mut ctx, &mut model, &mut record)
            .expect("no hardware fault");
        assert!(
            S::nothing_can_count(&model),
            "save leaves nothing able to count"
        );
        S::assert_clean(&model, &policy);
    }
}

/// A switch-out and back in: nothing can count in between, and every register reads the same
/// before and after.
fn round_trip<B: PmuBackend, M: SoftwarePmu + vpmu::MsrBus>(
    pmu: &B,
    ctx: &mut B::Context,
    model: &mut M,
    record: &mut HwRecord,
) {
    let before = read_all(pmu, ctx, model);
    pmu.save(ctx, model, record).expect("no hardware fault");
    let saved = read_all_saved(pmu, ctx);
    pmu.load(ctx, model, record).expect("no hardware fault");
    let after = read_all(pmu, ctx, model);
    assert_eq!(before, saved, "a save changes nothing the guest reads");
    assert_eq!(
        before, after,
        "a save and load change nothing the guest reads"
    );
}

fn each_msr<B: PmuBackend>(pmu: &B) -> impl Iterator<Item = vpmu::Msr> + '_ {
    pmu.msr_ranges()
        .iter()
        .flat_map(|&(first, last)| (first..=last).map(vpmu::Msr))
}

fn read_all<B: PmuBackend, M: vpmu::MsrBus>(
    pmu: &B,
    ctx: &mut B::Context,
    model: &mut M,
) -> Vec<MsrOutcome<u64>> {
    each_msr(pmu)
        .map(|msr| {
            pmu.guest_read(ctx, Some(&mut *model), msr)
                .expect("no hardware fault")
        })
        .collect()
}

fn read_all_saved<B: PmuBackend>(pmu: &B, ctx: &mut B::Context) -> Vec<MsrOutcome<u64>> {
    each_msr(pmu)
        .map(|msr| {
            pmu.guest_read::<vpmu_models::intel::IntelPmuModel>(ctx, None, msr)
                .expect("no hardware fault")
        })
        .collect()
}
