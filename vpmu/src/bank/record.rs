//! What a pCPU's hardware holds between contexts, as the bank loops keep it.

use crate::backend::CounterSet;

/// What a pCPU's PMU hardware is known to hold while no context is loaded on it, so that a
/// load writes only what must change. Owned by the core's per-pCPU state and handed to the
/// backend's `save` and `load`; nothing else reads it.
///
/// Per [`CounterSet`] bit: a counter value and a control value, each known or not. A bank
/// with a [`Controls::Shared`](super::Controls::Shared) control keeps it at the position of the bank's counter 0
/// (`first_bit`). And the global control (Intel GLOBAL_CTRL, AMD PerfCntrGlobalCtl), known or
/// not. Comparing values rather than owners makes a vCPU that returns to its pCPU with
/// nothing in between cost only what changed, and a context of another vCPU that happens to
/// hold the same values cost nothing for them.
///
/// Between a load and the next save the record is not maintained (the loaded context's
/// hardware images are the authority then, and guest writes go through to the hardware);
/// `save` brings it up to date from the context. Any hardware write that neither `save` nor
/// `load` makes while nothing is loaded must be followed by [`HwRecord::forget`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwRecord {
    pub(super) values: [u64; 64],
    pub(super) values_known: u64,
    pub(super) controls: [u64; 64],
    pub(super) controls_known: u64,
    /// Controls known to be 0: a subset of the known controls that hold 0, used as a quick
    /// filter (a save records a context's zero images without marking them here; a load that
    /// finds a control outside this mask checks the recorded value before writing 0).
    pub(super) controls_zero: u64,
    pub(super) global: Option<u64>,
}

impl Default for HwRecord {
    fn default() -> Self {
        Self::unknown()
    }
}

impl HwRecord {
    /// Nothing known: the next load writes everything it needs.
    pub const fn unknown() -> Self {
        HwRecord {
            values: [0; 64],
            values_known: 0,
            controls: [0; 64],
            controls_known: 0,
            controls_zero: 0,
            global: None,
        }
    }

    /// Forgets everything (someone wrote the PMU behind the record's back).
    pub fn forget(&mut self) {
        self.values_known = 0;
        self.controls_known = 0;
        self.controls_zero = 0;
        self.global = None;
    }

    /// After a clean-up that wrote every control 0 (`PmuBackend::init_hardware`): every
    /// control known 0, values and the global control unknown.
    pub fn controls_cleared(&mut self) {
        self.forget();
        self.controls = [0; 64];
        self.controls_known = u64::MAX;
        self.controls_zero = u64::MAX;
    }

    /// The global control, if known.
    pub fn global(&self) -> Option<u64> {
        self.global
    }

    /// Records the global control (`None`: unknown).
    pub fn set_global(&mut self, value: Option<u64>) {
        self.global = value;
    }

    /// Whether counter `bit` is known to hold `value`.
    pub fn knows_value(&self, bit: u32, value: u64) -> bool {
        self.values_known >> (bit & 63) & 1 != 0 && self.values[(bit & 63) as usize] == value
    }

    /// Whether control `bit` is known to hold `value`.
    pub fn knows_control(&self, bit: u32, value: u64) -> bool {
        self.controls_known >> (bit & 63) & 1 != 0 && self.controls[(bit & 63) as usize] == value
    }

    /// Controls known to be 0, as a set of positions: every position in it is, but a known
    /// control recorded as 0 may be missing from it ([`HwRecord::knows_control`] tells
    /// exactly).
    pub fn zero_controls(&self) -> CounterSet {
        CounterSet(self.controls_zero)
    }

    /// Records counter `bit` (`None`: unknown).
    pub fn set_value(&mut self, bit: u32, value: Option<u64>) {
        let mask = 1u64 << (bit & 63);
        match value {
            Some(value) => {
                self.values[(bit & 63) as usize] = value;
                self.values_known |= mask;
            }
            None => self.values_known &= !mask,
        }
    }

    /// Records control `bit` (`None`: unknown).
    pub fn set_control(&mut self, bit: u32, value: Option<u64>) {
        let mask = 1u64 << (bit & 63);
        match value {
            Some(value) => {
                self.controls[(bit & 63) as usize] = value;
                self.controls_known |= mask;
                if value == 0 {
                    self.controls_zero |= mask;
                } else {
                    self.controls_zero &= !mask;
                }
            }
            None => {
                self.controls_known &= !mask;
                self.controls_zero &= !mask;
            }
        }
    }
}
