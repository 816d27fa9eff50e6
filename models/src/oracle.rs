//! Definitions that fast paths are checked and benchmarked against.

use crate::{ExecMode, HwEvent, SoftwarePmu};

/// After how many core/reference cycles in `mode` `model` raises its PMI line (None: never
/// within 2^48 cycles), found by bisection on copies of the model: the definition of
/// `SoftwarePmu::cycles_until_pmi`, and the method the VMM's timed source used before the
/// models answered arithmetically (49 clone-and-count steps per KVM exit).
pub fn bisect_cycles_until_pmi<M: SoftwarePmu + Clone>(model: &M, mode: ExecMode) -> Option<u64> {
    let raises = |cycles: u64| raises_pmi_after(model, cycles, mode);
    let (mut lo, mut hi) = (0u64, 1u64 << 48);
    if !raises(hi) {
        return None;
    }
    // Invariant: raises(hi) and !raises(lo) (0 cycles raise nothing new); raising is monotonic
    // in the count (a counter wraps once the count exceeds its room).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if raises(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Whether `cycles` core and reference cycles in `mode` raise the PMI line anew on a copy of
/// `model` (its line taken first): `count(CoreCycles, cycles, mode); count(RefCycles, cycles,
/// mode)`.
pub fn raises_pmi_after<M: SoftwarePmu + Clone>(model: &M, cycles: u64, mode: ExecMode) -> bool {
    let mut m = model.clone();
    m.take_pmi();
    m.count(HwEvent::CoreCycles, cycles, mode);
    m.count(HwEvent::RefCycles, cycles, mode);
    m.pmi_pending()
}
