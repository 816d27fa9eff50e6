//! One run's delivery numbers (the report's delivery line, `profile.json`, the sweep): what the
//! counters should have produced, what the guests received, what was lost where, and where the
//! time per sample went.

use serde::Serialize;

use super::report::Check;
use super::ring_batch::RingTotals;
use super::run::{Mode, RunData};

/// One run's delivery numbers, for the JSON and the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct Delivery {
    /// The run's mode.
    pub mode: &'static str,
    /// How the samples reached the guests: "page", "ring", or "page (no ring)" when ring mode
    /// was asked for and the hypervisor had no ring.
    pub path: &'static str,
    /// Samples per second of CPU time asked for.
    pub frequency_hz: u64,
    /// The counter's mean period (cycles = TSC ticks).
    pub period_cycles: u64,
    /// Samples the counters' overflows should have produced: the frequency times the CPU time
    /// the sampled contexts ran (the counters count guest cycles: all mode, every domain's
    /// time on the pCPU; self mode, each sampler's own; hv mode, also the VMM's time serving
    /// the profiler, which is not included here).
    pub expected: u64,
    /// Whose CPU time `expected` is of: every sampled domain's, or (a Linux domain 0, whose
    /// time is mostly its unsampled boot) the workload domains' only.
    pub expected_of: &'static str,
    /// The CPU time (seconds in `KVM_RUN`) of the sampled contexts.
    pub sampled_cpu_s: f64,
    /// PMIs the core handled with an interrupt (generated).
    pub generated: u64,
    /// Samples the guests shipped.
    pub delivered: u64,
    /// Samples the core dropped (a sample still unread in the page, or no page).
    pub dropped: u64,
    /// Samples the guests read but could not buffer.
    pub lost_in_guest: u64,
    /// Ring mode: samples lost because the ring was full (`producer.lost`).
    pub lost_in_ring: u64,
    /// Ring mode: samples withheld because the page's LVTPC was masked.
    pub withheld: u64,
    /// Ring mode: what the vCPUs' ring shipments add up to.
    pub ring: Option<RingTotals>,
    /// PMU VIRQs the sampling guests took (page mode: one per sample).
    pub virqs: u64,
    /// Mean microseconds in the core's PMI path (`Vpmu::handle_pmi`, the VMM's clock) per PMI.
    pub hypervisor_us_per_pmi: Option<f64>,
    /// Mean microseconds from a predicted overflow to the exit that raised its PMI (the timed
    /// source's kick).
    pub kick_late_us: Option<f64>,
    /// Guest microseconds (its TSC) in the PMU VIRQ handler per delivered sample.
    pub guest_handler_us_per_sample: Option<f64>,
    /// Guest microseconds shipping per delivered sample.
    pub guest_ship_us_per_sample: Option<f64>,
    /// Guest microseconds in the VIRQ handler per VIRQ.
    pub guest_handler_us_per_virq: Option<f64>,
    /// Each workload domain's progress: rounds of its loop per second of wall time.
    pub work_rates: Vec<f64>,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
}

impl Delivery {
    /// The numbers of `data`.
    pub fn of(data: &RunData) -> Self {
        // All mode: the pCPU's counter, every domain's time. Self/hv: each sampler's own; the
        // profiler (domain 0) samples only in hv mode.
        // A Linux domain 0 boots and shuts down unsampled, the workloads held: only the
        // workloads' time is known to be sampled time (`expected_of`).
        let linux = data.linux.is_some();
        let cpu_s: f64 = data
            .results
            .iter()
            .filter(|r| {
                let workload = r.vcpu.is_some_and(|v| v.domain != 0);
                workload || (data.mode != Mode::SelfOnly && !linux)
            })
            .map(|r| r.guest_ns as f64 / 1e9)
            .sum();
        let stats = data.results.iter().filter_map(|r| r.stats);
        let ring = ring_totals(data);
        let delivered = data.samples().count() as u64;
        let timing = data
            .results
            .iter()
            .fold(vpmu_machine::timing::PmiTiming::default(), |t, r| {
                t.plus(r.pmi_timing)
            });
        let ticks = data.shipments.iter().fold((0u64, 0u64), |(h, s), (_, sh)| {
            (h + sh.guest_ticks.0, s + sh.guest_ticks.1)
        });
        let us = |ticks: u64| ticks as f64 * 1000.0 / data.tsc_khz.max(1) as f64;
        let per = |total: f64, n: u64| (n > 0).then(|| total / n as f64);
        let virqs = ring.map_or(delivered, |r| r.virqs);
        let path = match (data.delivery, ring) {
            (super::DeliveryPath::Ring, Some(_)) => "ring",
            (super::DeliveryPath::Ring, None) if delivered > 0 => "page (no ring)",
            (super::DeliveryPath::Ring, None) => "ring",
            (super::DeliveryPath::Page, _) => "page",
        };
        Self {
            mode: data.mode.name(),
            path,
            frequency_hz: data.frequency,
            period_cycles: data.period,
            expected: (data.frequency as f64 * cpu_s).round() as u64,
            expected_of: if linux {
                "workload domains"
            } else {
                "all sampled domains"
            },
            sampled_cpu_s: cpu_s,
            generated: stats.clone().map(|s| s.pmis_generated).sum(),
            delivered,
            dropped: stats.map(|s| s.pmis_dropped).sum(),
            lost_in_guest: data.shipments.iter().map(|(_, s)| s.lost).sum(),
            lost_in_ring: ring.map_or(0, |r| r.producer_lost),
            withheld: ring.map_or(0, |r| r.producer_withheld),
            ring,
            virqs,
            hypervisor_us_per_pmi: timing.handle_us(),
            kick_late_us: timing.kick_late_us(),
            guest_handler_us_per_sample: per(us(ticks.0), delivered),
            guest_ship_us_per_sample: per(us(ticks.1), delivered),
            guest_handler_us_per_virq: per(us(ticks.0), virqs),
            work_rates: (0..data.work.len())
                .filter_map(|d| data.work_rate(d))
                .collect(),
            wall_s: data.wall.as_secs_f64(),
        }
    }

    /// The report's delivery line.
    pub fn line(&self) -> String {
        let mut line = format!(
            "delivery ({}): {} samples expected{}, {} PMIs, {} delivered, {} dropped by the \
             vpmu, {} lost in the guest",
            self.path,
            self.expected,
            if self.expected_of == "workload domains" {
                " (of the workload domains' time)"
            } else {
                ""
            },
            self.generated,
            self.delivered,
            self.dropped,
            self.lost_in_guest
        );
        if let Some(r) = &self.ring {
            line += &format!(
                ", {} lost in the ring ({} in lost records, {} after the last), {} withheld; \
                 {} wakeups for {} records",
                r.producer_lost,
                r.lost_in_records,
                r.lost_pending(),
                r.producer_withheld,
                r.producer_wakeups,
                r.samples
            );
        }
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} us"));
        line += &format!(
            "; per sample: {} in the hypervisor's PMI path, {} guest handler, {} guest \
             shipping; kick {} after the overflow; run took {:.1} s",
            us(self.hypervisor_us_per_pmi),
            us(self.guest_handler_us_per_sample),
            us(self.guest_ship_us_per_sample),
            us(self.kick_late_us),
            self.wall_s
        );
        line
    }
}

/// The sum of every vCPU's ring totals (None if no vCPU shipped through a ring).
fn ring_totals(data: &RunData) -> Option<RingTotals> {
    data.shipments
        .iter()
        .filter_map(|(_, s)| s.ring)
        .reduce(|a, b| a.plus(&b))
}

/// Ring mode: the losses are accounted for exactly, per shipping vCPU: every gap in the
/// sequence numbers is covered by a lost record (or a withheld sample), the lost records never
/// report more than `producer.lost`, and every record the producer counted was decoded. None
/// if no vCPU shipped through a ring.
pub fn ring_accounting(data: &RunData) -> Option<Check> {
    let rings: Vec<_> = data
        .shipments
        .iter()
        .filter_map(|(id, s)| Some((*id, s.ring?)))
        .collect();
    if rings.is_empty() {
        return None;
    }
    let mut problems = Vec::new();
    for (id, r) in &rings {
        if !r.accounted() {
            problems.push(format!(
                "domain {} vCPU {}: {} records decoded of {} published, {} sequence numbers \
                 without a record (withheld {}), {} lost in records of {} lost",
                id.domain,
                id.vcpu,
                r.samples,
                r.producer_records,
                r.unaccounted,
                r.producer_withheld,
                r.lost_in_records,
                r.producer_lost
            ));
        }
    }
    let total = rings
        .iter()
        .map(|(_, r)| *r)
        .reduce(|a, b| a.plus(&b))
        .unwrap_or_default();
    let detail = format!(
        "{} records, {} lost ({} in {} lost records, {} after the last record), {} withheld, \
         {} sequence numbers without a record",
        total.samples,
        total.producer_lost,
        total.lost_in_records,
        total.lost_records,
        total.lost_pending(),
        total.producer_withheld,
        total.unaccounted
    );
    Some(Check {
        name: "ring losses accounted (sequence gaps = lost records + withheld)".into(),
        passed: problems.is_empty(),
        skipped: false,
        detail: if problems.is_empty() {
            detail
        } else {
            format!("{detail}; {}", problems.join("; "))
        },
    })
}
