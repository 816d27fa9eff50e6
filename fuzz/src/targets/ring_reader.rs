//! The sample ring's consumer (ABI 1.4): any data area, positions and `record_max` through
//! `vpmu_abi::RingRecords` (`next_record`), walked until the ring is empty or a record is
//! refused. Nothing panics; every record returned lies inside the data area, starts at the
//! tail modulo the data size, ends at or before `head`, advances the tail by exactly its size
//! (a multiple of 8, at least 8, at most `record_max`), and obeys its kind's rules; a sample or
//! lost record re-encoded with `vpmu_abi`'s encoder gives back exactly the bytes it was read
//! from. The walk never reads more records than the area holds.
//!
//! Input: byte 0 picks the data size (64 << (b % 7): 64 bytes to 4 KiB), bytes 1-8 the tail,
//! bytes 9-16 `head - tail`, bytes 17-20 `record_max` (all little-endian), the rest the data
//! area (cut to the data size, zero-filled when shorter). [`input`] writes this format.

use vpmu_abi::{
    Record, RingRecords, XENPMU_RECORD_LOST, XENPMU_RECORD_MAX, XENPMU_RECORD_SAMPLE,
    XENPMU_RING_SAMPLE_SIZE, append_record, encode_lost, encode_pad, encode_sample,
};

use crate::seeds::Seed;

/// Milestone: a sample record with a non-empty call chain decoded.
pub const SAMPLE_WITH_CHAIN: &str = "ring_reader: a sample with a call chain decoded";
/// Milestone: a lost record decoded.
pub const LOST: &str = "ring_reader: a lost record decoded";
/// Milestone: a PAD skipped, and the record after it read at offset 0.
pub const PAD_WRAPPED: &str = "ring_reader: a PAD skipped and the next record read at offset 0";

/// Bytes before the data area.
const PREFIX: usize = 21;

/// The input bytes for a data area of 64 << `size_code` bytes, positions and `record_max`.
pub fn input(size_code: u8, tail: u64, head: u64, record_max: u32, data: &[u8]) -> Vec<u8> {
    let mut out = vec![size_code];
    out.extend(tail.to_le_bytes());
    out.extend(head.wrapping_sub(tail).to_le_bytes());
    out.extend(record_max.to_le_bytes());
    out.extend(data);
    out
}

fn word<const N: usize>(data: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(bytes) = data.get(at..at + N) {
        out.copy_from_slice(bytes);
    }
    out
}

/// The target.
pub fn run(data: &[u8]) {
    let Some(&size_code) = data.first() else {
        return;
    };
    let data_size = 64usize << (size_code % 7);
    let tail = u64::from_le_bytes(word(data, 1));
    let head = tail.wrapping_add(u64::from_le_bytes(word(data, 9)));
    let record_max = u32::from_le_bytes(word(data, 17));
    let mut area = vec![0u8; data_size];
    let body = data.get(PREFIX..).unwrap_or_default();
    let len = body.len().min(data_size);
    area[..len].copy_from_slice(&body[..len]);

    let mut records = RingRecords::new(&area, record_max, tail, head);
    let mut position = tail;
    let mut after_pad = false;
    let mut steps = 0usize;
    while let Some(Ok(entry)) = records.next() {
        steps += 1;
        assert!(steps <= data_size / 8, "more records than the area holds");
        let size = entry.size;
        assert!(size >= 8 && size % 8 == 0, "record size {size}");
        assert!(
            size as u64 <= u64::from(record_max),
            "record above record_max"
        );
        assert_eq!(
            entry.offset as u64,
            position % data_size as u64,
            "record not at the tail"
        );
        assert!(
            entry.offset + size <= data_size,
            "record past the data area"
        );
        assert!(
            size as u64 <= head.wrapping_sub(position),
            "record past head"
        );
        assert_eq!(
            entry.next_tail,
            position.wrapping_add(size as u64),
            "tail advance"
        );
        let bytes = &area[entry.offset..entry.offset + size];
        if after_pad {
            assert_eq!(entry.offset, 0, "the record after a PAD is at offset 0");
            crate::reached(PAD_WRAPPED);
        }
        after_pad = false;
        match entry.record {
            Record::Sample(sample) => {
                let chain = sample.chain();
                assert_eq!(chain.len(), sample.fixed.chain_len as usize);
                assert_eq!(size, XENPMU_RING_SAMPLE_SIZE + 8 * chain.len());
                assert_eq!(sample.fixed.header.kind, XENPMU_RECORD_SAMPLE);
                let mut again = [0u8; XENPMU_RECORD_MAX];
                let written = encode_sample(&mut again, &sample.fixed, chain)
                    .expect("a decoded sample re-encodes");
                assert_eq!(&again[..written], bytes, "sample re-encoded differently");
                if !chain.is_empty() {
                    crate::reached(SAMPLE_WITH_CHAIN);
                }
            }
            Record::Lost(lost) => {
                assert_eq!(lost.header.kind, XENPMU_RECORD_LOST);
                let mut again = [0u8; 32];
                encode_lost(&mut again, lost.lost, lost.sequence, lost.tsc)
                    .expect("a lost record re-encodes");
                // The encoder writes misc 0; the reader does not check it (a later minor may
                // use it), so compare past it.
                assert_eq!(again[..4], bytes[..4], "lost header re-encoded differently");
                assert_eq!(again[8..], bytes[8..], "lost record re-encoded differently");
                crate::reached(LOST);
            }
            Record::Pad => {
                assert_eq!(entry.offset + size, data_size, "a PAD ends the area");
                after_pad = true;
            }
            Record::Unknown {
                kind,
                size: claimed,
            } => {
                assert!(kind > 3, "kind {kind} is known");
                assert_eq!(usize::from(claimed), size);
            }
        }
        position = entry.next_tail;
    }
    assert_eq!(
        records.tail(),
        position,
        "the walker's tail is the last record's end"
    );
    assert!(
        position.wrapping_sub(tail) <= head.wrapping_sub(tail),
        "the walk went past head"
    );
}

/// The seeds: rings written with `vpmu_abi`'s encoder (samples with chains, lost records, a
/// kind of a later minor, a PAD where the records wrap), read from their tail; and the same
/// rings with one record broken.
pub fn seeds() -> Vec<Seed> {
    let max = XENPMU_RECORD_MAX as u32;
    let mut seeds = Vec::new();
    for (name, size_code, start, chains) in [
        (
            "wrapped-2k",
            5u8,
            0x1_0000_0000u64 - 600,
            [3usize, 64, 0, 17, 33, 64],
        ),
        (
            "wrapped-4k",
            6,
            0u64.wrapping_sub(2048),
            [64, 64, 1, 40, 64, 64],
        ),
    ] {
        let data_size = 64usize << size_code;
        let mut data = vec![0u8; data_size];
        let (mut tail, mut head) = (start, start);
        let mut record = [0u8; XENPMU_RECORD_MAX];
        for (i, chain_len) in chains.into_iter().enumerate() {
            let sequence = 1 + i as u64;
            let chain: Vec<u64> = (0..chain_len as u64)
                .map(|k| 0xffff_8000_0000_0000 | sequence << 16 | k)
                .collect();
            let fixed = vpmu_abi::RingSample {
                sequence,
                tsc: 1000 * sequence,
                overflowed: 1,
                chain_end: 1,
                ..Default::default()
            };
            let records = [
                encode_sample(&mut record, &fixed, &chain).expect("fits"),
                if i == 1 {
                    encode_lost(&mut record[XENPMU_RECORD_MAX - 32..], 2, 9, 9).expect("fits")
                } else {
                    0
                },
            ];
            for (j, size) in records.into_iter().enumerate() {
                if size == 0 {
                    continue;
                }
                let bytes = if j == 0 {
                    &record[..size]
                } else {
                    &record[XENPMU_RECORD_MAX - 32..]
                };
                // The consumer keeps up just enough: it drops the oldest records until the new
                // one fits.
                loop {
                    match append_record(&mut data, tail, head, bytes) {
                        Ok(new_head) => {
                            head = new_head;
                            break;
                        }
                        Err(_) => {
                            let entry = vpmu_abi::next_record(&data, max, tail, head)
                                .expect("a valid ring")
                                .expect("a full ring has records");
                            tail = entry.next_tail;
                        }
                    }
                }
            }
        }
        let mut unknown = [0u8; 24];
        unknown[..8].copy_from_slice(&[7, 0, 24, 0, 0, 0, 0, 0]);
        if let Ok(new_head) = append_record(&mut data, tail, head, &unknown) {
            head = new_head;
        }
        seeds.push(Seed {
            target: "ring_reader",
            name: format!("seed-{name}"),
            bytes: input(size_code, tail, head, max, &data),
        });
        // The same ring with the record at the tail turned into a PAD that stops short.
        let mut broken = data.clone();
        let at = (tail % data_size as u64) as usize;
        encode_pad(&mut broken[at..at + 8]).expect("8 bytes");
        seeds.push(Seed {
            target: "ring_reader",
            name: format!("seed-{name}-short-pad"),
            bytes: input(size_code, tail, head, max, &broken),
        });
    }
    seeds
}
