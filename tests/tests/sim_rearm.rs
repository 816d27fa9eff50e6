//! The re-arm rule (docs/abi.md, "What the owner may change in the cached window"): a value the
//! owner writes into the shared page is judged exactly as the guest's WRMSR of that register
//! judges it. A profiler re-arms a counter in the cached window with a 64-bit `-period`, as a
//! WRMSR of IA32_PMCx or PERF_CTRn would take it, and the flush must take it the same way; a
//! value a WRMSR refuses (#GP) is refused by the flush (`-EIO`), and the page then names the
//! register's MSR and the reason (`flush_refusal`, version 1.3).
//!
//! For a table of values, on Intel v2 (legacy counter writes only), Intel v5 (full-width
//! writes), AMD K7 and AMD PerfMonV2, each register is written once through the page (take a
//! sample, edit the page, flush) and once by WRMSR (a fresh machine, after an unedited flush)
//! through each of its MSRs; the two paths must agree on accept/refuse and on the value read
//! back.

use vpmu::MsrOutcome;
use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    FlushRefusal, PageView, PageViewMut, XENPMU_MODE_SELF, XENPMU_OP_FLUSH,
    XENPMU_REFUSED_FORBIDDEN, XENPMU_REFUSED_RESERVED, XENPMU_REFUSED_WIDTH,
};
use vpmu_sim::world::Pending;
use vpmu_sim::{
    CounterSpec, Driver, PlanSpec, Run, Scenario, SimEvent, SimVendor, Step, Timing, World,
    amd_legacy, amd_v2, intel_v2, intel_v5,
};

/// Counter width of every simulated shape.
const MASK: u64 = (1 << 48) - 1;

/// 64-bit `-period` values a profiler writes, and values on the edges of each rule.
const VALUES: [u64; 17] = [
    0,
    5,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 47,
    MASK,
    1 << 48,
    0xdead_0000_0000_1234,
    u64::MAX,
    0u64.wrapping_sub(1000),
    0u64.wrapping_sub(0x7fff_ffff),
    0u64.wrapping_sub(0x8000_0000),
    0u64.wrapping_sub(1 << 40),
    0u64.wrapping_sub(1000) & MASK,
    0u64.wrapping_sub(1 << 40) & MASK,
];

/// dom1 vCPU 0 samples instructions every 5 on counter 0, its handler deferred.
fn scenario() -> Scenario {
    let plan = PlanSpec {
        counters: vec![CounterSpec {
            slot: 0,
            event: SimEvent::Instructions,
            os: true,
            usr: true,
            period: Some(5),
            initial: 0,
        }],
        page: true,
    };
    let runs = vec![Run {
        function: 1,
        len: 7,
        branch_every: 2,
    }];
    Scenario {
        pcpus: 1,
        domains: vec![1, 1],
        mode: XENPMU_MODE_SELF,
        timing: Timing::Deferred,
        workloads: vec![runs.clone(), runs],
        plans: vec![PlanSpec::default(), plan],
        steps: Vec::new(),
        filters: Vec::new(),
    }
}

/// A machine whose subject (dom1 vCPU 0) has a sample cached.
fn sampled<V: SimVendor>(vendor: V) -> World<V> {
    let mut world = World::new(vendor, &scenario());
    world.step(Step::Run {
        pcpu: 0,
        vcpu: 1,
        count: 12,
    });
    assert_eq!(world.guests[1].pending.front(), Some(&Pending::Virq));
    world
}

/// A register of the vendor area, with the MSRs that reach it.
#[derive(Clone, Copy, Debug)]
enum Register {
    /// Intel GP counter `i`: IA32_PMCi and (full-width writes) IA32_A_PMCi.
    IntelGp(u32),
    /// Intel IA32_FIXED_CTRi.
    IntelFixed(u32),
    /// Intel IA32_PERFEVTSELi.
    IntelEvtsel(u32),
    /// AMD PERF_CTRi through the K7 and (PerfCtrExtCore) the extended MSRs.
    AmdCounter(u32),
    /// AMD PERF_CTLi through both blocks.
    AmdCtrl(u32),
}

impl Register {
    /// The MSRs a guest writes the register through on `vendor`, the one a refusal names
    /// first.
    fn msrs<V: SimVendor>(self, vendor: &V) -> Vec<u32> {
        let (full_width, ext) = match vendor.driver() {
            Driver::Intel { full_width, .. } => (full_width, false),
            Driver::Amd { ext, .. } => (false, ext),
        };
        match self {
            Register::IntelGp(i) if full_width => vec![0xc1 + i, 0x4c1 + i],
            Register::IntelGp(i) => vec![0xc1 + i],
            Register::IntelFixed(i) => vec![0x309 + i],
            Register::IntelEvtsel(i) => vec![0x186 + i],
            // The K7 MSRs reach counters 0-3 only.
            Register::AmdCounter(i) if ext && i < 4 => {
                vec![0xC001_0201 + 2 * i, 0xC001_0004 + i]
            }
            Register::AmdCounter(i) if ext => vec![0xC001_0201 + 2 * i],
            Register::AmdCounter(i) => vec![0xC001_0004 + i],
            Register::AmdCtrl(i) if ext && i < 4 => vec![0xC001_0200 + 2 * i, 0xC001_0000 + i],
            Register::AmdCtrl(i) if ext => vec![0xC001_0200 + 2 * i],
            Register::AmdCtrl(i) => vec![0xC001_0000 + i],
        }
    }

    /// Writes `value` into the register's word of the subject's page.
    fn edit_page(self, page: &mut vpmu::abi::Page, value: u64) {
        let mut view = PageViewMut::new(page).expect("initialised");
        let done = match self {
            Register::IntelGp(i) => view.edit_intel(|_, banks, area| {
                let pair = banks.pair(area, i as usize)?;
                banks.set_pair(
                    area,
                    i as usize,
                    vpmu::abi::CounterPair {
                        counter: value,
                        ..pair
                    },
                )
            }),
            Register::IntelFixed(i) => {
                view.edit_intel(|_, banks, area| banks.set_fixed_counter(area, i as usize, value))
            }
            Register::IntelEvtsel(i) => view.edit_intel(|_, banks, area| {
                let pair = banks.pair(area, i as usize)?;
                banks.set_pair(
                    area,
                    i as usize,
                    vpmu::abi::CounterPair {
                        control: value,
                        ..pair
                    },
                )
            }),
            Register::AmdCounter(i) => {
                view.edit_amd(|_, banks, area| banks.set_counter(area, i as usize, value))
            }
            Register::AmdCtrl(i) => {
                view.edit_amd(|_, banks, area| banks.set_ctrl(area, i as usize, value))
            }
        };
        done.and_then(|inner| inner)
            .expect("the register is in the page");
    }
}

/// What one path did with a value: accepted, and the register's value read back by RDMSR
/// afterwards (through its first MSR), or refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Accepted(u64),
    Refused,
}

/// The page path: sample, write `value` into the page, flush. Returns the verdict and, for a
/// refusal, the page's report.
fn through_page<V: SimVendor>(
    vendor: V,
    register: Register,
    value: u64,
) -> (Verdict, Option<FlushRefusal>) {
    let msrs = register.msrs(&vendor);
    let mut world = sampled(vendor);
    let id = world.guests[1].id;
    let gfn = world.guests[1].page_gfn.expect("a page");
    register.edit_page(world.m.platform.frame_mut(id.domain, gfn), value);
    match world.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0)) {
        Ok(_) => match world.m.rdmsr(id, msrs[0]) {
            MsrOutcome::Handled(read) => (Verdict::Accepted(read), None),
            other => panic!("RDMSR {:#x} after a flush: {other:?}", msrs[0]),
        },
        Err(OpError::InvalidContext) => {
            let page = world.m.platform.frame(id.domain, gfn);
            let view = PageView::new(page).expect("initialised");
            assert!(view.is_cached(), "a refused flush leaves the sample cached");
            (Verdict::Refused, view.flush_refusal())
        }
        Err(other) => panic!("flush: {other:?}"),
    }
}

/// The WRMSR path through `msr`: sample, flush unedited (the window closes), WRMSR `value`,
/// read the register back through `read`.
fn through_wrmsr<V: SimVendor>(vendor: V, msr: u32, read: u32, value: u64) -> Verdict {
    let mut world = sampled(vendor);
    let id = world.guests[1].id;
    assert!(world.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0)).is_ok());
    match world.m.wrmsr(id, msr, value) {
        MsrOutcome::Handled(()) => match world.m.rdmsr(id, read) {
            MsrOutcome::Handled(read) => Verdict::Accepted(read),
            other => panic!("RDMSR {read:#x}: {other:?}"),
        },
        MsrOutcome::GeneralProtection => Verdict::Refused,
        other => panic!("WRMSR {msr:#x}: {other:?}"),
    }
}

/// The page's verdict on `value` in `register` is the WRMSR's: for a register whose MSRs are
/// aliases, their common verdict; for Intel GP counters, whose page slot has no alias of its
/// own, the verdict of the MSR that takes the value (with full-width writes IA32_A_PMCi for a
/// value within the width, else IA32_PMCi).
/// Returns the page's verdict and report.
fn agree<V: SimVendor + Copy>(
    vendor: V,
    register: Register,
    value: u64,
) -> (Verdict, Option<FlushRefusal>) {
    let name = vendor.name();
    let msrs = register.msrs(&vendor);
    let (page, report) = through_page(vendor, register, value);
    let by_msr: Vec<Verdict> = msrs
        .iter()
        .map(|&msr| through_wrmsr(vendor, msr, msrs[0], value))
        .collect();
    let expected = match register {
        // IA32_A_PMCi (where it exists) takes a value within the width; IA32_PMCi all others.
        Register::IntelGp(_) if by_msr.len() == 2 && value & !MASK == 0 => by_msr[1],
        Register::IntelGp(_) => by_msr[0],
        _ => {
            for other in &by_msr[1..] {
                assert_eq!(
                    *other, by_msr[0],
                    "{name} {register:?} {value:#x}: aliases agree"
                );
            }
            by_msr[0]
        }
    };
    assert_eq!(
        page, expected,
        "{name} {register:?} <- {value:#x}: the page and WRMSR ({msrs:x?}: {by_msr:?}) disagree"
    );
    if let Register::IntelGp(_) = register {
        // The full-width MSR takes exactly the values within the width, whole.
        if let Some(&fw) = by_msr.get(1) {
            let whole = (value & !MASK == 0).then_some(Verdict::Accepted(value));
            assert_eq!(
                fw,
                whole.unwrap_or(Verdict::Refused),
                "{name} IA32_A_PMC <- {value:#x}"
            );
        }
    }
    match page {
        Verdict::Accepted(_) => assert_eq!(report, None, "{name}: nothing reported"),
        Verdict::Refused => {
            let report = report.expect("a 1.3 page reports the refusal");
            assert_eq!(report.msr, msrs[0], "{name} {register:?}: the refused MSR");
            assert_eq!(
                report.value, value,
                "{name} {register:?}: the refused value"
            );
        }
    }
    (page, report)
}

fn counters_rearm_as_wrmsr_takes_them<V: SimVendor + Copy>(vendor: V, registers: &[Register]) {
    for &register in registers {
        for value in VALUES {
            let (verdict, _) = agree(vendor, register, value);
            // The re-arm itself: a 64-bit -period below 2^31 sets the counter to 2^48 - period
            // on every counter a WRMSR re-arms that way.
            if value == 0u64.wrapping_sub(1000) && !matches!(register, Register::IntelFixed(_)) {
                assert_eq!(
                    verdict,
                    Verdict::Accepted(MASK - 999),
                    "{} {register:?}: -1000 re-arms",
                    vendor.name()
                );
            }
        }
    }
}

#[test]
fn intel_v2_counters_rearm_with_a_64_bit_minus_period() {
    counters_rearm_as_wrmsr_takes_them(
        intel_v2(),
        &[
            Register::IntelGp(0),
            Register::IntelGp(2),
            Register::IntelFixed(1),
        ],
    );
}

#[test]
fn intel_v5_counters_rearm_with_a_64_bit_minus_period() {
    counters_rearm_as_wrmsr_takes_them(
        intel_v5(),
        &[
            Register::IntelGp(0),
            Register::IntelGp(5),
            Register::IntelFixed(3),
        ],
    );
}

#[test]
fn amd_k7_counters_rearm_with_a_64_bit_minus_period() {
    counters_rearm_as_wrmsr_takes_them(
        amd_legacy(),
        &[Register::AmdCounter(0), Register::AmdCounter(3)],
    );
}

#[test]
fn amd_perfmon_v2_counters_rearm_with_a_64_bit_minus_period() {
    counters_rearm_as_wrmsr_takes_them(
        amd_v2(),
        &[Register::AmdCounter(0), Register::AmdCounter(5)],
    );
}

/// The refused cases name the register's MSR and the reason: a fixed counter re-armed with an
/// unmasked `-period` (bits above the width), an AnyThread or reserved event-select bit, an
/// AMD HostOnly or reserved control bit.
#[test]
fn a_refused_flush_names_the_register_and_the_reason() {
    const MINUS_1000: u64 = 0u64.wrapping_sub(1000);
    const EVTSEL: u64 = (1 << 22) | (3 << 16) | 0xc0;
    type Outcome = (Verdict, Option<FlushRefusal>);
    let cases: [(fn() -> Outcome, u32); 6] = [
        (
            || agree(intel_v2(), Register::IntelFixed(0), MINUS_1000),
            XENPMU_REFUSED_WIDTH,
        ),
        (
            || agree(intel_v5(), Register::IntelFixed(2), MINUS_1000),
            XENPMU_REFUSED_WIDTH,
        ),
        (
            || agree(intel_v5(), Register::IntelEvtsel(1), EVTSEL | 1 << 21),
            XENPMU_REFUSED_FORBIDDEN,
        ),
        (
            || agree(intel_v2(), Register::IntelEvtsel(3), EVTSEL | 1 << 40),
            XENPMU_REFUSED_RESERVED,
        ),
        (
            || agree(amd_v2(), Register::AmdCtrl(1), EVTSEL | 1 << 41),
            XENPMU_REFUSED_FORBIDDEN,
        ),
        (
            || agree(amd_legacy(), Register::AmdCtrl(2), EVTSEL | 1 << 21),
            XENPMU_REFUSED_RESERVED,
        ),
    ];
    for (case, reason) in cases {
        let (verdict, report) = case();
        assert_eq!(verdict, Verdict::Refused);
        assert_eq!(report.map(|r| r.reason), Some(reason), "{report:?}");
    }
    // And the same registers with legal values are accepted by both paths.
    assert!(matches!(
        agree(intel_v5(), Register::IntelFixed(2), MINUS_1000 & MASK).0,
        Verdict::Accepted(v) if v == MASK - 999
    ));
    assert!(matches!(
        agree(intel_v5(), Register::IntelEvtsel(1), EVTSEL).0,
        Verdict::Accepted(_)
    ));
    assert!(matches!(
        agree(amd_v2(), Register::AmdCtrl(1), EVTSEL).0,
        Verdict::Accepted(_)
    ));
}
