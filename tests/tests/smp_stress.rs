//! The core on real OS threads, one per pCPU, for every vendor shape (issue 11, step 6): see
//! `vpmu_tests::smp` for what each thread does and what is checked.
//!
//! `STRESS_ITERS` sets the actions per pCPU thread (default below: about a second per vendor
//! in a debug build on two cores), `STRESS_SEED` the seed (printed by every run; each thread's
//! choices derive from it, their interleaving is the OS's). Nothing depends on timing: every
//! wait is for other threads' progress, counted in queue drains.
//!
//! Core bugs the stress found, each with a deterministic reproduction below (ignored while
//! open), and what `Config::avoid_known_bugs` leaves out of the workload so that the rest of
//! it keeps running:
//!
//! 1. Fixed: two conflicting policy changes retried concurrently livelocked (each retry that
//!    found the other's change complete committed its own again). A vCPU now remembers the
//!    change it began (`PendingChange`); its retry answers 0 once that one is complete, so
//!    the two are serialized. Every variant has privileged vCPUs changing mode and features
//!    concurrently.
//! 2. Fixed: a counter that overflowed while its interrupt was disabled became a PMI at the
//!    next save once the guest enabled the interrupt. The backends now acknowledge such a
//!    silent overflow when the interrupt is turned on. Intel v2/v5, AMD PerfMonV2 (and K7).
//! 3. Fixed: a counter overflowing again before the guest acknowledged its previous overflow
//!    lost its PMI if the vCPU was switched out first (`save` reported only new status bits).
//! 4. Fixed: a policy change caught up while an overflow was in flight on a running vCPU's
//!    loaded context saved it into `pending_pmi` and nothing delivered it until the vCPU's
//!    next switch-in (`restrict_loaded` and `catch_up` now deliver it at once). All four
//!    shapes.
//! 5. Open: the full workload (no avoidance) still finds, in about 1 run in 6 (release build,
//!    `STRESS_ITERS=100000`, seeds 100..=130: 5 of 31 failed, every vendor among them), an
//!    overflow that is neither routed nor kept pending: "PMI lost at switch-out" (a privileged
//!    vCPU switched out with an overflow whose PMI is not yet taken) or "PMI lost" (the PMI
//!    handled as `Spurious`; e.g. AMD PerfMonV2, `STRESS_SEED=0x68`: after an own-sample flush
//!    in self/hv mode and counter 0 reprogrammed and enabled alone, its wrap is spurious, which
//!    points at the backend's in-use bookkeeping of the reloaded context). Runs do not
//!    reproduce exactly (the interleaving is the OS's). The full-workload tests stay ignored
//!    until it is understood.

use std::sync::mpsc;
use std::thread;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{XENPMU_MODE_HV, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET};
use vpmu::{Completion, ExecMode, HwEvent, Msr, MsrBus, SoftwarePmu, VcpuId};
use vpmu_tests::sim::machine::Ctx;
use vpmu_tests::sim::truth::{CounterSetup, SimEvent};
use vpmu_tests::sim::vendor::COUNTER_MASK;
use vpmu_tests::sim::{Machine, SimFilter, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};
use vpmu_tests::smp::{self, Config, OwnedBus};

const DEFAULT_STEPS: u64 = 50_000;

fn stress<V>(vendor: V, avoid_known_bugs: bool)
where
    V: SimVendor + Sync,
    V::Backend: Sync,
    V::Model: Send,
    Ctx<V>: Send,
{
    let config = Config {
        // More threads than the two cores, and more vCPUs than pCPUs in every domain but the
        // profiler's, whose two vCPUs profile three pCPUs (p mod 2): one of them two pCPUs.
        pcpus: 3,
        vcpu_counts: vec![2, 3, 2],
        steps: smp::steps_from_env(DEFAULT_STEPS),
        seed: smp::seed_from_env(),
        avoid_known_bugs,
    };
    println!(
        "{}: STRESS_SEED={:#x} STRESS_ITERS={} ({} pCPU threads, vCPUs per domain {:?}, \
         avoiding known bugs: {avoid_known_bugs})",
        vendor.name(),
        config.seed,
        config.steps,
        config.pcpus,
        config.vcpu_counts
    );
    let report = smp::run(&vendor, &config);
    for (what, count) in &report.coverage {
        println!("  {what}: {count}");
    }
    assert!(
        report.findings.is_empty(),
        "{} with STRESS_SEED={:#x}:\n{}",
        vendor.name(),
        config.seed,
        report.findings
    );
    // A run that reached none of this would prove nothing.
    let reached = |what: &str| report.coverage.get(what).copied().unwrap_or(0);
    for what in [
        "counter reads checked exactly",
        "PMIs delivered",
        "request CatchUp completed",
        "request Unload completed",
        "filter changes completed",
    ] {
        assert!(reached(what) > 0, "{}: nothing of {what:?}", vendor.name());
    }
}

#[test]
fn stress_intel_v5() {
    stress(intel_v5(), true);
}

#[test]
fn stress_intel_v2() {
    stress(intel_v2(), true);
}

#[test]
fn stress_amd_perfmon_v2() {
    stress(amd_v2(), true);
}

#[test]
fn stress_amd_legacy() {
    stress(amd_legacy(), true);
}

#[test]
#[ignore = "open finding 5 (module documentation): a rare PMI lost at a privileged switch-out"]
fn stress_intel_v5_full_workload() {
    stress(intel_v5(), false);
}

#[test]
#[ignore = "open finding 5 (module documentation): a rare PMI lost at a privileged switch-out"]
fn stress_intel_v2_full_workload() {
    stress(intel_v2(), false);
}

#[test]
#[ignore = "open finding 5 (module documentation): a rare PMI lost at a privileged switch-out"]
fn stress_amd_perfmon_v2_full_workload() {
    stress(amd_v2(), false);
}

#[test]
#[ignore = "open finding 5 (module documentation): a rare PMI lost at a privileged switch-out"]
fn stress_amd_legacy_full_workload() {
    stress(amd_legacy(), false);
}

/// The property the stress relies on to catch cross-pCPU hardware access: a bus driven from
/// any thread but its owner's panics.
#[test]
fn a_bus_driven_from_a_foreign_thread_panics() {
    let mut bus = OwnedBus::new(0, intel_v5().model());
    assert!(bus.read(Msr(0x38f)).is_ok(), "the owner drives it");
    let (send, receive) = mpsc::channel();
    let foreign = thread::spawn(move || {
        let mut bus = bus;
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bus.write(Msr(0x38f), 0)));
        send.send(result.is_err()).expect("report");
    });
    foreign.join().expect("the foreign thread itself survives");
    assert!(
        receive.recv().expect("a report"),
        "the foreign WRMSR panicked"
    );
}

// ---- deterministic reproductions of the bugs the stress found ----

const P0: VcpuId = VcpuId { domain: 0, vcpu: 0 };
const P1: VcpuId = VcpuId { domain: 0, vcpu: 1 };
const A: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const B: VcpuId = VcpuId { domain: 1, vcpu: 1 };

fn instructions(ctr: u32, interrupt: bool, initial: u64) -> CounterSetup {
    CounterSetup {
        ctr,
        event: SimEvent::Instructions,
        os: true,
        usr: true,
        period: interrupt.then_some(1),
        initial,
    }
}

/// Counts `n` instructions on pCPU 0's model without taking the PMI they may raise: the
/// window between an overflow and its interrupt.
fn count_silently(m: &mut Machine<impl SimVendor>, n: u64) {
    let mode = ExecMode {
        cpl: 0,
        host: false,
    };
    m.pcpus[0].hw_mut().count(HwEvent::Instructions, n, mode);
}

/// Bug 1: two privileged vCPUs on two pCPUs set different modes (self ⇄ hv: never `-EBUSY`),
/// each restarting its hypercall after handling its own requests, as `-EAGAIN` asks. Each
/// restart finds the other's change complete and commits its own again: neither ever
/// completes.
#[test]
fn two_conflicting_mode_sets_both_complete() {
    let mut m = Machine::new(intel_v5(), 2, &[2, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(P0));
    m.schedule(1, Some(P1));
    m.hold_requests = true;
    let set = |mode| Params::new(mode, 0);
    let (mut p0_done, mut p1_done) = (false, false);
    for _ in 0..50 {
        if !p0_done {
            p0_done =
                m.op_once(P0, XENPMU_OP_MODE_SET, &set(XENPMU_MODE_HV)) != Err(OpError::Again);
        }
        m.complete_requests(1);
        if !p1_done {
            p1_done =
                m.op_once(P1, XENPMU_OP_MODE_SET, &set(XENPMU_MODE_SELF)) != Err(OpError::Again);
        }
        m.complete_requests(0);
    }
    assert!(
        p0_done && p1_done,
        "after 50 rounds in which each pCPU handled every request: P0 done {p0_done}, P1 done \
         {p1_done} (epoch {})",
        m.vpmu.policy().epoch
    );
}

fn phantom_pmi<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 1, &[1, 2], XENPMU_MODE_SELF);
    let driver = m.vendor.driver();
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.program(A, &[instructions(0, false, COUNTER_MASK - 2)]);
    let pmis = m.run(0, 10);
    assert!(pmis.is_empty(), "{name}: no interrupt, no PMI");
    // The guest reprograms the counter with its interrupt, far from wrapping.
    m.write(A, driver.disable(0));
    m.write(A, driver.write_counter(0, 100));
    m.write(A, driver.control(&instructions(0, true, 100)));
    m.schedule(0, Some(B));
    m.schedule(0, Some(A));
    assert_eq!(
        m.vcpu(A).stats().pmis_generated,
        0,
        "{name}: the overflow happened with the interrupt disabled; the hardware raised no PMI"
    );
}

/// Bug 2.
#[test]
fn an_overflow_with_its_interrupt_disabled_never_becomes_a_pmi() {
    phantom_pmi(intel_v5());
    phantom_pmi(intel_v2());
    phantom_pmi(amd_v2());
}

fn second_overflow_lost<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 1, &[1, 2], XENPMU_MODE_SELF);
    let driver = m.vendor.driver();
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.program(A, &[instructions(0, true, COUNTER_MASK - 2)]);
    assert_eq!(m.run(0, 10).len(), 1, "{name}: the first overflow's PMI");
    // Armed again; the guest has not acknowledged the first overflow (its status bit is set).
    m.platform.set_lvtpc_masked(A, false);
    m.write(A, driver.write_counter(0, COUNTER_MASK - 2));
    count_silently(&mut m, 10);
    // Taken now, this interrupt is delivered (handle_overflow reports it); the scheduler
    // switches A out first instead.
    m.schedule(0, Some(B));
    assert!(
        m.vcpu(A).pending_pmi().is_some(),
        "{name}: the second overflow's interrupt is kept with A"
    );
}

/// Bug 3.
#[test]
fn an_overflow_before_the_previous_one_is_acknowledged_is_kept_at_switch_out() {
    second_overflow_lost(intel_v5());
    second_overflow_lost(intel_v2());
    second_overflow_lost(amd_v2());
}

fn withheld_pmi<V: SimVendor>(vendor: V, filtered_domain: u32) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 1, &[1, 1, 1], XENPMU_MODE_SELF);
    let driver = m.vendor.driver();
    m.platform.set_lvtpc_masked(A, false);
    m.schedule(0, Some(A));
    m.program(
        A,
        &[
            instructions(0, true, COUNTER_MASK - 2),
            instructions(1, false, 0),
        ],
    );
    // Bookkeeping only: a counter disabled while loaded.
    m.write(A, driver.disable(1));
    count_silently(&mut m, 10);
    // The integrator installs a filter (for A's domain, or an unrelated one) while the
    // interrupt is in flight; pCPU 0 applies it at once.
    m.platform.filters[filtered_domain as usize] = SimFilter::Deny(0xc0);
    m.platform.calling_pcpu = Some(0);
    let done = m
        .vpmu
        .event_filter_changed(&mut m.platform, &mut m.pcpus[0], &m.vcpus)
        .expect("no other change");
    m.platform.calling_pcpu = None;
    assert_eq!(done, Completion::Done, "{name}");
    // The interrupt arrives; A keeps running.
    m.run(0, 1);
    assert!(
        m.vcpu(A).pending_pmi().is_none() && m.platform.lvtpc_deliveries.contains(&A),
        "{name}, filter of domain {filtered_domain}: A runs on with its PMI kept pending \
         ({:?}) and nothing delivered",
        m.vcpu(A).pending_pmi()
    );
}

/// Bug 4.
#[test]
fn a_pmi_in_flight_at_a_policy_change_reaches_the_running_vcpu() {
    for domain in [1, 2] {
        withheld_pmi(intel_v5(), domain);
        withheld_pmi(intel_v2(), domain);
        withheld_pmi(amd_v2(), domain);
        withheld_pmi(amd_legacy(), domain);
    }
}
