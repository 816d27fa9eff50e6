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
//! 5. Not a core bug: the full workload (no avoidance) found, in about 1 run in 6, an
//!    overflow of a privileged vCPU's own counter that was "lost": neither routed nor kept
//!    pending ("PMI lost" at a PMI answered `Spurious`, or "PMI lost at switch-out"). Every
//!    occurrence had the pCPU catch up, inside that `handle_pmi` or `context_switch`, with a
//!    change into a mode without vCPU contexts (off, or all entered) committed by the other
//!    privileged vCPU between the overflow and its interrupt. The catch-up saves the loaded
//!    context with the overflow and, the vCPU running on, discards it as documented
//!    (`catch_up` then `deliver_pending`), within one visit of the vCPU, where the runner's
//!    book (`Slot::observed`, which compares the vCPU before and after each visit) could not
//!    see the discard. The runner now accounts for it from the mode the pCPU caught up with
//!    (`take_pmi`); `an_overflow_in_flight_across_a_change_to_a_mode_without_contexts_is_discarded`
//!    pins the core's side.
//! 6. Fixed (found once the noise of 5 was gone): a pCPU that took a PMI of its system-wide
//!    context under all mode, while the profiler ended all mode on another pCPU, published the
//!    sample after that pCPU had loaded the profiler's own context: the profiler became
//!    "cached" with its context orphaned on the hardware ("hardware not clean with nothing
//!    loaded"). Such a sample is now dropped (`publish_system`); regression
//!    `a_system_wide_sample_of_an_ended_all_mode_does_not_reach_the_profiler` in
//!    `sim_smp_regressions.rs`.
//!
//! With 5 and 6 resolved, release `STRESS_ITERS=100000` runs of the full workload pass for
//! seeds 100..=160 on all four shapes, and the full-workload tests run by default (all four
//! take a few seconds in a debug build).

use std::sync::mpsc;
use std::thread;

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    XENPMU_MODE_ALL, XENPMU_MODE_HV, XENPMU_MODE_OFF, XENPMU_MODE_SELF, XENPMU_OP_MODE_SET,
};
use vpmu::{Completion, Mode, Msr, MsrBus, PmiOutcome, VcpuId, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::machine::Ctx;
use vpmu_sim::truth::{CounterSetup, SimEvent};
use vpmu_sim::vendor::COUNTER_MASK;
use vpmu_sim::{Machine, SimFilter, SimVendor, amd_legacy, amd_v2, intel_v2, intel_v5};
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
    // The threads go on past their steps while any of these is still 0 (`smp::MUST_REACH`).
    for what in smp::MUST_REACH {
        assert!(
            reached(what) > 0,
            "{}: nothing of {what:?} in {} times the steps",
            vendor.name(),
            smp::EXTRA_STEPS_FACTOR
        );
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
fn stress_intel_v5_full_workload() {
    stress(intel_v5(), false);
}

#[test]
fn stress_intel_v2_full_workload() {
    stress(intel_v2(), false);
}

#[test]
fn stress_amd_perfmon_v2_full_workload() {
    stress(amd_v2(), false);
}

#[test]
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

fn discarded_with_the_mode<V: SimVendor>(vendor: V, target: u64) {
    let name = vendor.name();
    let mut m = Machine::new(vendor, 2, &[2, 1], XENPMU_MODE_HV);
    m.platform.set_lvtpc_masked(P0, false);
    m.schedule(0, Some(P0));
    m.schedule(1, Some(P1));
    m.program(P0, &[instructions(0, true, COUNTER_MASK - 2)]);
    count_silently(&mut m, 10);
    assert!(
        m.pcpus[0].hw().pmi_pending(),
        "{name}: the overflow raised a PMI"
    );
    // P1 changes the mode on pCPU 1 while the interrupt is in flight on pCPU 0, which has not
    // taken its CatchUp yet.
    m.hold_requests = true;
    assert_eq!(
        m.op_once(P1, XENPMU_OP_MODE_SET, &Params::new(target, 0)),
        Err(OpError::Again),
        "{name}: pCPU 0 lags"
    );
    assert_eq!(
        (m.pcpus[0].mode_seen(), m.vcpu(P0).state()),
        (Mode::Hypervisor, VcpuState::Loaded { pcpu: 0 }),
        "{name}: the overflow is still on pCPU 0's hardware, under the old mode"
    );
    // The interrupt arrives: the handler first catches pCPU 0 up, which saves P0's context
    // with the overflow and, P0 running on, drops it with the mode's contexts.
    assert!(m.pcpus[0].hw_mut().take_pmi());
    m.platform.calling_pcpu = Some(0);
    let outcome = m
        .vpmu
        .handle_pmi(&mut m.platform, &mut m.pcpus[0], &m.vcpus)
        .expect("the backend never makes the model fault");
    m.platform.calling_pcpu = None;
    assert_eq!(outcome, PmiOutcome::Spurious, "{name}, mode {target:#x}");
    let p0 = m.vcpu(P0);
    assert_eq!(
        (p0.pending_pmi(), p0.stats().pmis_generated),
        (None, 0),
        "{name}, mode {target:#x}: discarded, neither kept nor generated"
    );
    assert!(m.platform.lvtpc_deliveries.is_empty(), "{name}");
    assert!(
        V::nothing_can_count(m.pcpus[0].hw()),
        "{name}, mode {target:#x}: P0's counters are off the hardware"
    );
}

/// Finding 5 (not a core bug): a change into a mode without vCPU contexts (off, all) caught
/// up between an overflow of a running privileged vCPU's own counter and its interrupt
/// discards the overflow, as documented, inside the one visit of the vCPU that saves it; the
/// stress runner's book, which only sees the vCPU before and after each visit, must account
/// for it where the PMI is taken.
#[test]
fn an_overflow_in_flight_across_a_change_to_a_mode_without_contexts_is_discarded() {
    for target in [XENPMU_MODE_OFF, XENPMU_MODE_ALL] {
        discarded_with_the_mode(intel_v5(), target);
        discarded_with_the_mode(intel_v2(), target);
        discarded_with_the_mode(amd_v2(), target);
        discarded_with_the_mode(amd_legacy(), target);
    }
}
