//! Where the time of a sample goes on the VMM's side, measured with the host's clock: how long
//! the core's PMI path (`Vpmu::handle_pmi`: the overflow, the re-arm, the record or the page
//! write, the call-chain walk, the VIRQ) took for each PMI it delivered, and how late the
//! timed source's kick brought the vCPU out after the predicted overflow.

use std::time::{Duration, Instant};

/// Totals of one vCPU's PMIs (the ones taken on its thread, while it ran).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PmiTiming {
    /// PMIs the core handled.
    pub pmis: u64,
    /// Nanoseconds spent in `Vpmu::handle_pmi` over them.
    pub handle_ns: u64,
    /// PMIs raised at a kick armed for a predicted overflow (the timed source).
    pub kicked: u64,
    /// Nanoseconds from the predicted overflow to the exit that raised the PMI, summed over
    /// `kicked`.
    pub kick_late_ns: u64,
}

impl PmiTiming {
    /// Counts one PMI whose `handle_pmi` took `took`, raised at an exit `late` after the
    /// predicted overflow (None: no kick was armed for one).
    pub(crate) fn record(&mut self, took: Duration, late: Option<Duration>) {
        self.pmis += 1;
        self.handle_ns = self.handle_ns.saturating_add(nanos(took));
        if let Some(late) = late {
            self.kicked += 1;
            self.kick_late_ns = self.kick_late_ns.saturating_add(nanos(late));
        }
    }

    /// The sum of two vCPUs' totals.
    pub fn plus(self, other: PmiTiming) -> PmiTiming {
        PmiTiming {
            pmis: self.pmis + other.pmis,
            handle_ns: self.handle_ns.saturating_add(other.handle_ns),
            kicked: self.kicked + other.kicked,
            kick_late_ns: self.kick_late_ns.saturating_add(other.kick_late_ns),
        }
    }

    /// Mean microseconds in the core's PMI path per PMI (None without PMIs).
    pub fn handle_us(&self) -> Option<f64> {
        (self.pmis > 0).then(|| self.handle_ns as f64 / 1000.0 / self.pmis as f64)
    }

    /// Mean microseconds from the predicted overflow to the PMI (None without kicks).
    pub fn kick_late_us(&self) -> Option<f64> {
        (self.kicked > 0).then(|| self.kick_late_ns as f64 / 1000.0 / self.kicked as f64)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How late a PMI raised now is against the overflow the kick was armed for (None if none was,
/// or the PMI came before it: then it was not the kick that raised it).
pub(crate) fn lateness(deadline: Option<Instant>, now: Instant) -> Option<Duration> {
    deadline.and_then(|d| now.checked_duration_since(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_means() {
        let mut t = PmiTiming::default();
        assert_eq!((t.handle_us(), t.kick_late_us()), (None, None));
        t.record(Duration::from_micros(10), Some(Duration::from_micros(100)));
        t.record(Duration::from_micros(30), None);
        assert_eq!(t.handle_us(), Some(20.0));
        assert_eq!(t.kick_late_us(), Some(100.0));
        let sum = t.plus(t);
        assert_eq!((sum.pmis, sum.kicked), (4, 2));
        assert_eq!(sum.handle_us(), Some(20.0));
        let now = Instant::now();
        assert_eq!(lateness(None, now), None);
        assert_eq!(lateness(Some(now + Duration::from_secs(1)), now), None);
        assert_eq!(
            lateness(Some(now), now + Duration::from_micros(5)),
            Some(Duration::from_micros(5))
        );
    }
}
