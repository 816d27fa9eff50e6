//! `vpmu profile --sweep`: page and ring delivery side by side at 1, 5, 10 and 20 kHz, in all
//! mode (the profiler samples everything) and self mode (each domain itself): samples
//! expected, delivered, lost and withheld, the workloads' slowdown against baseline runs
//! without sampling, and where the time per sample goes (the core's PMI path on the VMM's
//! clock, the guest's handler and shipping on its TSC, the kick's lateness), all in one
//! invocation.

use crate::ProfileError;
use std::fmt::Write as _;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use serde::Serialize;

use super::run::{self, DeliveryPath, DomainPlan, Mode, Plan};
use super::{Delivery, Options, validate};
use vpmu_machine::personality::Personality;

/// The frequencies of the sweep (samples per second of CPU time).
pub const FREQUENCIES: [u64; 4] = [1000, 5000, 10_000, 20_000];

/// The delivery paths compared.
pub const PATHS: [DeliveryPath; 2] = [DeliveryPath::Page, DeliveryPath::Ring];

/// Rounds of the sweep: every configuration runs once per round, each run between two
/// baseline runs without sampling, and the row reports the medians. The host's speed for the
/// same guest loop drifts by up to ~1.5x within seconds here (1.0-1.9 TSC ticks per
/// `dec; jnz` seen between runs), so a configuration is only compared with the baselines
/// right before and after it (their mean: linear drift cancels), and medians absorb the rest.
pub const ROUNDS: usize = 3;

/// One row of the sweep: a mode at a frequency through one delivery path, over `ROUNDS` runs.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The mode.
    pub mode: &'static str,
    /// Samples per second of CPU time asked for.
    pub frequency_hz: u64,
    /// The delivery path as the runs report it ("page (no ring)" if the ring was refused).
    pub path: &'static str,
    /// Median samples expected per run.
    pub expected: f64,
    /// Median samples delivered per run.
    pub delivered: f64,
    /// Median samples dropped by the vpmu per run (ring mode: lost and withheld included).
    pub dropped: f64,
    /// Median samples lost in the ring (ring mode).
    pub lost_in_ring: f64,
    /// Median samples withheld (ring mode).
    pub withheld: f64,
    /// Median samples the guests could not buffer per run.
    pub lost_in_guest: f64,
    /// Median delivered / expected.
    pub delivered_ratio: f64,
    /// Median over rounds of (the mean work rate of the baseline runs right before and after
    /// / this run's), each averaged over the workload domains (1.0: no slowdown).
    pub slowdown: f64,
    /// Median microseconds in the core's PMI path per PMI (the VMM's clock).
    pub hypervisor_us: f64,
    /// Median guest microseconds (its TSC, preemptions included) in the VIRQ handler per
    /// VIRQ: per sample on the page, per batch in the ring.
    pub handler_us_per_virq: f64,
    /// Median guest microseconds (handler and shipping) per delivered sample.
    pub guest_us_per_sample: f64,
    /// Median microseconds from a predicted overflow to the exit that raised its PMI.
    pub kick_late_us: f64,
    /// Attribution held (100 %) in every run.
    pub attribution: bool,
    /// Every run's numbers.
    pub runs: Vec<Delivery>,
}

/// The mean over the workload domains of baseline rate / rate.
fn slowdown(baseline: &[f64], rates: &[f64]) -> f64 {
    let ratios: Vec<f64> = baseline
        .iter()
        .zip(rates)
        .filter(|&(_, &r)| r > 0.0)
        .map(|(b, r)| b / r)
        .collect();
    if ratios.is_empty() {
        f64::NAN
    } else {
        ratios.iter().sum::<f64>() / ratios.len() as f64
    }
}

/// The median (NaN for none).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One row of the table.
fn row(mode: Mode, f: u64, runs: Vec<(Delivery, f64, bool)>) -> Row {
    let m = |get: &dyn Fn(&Delivery) -> f64| median(runs.iter().map(|r| get(&r.0)).collect());
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    Row {
        mode: mode.name(),
        frequency_hz: f,
        path: runs.first().map_or("-", |r| r.0.path),
        expected: m(&|d| d.expected as f64),
        delivered: m(&|d| d.delivered as f64),
        dropped: m(&|d| d.dropped as f64),
        lost_in_ring: m(&|d| d.lost_in_ring as f64),
        withheld: m(&|d| d.withheld as f64),
        lost_in_guest: m(&|d| d.lost_in_guest as f64),
        delivered_ratio: m(&|d| d.delivered as f64 / d.expected.max(1) as f64),
        slowdown: median(runs.iter().map(|r| r.1).collect()),
        hypervisor_us: m(&|d| nan(d.hypervisor_us_per_pmi)),
        handler_us_per_virq: m(&|d| nan(d.guest_handler_us_per_virq)),
        guest_us_per_sample: m(&|d| {
            nan(d.guest_handler_us_per_sample) + nan(d.guest_ship_us_per_sample)
        }),
        kick_late_us: m(&|d| nan(d.kick_late_us)),
        attribution: runs.iter().all(|r| r.2),
        runs: runs.into_iter().map(|r| r.0).collect(),
    }
}

/// The table's header line.
const HEADER: [&str; 13] = [
    "mode",
    "Hz",
    "path",
    "expected",
    "delivered",
    "fraction",
    "lost",
    "withheld",
    "slowdown",
    "hv us/PMI",
    "guest us/VIRQ",
    "guest us/smp",
    "kick us",
];

/// The table: one line per row, page and ring of each mode and frequency next to each other.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<5} {:>6} {:<5} {:>8} {:>9} {:>8} {:>6} {:>8} {:>8} {:>9} {:>13} {:>12} {:>7} attribution\n",
        HEADER[0],
        HEADER[1],
        HEADER[2],
        HEADER[3],
        HEADER[4],
        HEADER[5],
        HEADER[6],
        HEADER[7],
        HEADER[8],
        HEADER[9],
        HEADER[10],
        HEADER[11],
        HEADER[12]
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<5} {:>6} {:<5} {:>8.0} {:>9.0} {:>7.0}% {:>6.0} {:>8.0} {:>7.2}x {:>9.1} {:>13.1} \
             {:>12.1} {:>7.0} {}",
            r.mode,
            r.frequency_hz,
            r.path.split(' ').next().unwrap_or(r.path),
            r.expected,
            r.delivered,
            100.0 * r.delivered_ratio,
            r.lost_in_ring + r.lost_in_guest,
            r.withheld,
            r.slowdown,
            r.hypervisor_us,
            r.handler_us_per_virq,
            r.guest_us_per_sample,
            r.kick_late_us,
            if r.attribution { "100 %" } else { "FAILED" }
        );
    }
    out
}

/// Runs the sweep, prints the table and writes `sweep.json` and `sweep.txt`; Ok(true) if
/// attribution held in every run.
pub fn sweep<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    options: &Options,
    workloads: &[DomainPlan],
) -> Result<bool, ProfileError> {
    let plan = |mode, frequency, delivery| Plan {
        mode,
        frequency,
        delivery,
        duration: options.duration,
        vcpus: options.vcpus,
        pcpus: options.pcpus,
        workloads: workloads.to_vec(),
        progress: options.progress,
        interrupt: None,
        linux: None,
    };
    let configs: Vec<(Mode, u64, DeliveryPath)> = [Mode::All, Mode::SelfOnly]
        .into_iter()
        .flat_map(|m| FREQUENCIES.map(|f| (m, f)))
        .flat_map(|(m, f)| PATHS.map(|d| (m, f, d)))
        .collect();
    let mut baselines = Vec::new();
    let baseline = |round: usize| -> Result<Delivery, ProfileError> {
        eprintln!(
            "vpmu profile --sweep: round {}/{ROUNDS}: baseline (no sampling)",
            round + 1
        );
        let data = run::run(kvm, cpuid, p, &plan(Mode::All, 0, DeliveryPath::Page))?;
        Ok(Delivery::of(&data))
    };
    // runs[c][round], with the run's slowdown and attribution.
    let mut runs: Vec<Vec<(Delivery, f64, bool)>> = vec![Vec::new(); configs.len()];
    let mut before = baseline(0)?;
    for round in 0..ROUNDS {
        for (c, &(mode, f, path)) in configs.iter().enumerate() {
            eprintln!(
                "vpmu profile --sweep: round {}/{ROUNDS}: {} mode, {f} Hz, {}",
                round + 1,
                mode.name(),
                path.name()
            );
            let data = run::run(kvm, cpuid, p, &plan(mode, f, path))?;
            let delivery = Delivery::of(&data);
            let after = baseline(round)?;
            let flanking: Vec<f64> = before
                .work_rates
                .iter()
                .zip(&after.work_rates)
                .map(|(a, b)| (a + b) / 2.0)
                .collect();
            let s = slowdown(&flanking, &delivery.work_rates);
            runs[c].push((delivery, s, validate::attribution(&data).passed));
            baselines.push(std::mem::replace(&mut before, after));
        }
    }
    baselines.push(before);
    let rows: Vec<Row> = configs
        .iter()
        .zip(runs)
        .map(|(&(mode, f, _), runs)| row(mode, f, runs))
        .collect();
    let base_means: Vec<f64> = baselines
        .iter()
        .map(|b| b.work_rates.iter().sum::<f64>() / b.work_rates.len().max(1) as f64)
        .collect();
    let lowest = base_means.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = base_means.iter().copied().fold(0.0, f64::max);
    let mut out = format!(
        "{}: {} workload domains of {} vCPUs and the profiler on {} pCPUs; {ROUNDS} rounds \
         of {:.1} s runs, each run between two baseline runs without sampling; medians\n\
         the {} baseline runs' work rate (rounds/s, mean of the workload domains) ranged \
         {lowest:.0}-{highest:.0}: the host's own drift\n\
         lost: in the ring (and in the guest's buffers); hv us/PMI: the core's PMI path on the \
         VMM's clock; guest us/VIRQ and us/smp: the guest's TSC in its VIRQ handler per VIRQ \
         and in handler + shipping per sample (preemptions included); kick us: from the \
         predicted overflow to the PMI\n\n",
        p.name(),
        workloads.len(),
        options.vcpus,
        options.pcpus,
        options.duration.as_secs_f64(),
        baselines.len(),
    );
    out += &table(&rows);
    print!("{out}");
    let path = options.out.join("sweep.json");
    let body = serde_json::to_string_pretty(&serde_json::json!({
        "personality": p.name(),
        "duration_s": options.duration.as_secs_f64(),
        "rounds": ROUNDS,
        "baselines": baselines,
        "rows": rows,
    }))?;
    std::fs::write(&path, body).map_err(ProfileError::write(&path))?;
    let txt = options.out.join("sweep.txt");
    std::fs::write(&txt, &out).map_err(ProfileError::write(&txt))?;
    println!("wrote {} and {}", path.display(), txt.display());
    Ok(rows.iter().all(|r| r.attribution))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowdown_is_the_mean_ratio() {
        assert!((slowdown(&[2.0, 4.0], &[1.0, 4.0]) - 1.5).abs() < 1e-12);
        assert!(slowdown(&[1.0], &[0.0]).is_nan());
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
