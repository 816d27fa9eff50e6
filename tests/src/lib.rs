//! Shared helpers for the integration tests: building the C test programs against the
//! generated header, the deterministic pages the cross-language tests exchange, and the
//! concurrent stress run on real threads ([`smp`]) over the machine simulator's vendor shapes
//! (`vpmu-sim`).
#![deny(missing_docs)]

pub mod blessed;
pub mod c_build;
pub mod pattern_page;
pub mod smp;

/// The case count of a property suite: `PROPTEST_CASES` when set (as proptest's own default
/// configuration reads it, so one variable scales every suite of the workspace), else the
/// suite's own `default`, chosen to keep the debug-build test run within CI's time.
///
/// # Panics
/// If `PROPTEST_CASES` is set but not a positive integer: a silent fallback would run a
/// different number of cases than asked for.
pub fn proptest_cases(default: u32) -> u32 {
    match std::env::var("PROPTEST_CASES") {
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(cases) if cases > 0 => cases,
            _ => panic!("PROPTEST_CASES={text:?}: expected a positive integer"),
        },
        Err(_) => default,
    }
}

/// Runs `$check(vendor)` on each of the simulator's four test shapes (Intel v5, Intel v2, AMD
/// PerfMonV2, AMD K7), the set every cross-shape integration test covers.
#[macro_export]
macro_rules! for_each_vendor {
    ($check:ident) => {
        $check(vpmu_sim::intel_v5());
        $check(vpmu_sim::intel_v2());
        $check(vpmu_sim::amd_v2());
        $check(vpmu_sim::amd_legacy());
    };
}

/// `pcpu`'s hardware counter `ctr` as the model holds it now, read on the model directly (not
/// through an intercept, which would make the pCPU take its requests first).
pub fn hw_counter<V: vpmu_sim::SimVendor>(
    m: &mut vpmu_sim::Machine<V>,
    pcpu: u32,
    ctr: u32,
) -> u64 {
    use vpmu::MsrBus;
    let msr = m.vendor.driver().read_counter(ctr);
    m.pcpus[pcpu as usize]
        .hw_mut()
        .read(vpmu::Msr(msr))
        .expect("a counter of the model")
}
