//! `vpmu profile --sweep`: samples delivered vs dropped and the workloads' slowdown at 1, 4
//! and 10 kHz, in all mode (the profiler samples everything) and self mode (each domain
//! itself), against a baseline run without sampling, all in one invocation.

use std::fmt::Write as _;

use kvm_bindings::CpuId;
use kvm_ioctls::Kvm;
use serde::Serialize;

use super::run::{self, DomainPlan, Mode, Plan};
use super::{Delivery, Options, validate};
use crate::personality::Personality;

/// The frequencies of the sweep (samples per second of CPU time).
pub const FREQUENCIES: [u64; 3] = [1000, 4000, 10_000];

/// Rounds of the sweep: every configuration runs once per round, interleaved with a baseline
/// in the same round, and the row reports the medians. A single pair of runs is not enough:
/// the host's speed for the same guest loop varies by up to ~2x between runs here (seen
/// 1.0-1.9 TSC ticks per `dec; jnz`), which interleaving and medians absorb.
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
    /// Median over rounds of (the round's baseline work rate / this run's), each averaged
    /// over the workload domains (1.0: no slowdown).
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
) -> Result<bool, String> {
    let plan = |mode, frequency| Plan {
        mode,
        frequency,
        duration: options.duration,
        workloads: workloads.to_vec(),
        progress: options.progress,
    };
    let configs: Vec<(Mode, u64)> = [Mode::All, Mode::SelfOnly]
        .into_iter()
        .flat_map(|m| FREQUENCIES.map(|f| (m, f)))
        .collect();
    let mut baselines = Vec::new();
    // runs[c][round], with the round's slowdown and attribution.
    let mut runs: Vec<Vec<(Delivery, f64, bool)>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        eprintln!(
            "vpmu profile --sweep: round {}/{ROUNDS}: baseline (no sampling)",
            round + 1
        );
        let base = Delivery::of(&run::run(kvm, cpuid, p, &plan(Mode::All, 0))?);
        for (c, &(mode, f)) in configs.iter().enumerate() {
            eprintln!(
                "vpmu profile --sweep: round {}/{ROUNDS}: {} mode, {f} Hz",
                round + 1,
                mode.name()
            );
            let data = run::run(kvm, cpuid, p, &plan(mode, f))?;
            let delivery = Delivery::of(&data);
            let s = slowdown(&base.work_rates, &delivery.work_rates);
            runs[c].push((delivery, s, validate::attribution(&data).passed));
        }
        baselines.push(base);
    }
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
    let base_rates: Vec<Vec<f64>> = baselines.iter().map(|b| b.work_rates.clone()).collect();
    let mut out = format!(
        "{}: {} workload domains and the profiler on one pCPU; {ROUNDS} rounds of {:.1} s runs, \
         each a baseline without sampling and every configuration; medians\n\
         baseline work rates by round (rounds/s per workload domain): {}\n\n\
         {:<5} {:>6} {:>9} {:>9} {:>8} {:>6} {:>10} {:>9} {:>11}\n",
        p.name(),
        workloads.len(),
        options.duration.as_secs_f64(),
        base_rates
            .iter()
            .map(|r| format!("{:.0?}", r))
            .collect::<Vec<_>>()
            .join(" "),
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
    }))
    .map_err(|e| e.to_string())?;
    std::fs::write(&path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    let txt = options.out.join("sweep.txt");
    std::fs::write(&txt, &out).map_err(|e| format!("{}: {e}", txt.display()))?;
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
