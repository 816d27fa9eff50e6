//! Call stacks of samples: the sampled function and its callers, symbolized from the sampled
//! domain's own ELF, and their folded form (`dom1;w1_main;w1_deflate 123`), which FlameGraph,
//! inferno and speedscope read.

use std::collections::BTreeMap;

use serde::Serialize;
use vpmu_machine::symbols::Symbols;

use super::sample::{Origin, ProfileSample};

/// The name of a frame no symbol covers.
pub const UNKNOWN: &str = "[unknown]";

/// The suffix of a kernel (CPL0) frame in folded stacks, as FlameGraph's `stackcollapse-perf`
/// marks kernel functions.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// The function names of `sample`'s stack, outermost caller first, the sampled function last:
/// RIP's function, then each return address's (looked up one byte before it, inside the call
/// instruction, so that a call that ends its function is credited to that function).
pub fn frames<'a>(sample: &ProfileSample, symbols: Option<&'a Symbols>) -> Vec<&'a str> {
    let name = |ip: u64| symbols.and_then(|s| s.lookup(ip)).unwrap_or(UNKNOWN);
    let mut out: Vec<&str> = sample
        .details
        .chain
        .addresses()
        .iter()
        .rev()
        .map(|&ret| name(ret.saturating_sub(1)))
        .collect();
    out.push(name(sample.rip));
    out
}

/// Samples of one distinct stack of one domain, user or kernel.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct StackRow {
    /// Whose stack.
    pub origin: Origin,
    /// Taken at CPL3.
    pub user: bool,
    /// Function names, outermost caller first, the sampled function last.
    pub frames: Vec<String>,
    /// Samples with this stack.
    pub samples: u64,
}

impl StackRow {
    /// Whether the stack passes through `caller` into `callee`, `callee` being the sampled
    /// function: `caller` is the frame right above it.
    pub fn is_call(&self, caller: &str, callee: &str) -> bool {
        let n = self.frames.len();
        n >= 2 && self.frames[n - 1] == callee && self.frames[n - 2] == caller
    }

    /// The folded line: `<domain>;<outermost>;...;<sampled> <count>`, kernel frames marked
    /// `_[k]`; `;` in names becomes `:` and white space a blank so a name stays one frame.
    pub fn folded(&self) -> String {
        let mut line = sanitize(&self.origin.tag());
        for f in &self.frames {
            line.push(';');
            line.push_str(&sanitize(f));
            if !self.user {
                line.push_str(KERNEL_SUFFIX);
            }
        }
        line.push(' ');
        line.push_str(&self.samples.to_string());
        line
    }
}

/// Keeps a name a single folded-stack frame: `;` separates frames and line breaks end the
/// record, so neither may survive inside a name.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_whitespace() => ' ',
            c => c,
        })
        .collect()
}

/// Counts the distinct stacks of `samples`, symbolized with `symbols(origin)`; sorted by
/// origin, user before kernel... (the derived order), then most samples first.
pub fn count<'a>(
    samples: &[ProfileSample],
    symbols: impl Fn(Origin) -> Option<&'a Symbols>,
) -> Vec<StackRow> {
    let mut counts: BTreeMap<(Origin, bool, Vec<&str>), u64> = BTreeMap::new();
    for s in samples {
        *counts
            .entry((s.origin, s.user, frames(s, symbols(s.origin))))
            .or_default() += 1;
    }
    let mut rows: Vec<StackRow> = counts
        .into_iter()
        .map(|((origin, user, frames), samples)| StackRow {
            origin,
            user,
            frames: frames.into_iter().map(String::from).collect(),
            samples,
        })
        .collect();
    rows.sort_by(|a, b| {
        (a.origin, !a.user)
            .cmp(&(b.origin, !b.user))
            .then(b.samples.cmp(&a.samples))
            .then_with(|| a.frames.cmp(&b.frames))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{CallChain, ChainEnd, SampleDetails};
    use vpmu::abi::Regs;

    fn symbols() -> Symbols {
        Symbols::from_table(vec![
            (0x1000, 0x100, "w1_main".into()),
            (0x2000, 0x100, "w1_deflate".into()),
            (0x3000, 0x100, "user;return".into()),
        ])
    }

    fn sample(rip: u64, chain: &[u64], user: bool) -> ProfileSample {
        ProfileSample {
            origin: Origin::Domain(1),
            vcpu: 0,
            pcpu: 0,
            rip,
            user,
            regs: Regs::default(),
            shipped_by: 0,
            details: SampleDetails {
                chain: CallChain::new(chain, ChainEnd::Complete).unwrap(),
                ..SampleDetails::default()
            },
        }
    }

    #[test]
    fn frames_are_outermost_first_and_return_addresses_look_one_byte_back() {
        let sym = symbols();
        // 0x1100 is the end of w1_main: a call that ends the function is still w1_main's.
        let s = sample(0x2010, &[0x1100, 0x3004], true);
        assert_eq!(
            frames(&s, Some(&sym)),
            ["user;return", "w1_main", "w1_deflate"]
        );
        assert_eq!(frames(&s, None), [UNKNOWN; 3]);
        assert_eq!(frames(&sample(0x9000, &[], false), Some(&sym)), [UNKNOWN]);
    }

    #[test]
    fn counts_and_folds_stacks() {
        let sym = symbols();
        let samples = [
            sample(0x2010, &[0x1050], true),
            sample(0x2020, &[0x1050], true),
            sample(0x1010, &[], true),
            sample(0x2010, &[0x1050], false),
        ];
        let rows = count(&samples, |_| Some(&sym));
        let folded: Vec<String> = rows.iter().map(StackRow::folded).collect();
        assert_eq!(
            folded,
            [
                "dom1;w1_main;w1_deflate 2",
                "dom1;w1_main 1",
                "dom1;w1_main_[k];w1_deflate_[k] 1",
            ]
        );
        assert!(rows[0].is_call("w1_main", "w1_deflate"));
        assert!(!rows[1].is_call("w1_main", "w1_deflate"));
        let odd = count(&[sample(0x3000, &[], true)], |_| Some(&sym));
        assert_eq!(odd[0].folded(), "dom1;user:return 1");
    }
}
