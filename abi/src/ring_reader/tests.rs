//! The reader against the encoder: every record kind round-trips, every refusal is reached
//! with its code, and (proptest) arbitrary streams written across wraps read back exactly,
//! while arbitrary bytes and positions never make the reader panic or return a record outside
//! the data area or beyond `head`.

extern crate std;

use std::vec;
use std::vec::Vec;

use proptest::prelude::*;
use zerocopy::IntoBytes;

use super::*;
use crate::page::{Identity, Regs};
use crate::ring::{XENPMU_RECORD_MAX, XENPMU_RING_MAGIC};
use crate::ring_encode::{EncodeError, append_record, encode_lost, encode_pad, encode_sample};

const RECORD_MAX: u32 = XENPMU_RECORD_MAX as u32;

fn sample(sequence: u64) -> RingSample {
    RingSample {
        header: RecordHeader {
            kind: 0,
            size: 0,
            misc: crate::ring::XENPMU_RECORD_MISC_USER,
        },
        sequence,
        tsc: 1000 + sequence,
        identity: Identity {
            domain_id: 7,
            vcpu_id: 1,
            pcpu_id: 3,
            _pad0: 0,
        },
        overflowed: 1 << 32,
        chain_len: 0,
        chain_end: 2,
        regs: Regs {
            rip: 0xffff_8000_0000_1000 + sequence,
            rsp: 0x7ffe_0000,
            cpl: 3,
            mode: 1,
            ..Regs::default()
        },
    }
}

fn chain(len: usize, seed: u64) -> Vec<u64> {
    (0..len as u64)
        .map(|i| 0x40_0000 + seed * 0x100 + i)
        .collect()
}

fn sample_bytes(sequence: u64, chain_len: usize) -> Vec<u8> {
    let mut out = vec![0u8; XENPMU_RECORD_MAX];
    let size = encode_sample(&mut out, &sample(sequence), &chain(chain_len, sequence)).unwrap();
    out.truncate(size);
    out
}

fn lost_bytes(lost: u64, sequence: u64) -> Vec<u8> {
    let mut out = vec![0u8; 32];
    encode_lost(&mut out, lost, sequence, 77).unwrap();
    out
}

#[test]
fn a_sample_round_trips_with_every_field_and_its_chain() {
    for chain_len in [0, 1, 63, 64] {
        let mut data = vec![0u8; 4096];
        let record = sample_bytes(5, chain_len);
        let head = append_record(&mut data, 0, 0, &record).unwrap();
        assert_eq!(head, 224 + 8 * chain_len as u64);
        let entry = next_record(&data, RECORD_MAX, 0, head).unwrap().unwrap();
        assert_eq!(
            (entry.offset, entry.size, entry.next_tail),
            (0, record.len(), head)
        );
        let Record::Sample(read) = entry.record else {
            panic!("not a sample: {:?}", entry.record)
        };
        let mut expected = sample(5);
        expected.header = RecordHeader {
            kind: XENPMU_RECORD_SAMPLE,
            size: record.len() as u16,
            misc: expected.header.misc,
        };
        expected.chain_len = chain_len as u32;
        assert_eq!(read.fixed, expected);
        assert_eq!(read.chain(), chain(chain_len, 5).as_slice());
        assert_eq!(next_record(&data, RECORD_MAX, head, head), Ok(None));
    }
}

#[test]
fn lost_pad_and_unknown_records_are_returned_as_such() {
    let mut data = vec![0u8; 256];
    let mut head = append_record(&mut data, 0, 0, &lost_bytes(3, 9)).unwrap();
    let mut unknown = [0u8; 16];
    unknown[..8].copy_from_slice(
        RecordHeader {
            kind: 9,
            size: 16,
            misc: 0xabc,
        }
        .as_bytes(),
    );
    head = append_record(&mut data, 0, head, &unknown).unwrap();
    let pad_at = head as usize;
    encode_pad(&mut data[pad_at..]).unwrap();
    head = 256;
    let records: Vec<_> = RingRecords::new(&data, RECORD_MAX, 0, head)
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(records.len(), 3);
    assert_eq!(
        records[0].record,
        Record::Lost(RingLost {
            header: RecordHeader {
                kind: XENPMU_RECORD_LOST,
                size: 32,
                misc: 0
            },
            lost: 3,
            sequence: 9,
            tsc: 77
        })
    );
    assert_eq!(records[1].record, Record::Unknown { kind: 9, size: 16 });
    assert_eq!(
        (records[2].record, records[2].offset, records[2].size),
        (Record::Pad, 48, 208)
    );
    assert_eq!(records[2].next_tail, 256);
}

#[test]
fn append_pads_at_the_end_and_never_overwrites_unread_bytes() {
    let mut data = vec![0u8; 1024];
    let record = sample_bytes(1, 20); // 384 bytes
    let mut head = append_record(&mut data, 0, 0, &record).unwrap();
    head = append_record(&mut data, 0, head, &record).unwrap();
    assert_eq!(head, 768);
    // A third does not fit before the end (256 left): it needs a PAD and 384 at offset 0, and
    // offset 0 is unread until the consumer moves past the first record.
    let before = data.clone();
    assert_eq!(
        append_record(&mut data, 0, head, &record),
        Err(EncodeError::Full {
            need: 640,
            free: 256
        })
    );
    assert_eq!(data, before, "a refused append writes nothing");
    head = append_record(&mut data, 384, head, &record).unwrap();
    assert_eq!(head, 768 + 256 + 384);
    let kinds: Vec<_> = RingRecords::new(&data, RECORD_MAX, 384, head)
        .map(|r| r.map(|e| (e.offset, e.size, matches!(e.record, Record::Pad))))
        .collect();
    assert_eq!(
        kinds,
        [
            Ok((384, 384, false)),
            Ok((768, 256, true)),
            Ok((0, 384, false))
        ]
    );
}

#[test]
fn encoders_refuse_what_they_cannot_write() {
    let mut small = [0u8; 100];
    assert_eq!(
        encode_sample(&mut small, &sample(1), &[]),
        Err(EncodeError::TooSmall {
            need: 224,
            have: 100
        })
    );
    let mut out = [0u8; 1024];
    assert_eq!(
        encode_sample(&mut out, &sample(1), &[0; 65]),
        Err(EncodeError::ChainTooLong { len: 65 })
    );
    assert_eq!(
        encode_lost(&mut small[..31], 1, 1, 1),
        Err(EncodeError::TooSmall { need: 32, have: 31 })
    );
    assert_eq!(
        encode_pad(&mut small[..4]),
        Err(EncodeError::BadSize { size: 4 })
    );
    assert_eq!(
        encode_pad(&mut small[..12]),
        Err(EncodeError::BadSize { size: 12 })
    );
    let mut data = [0u8; 64];
    assert_eq!(
        append_record(&mut data[..48], 0, 0, &[1; 8]),
        Err(EncodeError::BadRing)
    );
    assert_eq!(
        append_record(&mut data, 8, 0, &[1; 8]),
        Err(EncodeError::BadRing)
    );
    assert_eq!(
        append_record(&mut data, 0, 4, &[1; 8]),
        Err(EncodeError::BadRing)
    );
    assert_eq!(
        append_record(&mut data, 0, 0, &[1; 12]),
        Err(EncodeError::BadSize { size: 12 })
    );
    assert_eq!(
        append_record(&mut data, 0, 0, &[1; 72]),
        Err(EncodeError::TooSmall { need: 72, have: 64 })
    );
    assert_eq!(
        append_record(&mut data, 0, 8, &[1; 64]),
        Err(EncodeError::Full {
            need: 120,
            free: 56
        })
    );
}

/// A data area of `size` bytes holding one record header at offset `at`, and for samples the
/// chain length word.
fn with_header(size: usize, at: usize, kind: u16, record_size: u16, chain_len: u32) -> Vec<u8> {
    let mut data = vec![0u8; size];
    let header = RecordHeader {
        kind,
        size: record_size,
        misc: 0,
    };
    data[at..at + 8].copy_from_slice(header.as_bytes());
    if kind == XENPMU_RECORD_SAMPLE && at + 52 <= size {
        data[at + 48..at + 52].copy_from_slice(&chain_len.to_le_bytes());
    }
    data
}

#[test]
fn every_refusal_is_reached_with_its_code() {
    let ok = with_header(1024, 0, XENPMU_RECORD_LOST, 32, 0);
    let cases: Vec<(Vec<u8>, u32, u64, u64, u32)> = vec![
        (vec![0; 1000], RECORD_MAX, 0, 8, XENPMU_CHECK_RING_GEOMETRY),
        (vec![0; 4], RECORD_MAX, 0, 8, XENPMU_CHECK_RING_GEOMETRY),
        (
            vec![0; 2 << 20],
            RECORD_MAX,
            0,
            8,
            XENPMU_CHECK_RING_GEOMETRY,
        ),
        (ok.clone(), RECORD_MAX, 4, 36, XENPMU_CHECK_RING_MISALIGNED),
        (ok.clone(), RECORD_MAX, 0, 36, XENPMU_CHECK_RING_MISALIGNED),
        (ok.clone(), RECORD_MAX, 4, 4, XENPMU_CHECK_RING_MISALIGNED),
        (ok.clone(), RECORD_MAX, 64, 32, XENPMU_CHECK_RING_TAIL_AHEAD),
        (ok.clone(), RECORD_MAX, 8, 0, XENPMU_CHECK_RING_TAIL_AHEAD),
        (
            ok.clone(),
            RECORD_MAX,
            0,
            1032,
            XENPMU_CHECK_RING_TAIL_BEHIND,
        ),
        (
            ok.clone(),
            RECORD_MAX,
            0,
            1 << 62,
            XENPMU_CHECK_RING_TAIL_BEHIND,
        ),
        (
            vec![0; 1024],
            RECORD_MAX,
            0,
            64,
            XENPMU_CHECK_RECORD_KIND_ZERO,
        ),
        (
            with_header(1024, 0, 1, 36, 0),
            RECORD_MAX,
            0,
            64,
            XENPMU_CHECK_RECORD_SIZE_UNALIGNED,
        ),
        (
            with_header(1024, 0, 2, 0, 0),
            RECORD_MAX,
            0,
            64,
            XENPMU_CHECK_RECORD_TOO_SMALL,
        ),
        (
            with_header(1024, 0, 2, 744, 0),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_RECORD_TOO_LARGE,
        ),
        (
            with_header(1024, 0, 5, 40, 0),
            32,
            0,
            64,
            XENPMU_CHECK_RECORD_TOO_LARGE,
        ),
        (
            with_header(1024, 1000, 2, 32, 0),
            RECORD_MAX,
            1000,
            1032,
            XENPMU_CHECK_RECORD_PAST_END,
        ),
        (
            with_header(1024, 0, 2, 32, 0),
            RECORD_MAX,
            0,
            24,
            XENPMU_CHECK_RECORD_PAST_HEAD,
        ),
        (
            with_header(1024, 0, 1, 736, 65),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_SAMPLE_CHAIN_LEN,
        ),
        (
            with_header(1024, 0, 1, 232, 2),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_SAMPLE_SIZE,
        ),
        (
            with_header(1024, 0, 1, 216, 0),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_SAMPLE_SIZE,
        ),
        (
            with_header(1024, 0, 2, 40, 0),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_LOST_SIZE,
        ),
        (
            with_header(1024, 0, 2, 24, 0),
            RECORD_MAX,
            0,
            1024,
            XENPMU_CHECK_LOST_SIZE,
        ),
        (
            with_header(1024, 512, 3, 256, 0),
            RECORD_MAX,
            512,
            1024,
            XENPMU_CHECK_PAD_SHORT,
        ),
    ];
    for (i, (data, record_max, tail, head, code)) in cases.iter().enumerate() {
        let result = next_record(data, *record_max, *tail, *head);
        assert_eq!(
            result.map_err(|e| e.code()),
            Err(*code),
            "case {i}: tail {tail} head {head}"
        );
    }
    // The accepted neighbours of the refusals.
    assert!(next_record(&ok, RECORD_MAX, 0, 32).unwrap().is_some());
    assert!(next_record(&ok, RECORD_MAX, 0, 1024).unwrap().is_some());
    let pad = with_header(1024, 512, 3, 512, 0);
    assert_eq!(
        next_record(&pad, RECORD_MAX, 512, 1024)
            .unwrap()
            .unwrap()
            .record,
        Record::Pad
    );
    // Wrapping positions: a tail just below 2^64 reads the record at its offset.
    let tail = 0u64.wrapping_sub(1024);
    assert_eq!(
        next_record(&ok, RECORD_MAX, tail, tail.wrapping_add(32))
            .unwrap()
            .unwrap()
            .next_tail,
        tail.wrapping_add(32)
    );
}

fn good_info() -> RingInfo {
    RingInfo {
        magic: XENPMU_RING_MAGIC,
        version_major: 1,
        version_minor: 4,
        data_offset: 4096,
        data_size: 8192,
        record_max: RECORD_MAX,
        wakeup_bytes: 4096,
        tsc_khz: 2_000_000,
        _reserved0: [0; 4],
    }
}

#[test]
fn ring_info_is_checked_in_order() {
    assert_eq!(check_ring_info(&good_info()), Ok(()));
    type Edit = (fn(&mut RingInfo), Option<u32>);
    let edits: [Edit; 17] = [
        (|i| i.magic = 0, Some(XENPMU_CHECK_RING_BAD_MAGIC)),
        (|i| i.version_major = 2, Some(XENPMU_CHECK_RING_VERSION)),
        (|i| i.version_minor = 3, Some(XENPMU_CHECK_RING_VERSION)),
        (|i| i.version_minor = 9, None),
        (
            |i| i.data_offset = 8192,
            Some(XENPMU_CHECK_RING_DATA_OFFSET),
        ),
        (|i| i.data_size = 12288, Some(XENPMU_CHECK_RING_DATA_SIZE)),
        (|i| i.data_size = 2048, Some(XENPMU_CHECK_RING_DATA_SIZE)),
        (|i| i.data_size = 2 << 20, Some(XENPMU_CHECK_RING_DATA_SIZE)),
        (|i| i.data_size = 1 << 20, None),
        (|i| i.record_max = 24, Some(XENPMU_CHECK_RING_RECORD_MAX)),
        (|i| i.record_max = 740, Some(XENPMU_CHECK_RING_RECORD_MAX)),
        (|i| i.record_max = 65536, Some(XENPMU_CHECK_RING_RECORD_MAX)),
        (|i| i.record_max = 8200, Some(XENPMU_CHECK_RING_RECORD_MAX)),
        (|i| i.record_max = 32, None),
        (|i| i.wakeup_bytes = 0, Some(XENPMU_CHECK_RING_WAKEUP)),
        (|i| i.wakeup_bytes = 8193, Some(XENPMU_CHECK_RING_WAKEUP)),
        (|i| i.wakeup_bytes = 8192, None),
    ];
    for (i, (edit, code)) in edits.iter().enumerate() {
        let mut info = good_info();
        edit(&mut info);
        assert_eq!(
            check_ring_info(&info).map_err(|e| e.code()),
            code.map_or(Ok(()), Err),
            "edit {i}"
        );
    }
    // Magic before version before everything else.
    let mut info = good_info();
    (info.magic, info.version_major, info.data_offset) = (1, 9, 0);
    assert_eq!(
        check_ring_info(&info).unwrap_err().errno(),
        -crate::XENPMU_EPROTONOSUPPORT
    );
    info.magic = XENPMU_RING_MAGIC;
    assert_eq!(
        check_ring_info(&info).map_err(|e| e.code()),
        Err(XENPMU_CHECK_RING_VERSION)
    );
    info.version_major = 1;
    let error = check_ring_info(&info).unwrap_err();
    assert_eq!(
        (error.code(), error.errno()),
        (XENPMU_CHECK_RING_DATA_OFFSET, -crate::XENPMU_EINVAL)
    );
}

/// One record a proptest stream writes: a sample with a chain of the given length, or a lost
/// record.
#[derive(Clone, Debug)]
enum Written {
    Sample(usize),
    Lost(u64),
}

fn written() -> impl Strategy<Value = Written> {
    prop_oneof![
        4 => (0usize..=64).prop_map(Written::Sample),
        1 => (1u64..1000).prop_map(Written::Lost),
    ]
}

// proptest's default configuration: 256 cases, or PROPTEST_CASES.
proptest! {
    /// A producer appends a stream across many wraps while a consumer reads at random points:
    /// the consumer reads back exactly the stream, in order, PADs only at the end of the area.
    #[test]
    fn streams_written_across_wraps_read_back_exactly(
        pages_log2 in 0u32..3,
        start in prop_oneof![Just(0u64), Just(0u64.wrapping_sub(4096)), (0u64..1 << 40).prop_map(|p| p * 8)],
        stream in proptest::collection::vec((written(), any::<bool>()), 1..120),
    ) {
        let mut data = vec![0u8; 1024 << pages_log2];
        let (mut tail, mut head) = (start, start);
        let mut pending: std::collections::VecDeque<(Written, u64)> = Default::default();
        let mut sequence = 0u64;
        let check_read = |tail: &mut u64, head: u64, pending: &mut std::collections::VecDeque<(Written, u64)>, data: &[u8]| -> Result<(), TestCaseError> {
            let mut records = RingRecords::new(data, RECORD_MAX, *tail, head);
            for entry in records.by_ref() {
                let entry = entry.map_err(|e| TestCaseError::fail(std::format!("{e}")))?;
                prop_assert!(entry.offset + entry.size <= data.len());
                if entry.record == Record::Pad {
                    prop_assert_eq!(entry.offset + entry.size, data.len());
                    continue;
                }
                let (expected, seq) = pending.pop_front().expect("a record was written");
                match (expected, entry.record) {
                    (Written::Sample(len), Record::Sample(s)) => {
                        prop_assert_eq!(s.fixed.sequence, seq);
                        let expected_chain = chain(len, seq);
                        prop_assert_eq!(s.chain(), expected_chain.as_slice());
                        prop_assert_eq!(s.fixed.regs, sample(seq).regs);
                    }
                    (Written::Lost(n), Record::Lost(l)) => prop_assert_eq!((l.lost, l.sequence), (n, seq)),
                    (w, r) => prop_assert!(false, "wrote {:?}, read {:?}", w, r),
                }
            }
            prop_assert_eq!(records.tail(), head);
            *tail = head;
            Ok(())
        };
        for (record, consume) in stream {
            sequence += 1;
            let bytes = match record {
                Written::Sample(len) => sample_bytes(sequence, len),
                Written::Lost(n) => lost_bytes(n, sequence),
            };
            match append_record(&mut data, tail, head, &bytes) {
                Ok(new_head) => {
                    head = new_head;
                    pending.push_back((record, sequence));
                }
                Err(EncodeError::Full { .. }) => {}
                Err(e) => prop_assert!(false, "append: {}", e),
            }
            if consume {
                check_read(&mut tail, head, &mut pending, &data)?;
            }
        }
        check_read(&mut tail, head, &mut pending, &data)?;
        prop_assert!(pending.is_empty());
    }

    /// Whatever the bytes, positions and record_max, the reader does not panic, and a record
    /// it returns lies inside the data area and before head, with the tail advanced by its size.
    #[test]
    fn arbitrary_rings_never_panic_nor_escape_the_area(
        size_log2 in 3u32..12,
        // Random words, and words that look like record headers (kinds 0-5, sizes multiples of
        // 8) and chain lengths, so that records decode as well as fail.
        words in proptest::collection::vec(
            prop_oneof![any::<u64>(), (0u64..6, 0u64..140).prop_map(|(k, s)| k | (8 * s) << 16), 0u64..80],
            512),
        tail in prop_oneof![any::<u64>(), (0u64..600).prop_map(|t| t * 8)],
        ahead in prop_oneof![any::<u64>(), (0u64..600).prop_map(|d| d * 8)],
        record_max in prop_oneof![any::<u32>(), Just(RECORD_MAX)],
    ) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let data = &bytes[..1 << size_log2];
        let head = tail.wrapping_add(ahead);
        let mut position = tail;
        for (steps, entry) in RingRecords::new(data, record_max, tail, head).enumerate() {
            prop_assert!(steps <= data.len() / 8, "more records than the area holds");
            let Ok(entry) = entry else { break };
            prop_assert!(entry.size >= 8 && entry.size % 8 == 0);
            prop_assert!(entry.offset + entry.size <= data.len());
            prop_assert_eq!(entry.offset as u64, position % data.len() as u64);
            prop_assert!(entry.size as u64 <= head.wrapping_sub(position));
            prop_assert_eq!(entry.next_tail, position.wrapping_add(entry.size as u64));
            prop_assert!(entry.size as u32 <= record_max);
            position = entry.next_tail;
        }
    }
}
