//! Property tests: random guest programs through the backend, with the model as hardware.
//!
//! 1. Hygiene: whatever a guest writes, the model's raw state never holds a reserved bit, a
//!    HostOnly bit (guest without host counting), a non-zero control without GuestOnly, an
//!    enabled denied event, or a GlobalCtl bit of an absent counter; the backend never sends an
//!    access the hardware faults on; and every save leaves the hardware clean.
//! 2. Equivalence: for guest-context execution, a vCPU run through the backend (with context
//!    switches and another vCPU sharing the CPU) reads exactly like bare hardware that received
//!    the guest's accepted writes directly.

mod common;

use common::*;
use proptest::prelude::*;
use vpmu::{AllowAll, EventFilter, GuestPolicy, Msr, MsrBus, MsrOutcome, PmuBackend, RawEvent};
use vpmu_amd::PmuShape;
use vpmu_amd::msrs::ctl;
use vpmu_models::amd::AmdPmuModel;
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};

const PMU_MSRS: [u32; 24] = [
    0xC000_0300,
    0xC000_0301,
    0xC000_0302,
    0xC000_0303,
    0xC001_0000,
    0xC001_0001,
    0xC001_0002,
    0xC001_0003,
    0xC001_0004,
    0xC001_0005,
    0xC001_0006,
    0xC001_0007,
    0xC001_0200,
    0xC001_0201,
    0xC001_0202,
    0xC001_0203,
    0xC001_0204,
    0xC001_0205,
    0xC001_0206,
    0xC001_0207,
    0xC001_0208,
    0xC001_0209,
    0xC001_020A,
    0xC001_020B,
];

#[derive(Clone, Debug)]
enum Op {
    Write(u32, u64),
    Read(u32),
    Count(HwEvent, u64, ExecMode),
    /// Save, let another vCPU program the CPU and count, save it, load ours back.
    Switch(Vec<(u32, u64)>, u64),
    /// Service a pending PMI.
    Pmi,
}

fn shape() -> impl Strategy<Value = PmuShape> {
    prop_oneof![
        Just(PmuShape::LegacyK7),
        Just(PmuShape::PerfCtrExtCore),
        (1u8..=6).prop_map(|counters| PmuShape::PerfMonV2 { counters }),
    ]
}

fn control_like() -> impl Strategy<Value = u64> {
    let events = prop::sample::select(vec![0xc0u64, 0xc2, 0x76, 0xc3, 0x1_0000_00c0]);
    let extra_bits = prop::sample::select(vec![18u32, 19, 21, 23, 24, 36, 39, 40, 41, 42, 63]);
    (
        events,
        any::<bool>(),
        0u64..4,
        any::<bool>(),
        prop::collection::vec(extra_bits, 0..3),
    )
        .prop_map(|(event, en, privilege, int, extra)| {
            let mut value = event | (privilege << 16);
            if en {
                value |= ctl::EN;
            }
            if int {
                value |= ctl::INT;
            }
            extra.into_iter().fold(value, |v, bit| v | (1 << bit))
        })
}

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => control_like(),
        2 => 0u64..2000,
        2 => (0u64..2000).prop_map(|d| MASK48 - d),
        1 => 0u64..0x80,
        1 => any::<u64>(),
        1 => Just(u64::MAX),
    ]
}

fn event() -> impl Strategy<Value = HwEvent> {
    prop::sample::select(vec![
        HwEvent::Instructions,
        HwEvent::Branches,
        HwEvent::CoreCycles,
        HwEvent::BranchMisses,
        HwEvent::RefCycles,
    ])
}

fn op(with_host: bool) -> impl Strategy<Value = Op> {
    let msr = prop::sample::select(PMU_MSRS.to_vec());
    let mode =
        (prop::sample::select(vec![0u8, 3]), any::<bool>()).prop_map(move |(cpl, host)| ExecMode {
            cpl,
            host: host && with_host,
        });
    let count = prop_oneof![0u64..3000, Just(1u64 << 47), Just(MASK48)];
    prop_oneof![
        6 => (msr.clone(), value()).prop_map(|(m, v)| Op::Write(m, v)),
        2 => msr.clone().prop_map(Op::Read),
        3 => (event(), count.clone(), mode).prop_map(|(e, n, m)| Op::Count(e, n, m)),
        1 => (prop::collection::vec((msr, value()), 0..6), count)
            .prop_map(|(w, n)| Op::Switch(w, n)),
        1 => Just(Op::Pmi),
    ]
}

struct DenyBranches;

impl EventFilter for DenyBranches {
    fn allows(&self, event: RawEvent) -> bool {
        event.select != 0xc2
    }
    fn allows_fixed(&self, _index: u32) -> bool {
        true
    }
}

static DENY: DenyBranches = DenyBranches;

/// The other vCPU of a context switch: programs the CPU with its own (accepted) writes.
fn run_other_vcpu(vcpu: &mut Vcpu, writes: &[(u32, u64)], n: u64) {
    let mut other = vcpu.backend.new_context();
    vcpu.backend
        .load(&other, &mut vcpu.hw, &mut vcpu.record)
        .unwrap();
    for &(msr, value) in writes {
        vcpu.backend
            .guest_write(
                &mut other,
                Some(&mut vcpu.hw),
                &vcpu.policy,
                Msr(msr),
                value,
            )
            .unwrap();
    }
    vcpu.hw.count(HwEvent::Instructions, n, KERNEL);
    vcpu.hw.take_pmi();
    vcpu.backend
        .save(&mut other, &mut vcpu.hw, &mut vcpu.record)
        .unwrap();
}

fn check_hygiene(vcpu: &Vcpu, filter_denies_branches: bool) -> Result<(), TestCaseError> {
    let regs = vcpu.hw.registers();
    let host = vcpu.policy.may_count_host;
    prop_assert_eq!(vcpu.hw.access_stats().faults, 0, "no faulting access");
    for (i, &control) in regs.controls.iter().enumerate() {
        prop_assert_eq!(control & ctl::RESERVED, 0, "reserved bit in control {}", i);
        if !host {
            prop_assert_eq!(control & ctl::HOST_ONLY, 0, "HostOnly in control {}", i);
            prop_assert!(
                control == 0 || control & ctl::GUEST_ONLY != 0,
                "control {} = {:#x} lacks GuestOnly",
                i,
                control
            );
        }
        if filter_denies_branches && ctl::event(control).select == 0xc2 {
            prop_assert_eq!(control & ctl::EN, 0, "denied event enabled in {}", i);
        }
    }
    let mask = (1u64 << regs.counters) - 1;
    prop_assert_eq!(regs.global_ctl & !mask, 0);
    prop_assert_eq!(regs.global_status & !mask, 0);
    Ok(())
}

fn hygiene(
    shape: PmuShape,
    policy: GuestPolicy<'static>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let denies = !policy.filter.allows(RawEvent {
        select: 0xc2,
        umask: 0,
    });
    let mut vcpu = Vcpu::with_policy(shape, policy);
    for op in ops {
        match op {
            Op::Write(msr, value) => {
                vcpu.write(msr, value);
            }
            Op::Read(msr) => {
                vcpu.read(msr);
            }
            Op::Count(event, n, mode) => vcpu.run(event, n, mode),
            Op::Switch(writes, n) => {
                vcpu.save();
                prop_assert!(vcpu.nothing_can_count(), "save leaves nothing counting");
                run_other_vcpu(&mut vcpu, &writes, n);
                prop_assert!(vcpu.nothing_can_count(), "the other vCPU's save too");
                vcpu.load();
            }
            Op::Pmi => {
                if vcpu.hw.take_pmi() {
                    vcpu.backend
                        .handle_overflow(&mut vcpu.ctx, &mut vcpu.hw)
                        .unwrap();
                }
            }
        }
        check_hygiene(&vcpu, denies)?;
    }
    vcpu.save();
    prop_assert!(vcpu.nothing_can_count());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(384)))]

    #[test]
    fn guest_writes_never_put_forbidden_bits_on_the_hardware(
        shape in shape(),
        ops in prop::collection::vec(op(true), 1..60),
    ) {
        hygiene(shape, GuestPolicy::guest_default(), ops)?;
    }

    #[test]
    fn denied_events_never_count_on_the_hardware(
        shape in shape(),
        ops in prop::collection::vec(op(true), 1..60),
    ) {
        let policy = GuestPolicy { features: 0, filter: &DENY, may_count_host: false };
        hygiene(shape, policy, ops)?;
    }

    #[test]
    fn host_counting_guests_still_never_set_reserved_bits(
        shape in shape(),
        ops in prop::collection::vec(op(true), 1..60),
    ) {
        let policy = GuestPolicy { features: 0, filter: &AllowAll, may_count_host: true };
        hygiene(shape, policy, ops)?;
    }

    #[test]
    fn a_virtualised_pmu_reads_like_bare_hardware(
        shape in shape(),
        ops in prop::collection::vec(op(false), 1..60),
    ) {
        let mut vcpu = Vcpu::new(shape);
        let mut bare = AmdPmuModel::new(pmu(shape));
        for op in ops {
            match op {
                Op::Write(msr, value) => {
                    if vcpu.write(msr, value) == MsrOutcome::Handled(()) {
                        prop_assert!(bare.write(Msr(msr), value).is_ok(), "bare hardware accepts {:#x}", msr);
                    }
                }
                Op::Read(msr) => {
                    let through_backend = vcpu.read(msr);
                    let bare_value = bare.read(Msr(msr));
                    match through_backend {
                        MsrOutcome::Handled(v) => prop_assert_eq!(Ok(v), bare_value, "msr {:#x}", msr),
                        MsrOutcome::GeneralProtection => prop_assert!(bare_value.is_err(), "msr {:#x}", msr),
                        MsrOutcome::NotPmu => prop_assert!(false, "PMU MSR not owned"),
                    }
                }
                Op::Count(event, n, mode) => {
                    vcpu.run(event, n, mode);
                    bare.count(event, n, mode);
                    prop_assert_eq!(vcpu.hw.take_pmi(), bare.take_pmi(), "PMI");
                }
                Op::Switch(writes, n) => {
                    vcpu.save();
                    run_other_vcpu(&mut vcpu, &writes, n);
                    vcpu.load();
                }
                Op::Pmi => {
                    vcpu.backend.handle_overflow(&mut vcpu.ctx, &mut vcpu.hw).unwrap();
                }
            }
        }
        for msr in PMU_MSRS {
            match vcpu.read(msr) {
                MsrOutcome::Handled(v) => prop_assert_eq!(Ok(v), bare.read(Msr(msr)), "final {:#x}", msr),
                _ => prop_assert!(bare.read(Msr(msr)).is_err()),
            }
        }
    }

    #[test]
    fn save_load_round_trips_any_legal_context(
        shape in shape(),
        writes in prop::collection::vec((prop::sample::select(PMU_MSRS.to_vec()), value()), 0..40),
        garbage in prop::collection::vec(0u64..=MASK48, 6),
    ) {
        let mut vcpu = Vcpu::new(shape);
        for (msr, value) in writes {
            vcpu.write(msr, value);
        }
        let view = |vcpu: &mut Vcpu| -> Vec<MsrOutcome<u64>> {
            PMU_MSRS.iter().map(|&m| vcpu.read(m)).collect()
        };
        let before = view(&mut vcpu);
        vcpu.save();
        let saved = vcpu.ctx.clone();
        prop_assert!(vcpu.nothing_can_count());
        for (i, g) in garbage.iter().enumerate() {
            vcpu.hw.plant_counter(i, *g);
        }
        // Written behind the record's back: it must be told.
        vcpu.record.forget();
        vcpu.load();
        prop_assert_eq!(view(&mut vcpu), before.clone());
        vcpu.save();
        prop_assert_eq!(&vcpu.ctx, &saved, "save(load(ctx)) == ctx without counting");
        prop_assert_eq!(view(&mut vcpu), before);
    }
}

/// `PROPTEST_CASES` when set (one variable scales every property suite), else this suite's own.
fn cases(own: u32) -> u32 {
    std::env::var("PROPTEST_CASES").map_or(own, |v| v.parse().expect("PROPTEST_CASES: a count"))
}
