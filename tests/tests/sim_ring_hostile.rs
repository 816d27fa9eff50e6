//! A hostile owner of a sample ring (ABI 1.4), on the four test shapes: a consumer tail that is
//! ahead of the head, misaligned, huge, more than the data area behind, or changing between
//! PMIs; a control page or data frame taken away under the producer; the producer's line,
//! `info` and the configuration scribbled over after `ring_init`. The hypervisor never writes
//! outside the free bytes (the simulator's platform checks every write), never panics, counts
//! every such sample lost (and each impossible tail in `bad_tail`), and recovers once the
//! owner repairs its tail: the losses are then reported by a lost record.

use vpmu::abi::ops::Params;
use vpmu::abi::{
    XENPMU_MODE_SELF, XENPMU_OP_RING_INIT, XENPMU_PAGE_SIZE, XENPMU_RING_CONSUMER_OFFSET,
    XENPMU_RING_PRODUCER_OFFSET,
};
use vpmu::{PmiOutcome, VcpuId};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::{Machine, SimVendor, guest_frame};
use vpmu_tests::for_each_vendor;
use zerocopy::FromZeros;

const SUBJECT: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const PERIOD: u64 = 10;
const PAGE: u64 = XENPMU_PAGE_SIZE as u64;

fn machine<V: SimVendor>(vendor: V) -> (Machine<V>, RingGuest) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(SUBJECT));
    m.register_page(SUBJECT);
    let gfn = guest_frame(1, 0x100);
    let ring = RingGuest::prepare(
        &mut m.platform,
        1,
        gfn,
        &config(2, 8, 0, &[(false, 0, PERIOD)]),
    );
    let init = m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0));
    assert!(init.is_ok(), "ring_init: {init:?}");
    m.program(SUBJECT, &[sampling(0, PERIOD)]);
    (m, ring)
}

/// One sample; returns whether it was published (it reaches the subject either way).
fn one_sample<V: SimVendor>(m: &mut Machine<V>) -> bool {
    let pmi = m.run(0, PERIOD).pop().expect("a PMI");
    match pmi.outcome {
        Some(PmiOutcome::Delivered { to, .. }) if to == SUBJECT => true,
        Some(PmiOutcome::Dropped { to, .. }) if to == SUBJECT => false,
        other => panic!("{other:?}"),
    }
}

/// The head the hypervisor keeps (never read back from the guest).
fn head<V: SimVendor>(m: &Machine<V>) -> u64 {
    m.vcpu(SUBJECT).ring().expect("a ring").head
}

fn impossible_tails<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let (mut m, mut ring) = machine(vendor);
    for _ in 0..5 {
        assert!(one_sample(&mut m), "{name}");
    }
    ring.consume(&mut m.platform).expect("well formed");
    let size = ring.data_size();
    let h = head(&m);
    let hostile = [
        h + 8,
        h + 1,
        h.wrapping_sub(4),
        u64::MAX,
        1 << 40,
        h.wrapping_sub(size + 8),
        1 << 63,
    ];
    for (k, &tail) in hostile.iter().enumerate() {
        ring.store_tail(&mut m.platform, tail);
        assert!(
            !one_sample(&mut m),
            "{name}: tail {tail:#x} must not be used"
        );
        let producer = ring.producer(&m.platform);
        assert_eq!(producer.bad_tail, k as u64 + 1, "{name}: tail {tail:#x}");
        assert_eq!(producer.lost, k as u64 + 1, "{name}");
        assert_eq!(head(&m), h, "{name}: nothing published");
    }
    // A valid tail that leaves no room (everything unread) loses the sample too, but is no
    // bad tail.
    ring.store_tail(&mut m.platform, h.wrapping_sub(size));
    assert!(!one_sample(&mut m), "{name}");
    assert_eq!(
        ring.producer(&m.platform).bad_tail,
        hostile.len() as u64,
        "{name}"
    );
    // Repaired: the losses come first, then the sample.
    ring.store_tail(&mut m.platform, h);
    assert!(one_sample(&mut m), "{name}");
    let records = ring.consume(&mut m.platform).expect("well formed");
    let lost = hostile.len() as u64 + 1;
    assert!(
        matches!(records.first(), Some(Record::Lost(l)) if l.lost == lost && l.sequence == 5 + lost),
        "{name}: {records:?}"
    );
    // A tail that changes between every PMI, valid and not.
    for k in 0..40u64 {
        let valid = k % 3 != 0;
        let tail = if valid {
            head(&m)
        } else {
            head(&m) ^ (1 << (k % 64)) | 1
        };
        ring.store_tail(&mut m.platform, tail);
        assert_eq!(one_sample(&mut m), valid, "{name}: round {k}");
    }
    m.assert_conservation();
}

#[test]
fn impossible_tails_lose_samples_and_are_never_used() {
    for_each_vendor!(impossible_tails);
}

fn frames_taken_away<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let (mut m, mut ring) = machine(vendor);
    assert!(one_sample(&mut m), "{name}");
    ring.consume(&mut m.platform).expect("well formed");
    // The control page goes: the tail cannot be read (a bad tail), nothing can be written.
    let control = m
        .platform
        .memory
        .remove(&(1, ring.gfn))
        .expect("the control page");
    for _ in 0..3 {
        assert!(!one_sample(&mut m), "{name}");
    }
    m.platform.memory.insert((1, ring.gfn), control);
    let status = m.vcpu(SUBJECT).ring().unwrap();
    assert_eq!(
        (status.counters.lost, status.counters.bad_tail),
        (3, 3),
        "{name}"
    );
    // A data page goes: the record cannot be written; the tail was fine.
    let data = m
        .platform
        .memory
        .remove(&(1, ring.gfn + 1))
        .expect("a data page");
    let second = m
        .platform
        .memory
        .remove(&(1, ring.gfn + 2))
        .expect("a data page");
    assert!(!one_sample(&mut m), "{name}");
    m.platform.memory.insert((1, ring.gfn + 1), data);
    m.platform.memory.insert((1, ring.gfn + 2), second);
    let producer = ring.producer(&m.platform);
    assert_eq!((producer.lost, producer.bad_tail), (4, 3), "{name}");
    assert!(one_sample(&mut m), "{name}");
    let records = ring.consume(&mut m.platform).expect("well formed");
    assert!(
        matches!(records.first(), Some(Record::Lost(l)) if l.lost == 4 && l.sequence == 5),
        "{name}: {records:?}"
    );
    m.assert_conservation();
}

#[test]
fn frames_taken_away_under_the_producer_lose_samples() {
    for_each_vendor!(frames_taken_away);
}

fn scribbled_control_page<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let (mut m, mut ring) = machine(vendor);
    let info = ring.info(&m.platform);
    let control = ring.gfn * PAGE;
    // Configuration, info and the producer's line overwritten with garbage after ring_init;
    // the consumer's line keeps a valid tail.
    let garbage = vec![0xa5u8; XENPMU_RING_CONSUMER_OFFSET];
    assert!(m.platform.write_physical(1, control, &garbage));
    for k in 1..=20u64 {
        assert!(one_sample(&mut m), "{name}: sample {k}");
        let producer = ring.producer(&m.platform);
        assert_eq!((producer.head, producer.records), (head(&m), k), "{name}");
        let records = ring.consume(&mut m.platform).expect("well formed");
        assert!(
            records
                .iter()
                .any(|r| matches!(r, Record::Sample(s, _) if s.sequence == k)),
            "{name}: {records:?}"
        );
        // Scribble over the producer's line again: the hypervisor never reads it back.
        let junk = [0x5au8; 64];
        assert!(
            m.platform
                .write_physical(1, control + XENPMU_RING_PRODUCER_OFFSET as u64, &junk)
        );
    }
    // What the hypervisor copied at ring_init stays in force (the garbage configuration would
    // be 0xa5a5a5a5 data pages and period): the ring still re-arms every PERIOD.
    assert_eq!(info.data_size, 2 * PAGE as u32, "{name}");
    let mut fresh = vpmu::abi::RingControl::new_zeroed();
    assert!(
        m.platform
            .read_physical(1, control, zerocopy::IntoBytes::as_mut_bytes(&mut fresh))
    );
    assert_ne!(fresh.info, info, "{name}: the guest's scribbles are there");
    m.assert_conservation();
}

#[test]
fn a_scribbled_control_page_changes_nothing_the_hypervisor_uses() {
    for_each_vendor!(scribbled_control_page);
}
