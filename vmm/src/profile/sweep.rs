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

/// One row of the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The run's delivery numbers.
    pub delivery: Delivery,
    /// The baseline's work rate over this run's, averaged over the workload domains
    /// (1.0: no slowdown).
    pub slowdown: f64,
    /// Attribution held (100 %) in this run.
    pub attribution: bool,
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

/// Runs the sweep, prints the table and writes `sweep.json`; Ok(true) if attribution held in
/// every run.
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
    eprintln!("vpmu profile --sweep: baseline (no sampling)");
    let base = run::run(kvm, cpuid, p, &plan(Mode::All, 0))?;
    let baseline = Delivery::of(&base, options.duration);
    let mut rows = Vec::new();
    for mode in [Mode::All, Mode::SelfOnly] {
        for f in FREQUENCIES {
            eprintln!("vpmu profile --sweep: {} mode, {f} Hz", mode.name());
            let data = run::run(kvm, cpuid, p, &plan(mode, f))?;
            let delivery = Delivery::of(&data, options.duration);
            rows.push(Row {
                slowdown: slowdown(&baseline.work_rates, &delivery.work_rates),
                attribution: validate::attribution(&data).passed,
                delivery,
            });
        }
    }
    let mut out = format!(
        "{}: {} workload domains and the profiler on one pCPU, {:.1} s per run\n\
         baseline (no sampling): work rates {:?} rounds per M TSC ticks\n\n\
         {:<5} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11} {:>9} {:>12}\n",
        p.name(),
        workloads.len(),
        options.duration.as_secs_f64(),
        baseline
            .work_rates
            .iter()
            .map(|r| (r * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        "mode",
        "Hz",
        "expected",
        "delivered",
        "dropped",
        "lost",
        "delivered/",
        "slowdown",
        "attribution"
    );
    let _ = writeln!(
        out,
        "{:<5} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11} {:>9} {:>12}",
        "", "", "", "", "", "", "expected", "", ""
    );
    for r in &rows {
        let d = &r.delivery;
        let _ = writeln!(
            out,
            "{:<5} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11.2} {:>8.3}x {:>12}",
            d.mode,
            d.frequency_hz,
            d.expected,
            d.delivered,
            d.dropped,
            d.lost_in_guest,
            if d.expected == 0 {
                0.0
            } else {
                d.delivered as f64 / d.expected as f64
            },
            r.slowdown,
            if r.attribution { "100 %" } else { "FAILED" }
        );
    }
    print!("{out}");
    let path = options.out.join("sweep.json");
    let body = serde_json::to_string_pretty(&serde_json::json!({
        "personality": p.name(),
        "duration_s": options.duration.as_secs_f64(),
        "baseline": baseline,
        "rows": rows,
    }))
    .map_err(|e| e.to_string())?;
    std::fs::write(&path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    std::fs::write(options.out.join("sweep.txt"), &out)
        .map_err(|e| format!("{}: {e}", options.out.display()))?;
    println!("wrote {}", path.display());
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
}
