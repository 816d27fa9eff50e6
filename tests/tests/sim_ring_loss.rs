//! Losses of the sample ring (ABI 1.4) under a slow consumer, on the four test shapes: a full
//! ring never has an unread byte overwritten (the simulator's platform checks every write
//! against the consumer's tail), a sample that does not fit is lost and counted, the losses
//! are reported in the stream by one lost record in front of the next sample that fits (its
//! count and last sequence number exact), every sample number is accounted for exactly once
//! (published, lost or withheld), and a loss while records wait unread wakes the owner once.

use vpmu::abi::ops::Params;
use vpmu::abi::{PageViewMut, XENPMU_MODE_SELF, XENPMU_OP_LVTPC_SET, XENPMU_OP_RING_INIT};
use vpmu::{PmiOutcome, VcpuId};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, Stream, config};
use vpmu_sim::{Machine, SimVendor, guest_frame};
use vpmu_tests::for_each_vendor;

const SUBJECT: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const PERIOD: u64 = 10;

/// The subject samples instructions every `PERIOD` into a ring of one data page whose
/// watermark is the whole area and whose latency bound is 1 s: only losses (and a ring filled
/// to the last byte) wake it.
fn machine<V: SimVendor>(vendor: V) -> (Machine<V>, RingGuest) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(SUBJECT));
    let page = m.register_page(SUBJECT);
    let gfn = guest_frame(1, 0x100);
    let ring = RingGuest::prepare(
        &mut m.platform,
        1,
        gfn,
        &config(1, 4096, 1_000_000, &[(false, 0, PERIOD)]),
    );
    let init = m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0));
    assert!(init.is_ok(), "ring_init: {init:?}");
    m.program(SUBJECT, &[sampling(0, PERIOD)]);
    assert_eq!(page, guest_frame(1, 0));
    (m, ring)
}

/// Runs `samples` periods; every PMI must reach the subject.
fn sample<V: SimVendor>(m: &mut Machine<V>, samples: u64) {
    let pmis = m.run(0, samples * PERIOD);
    assert_eq!(pmis.len() as u64, samples);
    for pmi in pmis {
        assert!(
            matches!(pmi.outcome, Some(PmiOutcome::Delivered { to, .. } | PmiOutcome::Dropped { to, .. }) if to == SUBJECT),
            "{pmi:?}"
        );
    }
}

fn lost_records_are_exact<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let (mut m, mut ring) = machine(vendor);
    // 60 samples of 224 bytes or more into 4 KiB, nobody reading: most are lost.
    sample(&mut m, 60);
    let producer = ring.producer(&m.platform);
    assert_eq!(producer.records + producer.lost, 60, "{name}: {producer:?}");
    assert!(producer.lost > 30, "{name}: {producer:?}");
    assert_eq!((producer.withheld, producer.bad_tail), (0, 0), "{name}");
    let status = m.vcpu(SUBJECT).ring().expect("a ring");
    assert_eq!(
        status.pending_lost, producer.lost,
        "{name}: no lost record fit yet"
    );
    // One wakeup for the episode of losses (plus one if the records filled the area exactly).
    assert!((1..=2).contains(&producer.wakeups), "{name}: {producer:?}");
    assert_eq!(m.platform.virqs.len() as u64, producer.wakeups, "{name}");
    let wakeups = producer.wakeups;
    sample(&mut m, 5);
    assert_eq!(
        ring.producer(&m.platform).wakeups,
        wakeups,
        "{name}: one wakeup per episode"
    );
    let mut stream = Stream::default();
    stream.take(ring.consume(&mut m.platform).expect("well formed"));
    assert_eq!(
        stream.samples,
        (1..=producer.records).collect::<Vec<_>>(),
        "{name}: the records before the losses"
    );
    let lost = producer.lost + 5;
    // The next sample that fits comes after a lost record counting all of them.
    sample(&mut m, 1);
    let records = ring.consume(&mut m.platform).expect("well formed");
    let Record::Lost(report) = &records[0] else {
        panic!("{name}: {records:?}")
    };
    assert_eq!((report.lost, report.sequence), (lost, 65), "{name}");
    let after: Vec<&Record> = records[1..]
        .iter()
        .filter(|r| !matches!(r, Record::Pad(_)))
        .collect();
    assert!(
        matches!(after[..], [Record::Sample(s, _)] if s.sequence == 66),
        "{name}: {records:?}"
    );
    stream.take(records);
    stream.accounts_for(1..=66, 0);
    assert_eq!(
        ring.producer(&m.platform).lost,
        lost,
        "{name}: losses counted once"
    );
    assert_eq!(m.vcpu(SUBJECT).ring().unwrap().pending_lost, 0, "{name}");
    m.assert_conservation();
}

#[test]
fn a_full_ring_loses_samples_and_reports_them_exactly_once() {
    for_each_vendor!(lost_records_are_exact);
}

/// The owner sets its page's LVTPC mask bit and applies it.
fn mask_page<V: SimVendor>(m: &mut Machine<V>, masked: bool) {
    PageViewMut::new(m.platform.frame_mut(1, guest_frame(1, 0)))
        .expect("an initialised page")
        .set_lvtpc_masked(masked);
    assert!(
        m.op(SUBJECT, XENPMU_OP_LVTPC_SET, &Params::new(0, 0))
            .is_ok()
    );
}

fn slow_consumer_accounts_for_everything<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let (mut m, mut ring) = machine(vendor);
    let mut stream = Stream::default();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut withheld = 0;
    for round in 0..300u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let masked = round % 37 >= 33;
        if round % 37 == 33 || round % 37 == 0 {
            mask_page(&mut m, masked);
        }
        sample(&mut m, 1 + state % 3);
        if masked {
            withheld = ring.producer(&m.platform).withheld;
        }
        // A consumer that reads only now and then.
        if state % 7 == 0 {
            stream.take(ring.consume(&mut m.platform).expect("well formed"));
        }
    }
    stream.take(ring.consume(&mut m.platform).expect("well formed"));
    let producer = ring.producer(&m.platform);
    let pending = m.vcpu(SUBJECT).ring().unwrap().pending_lost;
    let last = producer.records + producer.lost + producer.withheld;
    assert_eq!(producer.withheld, withheld, "{name}");
    assert!(
        producer.withheld > 0 && producer.lost > 0,
        "{name}: {producer:?}"
    );
    assert_eq!(stream.samples.len() as u64, producer.records, "{name}");
    let reported: u64 = stream.lost.iter().map(|&(count, _)| count).sum();
    assert_eq!(
        reported + pending,
        producer.lost,
        "{name}: every loss reported once"
    );
    stream.accounts_for(1..=last, producer.withheld + pending);
    let stats = *m.vcpu(SUBJECT).stats();
    assert_eq!(stats.pmis_generated, last, "{name}");
    assert_eq!(stats.pmis_delivered, producer.records, "{name}");
    m.assert_conservation();
}

#[test]
fn a_slow_consumer_sees_every_number_published_lost_or_withheld() {
    for_each_vendor!(slow_consumer_accounts_for_everything);
}
