//! The byte layout on its own: every field of a full snapshot survives an encode and a
//! decode, each part of the layout is where docs/snapshot.md says, and what the decoder
//! refuses it refuses for the documented reason.

use super::codec::reseal;
use super::*;
use crate::backend::Vendor;
use crate::ring::ProducerCounters;

/// A snapshot with every part present and every field distinct and non-zero.
fn full() -> VcpuSnapshot {
    let mut registers = Registers::new();
    for i in 0..MAX_REGISTERS as u32 {
        let register = if i % 7 == 6 {
            SnapshotRegister::state(i, 0x0101_0101_0101_0101 * u64::from(i))
        } else {
            SnapshotRegister::msr(0xc000_0000 + i, u64::MAX - u64::from(i))
        };
        registers.push(register).expect("room");
    }
    assert!(!registers.overflowed());
    let mut overfull = registers;
    assert_eq!(
        overfull.push(SnapshotRegister::msr(1, 1)),
        Err(RegistersFull)
    );
    assert!(overfull.overflowed() && overfull.len() == MAX_REGISTERS);
    VcpuSnapshot {
        shape: PmuCapabilities {
            vendor: Vendor::Amd,
            version: 2,
            gp_counters: 6,
            gp_width: 48,
            fixed_counters: 0b1011,
            fixed_width: 40,
            global_ctrl: true,
            full_width_writes: true,
        },
        mode: Mode::Hypervisor,
        features: 0x5,
        state: SnapshotState::SampleCached,
        registers,
        pending_pmi: Some(CounterSet(0x3_0000_0005)),
        page_lvtpc_masked: true,
        page: Some(PageRegistration {
            gfn: 0x1234_5678,
            samples: 99,
            chain_written: 17,
        }),
        ring: Some(RingRegistration {
            gfn: 0x9999,
            data_pages: 8,
            wakeup_bytes: 4096,
            max_latency_us: 250,
            period_gp: core::array::from_fn(|i| 1000 + i as u64),
            period_fixed: core::array::from_fn(|i| 2000 + i as u64),
            head: 0x10_0008,
            counters: ProducerCounters {
                records: 1,
                lost: 2,
                withheld: 3,
                wakeups: 4,
                bad_tail: 5,
            },
            pending_lost: Some(RingLostRecord {
                count: 6,
                sequence: 7,
                tsc: 8,
            }),
            unsignalled_bytes: 9,
            unsignalled_since: Some(10),
            loss_signalled: true,
        }),
    }
}

fn encoded(snapshot: &VcpuSnapshot) -> ([u8; VcpuSnapshot::MAX_ENCODED_LEN], usize) {
    let mut bytes = [0u8; VcpuSnapshot::MAX_ENCODED_LEN];
    let len = snapshot.encode(&mut bytes).expect("room");
    (bytes, len)
}

#[test]
fn every_field_survives_the_round_trip() {
    let snapshot = full();
    let (bytes, len) = encoded(&snapshot);
    assert_eq!(len, VcpuSnapshot::MAX_ENCODED_LEN);
    assert_eq!(VcpuSnapshot::decode(&bytes[..len]), Ok(snapshot));
    // And with every optional part absent.
    let bare = VcpuSnapshot {
        state: SnapshotState::Unused,
        registers: Registers::new(),
        pending_pmi: None,
        page_lvtpc_masked: false,
        page: None,
        ring: None,
        ..snapshot
    };
    let (bytes, len) = encoded(&bare);
    assert_eq!(len, 304);
    assert_eq!(VcpuSnapshot::decode(&bytes[..len]), Ok(bare));
    assert!(
        bytes[64..304].iter().all(|&b| b == 0),
        "absent parts are zero"
    );
}

#[test]
fn the_layout_is_the_documented_one() {
    let (bytes, len) = encoded(&full());
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
    let half = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
    assert_eq!(&bytes[..8], b"VPMUSNAP");
    assert_eq!((bytes[8], bytes[10]), (1, 0));
    assert_eq!(half(12) as usize, len);
    assert_eq!(half(20), MAX_REGISTERS as u32);
    assert_eq!(&bytes[24..29], &[2, 2, 6, 48, 0b1011]);
    assert_eq!((bytes[32], bytes[33]), (40, 0b11));
    assert_eq!((word(40), word(48)), (vpmu_abi::XENPMU_MODE_HV, 0x5));
    assert_eq!((half(56), half(60), word(64)), (2, 0b1111, 0x3_0000_0005));
    assert_eq!((word(72), word(80), half(88)), (0x1234_5678, 99, 17));
    assert_eq!(
        (word(96), half(104), half(108), half(112)),
        (0x9999, 8, 4096, 250)
    );
    assert_eq!((half(116), word(120), word(184)), (0b111, 1000, 2000));
    assert_eq!((word(216), word(224), word(256)), (0x10_0008, 1, 5));
    assert_eq!((word(264), word(280), word(288), word(296)), (6, 8, 9, 10));
    // The first register entry: number, kind, reserved, value.
    assert_eq!(half(304), 0xc000_0000);
    assert_eq!(&bytes[308..312], &[0, 0, 0, 0]);
    assert_eq!(word(312), u64::MAX);
    assert_eq!(
        &bytes[308 + 6 * 16..310 + 6 * 16],
        &[1, 0],
        "a state entry's kind"
    );
}

#[test]
fn the_decoder_refuses_for_the_documented_reason() {
    let (bytes, len) = encoded(&full());
    let bytes = &bytes[..len];
    let edited = |at: usize, value: u8| {
        let mut copy = bytes.to_vec();
        copy[at] = value;
        reseal(&mut copy);
        VcpuSnapshot::decode(&copy)
    };
    assert_eq!(edited(0, b'X'), Err(DecodeError::Magic));
    assert_eq!(
        edited(8, 2),
        Err(DecodeError::Version { major: 2, minor: 0 })
    );
    assert_eq!(
        edited(10, 1),
        Err(DecodeError::Version { major: 1, minor: 1 })
    );
    assert_eq!(edited(20, 33), Err(DecodeError::TooManyRegisters(33)));
    assert_eq!(edited(24, 3), Err(DecodeError::Field("vendor")));
    assert_eq!(edited(33, 4), Err(DecodeError::Reserved(33)));
    assert_eq!(edited(35, 1), Err(DecodeError::Reserved(35)));
    assert_eq!(edited(40, 3), Err(DecodeError::Field("mode")));
    assert_eq!(edited(56, 3), Err(DecodeError::Field("state")));
    assert_eq!(edited(60, 0x1f), Err(DecodeError::Reserved(60)));
    assert_eq!(edited(92, 1), Err(DecodeError::Reserved(92)));
    assert_eq!(edited(116, 8), Err(DecodeError::Reserved(116)));
    assert_eq!(edited(308, 2), Err(DecodeError::Field("register kind")));
    assert_eq!(edited(310, 1), Err(DecodeError::Reserved(310)));
    // Without the pending PMI, its word must be zero.
    assert_eq!(edited(60, 0b1011), Err(DecodeError::Reserved(64)));
    let mut damaged = bytes.to_vec();
    damaged[400] ^= 1;
    assert!(matches!(
        VcpuSnapshot::decode(&damaged),
        Err(DecodeError::Checksum { .. })
    ));
    let mut short = [0u8; 100];
    assert_eq!(
        full().encode(&mut short),
        Err(EncodeError::BufferTooSmall { needed: len })
    );
    short[..8].copy_from_slice(b"VPMUSNAP");
    assert_eq!(
        VcpuSnapshot::decode(&short),
        Err(DecodeError::Truncated {
            needed: 304,
            got: 100
        })
    );
}
