//! The sample ring (ABI 1.4) end to end on the simulator, on the four test shapes: records
//! decode as docs/abi.md describes them (sequence, identity, registers, call chain), the data
//! area wraps with a PAD, a slow consumer loses samples that are reported exactly once by
//! lost records, and the hypervisor's re-arm keeps the counter running so that the periods add
//! up to what it counted.

use vpmu::abi::ops::Params;
use vpmu::abi::{
    XENPMU_DOMID_SELF, XENPMU_MODE_SELF, XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT,
    XENPMU_RECORD_MAX, XENPMU_RING_MAGIC,
};
use vpmu::{PmiOutcome, VcpuId};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::{Machine, SimVendor, guest_frame};
use vpmu_tests::for_each_vendor;

const SUBJECT: VcpuId = VcpuId { domain: 1, vcpu: 0 };

/// A machine in self mode whose subject has a page and a ring of `data_pages` pages
/// (watermark 1 byte: a wakeup per record) re-arming counter 0 every `period`, and samples
/// instructions with that period; it runs on pCPU 0.
fn machine<V: SimVendor>(vendor: V, data_pages: u32, period: u64) -> (Machine<V>, RingGuest) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(SUBJECT));
    m.register_page(SUBJECT);
    let gfn = guest_frame(1, 0x100);
    let ring = RingGuest::prepare(
        &mut m.platform,
        1,
        gfn,
        &config(data_pages, 1, 0, &[(false, 0, period)]),
    );
    let init = m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0));
    assert!(init.is_ok(), "ring_init: {init:?}");
    m.program(SUBJECT, &[sampling(0, period)]);
    (m, ring)
}

fn records_and_wrap<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let period = 50;
    let (mut m, mut ring) = machine(vendor, 1, period);
    let info = ring.info(&m.platform);
    assert_eq!(
        (
            info.magic,
            info.data_offset,
            info.data_size,
            info.record_max
        ),
        (XENPMU_RING_MAGIC, 4096, 4096, XENPMU_RECORD_MAX as u32),
        "{name}"
    );
    let mut sequences = Vec::new();
    let mut pads = 0;
    // 3000 instructions: 60 samples of ~224..736 bytes through a 4 KiB ring, read as they come.
    for _ in 0..60 {
        let pmis = m.run(0, period);
        assert_eq!(pmis.len(), 1, "{name}: one PMI per period");
        assert!(
            matches!(pmis[0].outcome, Some(PmiOutcome::Delivered { to, .. }) if to == SUBJECT),
            "{name}: {pmis:?}"
        );
        for record in ring.consume(&mut m.platform).expect("a well-formed ring") {
            match record {
                Record::Sample(sample, chain) => {
                    assert_eq!(sample.identity.domain_id, XENPMU_DOMID_SELF);
                    assert_eq!(sample.overflowed & 1, 1, "{name}: counter 0 overflowed");
                    assert_eq!(sample.chain_len as usize, chain.len());
                    sequences.push(sample.sequence);
                }
                Record::Pad(_) => pads += 1,
                other => panic!("{name}: unexpected {other:?}"),
            }
        }
    }
    assert_eq!(
        sequences,
        (1..=60).collect::<Vec<_>>(),
        "{name}: every sample, in order"
    );
    assert!(pads > 0, "{name}: the data area wrapped with a PAD");
    let producer = ring.producer(&m.platform);
    assert_eq!(
        (
            producer.records,
            producer.lost,
            producer.withheld,
            producer.bad_tail
        ),
        (60, 0, 0, 0),
        "{name}"
    );
    assert_eq!(
        producer.wakeups, 60,
        "{name}: watermark of 1 byte: a wakeup per record"
    );
    assert_eq!(m.platform.virqs.len(), 60, "{name}");
    m.assert_conservation();
    let finish = m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(0, 0));
    assert!(finish.is_ok(), "{name}: {finish:?}");
}

#[test]
fn records_decode_and_the_data_area_wraps_with_a_pad() {
    for_each_vendor!(records_and_wrap);
}
