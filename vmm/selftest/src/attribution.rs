//! The VMM-side checks of the all-mode case (`selftest/all.c`): the profiler's samples, printed as
//! `SAMPLE dom vcpu rip cpl user`, against the VMM's own record of what ran on the pCPU at each
//! PMI (`RunResult::pmi_log`), and the core's PMI conservation for the profiler's vCPU.

use std::fmt::Write as _;

use vpmu::VcpuId;
use vpmu::abi::XENPMU_DOMID_SELF;

use vpmu_machine::{PRIVILEGED_DOMAIN, RunResult};

/// One sample as the profiler read it from its page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    domain: u32,
    vcpu: u32,
    rip: u64,
    cpl: u8,
}

fn parse(console: &str) -> Vec<Sample> {
    console
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("SAMPLE ")?.split_whitespace();
            let domain: u32 = w.next()?.parse().ok()?;
            let vcpu = w.next()?.parse().ok()?;
            let rip = u64::from_str_radix(w.next()?.trim_start_matches("0x"), 16).ok()?;
            let cpl = w.next()?.parse().ok()?;
            Some(Sample {
                // DOMID_SELF: the profiler's own domain.
                domain: if domain == XENPMU_DOMID_SELF {
                    PRIVILEGED_DOMAIN
                } else {
                    domain
                },
                vcpu,
                rip,
                cpl,
            })
        })
        .collect()
}

/// Checks `results` (by domain; domain 0 is the profiler) and returns a summary (lines for
/// people) and each check: its name and whether it passed.
pub fn check_all_mode(results: &[RunResult]) -> (String, Vec<(String, bool)>) {
    let mut summary = String::new();
    let mut out = Vec::new();
    let check = |out: &mut Vec<(String, bool)>, name: &str, ok: bool| {
        out.push((name.to_string(), ok));
    };
    let Some(profiler) = results.first() else {
        check(&mut out, "a profiler result", false);
        return (summary, out);
    };
    let me = VcpuId {
        domain: PRIVILEGED_DOMAIN,
        vcpu: 0,
    };
    let samples = parse(&profiler.console);
    let published: Vec<_> = profiler
        .pmi_log
        .iter()
        .filter(|r| r.delivered_to == Some(me))
        .collect();
    let matched = samples
        .iter()
        .zip(&published)
        .filter(|(s, r)| {
            s.domain == r.running.domain
                && s.vcpu == r.running.vcpu
                && s.rip == r.regs.rip
                && s.cpl == r.regs.cpl
        })
        .count();
    let mut per_domain = vec![0u64; results.len()];
    for r in &published {
        if let Some(n) = per_domain.get_mut(r.running.domain as usize) {
            *n += 1;
        }
    }
    let _ = writeln!(
        summary,
        "VMM: PMIs handled {}, published to the profiler {} (by running domain {:?}), \
         samples the profiler read {}, attributed as recorded {}",
        profiler.pmi_log.len(),
        published.len(),
        per_domain,
        samples.len(),
        matched
    );
    check(
        &mut out,
        "the profiler read every published sample",
        !samples.is_empty() && samples.len() == published.len(),
    );
    check(
        &mut out,
        "every sample's domain, vCPU, RIP and CPL = the VMM's record of that PMI (100 %)",
        !samples.is_empty() && matched == samples.len(),
    );
    match profiler.stats {
        Some(s) => {
            let _ = writeln!(
                summary,
                "VMM: profiler vCPU stats: generated {}, delivered {}, dropped {}, in flight {}",
                s.pmis_generated, s.pmis_delivered, s.pmis_dropped, s.pmis_in_flight
            );
            check(
                &mut out,
                "conservation: generated = delivered + dropped + in flight (profiler vCPU)",
                s.pmis_generated == s.pmis_delivered + s.pmis_dropped + s.pmis_in_flight,
            );
            check(
                &mut out,
                "the core's delivered count = the samples the VMM saw published",
                s.pmis_delivered == published.len() as u64,
            );
        }
        None => check(&mut out, "the profiler vCPU's stats", false),
    }
    let guest_pmis: u64 = results
        .iter()
        .skip(1)
        .filter_map(|r| r.stats)
        .map(|s| s.pmis_generated)
        .sum();
    check(
        &mut out,
        "no PMI routed to an unprivileged domain",
        guest_pmis == 0,
    );
    (summary, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_and_maps_domid_self() {
        let s = parse("x\nSAMPLE 32752 0 0x1234 0 0\nSAMPLE 2 0 0xabc 3 1\nSAMPLE bad\n");
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].domain, s[0].rip, s[0].cpl), (0, 0x1234, 0));
        assert_eq!((s[1].domain, s[1].rip, s[1].cpl), (2, 0xabc, 3));
    }
}
