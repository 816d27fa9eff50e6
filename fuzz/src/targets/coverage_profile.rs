//! The raw-profile parser of `vpmu coverage` (`vpmu_coverage::profraw`, vmm/coverage): the
//! profile comes out of a guest's buffer, written by whatever hypervisor answered
//! `XENPMU_OP_COVERAGE`; whatever its bytes, parsing returns a profile or an error and never
//! panics, and a parsed profile's accessors stay consistent.

use vpmu_coverage::profraw::RawProfile;

/// Milestone: a profile with at least one function parsed.
pub const PARSED: &str = "coverage_profile: a profile with functions parsed";

/// The target.
pub fn run(data: &[u8]) {
    if let Ok(p) = RawProfile::parse(data) {
        let counters: u64 = p.functions().iter().map(|f| f.counters.len() as u64).sum();
        assert!(counters <= p.num_counters());
        assert!(p.covered_functions() <= p.num_functions());
        let _ = p.summary();
        if p.num_functions() > 0 {
            crate::reached(PARSED);
        }
    }
}
