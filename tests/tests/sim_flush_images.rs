//! A flush of a page the owner left unedited gives each control the hardware image of the
//! policy in force at the flush. When nothing changed since the sample, the core lets the
//! backend take the images the published context holds instead of judging the controls again
//! (`PublishedImages::Current`, docs/core.md "Unedited controls at a flush"); when the policy
//! changed while the sample was cached, they must be judged again. Both are driven here, for
//! a vCPU's own sample (self mode) and a system-wide one (all mode), on every vendor shape:
//! a domain's event filter denies the sampled event while the sample is cached, and the
//! flushed counter must not count it; with no change it keeps counting.
//!
//! Debug builds also check every flush that takes the published images against judging them
//! again (`Diagnostic::PublishedImagesDiffer`, which the simulator's platform refuses).

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_ALL, XENPMU_MODE_SELF, XENPMU_OP_FLUSH};
use vpmu::{Msr, MsrBus, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::world::Pending;
use vpmu_sim::{
    CounterSpec, PlanSpec, Run, Scenario, SimEvent, SimFilter, SimVendor, Step, Timing, World,
    amd_legacy, amd_v2, intel_v2, intel_v5,
};

/// The event select of `SimEvent::Instructions` on both vendors.
const INSTRUCTIONS_SELECT: u16 = 0xc0;

/// The subject (dom1 vCPU 0 in self mode, the profiler dom0 vCPU 0 in all mode) samples
/// instructions every 5 on counter 0; dom1 vCPU 0 runs, its handler deferred.
fn scenario(mode: u64) -> Scenario {
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
    let (profiler, guest) = if mode == XENPMU_MODE_ALL {
        (plan, PlanSpec::default())
    } else {
        (PlanSpec::default(), plan)
    };
    let runs = vec![Run {
        function: 1,
        len: 7,
        branch_every: 2,
    }];
    Scenario {
        pcpus: 1,
        domains: vec![1, 1],
        mode,
        timing: Timing::Deferred,
        workloads: vec![runs.clone(), runs],
        plans: vec![profiler, guest],
        steps: Vec::new(),
        filters: Vec::new(),
    }
}

/// Takes a sample into the subject's page, optionally has the subject's domain deny
/// instructions while it is cached, flushes the page unedited, and returns how many of 3
/// instructions counter 0 then counts on the hardware.
fn counted_after_flush<V: SimVendor>(vendor: V, mode: u64, deny_while_cached: bool) -> u64 {
    let name = vendor.name();
    let mut world = World::new(vendor, &scenario(mode));
    world.step(Step::Run {
        pcpu: 0,
        vcpu: 1,
        count: 12,
    });
    let subject = if mode == XENPMU_MODE_ALL { 0 } else { 1 };
    let id = world.guests[subject].id;
    assert_eq!(
        world.guests[subject].pending.front(),
        Some(&Pending::Virq),
        "{name}: a sample is published"
    );
    assert!(
        matches!(world.m.vcpu(id).state(), VcpuState::Cached { .. }),
        "{name}: the sample is cached"
    );
    if deny_while_cached {
        world.m.platform.filters[id.domain as usize] = SimFilter::Deny(INSTRUCTIONS_SELECT);
        world.m.platform.calling_pcpu = Some(0);
        world
            .m
            .vpmu
            .event_filter_changed(&mut world.m.platform, &mut world.m.pcpus[0], &world.m.vcpus)
            .expect("no other change in progress");
        world.m.platform.calling_pcpu = None;
    }
    let flushed = world.m.op(id, XENPMU_OP_FLUSH, &Params::new(0, 0));
    assert!(
        flushed.is_ok(),
        "{name}: the unedited page flushes: {flushed:?}"
    );
    let counter = Msr(world.driver.read_counter(0));
    let hw = world.m.pcpus[0].hw_mut();
    let before = hw.read(counter).expect("counter 0");
    hw.count(
        HwEvent::Instructions,
        3,
        ExecMode {
            cpl: 3,
            host: false,
        },
    );
    let after = hw.read(counter).expect("counter 0");
    after.wrapping_sub(before)
}

fn unedited_controls_follow_the_policy<V: SimVendor + Copy>(vendor: V) {
    let name = vendor.name();
    for mode in [XENPMU_MODE_SELF, XENPMU_MODE_ALL] {
        assert_eq!(
            counted_after_flush(vendor, mode, false),
            3,
            "{name} mode {mode}: nothing changed, the flushed counter counts"
        );
        assert_eq!(
            counted_after_flush(vendor, mode, true),
            0,
            "{name} mode {mode}: the filter denied the event while the sample was cached"
        );
    }
}

#[test]
fn an_unedited_flush_gives_its_controls_the_images_of_the_policy_in_force() {
    unedited_controls_follow_the_policy(intel_v5());
    unedited_controls_follow_the_policy(intel_v2());
    unedited_controls_follow_the_policy(amd_v2());
    unedited_controls_follow_the_policy(amd_legacy());
}
