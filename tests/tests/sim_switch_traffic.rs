//! Hardware MSR accesses of a context switch-out plus switch-in, through the whole core
//! (`Vpmu::context_switch`), measured at the software PMU model (`access_stats`) and
//! cross-checked against the core's own per-vCPU accounting (`VcpuStats::hw_msr`):
//!
//! * a vCPU that never used the PMU: nothing;
//! * the same vCPU switched back in (`next == current`): nothing;
//! * all mode (system-wide counters stay on the pCPUs), for a profiled guest and for the
//!   profiler itself: nothing;
//! * one counter active, and every counter active: exactly the minimum the switch needs
//!   ([`minimum`], derived from what must be done, not from the implementation).
//!
//! Run with `--nocapture` for the table.

use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF};
use vpmu::{MsrAccessStats, VcpuId};
use vpmu_models::SoftwarePmu;
use vpmu_sim::helpers::counting;
use vpmu_sim::vendor::FIXED0;
use vpmu_sim::{Driver, Machine, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};

const PROFILER: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

/// Accesses of one switch-out and one switch-in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Traffic {
    save: (u64, u64),
    load: (u64, u64),
}

impl Traffic {
    fn total(&self) -> u64 {
        self.save.0 + self.save.1 + self.load.0 + self.load.1
    }
}

/// The least a switch-out + switch-in of a context using `gp` general-purpose and `fixed`
/// fixed counters can do, as (reads, writes) of the save and of the load:
///
/// * save — stop every counter at once where a global control exists (one write; without it,
///   each control must be cleared: that is what stops its counter); read the overflow status
///   where it exists (overflows since the last PMI belong to the context); read each counter
///   in use. With a global control the controls stay programmed: nothing counts while it is 0;
/// * load, nothing else having used the pCPU in between — the counters and controls still hold
///   the context's values: re-enable, with the global control (one write) or, without it, each
///   control.
///
/// *k* counters with a global control: *k* + 3.
fn minimum(driver: Driver, gp: u64, fixed: u64) -> Traffic {
    match driver {
        Driver::Intel { .. } => Traffic {
            save: (1 + gp + fixed, 1),
            load: (0, 1),
        },
        Driver::Amd { v2: true, .. } => Traffic {
            save: (gp + 1, 1),
            load: (0, 1),
        },
        Driver::Amd { .. } => Traffic {
            save: (gp, gp),
            load: (0, gp),
        },
    }
}

fn diff(after: MsrAccessStats, before: MsrAccessStats) -> (u64, u64) {
    let d = after - before;
    assert_eq!(d.faults, 0, "no access faults");
    (d.reads, d.writes)
}

/// Switches `vcpu` (running on pCPU 0) out to idle and back in; returns the accesses,
/// checking that the core charged exactly those to `vcpu`.
fn out_and_in<V: SimVendor>(m: &mut Machine<V>, vcpu: VcpuId) -> Traffic {
    assert_eq!(m.pcpus[0].current(), Some(vcpu));
    let charged = m.vcpu(vcpu).stats().hw_msr;
    let start = m.pcpus[0].hw().access_stats();
    m.switch(0, None);
    let middle = m.pcpus[0].hw().access_stats();
    m.switch(0, Some(vcpu));
    let end = m.pcpus[0].hw().access_stats();
    let traffic = Traffic {
        save: diff(middle, start),
        load: diff(end, middle),
    };
    let by_core = m.vcpu(vcpu).stats().hw_msr - charged;
    assert_eq!(
        (by_core.reads, by_core.writes),
        diff(end, start),
        "charged to {vcpu:?}"
    );
    traffic
}

/// `vcpu` programs `gp` general-purpose counters and (Intel) `fixed` fixed counters to count,
/// enables them globally, and retires a few instructions on pCPU 0.
fn use_counters<V: SimVendor>(m: &mut Machine<V>, vcpu: VcpuId, gp: u32, fixed: u32) {
    let driver = m.vendor.driver();
    let setups: Vec<_> = (0..gp)
        .map(|ctr| counting(ctr, 100 + u64::from(ctr)))
        .collect();
    m.program(vcpu, &setups);
    if fixed > 0 {
        let mut global = setups.iter().fold(0, |g, s| g | s.bit());
        for i in 0..fixed {
            m.write(vcpu, driver.write_counter(FIXED0 + i, 7 + u64::from(i)));
            global |= 1 << (FIXED0 + i);
        }
        let ctrl = (0..fixed).fold(0, |c, i| c | 0x3 << (4 * i));
        m.write(vcpu, (driver.control_msr(FIXED0), ctrl));
        m.write(vcpu, driver.global_enable(global).expect("Intel"));
    }
    assert!(m.run(0, 5).is_empty(), "counting, no PMI");
}

fn row(vendor: &str, scenario: &str, t: Traffic, min: Traffic) {
    println!(
        "| {vendor:<20} | {scenario:<30} | {:>2}r {:>2}w | {:>2}r {:>2}w | {:>5} | {:>7} |",
        t.save.0,
        t.save.1,
        t.load.0,
        t.load.1,
        t.total(),
        min.total()
    );
}

fn traffic<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let driver = vendor.driver();
    let (gp, fixed) = match driver {
        Driver::Intel { gp, fixed, .. } => (gp, fixed.count_ones()),
        Driver::Amd { counters, .. } => (counters, 0),
    };
    let zero = Traffic::default();

    // (a) A vCPU that never used the PMU, and switches between two such vCPUs.
    let mut m = Machine::new(vendor.clone(), 1, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(A));
    let t = out_and_in(&mut m, A);
    row(&name, "never used the PMU", t, zero);
    assert_eq!(t, zero);
    let before = m.pcpus[0].hw().access_stats();
    m.switch(0, Some(B));
    m.switch(0, Some(A));
    assert_eq!(
        m.pcpus[0].hw().access_stats(),
        before,
        "A -> B -> A, neither using the PMU"
    );

    // (b) The same vCPU switched back in: the pCPU already holds its state.
    use_counters(&mut m, A, 1, 0);
    let before = m.pcpus[0].hw().access_stats();
    m.switch(0, Some(A));
    let t = Traffic {
        save: (0, 0),
        load: diff(m.pcpus[0].hw().access_stats(), before),
    };
    row(&name, "same vCPU switched back in", t, zero);
    assert_eq!(t, zero);

    // (d) One counter active.
    let t = out_and_in(&mut m, A);
    let min = minimum(driver, 1, 0);
    row(&name, "1 counter active", t, min);
    assert_eq!(t, min);

    // (e) Every counter active.
    m.schedule(0, Some(B));
    use_counters(&mut m, B, gp, fixed);
    let t = out_and_in(&mut m, B);
    let min = minimum(driver, u64::from(gp), u64::from(fixed));
    row(
        &name,
        &format!("all {} counters active", gp + fixed),
        t,
        min,
    );
    assert_eq!(t, min);
    m.schedule(0, None);
    assert!(
        V::nothing_can_count(m.pcpus[0].hw()),
        "nothing can count when idle"
    );
    m.assert_conservation();

    // (c) All mode: the profiler's system-wide counters stay put whoever runs.
    let mut m = Machine::new(vendor.clone(), 1, &[1, 2], XENPMU_MODE_ALL);
    m.register_page(PROFILER);
    m.schedule(0, Some(A));
    use_counters(&mut m, PROFILER, gp, fixed);
    let counted = m.pcpus[0].hw().access_stats();
    let t = out_and_in(&mut m, A);
    row(&name, "all mode, profiled guest", t, zero);
    assert_eq!(t, zero);
    m.schedule(0, Some(PROFILER));
    let t = out_and_in(&mut m, PROFILER);
    row(&name, "all mode, the profiler itself", t, zero);
    assert_eq!(t, zero);
    assert_eq!(m.pcpus[0].hw().access_stats(), counted);
    assert!(
        !V::nothing_can_count(m.pcpus[0].hw()),
        "the system-wide counters are still programmed"
    );
}

#[test]
fn msr_traffic_per_switch_is_the_minimum() {
    println!(
        "| vendor               | scenario                       | save    | load    | total | minimum |"
    );
    println!(
        "|----------------------|--------------------------------|---------|---------|-------|---------|"
    );
    traffic(intel_v5());
    traffic(intel_v2());
    traffic(amd_v2());
    traffic(amd_legacy());
}
