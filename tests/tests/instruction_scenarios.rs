//! The scenarios of the instruction-count benchmark (`src/bin/instructions/`, run under
//! callgrind by `scripts/instructions.sh`) run natively here, on both vendors. Each scenario
//! checks that it reached the path it claims to measure (an intercept handled, B's counters
//! counting in the both-busy switch pairs, the number of overflowed counters the row names, a
//! catch-up that caught up, a request that crossed pCPUs, ...) and fails otherwise; here every
//! row must also allocate nothing and make exactly its must-change minimum of MSR accesses.

use std::process::{Command, Output};

/// Every row of the table (issues 13 and 27, and the ring's PMI rows), in order.
const ROWS: [&str; 26] = [
    "wrmsr",
    "rdmsr",
    "wrmsr-evtsel",
    "wrmsr-global-enable",
    "wrmsr-global-disable",
    "wrmsr-fixed-ctrl",
    "wrmsr-first-use",
    "wrmsr-catch-up",
    "switch-1",
    "switch-4",
    "switch-all",
    "switch-4-same",
    "switch-4-other",
    "switch-all-both",
    "switch-4-migrated",
    "pmi-lvtpc-1",
    "pmi-lvtpc-3",
    "pmi-lvtpc-all",
    "pmi-sample-1",
    "pmi-sample-3",
    "pmi-sample-all",
    "pmi-ring-1",
    "pmi-ring-all",
    "flush",
    "flush-ctrl",
    "request",
];

fn instructions(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_instructions"))
        .args(args)
        .output()
        .expect("run instructions")
}

fn lines(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn field(stdout: &str, name: &str) -> u64 {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stdout:?}"))
}

#[test]
fn every_row_is_listed() {
    assert_eq!(lines(&instructions(&["list"])), ROWS);
    let amd: Vec<&str> = ROWS
        .into_iter()
        .filter(|r| *r != "wrmsr-fixed-ctrl")
        .collect();
    assert_eq!(lines(&instructions(&["list", "amd-perfmonv2"])), amd);
    assert_eq!(lines(&instructions(&["list", "intel-v5"])), ROWS);
    // AMD has no fixed counters: the row does not run there.
    assert!(
        !instructions(&["run", "amd-perfmonv2", "wrmsr-fixed-ctrl"])
            .status
            .success()
    );
}

#[test]
fn every_scenario_runs_at_the_minimum_and_allocates_nothing() {
    for vendor in ["intel-v5", "amd-perfmonv2"] {
        for scenario in lines(&instructions(&["list", vendor])) {
            let out = instructions(&["run", vendor, &scenario]);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{vendor} {scenario}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(field(&stdout, "allocations"), 0, "{vendor} {scenario}");
            assert_eq!(
                field(&stdout, "msr_accesses"),
                field(&stdout, "minimum"),
                "{vendor} {scenario}: MSR accesses above the must-change minimum"
            );
        }
    }
}

#[test]
fn issue_13_names_still_run() {
    for (alias, row) in [("pmi-lvtpc", "pmi-lvtpc-1"), ("pmi-sample", "pmi-sample-1")] {
        let a = lines(&instructions(&["run", "intel-v5", alias]));
        let r = lines(&instructions(&["run", "intel-v5", row]));
        assert_eq!(a, r);
    }
}
