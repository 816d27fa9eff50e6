//! The checks `vpmu profile` runs on itself: attribution against the VMM's independent record,
//! the built-in workloads' shares against their construction, and the seed-002 check (a domain
//! profiled passively in all mode and by itself in self mode agree on its top functions).

use super::report::{Check, Report};
use super::run::RunData;
use super::sample::{Origin, ProfileSample};
use super::workloads::Workload;

/// How far a measured share may be from the construction, in percentage points.
pub const SHARE_TOLERANCE_PP: f64 = 5.0;
/// Fewer samples than this in a workload's functions make its share check fail (at 200
/// samples the binomial standard deviation of a 50 % share is 3.5 points).
pub const MIN_SHARE_SAMPLES: u64 = 200;

/// Whether `sample` is what the VMM recorded for the PMI in `record`: the domain and vCPU that
/// ran (or the hypervisor), the privilege level, every register (the sixteen GPRs, RIP,
/// RFLAGS, the selectors, CPL and mode) as the guest read them from its page, and the pCPU
/// (for the privileged receiver; an unprivileged one is shown its vCPU number instead).
fn agrees(sample: &ProfileSample, record: &vpmu_machine::PmiRecord) -> bool {
    // The physical CPU is the privileged domain's to see; others see their vCPU number.
    let pcpu = match record.delivered_to {
        Some(to) if to.domain == vpmu_machine::PRIVILEGED_DOMAIN => record.pcpu,
        _ => sample.vcpu,
    };
    let origin = if record.hypervisor {
        Origin::Hypervisor
    } else {
        Origin::Domain(record.running.domain)
    };
    sample.origin == origin
        && sample.vcpu == record.running.vcpu
        && sample.rip == record.regs.rip
        && sample.user == (record.regs.cpl == 3)
        && sample.regs == record.regs
        && sample.pcpu == pcpu
}

/// Attribution: every sample a guest shipped, in order, against the VMM's own record of the
/// PMIs the core delivered to that guest, in order (what was running on the pCPU, where it
/// was interrupted, whether the VMM itself was). 100 % or it fails.
pub fn attribution(data: &RunData) -> Check {
    let log = data.results.first().map_or(&[][..], |r| &r.pmi_log[..]);
    let (mut samples, mut matched, mut problems) = (0u64, 0u64, Vec::new());
    for &(receiver, ref shipment) in &data.shipments {
        let who = format!("domain {} vCPU {}", receiver.domain, receiver.vcpu);
        let records: Vec<_> = log
            .iter()
            .filter(|r| r.delivered_to == Some(receiver))
            .collect();
        samples += shipment.samples.len() as u64;
        matched += shipment
            .samples
            .iter()
            .zip(&records)
            .filter(|(s, r)| agrees(s, r))
            .count() as u64;
        if shipment.lost != 0 {
            problems.push(format!(
                "{who} lost {} samples (its buffers were full)",
                shipment.lost
            ));
        }
        if shipment.samples.len() != records.len() {
            problems.push(format!(
                "{who} shipped {} samples, the core delivered {} to it",
                shipment.samples.len(),
                records.len()
            ));
        }
    }
    let passed = samples > 0 && matched == samples && problems.is_empty();
    let mut detail = format!(
        "{matched} of {samples} samples agree with the VMM's record of their PMI (domain, vCPU, \
         pCPU, CPL, hypervisor, all registers) ({:.1} %)",
        if samples == 0 {
            0.0
        } else {
            100.0 * matched as f64 / samples as f64
        }
    );
    for p in problems {
        detail += "; ";
        detail += &p;
    }
    Check {
        name: "attribution 100 % (each sample = the VMM's record of what ran)".into(),
        passed,
        detail,
    }
}

/// The measured shares of `workload`'s functions in domain `domain` of `report`, in percent of
/// the samples in those functions, with that sample count.
pub fn measured_shares(
    report: &Report,
    domain: u32,
    workload: &Workload,
) -> (Vec<(&'static str, f64)>, u64) {
    let Some(d) = report
        .domains
        .iter()
        .find(|d| d.origin == Origin::Domain(domain))
    else {
        return (Vec::new(), 0);
    };
    let count = |f: &str| {
        d.functions
            .iter()
            .find(|r| r.name == f)
            .map_or(0, |r| r.samples)
    };
    let total: u64 = workload.functions.iter().map(|&(f, _)| count(f)).sum();
    let shares = workload
        .functions
        .iter()
        .map(|&(f, _)| {
            let pct = if total == 0 {
                0.0
            } else {
                100.0 * count(f) as f64 / total as f64
            };
            (f, pct)
        })
        .collect();
    (shares, total)
}

/// The built-in workloads' function shares within `SHARE_TOLERANCE_PP` of their construction
/// (`workloads[i]` runs in domain `i + 1`; None for a user's guest).
pub fn shares(report: &Report, workloads: &[Option<Workload>]) -> Vec<Check> {
    workloads
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Some((i as u32 + 1, (*w)?)))
        .map(|(domain, w)| {
            let (measured, total) = measured_shares(report, domain, &w);
            let mut worst: f64 = 0.0;
            let parts: Vec<String> = measured
                .iter()
                .zip(w.expected_percent())
                .map(|(&(f, got), (_, want))| {
                    worst = worst.max((got - want).abs());
                    format!("{f} {got:.1} % (built {want:.1} %)")
                })
                .collect();
            Check {
                name: format!(
                    "dom{domain} ({}) function shares within ±{SHARE_TOLERANCE_PP} points",
                    w.label
                ),
                passed: total >= MIN_SHARE_SAMPLES && worst <= SHARE_TOLERANCE_PP,
                detail: format!(
                    "{}; {total} samples, worst {worst:.1} points{}",
                    parts.join(", "),
                    if total < MIN_SHARE_SAMPLES {
                        format!(" (fewer than {MIN_SHARE_SAMPLES} samples)")
                    } else {
                        String::new()
                    }
                ),
            }
        })
        .collect()
}

/// A domain's workload functions ranked by samples, most first (ties by name).
fn ranking(report: &Report, domain: u32, workload: &Workload) -> Vec<&'static str> {
    let (mut shares, _) = measured_shares(report, domain, workload);
    shares.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    shares.into_iter().map(|(f, _)| f).collect()
}

/// Seed 002: each built-in workload domain profiled passively (all mode, `passive`) and by
/// itself (self mode, `own`) ranks its functions the same way.
pub fn passive_agrees_with_self(
    passive: &Report,
    own: &Report,
    workloads: &[Option<Workload>],
) -> Vec<Check> {
    workloads
        .iter()
        .enumerate()
        .filter_map(|(i, w)| Some((i as u32 + 1, (*w)?)))
        .map(|(domain, w)| {
            let a = ranking(passive, domain, &w);
            let b = ranking(own, domain, &w);
            let sampled = |r: &Report| measured_shares(r, domain, &w).1 > 0;
            let both_sampled = sampled(passive) && sampled(own);
            Check {
                name: format!(
                    "seed 002: dom{domain} ({}) profiled passively (all mode) and by itself \
                     (self mode) ranks its functions alike",
                    w.label
                ),
                passed: both_sampled && a == b,
                detail: format!("all mode: {}; self mode: {}", a.join(" > "), b.join(" > ")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Shipment;
    use crate::run::{Mode, RunData};
    use std::time::Duration;
    use vpmu::VcpuId;
    use vpmu::abi::Regs;
    use vpmu_machine::{PmiRecord, RunResult};

    const PROFILER: VcpuId = VcpuId { domain: 0, vcpu: 0 };

    fn regs(rip: u64, cpl: u8) -> Regs {
        Regs {
            rip,
            cpl,
            r13: rip ^ 0x5555,
            ..Regs::default()
        }
    }

    fn record(domain: u32, rip: u64, cpl: u8, hypervisor: bool) -> PmiRecord {
        PmiRecord {
            running: VcpuId { domain, vcpu: 0 },
            hypervisor,
            regs: regs(rip, cpl),
            pcpu: 0,
            delivered_to: Some(PROFILER),
            dropped: false,
        }
    }

    fn sample(origin: Origin, rip: u64, user: bool) -> ProfileSample {
        ProfileSample {
            origin,
            vcpu: 0,
            pcpu: 0,
            rip,
            user,
            regs: regs(rip, if user { 3 } else { 0 }),
            shipped_by: 0,
            details: Default::default(),
        }
    }

    fn data(log: Vec<PmiRecord>, samples: Vec<ProfileSample>) -> RunData {
        RunData {
            mode: Mode::All,
            frequency: 1000,
            tsc_khz: 1_000_000,
            period: 1_000_000,
            pcpus: 1,
            vcpus: 1,
            results: vec![
                RunResult {
                    pmi_log: log,
                    ..RunResult::default()
                },
                RunResult::default(),
            ],
            shipments: vec![(
                PROFILER,
                Shipment {
                    samples,
                    ..Shipment::default()
                },
            )],
            work: vec![Vec::new(), Vec::new()],
            wall: Duration::from_secs(1),
        }
    }

    fn log() -> Vec<PmiRecord> {
        vec![
            record(1, 0x1000, 3, false),
            record(0, 0x2000, 0, false),
            record(1, VmmActivityRip::RIP, 0, true),
        ]
    }

    struct VmmActivityRip;
    impl VmmActivityRip {
        const RIP: u64 = vpmu_machine::VmmActivity::RIP_BASE;
    }

    #[test]
    fn attribution_holds_when_every_sample_is_its_record() {
        let samples = vec![
            sample(Origin::Domain(1), 0x1000, true),
            sample(Origin::Domain(0), 0x2000, false),
            sample(Origin::Hypervisor, VmmActivityRip::RIP, false),
        ];
        let check = attribution(&data(log(), samples));
        assert!(check.passed, "{}", check.detail);
        assert!(check.detail.starts_with("3 of 3"));
    }

    #[test]
    fn any_disagreement_fails_attribution() {
        let good = [
            sample(Origin::Domain(1), 0x1000, true),
            sample(Origin::Domain(0), 0x2000, false),
            sample(Origin::Hypervisor, VmmActivityRip::RIP, false),
        ];
        // Wrong domain, wrong RIP, wrong privilege, guest instead of hypervisor.
        let wrong = [
            sample(Origin::Domain(2), 0x1000, true),
            sample(Origin::Domain(1), 0x1001, true),
            sample(Origin::Domain(1), 0x1000, false),
        ];
        for w in wrong {
            let mut s = good.to_vec();
            s[0] = w;
            assert!(!attribution(&data(log(), s)).passed, "{w:?}");
        }
        let mut s = good.to_vec();
        s[2] = sample(Origin::Domain(1), VmmActivityRip::RIP, false);
        assert!(!attribution(&data(log(), s)).passed);
        // The wrong pCPU.
        let mut s = good.to_vec();
        s[0].pcpu = 1;
        assert!(!attribution(&data(log(), s)).passed);
        // One general-purpose register off.
        let mut s = good.to_vec();
        s[1].regs.r13 ^= 1;
        assert!(!attribution(&data(log(), s)).passed);
        // A sample the core never delivered, or one missing.
        let mut extra = good.to_vec();
        extra.push(sample(Origin::Domain(1), 0x1000, true));
        let check = attribution(&data(log(), extra));
        assert!(!check.passed && check.detail.contains("shipped 4 samples"));
        assert!(!attribution(&data(log(), good[..2].to_vec())).passed);
        // Nothing at all is not a pass.
        assert!(!attribution(&data(Vec::new(), Vec::new())).passed);
    }

    /// A report of domain 1 (workload 1) with `deflate` and `checksum` samples.
    fn w1_report(deflate: u64, checksum: u64) -> Report {
        use crate::report::{DomainInfo, RunInfo};
        use vpmu_machine::symbols::Symbols;
        let symbols = Symbols::from_table(vec![
            (0x1000, 0x100, "w1_deflate".into()),
            (0x2000, 0x100, "w1_checksum".into()),
        ]);
        let mut samples = Vec::new();
        samples.extend((0..deflate).map(|_| sample(Origin::Domain(1), 0x1010, true)));
        samples.extend((0..checksum).map(|_| sample(Origin::Domain(1), 0x2010, true)));
        let run = RunInfo {
            mode: "all".into(),
            vendor: "test".into(),
            frequency_hz: 1000,
            duration_s: 1.0,
            tsc_khz: 1,
            pcpus: 1,
            vcpus: 1,
        };
        let domain = DomainInfo {
            origin: Origin::Domain(1),
            name: "work.elf".into(),
            symbols,
            dropped: 0,
        };
        Report::build(run, &samples, &[domain])
    }

    #[test]
    fn shares_within_five_points_and_enough_samples() {
        let w1 = Some(crate::workloads::BUILT_IN[0]);
        // 75 / 25 exactly; 4.9 points off; 5.1 points off; too few samples.
        assert!(shares(&w1_report(750, 250), &[w1])[0].passed);
        assert!(shares(&w1_report(701, 299), &[w1])[0].passed);
        assert!(!shares(&w1_report(699, 301), &[w1])[0].passed);
        let few = &shares(&w1_report(75, 25), &[w1])[0];
        assert!(!few.passed && few.detail.contains("fewer than"));
        // A user's guest (no construction) gets no share check.
        assert!(shares(&w1_report(1, 1), &[None]).is_empty());
    }

    #[test]
    fn seed_002_compares_rankings() {
        let w1 = Some(crate::workloads::BUILT_IN[0]);
        let passive = w1_report(700, 300);
        assert!(passive_agrees_with_self(&passive, &w1_report(760, 240), &[w1])[0].passed);
        let flipped = &passive_agrees_with_self(&passive, &w1_report(300, 700), &[w1])[0];
        assert!(!flipped.passed, "{}", flipped.detail);
        // No samples on either side is no agreement.
        assert!(!passive_agrees_with_self(&w1_report(0, 0), &w1_report(0, 0), &[w1])[0].passed);
    }
}
