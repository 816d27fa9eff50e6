//! MSR numbers and the hardware-access trait.
//!
//! Everything that touches PMU registers does it through [`MsrBus`], so the same backend code
//! drives real MSRs (ring 0, feature `hw-msr`), a software PMU model, or a VMM's emulation.

/// An MSR number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct Msr(pub u32);

impl core::fmt::LowerHex for Msr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// An MSR access faulted (#GP): the register does not exist or the value is not allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MsrFault {
    /// The MSR accessed.
    pub msr: Msr,
}

/// Read and write MSRs. Each access can fault.
pub trait MsrBus {
    /// RDMSR.
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault>;
    /// WRMSR.
    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault>;
}

impl<B: MsrBus + ?Sized> MsrBus for &mut B {
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        (**self).read(msr)
    }

    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        (**self).write(msr, value)
    }
}

/// Counts of the accesses a bus has served, for tests and benchmarks that measure traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsrAccessStats {
    /// RDMSRs served (including faulting ones).
    pub reads: u64,
    /// WRMSRs served (including faulting ones).
    pub writes: u64,
    /// Accesses that faulted.
    pub faults: u64,
}

impl MsrAccessStats {
    /// Reads plus writes.
    pub fn total(&self) -> u64 {
        self.reads + self.writes
    }

    /// Reads `msr` through `bus`, counted here (a fault is counted on the error path only).
    #[inline]
    pub(crate) fn read_through<B: MsrBus + ?Sized>(
        &mut self,
        bus: &mut B,
        msr: Msr,
    ) -> Result<u64, MsrFault> {
        self.reads += 1;
        let result = bus.read(msr);
        if result.is_err() {
            self.faults += 1;
        }
        result
    }

    /// Writes `value` to `msr` through `bus`, counted here.
    #[inline]
    pub(crate) fn write_through<B: MsrBus + ?Sized>(
        &mut self,
        bus: &mut B,
        msr: Msr,
        value: u64,
    ) -> Result<(), MsrFault> {
        self.writes += 1;
        let result = bus.write(msr, value);
        if result.is_err() {
            self.faults += 1;
        }
        result
    }
}

impl core::ops::Sub for MsrAccessStats {
    type Output = MsrAccessStats;

    fn sub(self, earlier: MsrAccessStats) -> MsrAccessStats {
        MsrAccessStats {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            faults: self.faults - earlier.faults,
        }
    }
}

/// Wraps a bus and counts its traffic.
#[derive(Debug)]
pub struct CountingBus<B> {
    inner: B,
    stats: MsrAccessStats,
}

impl<B: MsrBus> CountingBus<B> {
    /// Counts the accesses made through it to `inner`.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            stats: MsrAccessStats::default(),
        }
    }

    /// Accesses so far.
    pub fn stats(&self) -> MsrAccessStats {
        self.stats
    }

    /// The wrapped bus.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped bus, mutably (accesses made through it are not counted).
    pub fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Unwraps the bus.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

// Faults are counted on the error path only: every caller branches on the result anyway, and
// the core charges these counts on its context-switch path.
impl<B: MsrBus> MsrBus for CountingBus<B> {
    #[inline]
    fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
        self.stats.read_through(&mut self.inner, msr)
    }

    #[inline]
    fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
        self.stats.write_through(&mut self.inner, msr, value)
    }
}

/// The physical CPU's MSRs through RDMSR/WRMSR (the `x86` crate). Ring 0 only.
#[cfg(all(feature = "hw-msr", any(target_arch = "x86", target_arch = "x86_64")))]
#[allow(unsafe_code)]
pub mod hardware {
    use super::{Msr, MsrBus, MsrFault};

    /// RDMSR/WRMSR on the current CPU.
    ///
    /// A real RDMSR/WRMSR that faults raises #GP in the caller's own context, which a hypervisor
    /// without an exception-fixup table cannot turn into an error. This bus therefore never
    /// reports faults: the backends only touch MSRs their enumeration says exist, with values
    /// they validated, and anything else is a bug to be caught by the software model first.
    #[derive(Debug)]
    pub struct HardwareMsrBus {
        _ring0: (),
    }

    impl HardwareMsrBus {
        /// A bus over the current CPU's MSRs.
        ///
        /// # Safety
        ///
        /// The caller runs at CPL 0 with the PMU MSRs it will access present (as enumerated by
        /// CPUID), and owns the PMU of this CPU for as long as the bus is used.
        pub unsafe fn new() -> Self {
            Self { _ring0: () }
        }
    }

    impl MsrBus for HardwareMsrBus {
        fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
            // SAFETY: `new`'s contract: CPL 0, and only enumerated PMU MSRs are accessed.
            Ok(unsafe { x86::msr::rdmsr(msr.0) })
        }

        fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
            // SAFETY: `new`'s contract: CPL 0, and only enumerated PMU MSRs with values the
            // backend validated are written.
            unsafe { x86::msr::wrmsr(msr.0, value) };
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bus with one readable/writable register at 0x10; everything else faults.
    struct OneRegister(u64);

    impl MsrBus for OneRegister {
        fn read(&mut self, msr: Msr) -> Result<u64, MsrFault> {
            if msr == Msr(0x10) {
                Ok(self.0)
            } else {
                Err(MsrFault { msr })
            }
        }

        fn write(&mut self, msr: Msr, value: u64) -> Result<(), MsrFault> {
            if msr == Msr(0x10) {
                self.0 = value;
                Ok(())
            } else {
                Err(MsrFault { msr })
            }
        }
    }

    #[test]
    fn counting_bus_counts_reads_writes_and_faults() {
        let mut bus = CountingBus::new(OneRegister(0));
        bus.write(Msr(0x10), 7).unwrap();
        assert_eq!(bus.read(Msr(0x10)), Ok(7));
        assert_eq!(bus.read(Msr(0x11)), Err(MsrFault { msr: Msr(0x11) }));
        assert_eq!(
            bus.stats(),
            MsrAccessStats {
                reads: 2,
                writes: 1,
                faults: 1
            }
        );
        let before = bus.stats();
        let by_ref = &mut bus;
        by_ref.write(Msr(0x12), 1).unwrap_err();
        assert_eq!(
            bus.stats() - before,
            MsrAccessStats {
                reads: 0,
                writes: 1,
                faults: 1
            }
        );
        assert_eq!(bus.stats().total(), 4);
        assert_eq!(bus.into_inner().0, 7);
    }
}
