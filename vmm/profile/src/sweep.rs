//! `vpmu profile --sweep`: samples delivered vs dropped and the workloads' slowdown at 1, 4
//! and 10 kHz, in all mode (the profiler samples everything) and self mode (each domain
//! itself), against a baseline run without sampling, all in one invocation.

use crate::ProfileError;
use std::fmt::Write as _;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use serde::Serialize;

use super::run::{self, DomainPlan, Mode, Plan};
use super::{Delivery, Options, validate};
use vpmu_machine::personality::Personality;

/// The frequencies of the sweep (samples per second of CPU time).
pub const FREQUENCIES: [u64; 3] = [1000, 4000, 10_000];

/// Rounds of the sweep: every configuration runs once per round, each run between two
/// baseline runs without sampling, and the row reports the medians. The host's speed for the
/// same guest loop drifts by up to ~1.5x within seconds here (1.0-1.9 TSC ticks per
/// `dec; jnz` seen between runs), so a configuration is only compared with the baselines
/// right before and after it (their mean: linear drift cancels), and medians absorb the rest.
pub const ROUNDS: usize = 3;

/// One row of the sweep: a mode at a frequency, over `ROUNDS` runs.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The mode.
    pub mode: &'static str,
    /// Samples per second of CPU time asked for.
    pub frequency_hz: u64,
    /// Median samples expected per run.
    pub expected: f64,
    /// Median samples delivered per run.
    pub delivered: f64,
    /// Median samples dropped by the vpmu per run.
    pub dropped: f64,
    /// Median samples the guests could not buffer per run.
    pub lost_in_guest: f64,
    /// Median delivered / expected.
    pub delivered_ratio: f64,
    /// Median over rounds of (the mean work rate of the baseline runs right before and after
    /// / this run's), each averaged over the workload domains (1.0: no slowdown).
    pub slowdown: f64,
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

/// Runs the sweep, prints the table and writes `sweep.json` and `sweep.txt`; Ok(true) if
/// attribution held in every run.
pub fn sweep<P: Personality + Copy + Sync>(
    kvm: &Kvm,
    cpuid: &CpuId,
    p: P,
    options: &Options,
    workloads: &[DomainPlan],
) -> Result<bool, ProfileError> {
    let plan = |mode, frequency| Plan {
        mode,
        frequency,
        delivery: options.delivery,
        duration: options.duration,
        vcpus: options.vcpus,
        pcpus: options.pcpus,
        workloads: workloads.to_vec(),
        progress: options.progress,
        interrupt: None,
    };
    let configs: Vec<(Mode, u64)> = [Mode::All, Mode::SelfOnly]
        .into_iter()
        .flat_map(|m| FREQUENCIES.map(|f| (m, f)))
        .collect();
    let mut baselines = Vec::new();
    let baseline = |round: usize| -> Result<Delivery, ProfileError> {
        eprintln!(
            "vpmu profile --sweep: round {}/{ROUNDS}: baseline (no sampling)",
            round + 1
        );
        Ok(Delivery::of(&run::run(kvm, cpuid, p, &plan(Mode::All, 0))?))
    };
    // runs[c][round], with the run's slowdown and attribution.
    let mut runs: Vec<Vec<(Delivery, f64, bool)>> = vec![Vec::new(); configs.len()];
    let mut before = baseline(0)?;
    for round in 0..ROUNDS {
        for (c, &(mode, f)) in configs.iter().enumerate() {
            eprintln!(
                "vpmu profile --sweep: round {}/{ROUNDS}: {} mode, {f} Hz",
                round + 1,
                mode.name()
            );
            let data = run::run(kvm, cpuid, p, &plan(mode, f))?;
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
        .map(|(&(mode, f), runs)| {
            let m =
                |get: &dyn Fn(&Delivery) -> f64| median(runs.iter().map(|r| get(&r.0)).collect());
            Row {
                mode: mode.name(),
                frequency_hz: f,
                expected: m(&|d| d.expected as f64),
                delivered: m(&|d| d.delivered as f64),
                dropped: m(&|d| d.dropped as f64),
                lost_in_guest: m(&|d| d.lost_in_guest as f64),
                delivered_ratio: m(&|d| d.delivered as f64 / d.expected.max(1) as f64),
                slowdown: median(runs.iter().map(|r| r.1).collect()),
                attribution: runs.iter().all(|r| r.2),
                runs: runs.into_iter().map(|r| r.0).collect(),
            }
        })
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
         {lowest:.0}-{highest:.0}: the host's own drift\n\n\
         {:<5} {:>6} {:>9} {:>9} {:>8} {:>6} {:>10} {:>9} {:>11}\n",
        p.name(),
        workloads.len(),
        options.vcpus,
        options.pcpus,
        options.duration.as_secs_f64(),
        baselines.len(),
        "mode",
        "Hz",
        "expected",
        "delivered",
        "dropped",
        "lost",
        "delivered",
        "slowdown",
        "attribution"
    );
    for r in &rows {
        let _ = writeln!(
            out,
            "{:<5} {:>6} {:>9.0} {:>9.0} {:>8.0} {:>6.0} {:>9.0}% {:>8.2}x {:>11}",
            r.mode,
            r.frequency_hz,
            r.expected,
            r.delivered,
            r.dropped,
            r.lost_in_guest,
            100.0 * r.delivered_ratio,
            r.slowdown,
            if r.attribution { "100 %" } else { "FAILED" }
        );
    }
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
