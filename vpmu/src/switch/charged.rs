//! The pCPU's bus as a switch uses it: every access charged to the vCPU it is made for.

use crate::msr::{Msr, MsrAccessStats, MsrBus, MsrFault};

/// `hw`, with each access counted straight into a vCPU's statistics as it is made: a
/// [`CountingBus`](crate::msr::CountingBus) would have to be zeroed before the save or load
/// and its tally added to the vCPU's afterwards, which a switch pays twice.
pub(super) struct ChargedBus<'a, H> {
    pub(super) hw: &'a mut H,
    pub(super) stats: &'a mut MsrAccessStats,
}

impl<H: MsrBus> MsrBus for ChargedBus<'_, H> {
    #[inline]
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.stats.read_through(self.hw, msr)
    }

    #[inline]
    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.stats.write_through(self.hw, msr, value)
    }
}
