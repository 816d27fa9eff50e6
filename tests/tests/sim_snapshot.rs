//! vCPU PMU snapshots (`vpmu::snapshot`, docs/snapshot.md) on the four test shapes.
//!
//! Round trip: a vCPU programs counters (counting and sampling, through the virtual LVTPC, its
//! page or its ring), runs, is switched out; its snapshot is taken, encoded, decoded and
//! restored into a fresh vCPU of another machine (with the VMM's own state carried over),
//! which then runs on pCPU 0 or 1. A twin machine that never migrated does the same work.
//! Right after the restore the snapshot taken again is byte-identical and the guest reads the
//! same from every PMU MSR; after more work the two read the same, raised the same PMIs, show
//! the same pages, and their snapshots are byte-identical. `PROPTEST_CASES` scales the runs.
//!
//! Refusals: a snapshot of another shape, truncated bytes, and every single-byte corruption
//! (refused by the checksum; with the checksum recomputed, refused by a validator or restored
//! into a state the validators accept as it is, which runs).

use proptest::prelude::*;
use vpmu::abi::ops::Params;
use vpmu::abi::{
    XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_FLUSH, XENPMU_OP_RING_INIT,
};
use vpmu::snapshot::{SnapshotBackend, VcpuSnapshot, reseal};
use vpmu::{DecodeError, RestoreError, TakeError, VcpuId};
use vpmu_models::SoftwarePmu;
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::migrate::{Refused, carry_vmm_state, guest_view, restore_bytes, take_bytes};
use vpmu_sim::ring::{RingGuest, config};
use vpmu_sim::truth::CounterSetup;
use vpmu_sim::{
    Machine, PmiRecord, SimVendor, amd_legacy, amd_v2, guest_frame, intel_v2, intel_v5,
};
use vpmu_tests::proptest_cases;

const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };

/// What the vCPU does before and after the migration.
#[derive(Clone, Debug)]
struct Plan {
    /// (counter choice, sampling period or none, initial value of a counting counter).
    counters: Vec<(usize, Option<u64>, u64)>,
    /// Whether it registers its page (samples there, not through the virtual LVTPC).
    page: bool,
    /// Whether it also registers a ring (samples there; needs the page).
    ring: bool,
    /// Instructions before the migration and after it.
    before: u64,
    after: u64,
    /// The destination's pCPU.
    dest_pcpu: u32,
    /// Whether the guest flushes its page after the second run.
    flush: bool,
    /// Instructions counted just before the switch-out whose PMI is not taken before it (an
    /// interrupt in flight: the overflow is kept pending with the context).
    in_flight: u64,
}

fn plans() -> impl Strategy<Value = Plan> {
    (
        prop::collection::vec(
            (
                0usize..16,
                prop::option::of(3u64..120),
                prop_oneof![0u64..1000, ((1u64 << 48) - 400)..(1u64 << 48), any::<u64>()],
            ),
            0..5,
        ),
        any::<bool>(),
        any::<bool>(),
        0u64..250,
        0u64..250,
        0u32..2,
        any::<bool>(),
        prop_oneof![Just(0u64), 1u64..200],
    )
        .prop_map(
            |(counters, page, ring, before, after, dest_pcpu, flush, in_flight)| Plan {
                counters,
                page,
                ring: page && ring,
                before,
                after,
                dest_pcpu,
                flush,
                in_flight,
            },
        )
}

/// The counters of `plan` on this shape: distinct, instructions only.
fn setups<V: SimVendor>(vendor: &V, plan: &Plan) -> Vec<CounterSetup> {
    let available = vendor.driver().counters();
    let mut chosen: Vec<CounterSetup> = Vec::new();
    for &(choice, period, initial) in &plan.counters {
        let ctr = available[choice % available.len()];
        if chosen.iter().any(|s| s.ctr == ctr) {
            continue;
        }
        chosen.push(match period {
            Some(period) => sampling(ctr, period),
            None => counting(ctr, initial),
        });
    }
    chosen
}

/// The first part of the plan on `m`: set-up, work, switch-out.
fn before<V: SimVendor>(m: &mut Machine<V>, plan: &Plan) {
    m.schedule(0, Some(A));
    m.platform.set_lvtpc_masked(A, false);
    if plan.page {
        m.register_page(A);
    }
    let setups = setups(&m.vendor.clone(), plan);
    if plan.ring {
        let periods: Vec<(bool, usize, u64)> = setups
            .iter()
            .filter_map(|s| s.period.map(|p| (s.ctr >= 32, (s.ctr % 32) as usize, p)))
            .collect();
        let gfn = guest_frame(A.domain, 0x40);
        RingGuest::prepare(&mut m.platform, A.domain, gfn, &config(1, 0, 0, &periods));
        let init = m.op(A, XENPMU_OP_RING_INIT, &Params::new(gfn, A.vcpu));
        assert!(init.is_ok(), "ring init: {init:?}");
    }
    m.program(A, &setups);
    m.run(0, plan.before);
    // Counted, the PMI they may raise not taken: the interrupt is in flight at the switch.
    let kernel = vpmu_models::ExecMode {
        cpl: 0,
        host: false,
    };
    m.pcpus[0]
        .hw_mut()
        .count(vpmu_models::HwEvent::Instructions, plan.in_flight, kernel);
    m.schedule(0, None);
}

/// What a PMI record shows that does not depend on which pCPU took it, for the PMIs a guest
/// can tell of: not those the core found no overflow for (the late interrupt of an overflow
/// the switch-out kept pending arrives only on the pCPU that raised it), nor those a masked
/// physical LVTPC discarded.
fn pmis(records: &[PmiRecord]) -> Vec<String> {
    records
        .iter()
        .filter(|r| !matches!(r.outcome, None | Some(vpmu::PmiOutcome::Spurious)))
        .map(|r| {
            format!(
                "{:?} {:?} {} {:?}",
                r.running, r.insn, r.hypervisor, r.outcome
            )
        })
        .collect()
}

/// The guest-visible effects of interrupts on `A` so far: LVTPC deliveries, VIRQs, the mask.
fn interrupts<V: SimVendor>(m: &Machine<V>) -> (usize, usize, Option<bool>) {
    let p = &m.platform;
    (
        p.lvtpc_deliveries.iter().filter(|&&v| v == A).count(),
        p.virqs.iter().filter(|&&v| v == A).count(),
        p.vlapic_masked.get(&A).copied(),
    )
}

/// Everything of `A`'s guest memory, the clock-independent way: every frame of its domain.
fn memory<V: SimVendor>(m: &Machine<V>) -> Vec<(u64, Vec<u8>)> {
    use zerocopy::IntoBytes;
    m.platform
        .memory
        .iter()
        .filter(|((domain, _), _)| *domain == A.domain)
        .map(|((_, gfn), page)| (*gfn, page.as_bytes().to_vec()))
        .collect()
}

fn round_trip<V: SimVendor>(vendor: V, plan: &Plan) -> Result<(), TestCaseError>
where
    V::Backend: SnapshotBackend,
{
    let mut source = Machine::new(vendor.clone(), 2, &[1, 1], XENPMU_MODE_SELF);
    let mut twin = Machine::new(vendor.clone(), 2, &[1, 1], XENPMU_MODE_SELF);
    before(&mut source, plan);
    before(&mut twin, plan);
    let bytes = take_bytes(&source, A).expect("a switched-out vCPU");

    let mut dest = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_SELF);
    carry_vmm_state(&source, &mut dest, A);
    restore_bytes(&mut dest, A, &bytes).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
    prop_assert_eq!(
        &take_bytes(&dest, A).expect("restored"),
        &bytes,
        "taken again"
    );
    prop_assert_eq!(guest_view(&mut dest, A), guest_view(&mut twin, A));
    prop_assert_eq!(memory(&dest), memory(&twin));

    let (twin_pmis, dest_pmis) = (twin.pmis.len(), dest.pmis.len());
    let (twin_irqs, dest_irqs) = (interrupts(&twin), interrupts(&dest));
    twin.schedule(0, Some(A));
    dest.schedule(plan.dest_pcpu, Some(A));
    twin.run(0, plan.after);
    dest.run(plan.dest_pcpu, plan.after);
    if plan.flush && plan.page {
        let flushed = twin.op(A, XENPMU_OP_FLUSH, &Params::new(0, 0));
        prop_assert_eq!(dest.op(A, XENPMU_OP_FLUSH, &Params::new(0, 0)), flushed);
        twin.run(0, plan.after / 2);
        dest.run(plan.dest_pcpu, plan.after / 2);
    }
    prop_assert_eq!(pmis(&dest.pmis[dest_pmis..]), pmis(&twin.pmis[twin_pmis..]));
    let (t, d) = (interrupts(&twin), interrupts(&dest));
    prop_assert_eq!(d.0 - dest_irqs.0, t.0 - twin_irqs.0, "LVTPC deliveries");
    prop_assert_eq!(d.1 - dest_irqs.1, t.1 - twin_irqs.1, "VIRQs");
    prop_assert_eq!(d.2, t.2, "virtual LVTPC mask");
    prop_assert_eq!(guest_view(&mut dest, A), guest_view(&mut twin, A));
    prop_assert_eq!(memory(&dest), memory(&twin));
    twin.schedule(0, None);
    dest.schedule(plan.dest_pcpu, None);
    prop_assert_eq!(
        take_bytes(&dest, A),
        take_bytes(&twin, A),
        "after more work"
    );
    Ok(())
}

/// A snapshot of a vCPU with counters running, a page and a sample pending in it.
fn busy_snapshot<V: SimVendor>(vendor: V) -> (Machine<V>, Vec<u8>)
where
    V::Backend: SnapshotBackend,
{
    let mut m = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_SELF);
    let plan = Plan {
        counters: vec![(0, Some(40), 0), (1, None, 77), (2, None, (1 << 48) - 5)],
        page: true,
        ring: false,
        before: 100,
        after: 0,
        dest_pcpu: 0,
        flush: false,
        in_flight: 0,
    };
    before(&mut m, &plan);
    let bytes = take_bytes(&m, A).expect("switched out");
    (m, bytes)
}

/// A corrupted snapshot: refused by decoding or restoring, or restored into a state the
/// validators take as it is (taking it again gives the decoded snapshot, under the mode in
/// force) and that runs.
fn corruption_is_contained<V: SimVendor>(
    vendor: &V,
    source: &Machine<V>,
    bytes: &[u8],
    offset: usize,
    xor: u8,
) -> Result<(), TestCaseError>
where
    V::Backend: SnapshotBackend,
{
    let mut corrupted = bytes.to_vec();
    corrupted[offset] ^= xor;
    prop_assert!(
        VcpuSnapshot::decode(&corrupted).is_err(),
        "a damaged byte at {} passed the checksum",
        offset
    );
    reseal(&mut corrupted);
    let mut dest = Machine::new(vendor.clone(), 2, &[1, 1], XENPMU_MODE_SELF);
    carry_vmm_state(source, &mut dest, A);
    if restore_bytes(&mut dest, A, &corrupted).is_err() {
        return Ok(());
    }
    let mut decoded = VcpuSnapshot::decode(&corrupted).expect("restored, so decoded");
    decoded.mode = dest.vpmu.mode();
    let again = dest.vpmu.take_snapshot(&dest.vcpu(A)).expect("restored");
    prop_assert_eq!(again, decoded, "corruption at {} xor {:#x}", offset, xor);
    accepted_by_guest_writes(vendor, &again)?;
    dest.schedule(1, Some(A));
    dest.run(1, 50);
    dest.schedule(1, None);
    prop_assert!(V::nothing_can_count(dest.pcpus[1].hw()));
    Ok(())
}

/// Every register of `snapshot` is a value the guest could have written: each WRMSR of it on
/// a fresh vCPU is accepted (the status through its SET register where the PMU has one; a
/// counter without full-width writes, whose legacy WRMSR never refuses, within its width;
/// AMD's armed counters present ones). Independent of the restore's own checks.
fn accepted_by_guest_writes<V: SimVendor>(
    vendor: &V,
    snapshot: &VcpuSnapshot,
) -> Result<(), TestCaseError> {
    let shape = &snapshot.shape;
    let mut m = Machine::new(vendor.clone(), 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let gp_mask = if shape.gp_width >= 64 {
        u64::MAX
    } else {
        (1u64 << shape.gp_width) - 1
    };
    for register in snapshot.registers.as_slice() {
        let (msr, value) = (register.number, register.value);
        let write = match (register.kind, shape.vendor, msr) {
            (vpmu::snapshot::RegisterKind::State, _, _) => {
                prop_assert_eq!(value & !((1u64 << shape.gp_counters) - 1), 0, "armed");
                continue;
            }
            (_, vpmu::Vendor::Intel, 0x38e) if shape.version >= 4 => 0x391,
            (_, vpmu::Vendor::Intel, 0x38e) => {
                prop_assert_eq!(value & !(shape.all_counters().0 | 1 << 62), 0, "status");
                continue;
            }
            (_, vpmu::Vendor::Intel, 0xc1..=0xc8) if shape.full_width_writes => msr + 0x400,
            (_, vpmu::Vendor::Intel, 0xc1..=0xc8) => {
                prop_assert_eq!(value & !gp_mask, 0, "counter width");
                continue;
            }
            (_, vpmu::Vendor::Amd, 0xC000_0300) => 0xC000_0303,
            _ => msr,
        };
        prop_assert_eq!(
            m.wrmsr(A, write, value),
            vpmu::MsrOutcome::Handled(()),
            "WRMSR {:#x} <- {:#x}",
            write,
            value
        );
    }
    Ok(())
}

fn refuses_other_shapes<V: SimVendor, W: SimVendor>(from: V, to: W)
where
    V::Backend: SnapshotBackend,
    W::Backend: SnapshotBackend,
{
    let same = from.name() == to.name();
    let (source, bytes) = busy_snapshot(from);
    let mut dest = Machine::new(to, 2, &[1, 1], XENPMU_MODE_SELF);
    let result = restore_bytes(&mut dest, A, &bytes);
    if same {
        assert_eq!(result, Ok(()));
        return;
    }
    let _ = source;
    match result {
        Err(Refused::Restore(
            RestoreError::Vendor | RestoreError::Shape { .. } | RestoreError::RegisterSet { .. },
        )) => {}
        other => panic!("a snapshot of another shape: {other:?}"),
    }
    assert!(dest.vcpu(A).page().is_none(), "a refusal changed nothing");
}

fn refusals<V: SimVendor>(vendor: V)
where
    V::Backend: SnapshotBackend,
{
    let (mut source, bytes) = busy_snapshot(vendor.clone());
    // Truncated, and one byte too many.
    for len in 0..bytes.len() {
        assert!(
            matches!(
                VcpuSnapshot::decode(&bytes[..len]),
                Err(DecodeError::Truncated { .. } | DecodeError::Length { .. })
            ),
            "{len} bytes"
        );
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(VcpuSnapshot::decode(&longer).is_err());
    // Every byte damaged three ways.
    for offset in 0..bytes.len() {
        for xor in [0x01, 0x80, 0xff] {
            corruption_is_contained(&vendor, &source, &bytes, offset, xor).unwrap();
        }
    }
    // The destination's policy and the target.
    for (mode, error) in [
        (XENPMU_MODE_OFF, RestoreError::Mode(vpmu::Mode::Off)),
        (
            vpmu::abi::XENPMU_MODE_ALL,
            RestoreError::Mode(vpmu::Mode::All),
        ),
    ] {
        let mut dest = Machine::new(vendor.clone(), 1, &[1, 1], mode);
        assert_eq!(
            restore_bytes(&mut dest, A, &bytes),
            Err(Refused::Restore(error))
        );
    }
    let mut hv = Machine::new(vendor.clone(), 1, &[1, 1], XENPMU_MODE_HV);
    carry_vmm_state(&source, &mut hv, A);
    assert_eq!(
        restore_bytes(&mut hv, A, &bytes),
        Ok(()),
        "self and hv keep contexts alike"
    );
    assert_eq!(
        restore_bytes(&mut hv, A, &bytes),
        Err(Refused::Restore(RestoreError::TargetNotFresh))
    );
    let missing = VcpuId { domain: 1, vcpu: 5 };
    let mut dest = Machine::new(vendor.clone(), 1, &[1, 1], XENPMU_MODE_SELF);
    assert_eq!(
        restore_bytes(&mut dest, missing, &bytes),
        Err(Refused::Restore(RestoreError::NoSuchVcpu))
    );
    // A running vCPU is not quiesced.
    source.schedule(1, Some(A));
    assert_eq!(take_bytes(&source, A), Err(TakeError::NotQuiesced));
}

macro_rules! shapes {
    ($($shape:ident: $vendor:expr;)*) => {$(
        mod $shape {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(proptest_cases(32)))]

                #[test]
                fn round_trip_continues_exactly(plan in plans()) {
                    round_trip($vendor, &plan)?;
                }

                #[test]
                fn a_corrupted_byte_is_refused_or_valid(
                    plan in plans(),
                    offset in any::<prop::sample::Index>(),
                    xor in 1u8..=255,
                ) {
                    let vendor = $vendor;
                    let mut source = Machine::new(vendor.clone(), 2, &[1, 1], XENPMU_MODE_SELF);
                    before(&mut source, &plan);
                    let bytes = take_bytes(&source, A).expect("switched out");
                    let offset = offset.index(bytes.len());
                    corruption_is_contained(&vendor, &source, &bytes, offset, xor)?;
                }
            }

            #[test]
            fn refusals() {
                super::refusals($vendor);
            }

            #[test]
            fn other_shapes_are_refused() {
                refuses_other_shapes($vendor, intel_v5());
                refuses_other_shapes($vendor, intel_v2());
                refuses_other_shapes($vendor, amd_v2());
                refuses_other_shapes($vendor, amd_legacy());
            }
        }
    )*};
}

shapes! {
    intel_v5_shape: intel_v5();
    intel_v2_shape: intel_v2();
    amd_v2_shape: amd_v2();
    amd_k7_shape: amd_legacy();
}
