//! The fuzz targets' code, as plain functions over the input bytes: `fuzz_targets/*.rs` are
//! one-line libFuzzer entry points calling them, and the crate's own tests (`tests/corpus.rs`)
//! run them over the committed corpus without libFuzzer or a sanitizer, checking that every
//! target still reaches its deep path ([`reached`]).
//!
//! * [`shapes`]: the PMUs under test, the forbidden-bit invariants and a guest's PMU accesses.
//! * [`targets`]: one module per fuzz target.
//! * [`seeds`]: the seed corpus, generated from real structures.
#![deny(missing_docs)]

pub mod seeds;
pub mod shapes;
pub mod targets;

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Milestones reached so far in this process, by name, with how often.
static REACHED: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());

/// The environment variable that makes [`reached`] print each milestone the first time it is
/// reached (`VPMU_FUZZ_REACHED=1 cargo fuzz run <target> <corpus> -- -runs=0` shows which deep
/// paths the corpus reaches).
pub const REACHED_ENV: &str = "VPMU_FUZZ_REACHED";

/// Records that an input reached `milestone` (a deep path of a target: a decoded sample, an
/// accepted non-trivial flush, a published record). The first time in a process, prints
/// `reached: <milestone>` to stderr when [`REACHED_ENV`] is set.
pub fn reached(milestone: &'static str) {
    let mut reached = REACHED.lock().unwrap_or_else(|e| e.into_inner());
    let count = reached.entry(milestone).or_insert(0);
    if *count == 0 && std::env::var_os(REACHED_ENV).is_some() {
        eprintln!("reached: {milestone}");
    }
    *count += 1;
}

/// How often `milestone` was reached in this process.
pub fn reached_count(milestone: &str) -> u64 {
    REACHED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(milestone)
        .copied()
        .unwrap_or(0)
}

/// Every target: its name (the cargo-fuzz target and `corpus/<name>/`), its entry point, and
/// the milestones its committed corpus must reach.
pub const TARGETS: &[Target] = &[
    Target {
        name: "flush_verify",
        run: targets::flush_verify::run,
        deep: &[
            targets::flush_verify::ACCEPTED_EDITED,
            targets::flush_verify::REFUSED_EDITED,
        ],
    },
    Target {
        name: "guest_msr",
        run: targets::guest_msr::run,
        deep: &[targets::guest_msr::COUNTING, targets::guest_msr::OVERFLOWED],
    },
    Target {
        name: "page_view",
        run: targets::page_view::run,
        deep: &[targets::page_view::BANKS_READ],
    },
    Target {
        name: "profile_batch",
        run: targets::profile_batch::run,
        deep: &[
            targets::profile_batch::DECODED,
            targets::profile_batch::RING_DECODED,
        ],
    },
    Target {
        name: "coverage_profile",
        run: targets::coverage_profile::run,
        deep: &[targets::coverage_profile::PARSED],
    },
    Target {
        name: "core_world",
        run: targets::core_world::run,
        deep: &[
            targets::core_world::PUBLISHED,
            targets::core_world::MIGRATED,
            targets::core_world::HOSTILE_FLUSH,
            targets::core_world::HOSTILE_RING,
        ],
    },
    Target {
        name: "ring_reader",
        run: targets::ring_reader::run,
        deep: &[
            targets::ring_reader::SAMPLE_WITH_CHAIN,
            targets::ring_reader::LOST,
            targets::ring_reader::PAD_WRAPPED,
        ],
    },
    Target {
        name: "ring_producer",
        run: targets::ring_producer::run,
        deep: &[
            targets::ring_producer::PUBLISHED,
            targets::ring_producer::LOST,
            targets::ring_producer::PAD,
        ],
    },
    Target {
        name: "snapshot_decode",
        run: targets::snapshot_decode::run,
        deep: &[
            targets::snapshot_decode::RESTORED,
            targets::snapshot_decode::RESTORED_CACHED,
            targets::snapshot_decode::RESTORED_RING,
        ],
    },
];

/// A fuzz target.
#[derive(Debug)]
pub struct Target {
    /// The cargo-fuzz target's name, also its corpus directory's.
    pub name: &'static str,
    /// The target's body.
    pub run: fn(&[u8]),
    /// Milestones the committed corpus must reach.
    pub deep: &'static [&'static str],
}
