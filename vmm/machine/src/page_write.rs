//! Writing the core's changes to a shared page back into guest memory: whole 8-byte words,
//! each with one single-copy-atomic store, `pmu_flags` last and released (docs/abi.md
//! "Memory ordering").

use std::sync::atomic::Ordering;

use vpmu::abi::Page;

use crate::kvm::GuestMem;

/// The page offset of the 8-byte word that holds `pmu_flags` (and `XENPMU_FLAG_CACHED`).
const FLAGS_WORD: usize = std::mem::offset_of!(Page, pmu_flags);

/// Writes back to the page at `gpa` the 8-byte words where `after` differs from `before`
/// (copies of the same page), as docs/abi.md "Memory ordering" promises: each word with one
/// single-copy-atomic 64-bit store (every `uint64_t` field is 8-aligned, so a 64-bit reader
/// never sees one torn, e.g. `dropped_samples` bumped while it reads), and the word of
/// `pmu_flags` last, with release ordering, so that a reader who sees `XENPMU_FLAG_CACHED`
/// change (an acquire load) sees every other word of the same update. Fields smaller than a
/// word share it only with fields the same writer owns at that time.
pub(crate) fn write_changes(mem: &GuestMem, gpa: u64, before: &[u8], after: &[u8]) {
    write_words(before, after, |offset, word, order| {
        // Inside RAM: the page was just read from there.
        let _ = mem.store_u64(gpa + offset as u64, word, order);
    });
}

/// The stores `write_changes` makes, in order: `(offset, word, ordering)` for each changed
/// 8-byte word, the flags word last and released.
fn write_words(before: &[u8], after: &[u8], mut store: impl FnMut(usize, u64, Ordering)) {
    let word = |bytes: &[u8], at: usize| {
        bytes
            .get(at..at + 8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
    };
    let mut flags = None;
    for at in (0..after.len()).step_by(8) {
        let Some(new) = word(after, at) else {
            break;
        };
        if word(before, at) == Some(new) {
            continue;
        }
        if at == FLAGS_WORD {
            flags = Some(new);
        } else {
            store(at, new, Ordering::Relaxed);
        }
    }
    if let Some(new) = flags {
        store(FLAGS_WORD, new, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use vpmu::abi::XENPMU_PAGE_SIZE;

    const DROPPED: usize = std::mem::offset_of!(Page, dropped_samples);

    #[test]
    fn changed_words_are_stored_whole_and_the_flags_word_last() {
        let before = vec![0u8; XENPMU_PAGE_SIZE];
        let mut after = before.clone();
        // A sample: identity (16), flags (32), a register (48), one byte of the vendor area
        // (259) and the sequence (1296).
        after[16] = 1;
        after[FLAGS_WORD] = 1;
        after[48 + 3] = 0xaa;
        after[259] = 7;
        after[1296] = 9;
        let mut stores = Vec::new();
        write_words(&before, &after, |at, word, order| {
            stores.push((at, word, order))
        });
        let offsets: Vec<usize> = stores.iter().map(|s| s.0).collect();
        assert_eq!(offsets, [16, 48, 256, 1296, FLAGS_WORD]);
        assert!(stores.iter().all(|s| s.0 % 8 == 0));
        assert_eq!(stores[2].1, 7 << 24, "the whole word, not the one byte");
        let orders: Vec<Ordering> = stores.iter().map(|s| s.2).collect();
        assert_eq!(orders[..4], [Ordering::Relaxed; 4]);
        assert_eq!(orders[4], Ordering::Release);
        // Nothing changed: nothing stored.
        write_words(&before, &before, |at, _, _| panic!("stored {at}"));
    }

    /// A reader on another thread loading `dropped_samples` with one 64-bit load (as a 64-bit
    /// guest's READ_ONCE does) while the VMM bumps it across carries: it sees the old or the
    /// new value, never a mix of the two (a byte-wise copy of the changed bytes tears).
    #[test]
    fn a_64_bit_reader_never_sees_dropped_samples_torn() {
        let mem = GuestMem::new(2 * 4096).expect("memory");
        let gpa = 4096u64;
        let page_bytes = XENPMU_PAGE_SIZE;
        let values = [
            0x00ff_ffffu64,
            0x0100_0000,
            0x0000_ffff_ffff_ffff,
            0x0001_0000_0000_0000,
        ];
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut torn = 0u64;
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let v = mem
                        .load_u64(gpa + DROPPED as u64, Ordering::Relaxed)
                        .unwrap();
                    if v != 0 && !values.contains(&v) {
                        torn += 1;
                    }
                    reads += 1;
                }
                (torn, reads)
            });
            let mut before = vec![0u8; page_bytes];
            for i in 0..50_000usize {
                let mut after = before.clone();
                let v = values[i % values.len()];
                after[DROPPED..DROPPED + 8].copy_from_slice(&v.to_le_bytes());
                write_changes(&mem, gpa, &before, &after);
                before = after;
            }
            stop.store(true, Ordering::Relaxed);
            let (torn, reads) = reader.join().expect("reader");
            assert!(reads > 0);
            assert_eq!(
                torn, 0,
                "{torn} of {reads} reads saw a torn dropped_samples"
            );
        });
    }
}
