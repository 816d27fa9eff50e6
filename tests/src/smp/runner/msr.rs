//! Guest WRMSRs and RDMSRs of the PMU's MSRs: programming, disabling and reading counters,
//! acknowledging overflows, and illegal writes that must fault.

use vpmu::{Msr, MsrOutcome, VcpuId, VcpuState};

use vpmu_sim::truth::{CounterSetup, SimEvent};
use vpmu_sim::vendor::{COUNTER_MASK, FIXED0};
use vpmu_sim::{Driver, SimVendor};

use crate::smp::shared::lock;
use crate::smp::table::{CounterBook, Ledger};

use super::Runner;

/// AMD's HostOnly bit (legal for the privileged domain in hv and all mode only).
const AMD_HOST_ONLY: u64 = 1 << 41;
/// Bit 21 of an event select: AnyThread on Intel, reserved on AMD; a guest may never set it.
const ILLEGAL_CTRL_BIT: u64 = 1 << 21;

impl<V: SimVendor> Runner<'_, V> {
    /// A legal WRMSR by `x`: see `wrmsr_checked`.
    fn wrmsr(
        &mut self,
        x: VcpuId,
        (msr, value): (u32, u64),
        apply: impl FnOnce(&mut Ledger),
    ) -> MsrOutcome<()> {
        self.wrmsr_checked(x, (msr, value), true, apply)
    }

    /// A WRMSR by `x` (`legal`: of a value the guest may write, which an unprivileged vCPU
    /// whose vPMU is in use must then have handled unless in its cached window). `apply` runs
    /// on the guest's book if handled.
    fn wrmsr_checked(
        &mut self,
        x: VcpuId,
        (msr, value): (u32, u64),
        legal: bool,
        apply: impl FnOnce(&mut Ledger),
    ) -> MsrOutcome<()> {
        self.in_hypervisor(Some(x));
        let mut slot = self.table.lock(x);
        let may_refuse = !slot.pmu.in_use() || matches!(slot.pmu.state(), VcpuState::Cached { .. });
        let (vpmu, platform, pcpu) = (self.vpmu, &mut self.platform, &mut self.pcpu);
        let result = slot.observed(|pmu| vpmu.wrmsr(platform, pcpu, pmu, Msr(msr), value));
        let state = slot.pmu.state();
        if result == Ok(MsrOutcome::Handled(())) {
            if let Some(ledger) = slot.book.ledger.as_mut() {
                apply(ledger);
            }
        }
        drop(slot);
        let outcome = self.core_ok("wrmsr", result);
        self.note(format!("{x:?} WRMSR {msr:#x} <- {value:#x}: {outcome:?}"));
        let unprivileged = x.domain != 0;
        if legal && unprivileged && outcome == MsrOutcome::GeneralProtection && !may_refuse {
            self.find(
                "legal WRMSR of an in-use vPMU refused",
                format!("{x:?} WRMSR {msr:#x} <- {value:#x}: #GP in state {state:?}"),
            );
        }
        if outcome == MsrOutcome::NotPmu {
            self.find("PMU MSR not recognised", format!("{msr:#x}"));
        }
        outcome
    }

    /// A RDMSR by `x`: the outcome, whether its vPMU was in use, and the guest's book on
    /// counter `ctr` as it stood at the read (under the same lock: a sibling's finish may reset
    /// it right after).
    fn rdmsr(
        &mut self,
        x: VcpuId,
        msr: u32,
        ctr: u32,
    ) -> (MsrOutcome<u64>, bool, Option<(CounterBook, u64)>) {
        self.in_hypervisor(Some(x));
        let mut slot = self.table.lock(x);
        let in_use = slot.pmu.in_use();
        let (vpmu, platform, pcpu) = (self.vpmu, &mut self.platform, &mut self.pcpu);
        let result = slot.observed(|pmu| vpmu.rdmsr(platform, pcpu, pmu, Msr(msr)));
        let book = match (&result, slot.book.ledger.as_ref()) {
            (Ok(MsrOutcome::Handled(value)), Some(ledger)) => {
                Some((ledger.counters[&ctr], ledger.advance(ctr, *value)))
            }
            _ => None,
        };
        drop(slot);
        let outcome = self.core_ok("rdmsr", result);
        (outcome, in_use, book)
    }

    pub(super) fn program(&mut self, x: VcpuId) {
        let privileged = x.domain == 0;
        let avoid = self.shared.avoid_known_bugs;
        if avoid {
            // No overflow left unacknowledged when a counter is armed again.
            self.ack_status(x);
        }
        let counters = self.driver.counters();
        let c = self.rng.pick(&counters);
        let interrupt = privileged || self.rng.chance(2, 3);
        // Without its interrupt a counter must not overflow silently when known bugs are
        // avoided.
        let near = (interrupt || !avoid) && self.rng.chance(if privileged { 2 } else { 1 }, 3);
        let initial = if near {
            COUNTER_MASK - self.rng.below(300)
        } else {
            self.rng.below(1 << 20)
        };
        let os = privileged && self.rng.chance(1, 2);
        let setup = CounterSetup {
            ctr: c,
            event: SimEvent::Instructions,
            os,
            usr: true,
            period: interrupt.then_some(1),
            initial,
        };
        let mut control = self.driver.control(&setup);
        let host_only = privileged && c < FIXED0 && !self.driver.is_intel();
        if host_only && self.rng.chance(1, 3) {
            control.1 |= AMD_HOST_ONLY;
        }
        let stored = self.driver.stored(c, initial);
        let steps = [
            (self.driver.disable(c), 0u8),
            (self.driver.write_counter(c, initial), 1),
            (control, 2),
        ];
        for (write, what) in steps {
            let outcome = self.wrmsr(x, write, |ledger| {
                let book = ledger.counters.get_mut(&c).expect("a counter of the guest");
                match what {
                    0 => book.ctrl_on = false,
                    1 => {
                        book.base = stored;
                        book.lo = 0;
                        book.hi = 0;
                    }
                    _ => book.ctrl_on = true,
                }
            });
            if outcome != MsrOutcome::Handled(()) {
                return;
            }
        }
        let global = self
            .table
            .lock(x)
            .book
            .ledger
            .as_ref()
            .map_or(0, |l| l.global);
        if let Some(enable) = self.driver.global_enable(global | 1 << c) {
            self.wrmsr(x, enable, |ledger| ledger.global = enable.1);
        }
        // As a perf driver sets its LVTPC up when it starts counting.
        if self.rng.chance(3, 4) {
            lock(&self.shared.vlapics[self.shared.flat(x)]).masked = false;
        }
        self.shared.coverage.hit("counters programmed");
    }

    pub(super) fn disable(&mut self, x: VcpuId) {
        let c = self.rng.pick(&self.driver.counters());
        self.wrmsr(x, self.driver.disable(c), |ledger| {
            ledger.counters.get_mut(&c).expect("a counter").ctrl_on = false;
        });
    }

    pub(super) fn global_write(&mut self, x: VcpuId) {
        let all = self
            .driver
            .counters()
            .iter()
            .fold(0u64, |bits, &c| bits | 1 << c);
        let value = self.rng.next_u64() & all;
        if let Some(write) = self.driver.global_enable(value) {
            self.wrmsr(x, write, |ledger| ledger.global = value);
        }
    }

    pub(super) fn ack_status(&mut self, x: VcpuId) {
        let Some(status_msr) = self.driver.status_msr() else {
            return;
        };
        let (outcome, _, _) = self.rdmsr(x, status_msr, 0);
        if let MsrOutcome::Handled(status) = outcome {
            if let Some(ack) = self.driver.ack(status) {
                if status != 0 {
                    self.wrmsr(x, ack, |_| {});
                }
            }
        }
    }

    pub(super) fn read(&mut self, x: VcpuId) {
        let c = self.rng.pick(&self.driver.counters());
        let (outcome, in_use, book) = self.rdmsr(x, self.driver.read_counter(c), c);
        self.note(format!("{x:?} reads counter {c}: {outcome:?}"));
        match outcome {
            MsrOutcome::Handled(value) => {
                let Some((book, advance)) = book else {
                    return;
                };
                let state = self.table.lock(x).pmu.state();
                self.shared.coverage.hit("counter reads checked");
                if book.lo == book.hi {
                    self.shared.coverage.hit("counter reads checked exactly");
                }
                if advance < book.lo || advance > book.hi {
                    let view = self.shared.filters[x.domain as usize].view();
                    self.find(
                        "counter read outside what the guest's own instructions allow",
                        format!(
                            "{x:?} counter {c} reads {value:#x}: advanced {advance} from {:#x}, expected {}..={} \
                             (state {state:?}, filter {view:?})",
                            book.base, book.lo, book.hi
                        ),
                    );
                }
            }
            MsrOutcome::GeneralProtection if in_use && x.domain != 0 => {
                self.find(
                    "RDMSR of an in-use vPMU refused",
                    format!("{x:?} counter {c}"),
                );
            }
            MsrOutcome::NotPmu => self.find("PMU MSR not recognised", format!("counter {c}")),
            MsrOutcome::GeneralProtection => {}
        }
    }

    pub(super) fn illegal_write(&mut self, x: VcpuId) {
        let gp: Vec<u32> = self
            .driver
            .counters()
            .into_iter()
            .filter(|&c| c < FIXED0)
            .collect();
        let c = self.rng.pick(&gp);
        // Intel's full-width alias refuses bits above the width; AMD counters keep the low
        // 48 bits of any value (as the hardware does), so no counter value is illegal there.
        let full_width = matches!(
            self.driver,
            Driver::Intel {
                full_width: true,
                ..
            }
        );
        let write = match self.rng.below(3) {
            0 => {
                let setup = CounterSetup {
                    ctr: c,
                    event: SimEvent::Instructions,
                    os: false,
                    usr: true,
                    period: None,
                    initial: 0,
                };
                let (msr, value) = self.driver.control(&setup);
                (msr, value | ILLEGAL_CTRL_BIT)
            }
            1 if full_width => (self.driver.write_counter(c, 0).0, COUNTER_MASK + 1),
            _ => match self.driver.status_msr() {
                Some(msr) => (msr, 1),
                None => (self.driver.control_msr(c), ILLEGAL_CTRL_BIT),
            },
        };
        let outcome = self.wrmsr_checked(x, write, false, |_| {});
        if outcome != MsrOutcome::GeneralProtection {
            self.find(
                "illegal WRMSR accepted",
                format!("{x:?} WRMSR {:#x} <- {:#x}: {outcome:?}", write.0, write.1),
            );
        }
        self.shared.coverage.hit("illegal WRMSRs refused");
    }
}
