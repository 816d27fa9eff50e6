//! The host switching the xenpmu interface off in the middle of a run
//! (`Machine::switch_interface_off_after`, `vpmu boot --xenpmu-off-after SECONDS`).
//!
//! The semantics are Xen's: the administrator sets the vPMU mode to off (Xen: `xenpmu_op
//! (XENPMU_mode_set, XENPMU_MODE_OFF)`, what writing `off` to dom0's
//! `/sys/hypervisor/pmu/pmu_mode` does), and the interface's consumer — a driver that
//! registered pages and rings — is not told. So the VMM performs exactly that operation through
//! the core (`Vpmu::control_op`, `XENPMU_OP_MODE_SET`), on behalf of the privileged domain, on
//! the thread of its vCPU 0, through the core's own change protocol: the new policy is
//! committed as a new epoch, every pCPU catches up before it next runs a guest (`-EAGAIN` is
//! retried here, as a hypervisor restarts the hypercall), and what is programmed is re-judged
//! under mode off. What the guest then sees (docs/abi.md "Control operations", "Modes"):
//!
//! - no vPMU: every PMU MSR access faults (#GP), so no counter runs and no PMI is raised; the
//!   LVTPC deliveries still queued are dropped, as after a guest's own MODE_SET;
//! - its registered page and ring stay registered and readable: nothing published is taken
//!   back, the ring's producer simply stops (its counters are final, the samples it counted
//!   lost but had not yet reported in a LOST record never will be);
//! - the operations keep working: MODE_GET answers `XENPMU_MODE_OFF` (how a driver finds out),
//!   FINISH and RING_FINISH unregister as before, INIT is refused (`-ENOENT`, no vPMU).
//!
//! The core refuses the change (`-EBUSY`) while an unprivileged domain has a vPMU in use, as it
//! refuses the guest's own MODE_SET; the report says so and the run goes on unchanged.
//!
//! The time counts from domain 0's first PMI — when sampling began — not from the start of
//! the run, so that a test can aim into the sampled interval however long the kernel takes
//! to boot.

use std::time::{Duration, Instant};

use vpmu::abi::ops::{OpError, Params, Version, XENPMU_MODE_OFF, XENPMU_OP_MODE_SET};
use vpmu::abi::{XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR};
use vpmu::{Mode, VcpuId};

use crate::error::Result;
use crate::personality::Personality;
use crate::runner::Runner;
use crate::{PRIVILEGED_DOMAIN, RunResult};

/// How long the change may wait for other pCPUs (`-EAGAIN`) before the VMM gives up and
/// reports it: a pCPU catches up at its next guest entry, milliseconds away.
const CHANGE_PATIENCE: Duration = Duration::from_secs(2);
/// The pause between retries of a change that waits for other pCPUs.
const AGAIN_BACKOFF: Duration = Duration::from_micros(20);

/// The vCPU whose thread performs the change: the privileged domain's first.
pub(crate) const ADMINISTRATOR: VcpuId = VcpuId {
    domain: PRIVILEGED_DOMAIN,
    vcpu: 0,
};

/// A planned switch-off, held by the runner of [`ADMINISTRATOR`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    /// How long after domain 0's first PMI.
    pub(crate) after: Duration,
    /// When the first PMI was seen (the first exit after it), once it was.
    pub(crate) first_pmi: Option<Instant>,
    /// Done (or refused): from then on the PMIs after it are counted into the report; the
    /// pCPU's PMI record up to here was looked at.
    pub(crate) done: bool,
    pub(crate) pmis_seen: usize,
}

impl Plan {
    /// A switch-off `after` domain 0's first PMI.
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            first_pmi: None,
            done: false,
            pmis_seen: 0,
        }
    }
}

/// What the host's switch-off did (`RunResult::interface_off`, on the result of domain 0's
/// vCPU 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceOff {
    /// When it happened, from domain 0's first PMI.
    pub after_first_pmi: Duration,
    /// The mode before.
    pub mode_before: Mode,
    /// `None`: the mode is off now; `Some(errno)`: the core refused the change (`-EBUSY`
    /// while an unprivileged domain had a vPMU in use, or `-EAGAIN` if other pCPUs did not
    /// catch up within the VMM's patience), as `-errno`.
    pub refused: Option<i32>,
    /// The PMIs of this vCPU's pCPU the core delivered (to a page, a ring or an LVTPC) before
    /// the change, by the VMM's own record of them.
    pub delivered_before: usize,
    /// The PMIs it raised after the change, up to the vCPU's last entry, and of them those
    /// the core delivered (none, once the mode is off).
    pub raised_after: usize,
    /// See `raised_after`.
    pub delivered_after: usize,
    /// LVTPC deliveries still queued at the change, dropped.
    pub dropped_deliveries: usize,
}

impl InterfaceOff {
    /// One line for the VMM's report: what was done and what the guest got before and after.
    pub fn describe(&self) -> String {
        let at = self.after_first_pmi.as_secs_f64();
        let was = mode_name(self.mode_before);
        match self.refused {
            None => format!(
                "the host switched the xenpmu interface off {at:.3} s after the guest's first \
                 PMI (mode {was} -> off, as an administrator's XENPMU_OP_MODE_SET): PMIs \
                 delivered before {}, after {} (of {} raised after); {} queued LVTPC \
                 deliveries dropped",
                self.delivered_before,
                self.delivered_after,
                self.raised_after,
                self.dropped_deliveries
            ),
            Some(errno) => format!(
                "switching the xenpmu interface off {at:.3} s after the guest's first PMI was \
                 refused: {errno} ({}); the mode stays {was}",
                if errno == OpError::Busy.return_value() as i32 {
                    "EBUSY: an unprivileged domain has a vPMU in use"
                } else {
                    "the change did not complete"
                }
            ),
        }
    }
}

/// The mode's name as docs/abi.md writes it.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Off => "off",
        Mode::SelfProfiling => "self",
        Mode::Hypervisor => "hv",
        Mode::All => "all",
    }
}

impl<P: Personality> crate::Machine<P> {
    /// The host switches the xenpmu interface off `after` domain 0's first PMI (module docs);
    /// domain 0's vCPU 0's result reports it (`RunResult::interface_off`).
    pub fn switch_interface_off_after(&mut self, after: Duration) {
        self.interface_off_after = Some(after);
    }
}

impl<P: Personality> Runner<'_, P> {
    /// At every exit of [`ADMINISTRATOR`]'s run loop: switches the interface off once it is
    /// time (module docs), and otherwise says when that will be (the loop's kick deadline,
    /// so that the vCPU leaves `KVM_RUN` then); once done, counts the PMIs that came after.
    /// `None`: nothing planned, or done.
    pub(crate) fn switch_interface_off_when_due(
        &mut self,
        result: &mut RunResult,
    ) -> Result<Option<Instant>> {
        let Some(mut plan) = self.interface_off else {
            return Ok(None);
        };
        let log = self.cpu.as_ref().map_or(&[][..], |c| &c.pmi_log[..]);
        let pmis = log.len();
        if plan.done {
            if let Some(report) = result
                .interface_off
                .as_mut()
                .filter(|_| pmis > plan.pmis_seen)
            {
                let new = &log[plan.pmis_seen..];
                report.raised_after += new.len();
                report.delivered_after += new.iter().filter(|r| r.delivered_to.is_some()).count();
                plan.pmis_seen = pmis;
                self.interface_off = Some(plan);
            }
            return Ok(None);
        }
        let now = Instant::now();
        let first_pmi = match plan.first_pmi {
            Some(at) => at,
            None if pmis > 0 => {
                plan.first_pmi = Some(now);
                self.interface_off = Some(plan);
                now
            }
            None => return Ok(None),
        };
        let due = first_pmi + plan.after;
        if now < due {
            return Ok(Some(due));
        }
        let mode_before = self.shared.vpmu.mode();
        let params = Params {
            version: Version {
                major: u32::from(XENPMU_VERSION_MAJOR),
                minor: u32::from(XENPMU_VERSION_MINOR),
            },
            val: XENPMU_MODE_OFF,
            ..Params::default()
        };
        let outcome = loop {
            self.complete_requests()?;
            let mut p = self.parts();
            let outcome = p.shared.vpmu.control_op(
                &mut p.platform,
                p.pmu,
                &p.shared.vcpus,
                ADMINISTRATOR,
                XENPMU_OP_MODE_SET,
                &params,
            );
            if outcome != Err(OpError::Again) || Instant::now() >= now + CHANGE_PATIENCE {
                break outcome;
            }
            std::thread::sleep(AGAIN_BACKOFF);
        };
        let changed = outcome.is_ok() && self.shared.vpmu.mode() != mode_before;
        let dropped_deliveries = if changed {
            self.shared.discard_all_queued()
        } else {
            0
        };
        let log = self.cpu.as_ref().map_or(&[][..], |c| &c.pmi_log[..]);
        result.interface_off = Some(InterfaceOff {
            after_first_pmi: now - first_pmi,
            mode_before,
            refused: outcome.err().map(|e| e.return_value() as i32),
            delivered_before: log.iter().filter(|r| r.delivered_to.is_some()).count(),
            raised_after: 0,
            delivered_after: 0,
            dropped_deliveries,
        });
        plan.done = true;
        plan.pmis_seen = log.len();
        self.interface_off = Some(plan);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(refused: Option<i32>) -> InterfaceOff {
        InterfaceOff {
            after_first_pmi: Duration::from_millis(1500),
            mode_before: Mode::All,
            refused,
            delivered_before: 1291,
            raised_after: 2,
            delivered_after: 0,
            dropped_deliveries: 1,
        }
    }

    #[test]
    fn the_report_says_what_was_done_and_what_came_after() {
        let done = report(None).describe();
        assert!(done.starts_with("the host switched the xenpmu interface off 1.500 s"));
        assert!(done.contains("(mode all -> off"), "{done}");
        assert!(
            done.contains("PMIs delivered before 1291, after 0 (of 2 raised after); 1 queued"),
            "{done}"
        );
        let busy = report(Some(OpError::Busy.return_value() as i32)).describe();
        assert!(busy.contains("was refused: -16 (EBUSY"), "{busy}");
        assert!(busy.ends_with("the mode stays all"), "{busy}");
        let again = report(Some(OpError::Again.return_value() as i32)).describe();
        assert!(
            again.contains("-11 (the change did not complete)"),
            "{again}"
        );
    }
}
