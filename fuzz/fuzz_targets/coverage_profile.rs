//! The raw-profile parser of `vpmu coverage` (`vpmu_coverage::profraw`, vmm/coverage): the profile comes
//! out of a guest's buffer, written by whatever hypervisor answered `XENPMU_OP_COVERAGE`;
//! whatever its bytes, parsing returns a profile or an error and never panics, and a parsed
//! profile's accessors stay consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;

use vpmu_coverage as coverage;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = coverage::profraw::RawProfile::parse(data) {
        let counters: u64 = p.functions().iter().map(|f| f.counters.len() as u64).sum();
        assert!(counters <= p.num_counters());
        assert!(p.covered_functions() <= p.num_functions());
        let _ = p.summary();
    }
});
