//! The built-in workloads of `profile/work_loops.S` and their time shares by construction: each
//! function is the same `dec; jnz` loop run for a number of units, so its share of a round is
//! its units over the round's units (the loop's own instructions are ~0.01 %).
//!
//! The stacks are known too: every function is called from its workload's main (`w1_main`),
//! which builds a frame-pointer frame like each function, so a sample in `w1_deflate` has the
//! stack `w1_main → w1_deflate`, and that stack carries the function's share
//! (`expected_stacks`). Measured on /dev/kvm (default run, 5 s): every user sample of the
//! workloads' functions had its complete chain, 100 % of them with their main as caller.

/// One built-in workload.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Its number in `profile_config.workload`.
    pub number: u32,
    /// A short label for reports.
    pub label: &'static str,
    /// The function that calls the others, once each per round.
    pub main: &'static str,
    /// Its functions and their units per round.
    pub functions: &'static [(&'static str, u32)],
}

impl Workload {
    /// Each function's expected share of the workload's time, in percent.
    pub fn expected_percent(&self) -> Vec<(&'static str, f64)> {
        let total: u32 = self.functions.iter().map(|&(_, u)| u).sum();
        self.functions
            .iter()
            .map(|&(f, u)| (f, 100.0 * f64::from(u) / f64::from(total)))
            .collect()
    }

    /// Each function's stack (its main, then the function) and its expected share of the
    /// samples in the workload's functions, in percent.
    pub fn expected_stacks(&self) -> Vec<([&'static str; 2], f64)> {
        self.expected_percent()
            .into_iter()
            .map(|(f, pct)| ([self.main, f], pct))
            .collect()
    }
}

/// The built-in workloads, one per workload domain (domain `i + 1` runs `BUILT_IN[i]`).
pub const BUILT_IN: [Workload; 3] = [
    Workload {
        number: 1,
        main: "w1_main",
        label: "compressor",
        functions: &[("w1_deflate", 3), ("w1_checksum", 1)],
    },
    Workload {
        number: 2,
        main: "w2_main",
        label: "web server",
        functions: &[("w2_parse", 1), ("w2_lookup", 3), ("w2_render", 2)],
    },
    Workload {
        number: 3,
        main: "w3_main",
        label: "database",
        functions: &[("w3_scan", 1), ("w3_sort", 2), ("w3_merge", 4)],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use vpmu_machine::symbols::Symbols;

    #[test]
    fn shares_are_distinct_and_sum_to_100() {
        for w in BUILT_IN {
            let shares = w.expected_percent();
            let sum: f64 = shares.iter().map(|s| s.1).sum();
            assert!((sum - 100.0).abs() < 1e-9);
            for (i, a) in shares.iter().enumerate() {
                for b in &shares[i + 1..] {
                    assert!((a.1 - b.1).abs() > 5.0, "{a:?} vs {b:?}");
                }
            }
        }
    }

    #[test]
    fn stacks_go_through_main() {
        let w = BUILT_IN[0];
        let stacks = w.expected_stacks();
        assert_eq!(stacks[0].0, ["w1_main", "w1_deflate"]);
        assert!((stacks[0].1 - 75.0).abs() < 1e-9);
    }

    #[test]
    fn every_function_is_in_the_work_image() {
        let symbols = Symbols::from_elf(vpmu_guests::WORK).expect("work.elf symbols");
        for w in BUILT_IN {
            for &f in w.functions.iter().map(|(f, _)| f).chain([&w.main]) {
                assert!(
                    (0..0x40_0000u64)
                        .step_by(16)
                        .any(|ip| symbols.lookup(ip) == Some(f)),
                    "{f} not in work.elf"
                );
            }
        }
    }
}
