//! The scenarios of the instruction-count benchmark (`src/bin/instructions/`, run under
//! callgrind by `scripts/instructions.sh`) run natively here: each must reach the path it
//! claims to measure (an intercept handled, a switch pair, a PMI delivered through the LVTPC or
//! as a sample, a flush accepted) and allocate nothing on the heap.

use std::process::Command;

#[test]
fn every_scenario_runs_and_allocates_nothing() {
    let bin = env!("CARGO_BIN_EXE_instructions");
    let list = Command::new(bin)
        .arg("list")
        .output()
        .expect("run instructions");
    assert!(list.status.success());
    let scenarios = String::from_utf8(list.stdout).expect("UTF-8");
    assert!(scenarios.lines().count() >= 8, "{scenarios}");
    for vendor in ["intel-v5", "amd-perfmonv2"] {
        for scenario in scenarios.lines() {
            let out = Command::new(bin)
                .args(["run", vendor, scenario])
                .output()
                .expect("run instructions");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{vendor} {scenario}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let field = |name: &str| -> u64 {
                stdout
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                    .unwrap_or_else(|| panic!("{vendor} {scenario}: no {name} in {stdout:?}"))
            };
            assert_eq!(field("allocations"), 0, "{vendor} {scenario}: heap use");
            assert!(field("msr_accesses") > 0, "{vendor} {scenario}: {stdout}");
        }
    }
}
