//! The table: every scenario of both vendors in its own process under callgrind, the core's
//! share of what callgrind counted, and the two references of each row (the must-change
//! minimum of MSR accesses and Xen's count for the same scenario).

use std::fmt::Write as _;
use std::process::Command;

use crate::{CALIBRATIONS, SCENARIOS, Scenario, VENDORS};

/// The PMU geometry the references are computed from.
struct Geometry {
    gp: u32,
    fixed: u32,
}

fn geometry(vendor: &str) -> Geometry {
    match vendor {
        // intel_v5(): 8 GP, 4 fixed counters; amd_v2(): 6 counters.
        "intel-v5" => Geometry { gp: 8, fixed: 4 },
        _ => Geometry { gp: 6, fixed: 0 },
    }
}

/// The fewest MSR accesses the scenario can take on a PMU with a global control (both shapes
/// here), as docs and the README derive them.
fn minimum(scenario: Scenario, k: u32) -> u32 {
    match scenario {
        Scenario::Wrmsr | Scenario::Rdmsr | Scenario::CalibrateAccess => 1,
        Scenario::CalibrateEmpty
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback => 0,
        // Stop (global control), overflow status, read each used counter; re-enable.
        Scenario::SwitchPair(_) => k + 3,
        // Read the overflow status, acknowledge it.
        Scenario::PmiLvtpc => 2,
        // Status, acknowledge, stop, read the used counters.
        Scenario::PmiSample => k + 3,
        // Write the re-armed counter, re-enable.
        Scenario::Flush => 2,
    }
}

/// What Xen's VPMU (xen/arch/x86/cpu/vpmu_intel.c, vpmu_amd.c, staging as of 2024) does for the
/// scenario on an HVM guest, counted from core2_vpmu_save/__core2_vpmu_load and
/// amd_vpmu_save/context_load: it saves and reloads every counter whatever is in use.
fn xen(vendor: &str, scenario: Scenario) -> String {
    let g = geometry(vendor);
    let intel = vendor.starts_with("intel");
    let n = match scenario {
        Scenario::Wrmsr | Scenario::Rdmsr | Scenario::CalibrateAccess => 1,
        Scenario::CalibrateEmpty
        | Scenario::CalibratePlatformCall
        | Scenario::CalibrateCallback => 0,
        // Intel: save reads F fixed + A (counter, event select) pairs; load writes them and
        // FIXED_CTR_CTRL (GLOBAL_CTRL travels in the VMCS). AMD: save stops every control and
        // reads every counter; load writes every counter and control.
        Scenario::SwitchPair(_) if intel => 2 * g.fixed + 4 * g.gp + 1,
        Scenario::SwitchPair(_) => 4 * g.gp,
        // core2_vpmu_do_interrupt: read GLOBAL_STATUS, write GLOBAL_OVF_CTRL.
        Scenario::PmiLvtpc if intel => 2,
        Scenario::PmiLvtpc => return "– (no PerfMonV2)".into(),
        // All mode: the interrupt, then arch_vpmu_save(to_guest) of the whole bank.
        Scenario::PmiSample if intel => 2 + g.fixed + 2 * g.gp,
        Scenario::PmiSample => return "– (no PerfMonV2)".into(),
        // XENPMU_OP_FLUSH: vpmu_load(from_guest) rewrites the whole bank.
        Scenario::Flush if intel => g.fixed + 2 * g.gp + 1,
        Scenario::Flush => return "– (no PerfMonV2)".into(),
    };
    n.to_string()
}

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

pub fn table() -> Result<String, String> {
    let mut out = String::new();
    for vendor in VENDORS {
        check_calibration(vendor)?;
    }
    let _ = writeln!(
        out,
        "| scenario | vendor | core instructions | platform calls | MSR accesses | must-change minimum | Xen | heap allocations |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for (name, scenario) in SCENARIOS {
        for vendor in VENDORS {
            let (counts, report) = callgrind(vendor, name, false)?;
            let number =
                |key: &str| field(&report, key).ok_or_else(|| format!("{vendor} {name}: no {key}"));
            let accesses = number("msr_accesses")?;
            let allocations = number("allocations")?;
            let k = number("counters")? as u32;
            let calls = number("platform_calls")?;
            let core = counts.total - counts.harness;
            let _ = writeln!(
                out,
                "| {name} | {vendor} | {core} | {calls} | {accesses} | {} | {} | {allocations} |",
                minimum(scenario, k),
                xen(vendor, scenario)
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThe harness's own instructions are left out by source (its files and the standard \
         library inlined into its functions); every calibration run measured 0 core instructions."
    );
    Ok(out)
}
