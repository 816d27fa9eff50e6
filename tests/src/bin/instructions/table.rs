//! The table: every scenario of both vendors in its own process under callgrind, the core's
//! share of what callgrind counted, the two references of each row (the must-change minimum
//! of MSR accesses and Xen's count for the same scenario, `reference.rs`) and whether the row
//! meets its budget.

use std::fmt::Write as _;
use std::process::Command;

use crate::reference::{budget, minimum, xen};
use crate::{CALIBRATIONS, SCENARIOS, VENDORS, applies};

/// What callgrind counted in one measured run.
struct Counts {
    /// Every instruction collected.
    total: u64,
    /// The harness's own share of them (see `harness_share`).
    harness: u64,
}

/// Runs `vendor`/`scenario` in a child process under callgrind; its instruction counts (with
/// the platform's and the vCPU table's instructions if `with_platform`) and its report.
fn callgrind(
    vendor: &str,
    scenario: &str,
    with_platform: bool,
) -> Result<(Counts, String), String> {
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let out = std::env::temp_dir().join(format!(
        "vpmu-callgrind-{}-{vendor}-{scenario}.out",
        std::process::id()
    ));
    let result = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=*vpmu_bench_measured*",
            "--toggle-collect=*vpmu_bench_off_*",
            "--toggle-collect=*vpmu_bench_on_*",
        ])
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(&me)
        .args(["run", vendor, scenario])
        .args(with_platform.then_some("--with-platform"))
        .output()
        .map_err(|e| format!("cannot run valgrind ({e}): scripts/instructions.sh installs it"))?;
    let stdout = String::from_utf8_lossy(&result.stdout).into_owned();
    if !result.status.success() {
        return Err(format!(
            "{vendor} {scenario}: {}\n{}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    let profile = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let total = profile
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("{vendor} {scenario}: no totals in the callgrind output"));
    let harness = harness_share(&out);
    let _ = std::fs::remove_file(&out);
    Ok((
        Counts {
            total: total?,
            harness: harness.map_err(|e| format!("{vendor} {scenario}: {e}"))?,
        },
        stdout,
    ))
}

/// The instructions of a callgrind profile that are the harness's, by where callgrind's debug
/// information puts them (`callgrind_annotate`, one line per source file and function, inlined
/// code under its own file): every line of this binary's own sources (`instructions/`), and
/// the standard library's lines inlined into the harness's functions (`instructions::…`: its
/// atomics and `Option`s). The core's code inlined into a harness closure stays the core's
/// (its file is the core's), and so does everything the core calls (`memcpy` included); where
/// the two cannot be told apart (standard-library lines inside the closure that runs the
/// core's callback) the lines are counted as the core's.
fn harness_share(profile: &std::path::Path) -> Result<u64, String> {
    // callgrind_annotate prints paths under its working directory relative to it.
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let annotated = Command::new("callgrind_annotate")
        .args(["--inclusive=no", "--threshold=100"])
        .arg(profile)
        .current_dir(here)
        .output()
        .map_err(|e| format!("cannot run callgrind_annotate ({e})"))?;
    if !annotated.status.success() {
        return Err(format!(
            "callgrind_annotate: {}",
            String::from_utf8_lossy(&annotated.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&annotated.stdout);
    let own_sources = here.join("src/bin/instructions");
    let mut harness = 0;
    for line in text.lines() {
        let line = line.trim_start();
        let Some((count, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(count) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        let Some((_, place)) = rest.split_once("%)") else {
            continue;
        };
        let Some((file, function)) = place.trim().split_once(':') else {
            continue;
        };
        let std_source = file.starts_with("/rustc/");
        let harness_function =
            function.starts_with("instructions::") || function.starts_with("<instructions::");
        // The core's callback inlined into an excluded call's closures (three deep: the
        // call's, the platform's visit, `core_callback`'s): its standard-library lines are
        // the core's, so they are counted (at worst with a few of the harness's own).
        let core_callback = function.contains("{{closure}}::{{closure}}::{{closure}}");
        if here.join(file).starts_with(&own_sources)
            || (std_source && harness_function && !core_callback)
        {
            harness += count;
        }
    }
    Ok(harness)
}

fn field(report: &str, name: &str) -> Option<u64> {
    report
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

/// The calibration runs measure nothing but the harness: each must come out at 0 core
/// instructions, which checks `harness_share`'s attribution (an exclusion that leaked, or a
/// harness line counted as the core's, shows here).
fn check_calibration(vendor: &str) -> Result<(), String> {
    for (name, _) in CALIBRATIONS {
        let (counts, _) = callgrind(vendor, name, false)?;
        if counts.total != counts.harness {
            return Err(format!(
                "{vendor} {name}: {} of {} instructions are not attributed to the harness",
                counts.total - counts.harness,
                counts.total
            ));
        }
    }
    Ok(())
}

/// Whether a row meets its budget: its instruction budget (if it has one), the must-change
/// minimum of MSR accesses, no heap allocation; what it misses, if anything.
fn verdict(core: u64, limit: Option<u64>, accesses: u64, minimum: u32, allocations: u64) -> String {
    let mut missed = Vec::new();
    if let Some(limit) = limit.filter(|&l| core > l) {
        missed.push(format!("{core} > {limit} instructions"));
    }
    if accesses != u64::from(minimum) {
        missed.push(format!("{accesses} MSR accesses, minimum {minimum}"));
    }
    if allocations != 0 {
        missed.push(format!("{allocations} allocations"));
    }
    let limit = limit.map_or("MSR = min".to_string(), |l| format!("≤ {l}, MSR = min"));
    if missed.is_empty() {
        format!("{limit}: met")
    } else {
        format!("{limit}: **not met** ({})", missed.join(", "))
    }
}

pub fn table() -> Result<String, String> {
    let mut out = String::new();
    for vendor in VENDORS {
        check_calibration(vendor)?;
    }
    let _ = writeln!(
        out,
        "| scenario | vendor | core instructions | platform calls | MSR accesses | must-change minimum | Xen | heap allocations | budget |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for (name, scenario) in SCENARIOS {
        for vendor in VENDORS {
            if !applies(vendor, scenario) {
                let _ = writeln!(
                    out,
                    "| {name} | {vendor} | – | – | – | – | – | – | – (no fixed counters) |"
                );
                continue;
            }
            let (counts, report) = callgrind(vendor, name, false)?;
            let number =
                |key: &str| field(&report, key).ok_or_else(|| format!("{vendor} {name}: no {key}"));
            let accesses = number("msr_accesses")?;
            let allocations = number("allocations")?;
            let k = number("counters")? as u32;
            let calls = number("platform_calls")?;
            let core = counts.total - counts.harness;
            let least = minimum(vendor, scenario, k);
            let _ = writeln!(
                out,
                "| {name} | {vendor} | {core} | {calls} | {accesses} | {least} | {} | {allocations} | {} |",
                xen(vendor, scenario, k),
                verdict(core, budget(scenario), accesses, least, allocations)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe harness's own instructions are left out by source line (its files and the \
         standard library inlined into its functions); every calibration run measured 0 core \
         instructions."
    );
    Ok(out)
}
