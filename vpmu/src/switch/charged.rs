//! The pCPU's bus as a switch uses it: every access charged to the vCPU it is made for.

use crate::msr::{Msr, MsrAccessStats, MsrBus, MsrFault};

/// `hw`, with each access counted straight into a vCPU's statistics as it is made: a
/// [`CountingBus`](crate::msr::CountingBus) would have to be zeroed before the save or load
/// and its tally added to the vCPU's afterwards, which a switch pays twice.
pub(super) struct ChargedBus<'a, H> {
    pub(super) hw: &'a mut H,
    pub(super) stats: &'a mut MsrAccessStats,
}

// Faults are counted on the error path only, as by `CountingBus`.
impl<H: MsrBus> MsrBus for ChargedBus<'_, H> {
    #[inline]
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.stats.reads += 1;
        let result = self.hw.read(msr);
        if result.is_err() {
            self.stats.faults += 1;
        }
        result
    }

    #[inline]
    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.stats.writes += 1;
        let result = self.hw.write(msr, value);
        if result.is_err() {
            self.stats.faults += 1;
        }
        result
    }
}
