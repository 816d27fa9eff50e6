//! The guest-write rules (`GuestRules`) of several enumerated shapes: forbidden bits, the
//! feature whitelists, the event filter, and the masks each register follows.

use vpmu::abi::{XENPMU_FEATURE_ARCH_ONLY, XENPMU_FEATURE_INTEL_BTS, XENPMU_FEATURE_IPC_ONLY};
use vpmu::{CounterSet, EventFilter, GuestPolicy, RawEvent};
use vpmu_intel::msrs::{
    EVTSEL_ANY_THREAD, EVTSEL_PIN_CONTROL, STATUS_COND_CHANGED, STATUS_OVF_BUFFER,
};
use vpmu_intel::{GuestRules, IntelCaps, Refused};
use vpmu_models::intel::SyntheticCpuid;

fn rules(shape: SyntheticCpuid) -> GuestRules {
    GuestRules::new(&IntelCaps::from_cpuid(shape, None).expect("valid shape"))
}

struct DenyBranchesAndFixed1;

impl EventFilter for DenyBranchesAndFixed1 {
    fn allows(&self, event: RawEvent) -> bool {
        event.select != 0xc4
    }

    fn allows_fixed(&self, index: u32) -> bool {
        index != 1
    }
}

fn with_features(features: u64) -> GuestPolicy<'static> {
    GuestPolicy {
        features,
        ..GuestPolicy::guest_default()
    }
}

#[test]
fn event_select_forbidden_bits() {
    let r = rules(SyntheticCpuid::v2(4, 3));
    let policy = GuestPolicy::guest_default();
    let base = 0x0043_00c0;
    assert_eq!(r.event_select(base, &policy), Ok(base));
    assert_eq!(
        r.event_select(base | EVTSEL_ANY_THREAD, &policy),
        Err(Refused::FORBIDDEN)
    );
    assert_eq!(
        r.event_select(base | EVTSEL_PIN_CONTROL, &policy),
        Err(Refused::FORBIDDEN)
    );
    for bit in 32..64 {
        assert_eq!(
            r.event_select(base | 1 << bit, &policy),
            Err(Refused::RESERVED)
        );
    }
}

#[test]
fn feature_whitelists_judge_enabled_selectors() {
    let r = rules(SyntheticCpuid::v2(4, 3));
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    let arch = with_features(XENPMU_FEATURE_ARCH_ONLY);
    let branches = 0x0043_00c4;
    assert_eq!(r.event_select(branches, &ipc), Err(Refused::EVENT));
    assert_eq!(r.event_select(branches, &arch), Ok(branches));
    assert_eq!(r.event_select(0x0043_00d1, &arch), Err(Refused::EVENT));
    assert_eq!(r.event_select(0x0043_013c, &ipc), Ok(0x0043_013c));
    // Disabled selectors cannot count and pass whatever their event.
    assert_eq!(r.event_select(0x0003_00d1, &ipc), Ok(0x0003_00d1));
    assert_eq!(r.event_select(0, &ipc), Ok(0));
}

#[test]
fn filter_clears_enable_but_keeps_guest_value() {
    let r = rules(SyntheticCpuid::v2(4, 3));
    let policy = GuestPolicy {
        features: 0,
        filter: &DenyBranchesAndFixed1,
        may_count_host: false,
    };
    assert_eq!(r.event_select(0x0053_00c4, &policy), Ok(0x0013_00c4));
    assert_eq!(r.event_select(0x0053_00c0, &policy), Ok(0x0053_00c0));
    assert_eq!(r.fixed_ctrl(0xbbb, &policy), Ok(0xb8b));
}

#[test]
fn fixed_ctrl_masks_follow_enumeration() {
    let policy = GuestPolicy::guest_default();
    let three = rules(SyntheticCpuid::v2(4, 3));
    assert_eq!(three.fixed_ctrl(0xbbb, &policy), Ok(0xbbb));
    assert_eq!(three.fixed_ctrl(0xb000, &policy), Err(Refused::RESERVED));
    assert_eq!(
        three.fixed_ctrl(0x4, &policy),
        Err(Refused::FORBIDDEN),
        "AnyThread"
    );
    let sparse = rules(SyntheticCpuid::v5(8, 0, 0b1001));
    assert_eq!(sparse.fixed_ctrl(0xb00b, &policy), Ok(0xb00b));
    assert_eq!(sparse.fixed_ctrl(0x00b0, &policy), Err(Refused::RESERVED));
    let ipc = with_features(XENPMU_FEATURE_IPC_ONLY);
    assert_eq!(sparse.fixed_ctrl(0x8000, &ipc), Ok(0x8000));
    assert_eq!(
        sparse.fixed_ctrl(0x3000, &ipc),
        Err(Refused::EVENT),
        "topdown slots"
    );
}

#[test]
fn global_registers_follow_enumeration() {
    let v2 = rules(SyntheticCpuid::v2(4, 3));
    assert_eq!(v2.global_ctrl(0x7_0000_000f), Ok(0x7_0000_000f));
    assert_eq!(v2.global_ctrl(1 << 4), Err(Refused::RESERVED));
    assert_eq!(v2.global_ctrl(1 << 35), Err(Refused::RESERVED));
    assert_eq!(
        v2.ovf_ctrl(STATUS_COND_CHANGED | 1),
        Ok(STATUS_COND_CHANGED | 1)
    );
    assert_eq!(
        v2.ovf_ctrl(1 << 61),
        Err(Refused::RESERVED),
        "uncore overflow is not the guest's"
    );
    assert_eq!(
        v2.status_set(1),
        Err(Refused::RESERVED),
        "no STATUS_SET before v4"
    );
    let v5 = rules(SyntheticCpuid::v5(8, 4, 0));
    assert_eq!(v5.status_set(0xff), Ok(0xff));
    assert_eq!(v5.status_set(STATUS_COND_CHANGED), Err(Refused::RESERVED));
}

#[test]
fn counter_values() {
    let r = rules(SyntheticCpuid::v2(4, 3));
    assert_eq!(r.legacy_counter(0xff01_2345_6789), 0x2345_6789);
    assert_eq!(r.legacy_counter(0x8000_0000), 0xffff_8000_0000);
    assert_eq!(r.full_width_counter(0xffff_ffff_ffff), Ok(0xffff_ffff_ffff));
    assert_eq!(r.full_width_counter(1 << 48), Err(Refused::WIDTH));
    assert_eq!(r.fixed_counter(1 << 48), Err(Refused::WIDTH));
}

#[test]
fn ds_area_and_pebs() {
    let shape = SyntheticCpuid {
        debug_store: true,
        ..SyntheticCpuid::v2(4, 3)
    };
    let r = rules(shape);
    let bts = with_features(XENPMU_FEATURE_INTEL_BTS);
    let none = GuestPolicy::guest_default();
    assert_eq!(r.ds_area(0, &none), Ok(0));
    assert_eq!(
        r.ds_area(0xffff_8000_0000_1000, &none),
        Err(Refused::FORBIDDEN)
    );
    assert_eq!(
        r.ds_area(0xffff_8000_0000_1000, &bts),
        Ok(0xffff_8000_0000_1000)
    );
    assert_eq!(
        r.ds_area(0x0000_8000_0000_1000, &bts),
        Err(Refused::FORBIDDEN),
        "non-canonical"
    );
    let bts_ipc = with_features(XENPMU_FEATURE_INTEL_BTS | XENPMU_FEATURE_IPC_ONLY);
    assert_eq!(r.ds_area(0x1000, &bts_ipc), Err(Refused::FORBIDDEN));
    let no_ds = rules(SyntheticCpuid::v2(4, 3));
    assert_eq!(no_ds.ds_area(0x1000, &bts), Err(Refused::FORBIDDEN));
    assert_eq!(r.pebs_enable(0), Ok(0));
    assert_eq!(r.pebs_enable(1), Err(Refused::FORBIDDEN));
}

#[test]
fn status_counters_drop_buffer_bits() {
    let r = rules(SyntheticCpuid::v2(4, 3));
    let set = r.status_counters(STATUS_OVF_BUFFER | STATUS_COND_CHANGED | 1 << 33 | 1);
    assert_eq!(set, CounterSet::gp(0).union(CounterSet::fixed(1)));
}
