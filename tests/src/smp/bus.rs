//! The MSR bus of one pCPU: a vendor's software PMU model that panics when any thread but the
//! one that made it drives it. A ring-0 bus reads the MSRs of whatever CPU it runs on, so a
//! core that reached another pCPU's bus would silently touch the wrong hardware; here that is a
//! panic naming both threads.

use std::thread::{self, ThreadId};

use vpmu::{Msr, MsrBus, MsrFault};

/// A pCPU's PMU hardware, bound to the thread that owns that pCPU.
#[derive(Debug)]
pub struct OwnedBus<M> {
    owner: ThreadId,
    pcpu: u32,
    model: M,
}

impl<M> OwnedBus<M> {
    /// pCPU `pcpu`'s hardware, owned by the calling thread from now on.
    pub fn new(pcpu: u32, model: M) -> Self {
        Self {
            owner: thread::current().id(),
            pcpu,
            model,
        }
    }

    fn check(&self, what: &str) {
        let caller = thread::current();
        assert!(
            caller.id() == self.owner,
            "pCPU {}'s PMU hardware ({what}) driven from thread {:?} ({:?}); it belongs to {:?}",
            self.pcpu,
            caller.name(),
            caller.id(),
            self.owner
        );
    }

    /// The model, for feeding it events and reading its raw registers.
    pub fn model(&self) -> &M {
        self.check("model read");
        &self.model
    }

    /// The model, mutably.
    pub fn model_mut(&mut self) -> &mut M {
        self.check("model write");
        &mut self.model
    }
}

impl<M: MsrBus> MsrBus for OwnedBus<M> {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.check("RDMSR");
        self.model.read(msr)
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.check("WRMSR");
        self.model.write(msr, value)
    }
}
