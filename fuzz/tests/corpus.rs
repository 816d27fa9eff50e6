//! The committed corpus: its seeds are exactly what `vpmu_fuzz::seeds` generates from real
//! structures (run with `VPMU_FUZZ_BLESS=1` to write them after a format change), and every
//! target, run over its whole corpus directory without libFuzzer, reaches each of its deep
//! paths (`Target::deep`). Plain `cargo test`, no nightly, no sanitizer: a target that rots
//! (an input format that no longer reaches the decoder, an invariant that no longer holds on
//! real inputs) fails here.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use vpmu_fuzz::targets::core_world::CoreInput;
use vpmu_fuzz::targets::ring_producer::RingInput;
use vpmu_fuzz::{TARGETS, reached_count, seeds};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    let bless = std::env::var_os("VPMU_FUZZ_BLESS").is_some();
    let seeds = seeds::all();
    for target in TARGETS {
        let dir = corpus(target.name);
        let expected: BTreeSet<&str> = seeds
            .iter()
            .filter(|s| s.target == target.name)
            .map(|s| s.name.as_str())
            .collect();
        assert!(!expected.is_empty(), "{}: no seed generated", target.name);
        if bless {
            fs::create_dir_all(&dir).expect("corpus directory");
            for entry in fs::read_dir(&dir).expect("corpus directory") {
                let path = entry.expect("entry").path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.starts_with("seed-") && !expected.contains(name) {
                    fs::remove_file(&path).expect("stale seed removed");
                }
            }
        }
        let committed: BTreeSet<String> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|name| name.starts_with("seed-"))
            .collect();
        if !bless {
            let committed: BTreeSet<&str> = committed.iter().map(String::as_str).collect();
            assert_eq!(
                committed, expected,
                "{}: committed seeds (VPMU_FUZZ_BLESS=1 rewrites them)",
                target.name
            );
        }
    }
    for seed in &seeds {
        let path = corpus(seed.target).join(&seed.name);
        if bless {
            fs::write(&path, &seed.bytes).expect("seed written");
        }
        let committed = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == seed.bytes,
            "{} differs from the generated seed (VPMU_FUZZ_BLESS=1 rewrites it)",
            path.display()
        );
    }
}

#[test]
fn every_target_reaches_its_deep_paths_over_its_corpus() {
    for target in TARGETS {
        let dir = corpus(target.name);
        let mut inputs = 0;
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            let bytes = fs::read(&path).expect("corpus file");
            (target.run)(&bytes);
            inputs += 1;
        }
        for milestone in target.deep {
            let count = reached_count(milestone);
            println!(
                "{}: {inputs} inputs, {milestone:?} reached {count} times",
                target.name
            );
            assert!(
                count > 0,
                "{}: its corpus never reaches {milestone:?}",
                target.name
            );
        }
    }
}

#[test]
fn core_world_seeds_round_trip_through_the_format() {
    for seed in seeds::all().iter().filter(|s| s.target == "core_world") {
        let input = CoreInput::parse(&seed.bytes).expect("a seed decodes");
        assert_eq!(input.to_bytes(), seed.bytes, "{}", seed.name);
    }
}

#[test]
fn ring_reader_seeds_read_to_head_or_stop_at_their_broken_record() {
    use vpmu_abi::{RingError, RingRecords};
    for seed in seeds::all().iter().filter(|s| s.target == "ring_reader") {
        let word = |at: usize| u64::from_le_bytes(seed.bytes[at..at + 8].try_into().expect("8"));
        let (tail, unread) = (word(1), word(9));
        let record_max = u32::from_le_bytes(seed.bytes[17..21].try_into().expect("4"));
        let data = &seed.bytes[21..];
        let mut records = RingRecords::new(data, record_max, tail, tail.wrapping_add(unread));
        let errors: Vec<RingError> = records.by_ref().filter_map(Result::err).collect();
        if seed.name.ends_with("-short-pad") {
            assert!(
                matches!(errors.as_slice(), [RingError::PadShort { .. }]),
                "{}: {errors:?}",
                seed.name
            );
            assert_eq!(
                records.tail(),
                tail,
                "{}: the first record is the broken one",
                seed.name
            );
        } else {
            assert!(errors.is_empty(), "{}: {errors:?}", seed.name);
            assert_eq!(
                records.tail(),
                tail.wrapping_add(unread),
                "{}: read to head",
                seed.name
            );
        }
    }
}

#[test]
fn ring_producer_seeds_round_trip_through_the_format() {
    for seed in seeds::all().iter().filter(|s| s.target == "ring_producer") {
        let input = RingInput::parse(&seed.bytes).expect("a seed decodes");
        assert_eq!(input.to_bytes(), seed.bytes, "{}", seed.name);
    }
}
