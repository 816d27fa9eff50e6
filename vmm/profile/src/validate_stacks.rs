//! The built-in workloads' ground truth on call stacks (`Workload::expected_stacks`): the
//! share check of `validate::shares`, run on stacks. Over a workload domain's samples in its
//! functions, the share of each stack `main → function` (the function sampled, its main the
//! frame right above it) must be within `SHARE_TOLERANCE_PP` of the function's share by
//! construction: a sample in the function whose chain misses its main (or names another
//! caller) counts against it.

use super::report::{Check, Report};
use super::sample::Origin;
use super::validate::{MIN_SHARE_SAMPLES, SHARE_TOLERANCE_PP};
use super::workloads::Workload;

/// The measured stack shares of `workload` in domain `domain`: for each expected stack, the
/// percent of the samples in the workload's functions that have it; and that sample count.
pub fn measured_stack_shares(
    report: &Report,
    domain: u32,
    workload: &Workload,
) -> (Vec<([&'static str; 2], f64)>, u64) {
    let rows: Vec<_> = report
        .stacks
        .iter()
        .filter(|r| r.origin == Origin::Domain(domain))
        .filter(|r| {
            r.frames
                .last()
                .is_some_and(|f| workload.functions.iter().any(|&(w, _)| w == f))
        })
        .collect();
    let total: u64 = rows.iter().map(|r| r.samples).sum();
    let shares = workload
        .expected_stacks()
        .into_iter()
        .map(|([caller, callee], _)| {
            let n: u64 = rows
                .iter()
                .filter(|r| r.is_call(caller, callee))
                .map(|r| r.samples)
                .sum();
            let pct = if total == 0 {
                0.0
            } else {
                100.0 * n as f64 / total as f64
            };
            ([caller, callee], pct)
        })
        .collect();
    (shares, total)
}

/// One check per built-in workload domain (`workloads[i]` runs in domain `i + 1`; None for a
/// user's guest): its stacks' shares within `SHARE_TOLERANCE_PP` points of the construction.
/// With fewer than `MIN_SHARE_SAMPLES` samples in its functions the check says so and passes:
/// a short run is not a wrong one.
pub fn stack_shares(report: &Report, workloads: &[Option<Workload>]) -> Vec<Check> {
    workloads
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Some((i as u32 + 1, (*w)?)))
        .map(|(domain, w)| {
            let (measured, total) = measured_stack_shares(report, domain, &w);
            let mut worst: f64 = 0.0;
            let parts: Vec<String> = measured
                .iter()
                .zip(w.expected_stacks())
                .map(|(&([caller, callee], got), (_, want))| {
                    worst = worst.max((got - want).abs());
                    format!("{caller} → {callee} {got:.1} % (built {want:.1} %)")
                })
                .collect();
            let name = format!(
                "dom{domain} ({}) call-stack shares within ±{SHARE_TOLERANCE_PP} points",
                w.label
            );
            if total < MIN_SHARE_SAMPLES {
                return Check::skipped(
                    name,
                    format!("not enough samples ({total} < {MIN_SHARE_SAMPLES})"),
                );
            }
            Check {
                name,
                passed: worst <= SHARE_TOLERANCE_PP,
                skipped: false,
                detail: format!(
                    "{}; {total} samples in its functions, worst {worst:.1} points",
                    parts.join(", ")
                ),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::RunInfo;
    use crate::stacks::StackRow;
    use crate::workloads::BUILT_IN;

    fn report(rows: &[(&[&str], u64)]) -> Report {
        let run = RunInfo {
            mode: "all".into(),
            vendor: "intel".into(),
            frequency_hz: 1000,
            duration_s: 1.0,
            tsc_khz: 1_000_000,
            pcpus: 1,
            vcpus: 1,
        };
        let mut r = Report::build(run, &[], &[]);
        r.stacks = rows
            .iter()
            .map(|&(frames, samples)| StackRow {
                origin: Origin::Domain(1),
                user: true,
                frames: frames.iter().map(|f| f.to_string()).collect(),
                samples,
            })
            .collect();
        r
    }

    #[test]
    fn stacks_through_main_match_the_construction() {
        let r = report(&[
            (&["user_enter", "w1_main", "w1_deflate"], 750),
            (&["user_enter", "w1_main", "w1_checksum"], 250),
            (&["_start", "main"], 40), // not in the workload's functions: not counted
        ]);
        let checks = stack_shares(&r, &[Some(BUILT_IN[0])]);
        assert_eq!(checks.len(), 1);
        assert!(checks[0].passed, "{:?}", checks[0]);
        assert!(
            checks[0]
                .detail
                .contains("w1_main → w1_deflate 75.0 % (built 75.0 %)")
        );
    }

    #[test]
    fn a_missing_caller_counts_against_the_stack() {
        // A third of w1_deflate's samples lost their caller (no frame in w1_deflate).
        let r = report(&[
            (&["user_enter", "w1_main", "w1_deflate"], 500),
            (&["user_enter", "w1_deflate"], 250),
            (&["user_enter", "w1_main", "w1_checksum"], 250),
        ]);
        let checks = stack_shares(&r, &[Some(BUILT_IN[0])]);
        assert!(!checks[0].passed, "{:?}", checks[0]);
        assert!(checks[0].detail.contains("worst 25.0 points"));
    }

    #[test]
    fn too_few_samples_say_so_and_do_not_fail() {
        let r = report(&[(&["w1_main", "w1_deflate"], 10)]);
        let checks = stack_shares(&r, &[Some(BUILT_IN[0]), None]);
        assert_eq!(checks.len(), 1);
        assert!(checks[0].skipped && !checks[0].fails(), "{:?}", checks[0]);
        assert_eq!(
            checks[0].detail,
            format!("not enough samples (10 < {MIN_SHARE_SAMPLES})")
        );
    }
}
