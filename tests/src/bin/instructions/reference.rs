//! The references of each row: the must-change minimum of MSR accesses, what Xen's VPMU does
//! for the same scenario, and the budget the row must meet (issues 13 and 27).
//!
//! The minima are for PMUs with a global control (both shapes here: Intel v5, AMD
//! PerfMonV2), where one write of the global control stops or starts every counter. *k* is the
//! number of counters the row uses. What must change, row by row:
//!
//! * an intercepted WRMSR (`wrmsr` a counter's value, `wrmsr-evtsel` a new event select,
//!   `wrmsr-global-enable`/`-disable`, `wrmsr-fixed-ctrl`) of a context loaded on the pCPU:
//!   the one register written, 1; an RDMSR of a loaded counter: the one read, 1;
//! * `wrmsr-first-use`: 0. The write (Linux's `check_hw_exists` counter write) puts the vPMU in
//!   use, but the counter it writes is not enabled, so nothing has to reach the hardware until
//!   a control enables it (the context is loaded then);
//! * `wrmsr-catch-up`: 1. Between self and hv mode no image of an unprivileged guest's context
//!   changes (hv only routes the profiler's hypervisor samples), so catching the pCPU up
//!   needs no access; the write itself is the 1;
//! * a switch pair with B idle (`switch-1`, `-4`, `-all`): save A (global control 0, read the
//!   overflow status, read the *k* counters) and load A again on hardware that still holds
//!   its values and controls (the global control): *k* + 3;
//! * a switch pair with B busy on the same *k* counters (`switch-4-same`): each save is
//!   *k* + 2, each load writes the *k* counter values the other context left and the global
//!   control, *k* + 1, the controls being equal: 2(*k* + 2) + 2(*k* + 1) = 4*k* + 6 (22 for
//!   4); `switch-4-migrated` (A and B swap pCPUs, each loaded where the other last ran) is
//!   the same two saves and two loads: 22;
//! * B busy on other events (`switch-4-other`, `switch-all-both`): each load also writes the
//!   *c* controls that differ, 4*k* + 6 + 2*c*: *c* = *k* = 4 gives 30; every counter on both
//!   sides is *k* = 9, *c* = 8 on Intel v5 (fixed counter 0 counts instructions on both
//!   sides, so FIXED_CTR_CTRL is equal), 58, and *k* = *c* = 6 on AMD, 42;
//! * a PMI through the LVTPC, whatever the number of counters that overflowed: read the
//!   overflow status, acknowledge every bit in one write: 2;
//! * an all-mode sample with *k* counters in use: stop (global control 0), read the status,
//!   acknowledge it, read the *k* counters: *k* + 3;
//! * a ring PMI (`pmi-ring-1`, `-all`) with *k* counters overflowed and re-armed: read the
//!   overflow status, acknowledge it, then per counter read what it counted past its wrap
//!   and write the re-armed value: 2*k* + 2 (no save, no load, no LVTPC mask);
//! * a flush (`flush`): write the re-armed counter, re-enable: 2; with an edited control
//!   (`flush-ctrl`), write that control too: 3;
//! * `request`: the write reaches the hardware of both pCPUs the profiler profiles, one
//!   access each: 2.
//!
//! The request measured is `SystemWrite`. An all-mode profiler's write is replayed on every
//! other pCPU it profiles, so one write sends a request to each of them, and both halves are
//! core entry points of their own (the intercept that sends, `complete_request` on the
//! target). The other all-mode request, `ResumeSystem` (a flush of a sample taken on a pCPU
//! the profiler does not run on), is sent by the tail of a flush, whose own cost the flush
//! rows measure; `Teardown`, `DropSystem` and `CatchUp` are sent once per finish, domain
//! destruction or policy change.

use crate::Scenario;

/// The PMU geometry the references are computed from.
struct Geometry {
    gp: u32,
    fixed: u32,
}

fn geometry(vendor: &str) -> Geometry {
    match vendor {
        // intel_v5(): 8 GP, 4 fixed counters; amd_v2(): 6 counters.
        "intel-v5" => Geometry { gp: 8, fixed: 4 },
        _ => Geometry { gp: 6, fixed: 0 },
    }
}

/// The fewest MSR accesses the scenario can take with `k` counters in use (module docs).
pub fn minimum(vendor: &str, scenario: Scenario, k: u32) -> u32 {
    let g = geometry(vendor);
    match scenario {
        Scenario::Wrmsr
        | Scenario::Rdmsr
        | Scenario::WrmsrEvtsel
        | Scenario::WrmsrGlobal(_)
        | Scenario::WrmsrFixedCtrl
        | Scenario::WrmsrCatchUp
        | Scenario::CalibrateAccess => 1,
        Scenario::WrmsrFirstUse
        | Scenario::CalibrateEmpty
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback
        | Scenario::CalibrateUnmeasured => 0,
        Scenario::SwitchPair(_) => k + 3,
        Scenario::SwitchBusy {
            other_events: false,
            ..
        }
        | Scenario::SwitchMigrated => 4 * k + 6,
        // B's general-purpose counters count other events; fixed counters keep theirs.
        Scenario::SwitchBusy {
            other_events: true, ..
        } => 4 * k + 6 + 2 * k.min(g.gp),
        Scenario::PmiLvtpc(_) => 2,
        Scenario::PmiSample(_) => k + 3,
        Scenario::PmiRing(_) => 2 * k + 2,
        Scenario::Flush => 2,
        Scenario::FlushCtrl => 3,
        Scenario::Request => 2,
    }
}

/// The instruction budget of a row, if an issue set one: issue 27's for every intercept
/// (≤ 150), the switch pairs with both sides busy (4 counters ≤ 1000, all ≤ 1800), the PMIs
/// with every counter overflowed (LVTPC ≤ 600, sample ≤ 1100) and the request (≤ 300);
/// issue 13's for the rows it measured (switch pair with 4 counters ≤ 600, PMI through the
/// LVTPC ≤ 300, sample ≤ 800, flush ≤ 800). Every row must also make exactly the must-change
/// minimum of MSR accesses and no heap allocation.
pub fn budget(scenario: Scenario) -> Option<u64> {
    match scenario {
        Scenario::Wrmsr
        | Scenario::Rdmsr
        | Scenario::WrmsrEvtsel
        | Scenario::WrmsrGlobal(_)
        | Scenario::WrmsrFixedCtrl
        | Scenario::WrmsrFirstUse
        | Scenario::WrmsrCatchUp => Some(150),
        Scenario::SwitchPair(Some(4)) => Some(600),
        Scenario::SwitchBusy { n: Some(_), .. } => Some(1000),
        Scenario::SwitchBusy { n: None, .. } => Some(1800),
        Scenario::PmiLvtpc(Some(1)) => Some(300),
        Scenario::PmiLvtpc(None) => Some(600),
        Scenario::PmiSample(Some(1)) => Some(800),
        Scenario::PmiSample(None) => Some(1100),
        Scenario::Flush => Some(800),
        Scenario::Request => Some(300),
        _ => None,
    }
}

/// What Xen's VPMU does for the scenario, in PMU MSR accesses, for an HVM guest (a PV
/// profiler for the sample and flush rows, the only kind Xen's sampling interface serves),
/// counted from Xen's source (xen-project/xen at c447b7308b13, 2026-08-20;
/// xen/arch/x86/cpu/vpmu.c, vpmu_intel.c, vpmu_amd.c), with F fixed and A general-purpose
/// counters on Intel, N counters on AMD (the family 15h+ MSRs; Xen has no PerfMonV2 support).
/// APIC LVTPC writes (`vpmu_save`, `vpmu_load`, `vpmu_do_interrupt`) are not counted. The
/// docs/measurements.md cites the function behind each row.
pub fn xen(vendor: &str, scenario: Scenario, k: u32) -> String {
    let g = geometry(vendor);
    let intel = vendor.starts_with("intel");
    let (f, a, n) = (g.fixed, g.gp, g.gp);
    let count = match scenario {
        // Once the context is loaded and running, the MSR bitmap lets the guest reach its
        // counters without an exit (core2_vpmu_set_msr_bitmap, amd_vpmu_set_msr_bitmap):
        // the guest's own access. Event selects and FIXED_CTR_CTRL writes are intercepted
        // and written through (core2_vpmu_do_wrmsr, amd_vpmu_do_wrmsr): 1. Xen keeps no
        // policy epoch: the catch-up row is the plain write.
        Scenario::Wrmsr
        | Scenario::Rdmsr
        | Scenario::WrmsrEvtsel
        | Scenario::WrmsrCatchUp
        | Scenario::WrmsrFixedCtrl
        | Scenario::CalibrateAccess => 1,
        // GLOBAL_CTRL of a VMX guest lives in the VMCS MSR-load list (vmx_write_guest_msr).
        Scenario::WrmsrGlobal(_) if intel => 0,
        Scenario::WrmsrGlobal(_) => return "– (no PerfMonV2)".into(),
        // The first intercepted write loads the whole context (core2_vpmu_msr_common_check
        // → __core2_vpmu_load; amd_vpmu_do_wrmsr → context_load), then writes.
        Scenario::WrmsrFirstUse if intel => f + 2 * a + 1 + 1,
        Scenario::WrmsrFirstUse => 2 * n + 1,
        Scenario::CalibrateEmpty
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback
        | Scenario::CalibrateUnmeasured => 0,
        // vpmu_switch_from → core2_vpmu_save (F counters, A counter/control pairs read);
        // vpmu_switch_to → __core2_vpmu_load (the same written, and FIXED_CTR_CTRL).
        // amd_vpmu_save stops N controls and reads N counters; context_load writes 2N.
        // Whatever is in use, per context switched out and in again.
        Scenario::SwitchPair(_) if intel => 2 * f + 4 * a + 1,
        Scenario::SwitchPair(_) => 4 * n,
        Scenario::SwitchBusy { .. } | Scenario::SwitchMigrated if intel => 2 * (2 * f + 4 * a + 1),
        Scenario::SwitchBusy { .. } | Scenario::SwitchMigrated => 2 * 4 * n,
        // core2_vpmu_do_interrupt: GLOBAL_STATUS read, one read per overflowed counter
        // (handle_pmc_quirk, family 6; a write too if it reads 0), GLOBAL_OVF_CTRL write.
        // amd_vpmu_do_interrupt makes none.
        Scenario::PmiLvtpc(_) if intel => k + 2,
        Scenario::PmiLvtpc(_) => 0,
        // vpmu_do_interrupt (PV sampler) → core2_vpmu_save(to_guest): GLOBAL_CTRL 0, the
        // bank read (F + 2A), GLOBAL_STATUS; amd_vpmu_save: N stops, N reads.
        Scenario::PmiSample(_) if intel => 1 + f + 2 * a + 1,
        Scenario::PmiSample(_) => 2 * n,
        // Xen has no sample ring: its samples go through the page only.
        Scenario::PmiRing(_) => return "– (no ring)".into(),
        // XENPMU_flush → vpmu_load(from_guest) → __core2_vpmu_load: the bank, FIXED_CTR_CTRL,
        // GLOBAL_OVF_CTRL and GLOBAL_CTRL (a PV vCPU); amd_vpmu_load → context_load: 2N.
        Scenario::Flush | Scenario::FlushCtrl if intel => f + 2 * a + 3,
        Scenario::Flush | Scenario::FlushCtrl => 2 * n,
        // Xen replays no write on other pCPUs: in all mode each dom0 vCPU's writes go to its
        // own context.
        Scenario::Request => return "– (no such request)".into(),
    };
    count.to_string()
}
