//! `XENPMU_OP_RING_INIT` and `XENPMU_OP_RING_FINISH` (ABI 1.4) in detail, on the four test
//! shapes: every invalid configuration field is `-EINVAL` (periods judged by each counter's
//! WRMSR rule: up to 2^(w−1) − 1, 2^31 − 1 for Intel general-purpose counters without
//! full-width writes, none for absent counters or AMD fixed counters); the area's frames, its
//! overlaps with pages and rings, a cached sample and a platform without rings give their
//! documented errors; a refused call changes nothing. A successful one copies the
//! configuration once (later edits change nothing), writes `info`, zeroes the producer,
//! consumer and reserved bytes and leaves the data area alone. FINISH of the page and domain
//! teardown take the ring down; RING_FINISH sends samples back to the page; `ring_poll` wakes
//! the owner once the latency bound has passed.

use vpmu::abi::ops::{OpError, Params};
use vpmu::abi::{
    PageView, RingConfig, XENPMU_MODE_SELF, XENPMU_OP_FINISH, XENPMU_OP_INIT,
    XENPMU_OP_RING_FINISH, XENPMU_OP_RING_INIT, XENPMU_PAGE_SIZE, XENPMU_RECORD_MAX,
    XENPMU_RING_MAGIC, XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR,
};
use vpmu::{PmiOutcome, PmuBackend, VcpuId, VcpuState};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::{Machine, SimPlatform, SimVendor, Snapshot, guest_frame};
use vpmu_tests::for_each_vendor;
use zerocopy::IntoBytes;

const SUBJECT: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const SIBLING: VcpuId = VcpuId { domain: 1, vcpu: 1 };
const PAGE: u64 = XENPMU_PAGE_SIZE as u64;
const RING: u64 = 0x100;

fn machine<V: SimVendor>(vendor: V) -> Machine<V> {
    let mut m = Machine::new(vendor, 2, &[1, 2], XENPMU_MODE_SELF);
    m.schedule(0, Some(SUBJECT));
    m.register_page(SUBJECT);
    m
}

/// RING_INIT of `target` by the subject with the configuration `config` at frame index
/// `index`; the state must be unchanged when it fails.
fn ring_init<V: SimVendor>(
    m: &mut Machine<V>,
    index: u64,
    config: &RingConfig,
    target: u32,
) -> Result<(), OpError> {
    let gfn = guest_frame(1, index);
    RingGuest::prepare(&mut m.platform, 1, gfn, config);
    let before = Snapshot::take(m);
    let result = m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, target));
    if result.is_err() {
        assert_eq!(
            before,
            Snapshot::take(m),
            "a refused RING_INIT changed something"
        );
    }
    result.map(|_| ())
}

/// The largest period of each counter by docs/abi.md's rule, from the enumeration.
fn period_limits<V: SimVendor>(vendor: &V) -> (Vec<u64>, Vec<u64>) {
    let caps = *vendor.backend().capabilities();
    let half = |w: u8| (1u64 << (w - 1)) - 1;
    let intel = vendor.driver().is_intel();
    let gp = (0..caps.gp_counters)
        .map(|_| {
            if intel && !caps.full_width_writes {
                half(caps.gp_width).min((1 << 31) - 1)
            } else {
                half(caps.gp_width)
            }
        })
        .collect();
    let fixed = (0..4)
        .map(|i| {
            if caps.fixed_counters & 1 << i != 0 {
                half(caps.fixed_width)
            } else {
                0
            }
        })
        .collect();
    (gp, fixed)
}

fn configuration_checks<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = machine(vendor.clone());
    let valid = config(1, 0, 0, &[]);
    let invalid = |edit: &dyn Fn(&mut RingConfig)| {
        let mut c = valid;
        edit(&mut c);
        c
    };
    let mut bad = vec![
        invalid(&|c| c.data_pages = 0),
        invalid(&|c| c.data_pages = 3),
        invalid(&|c| c.data_pages = 512),
        invalid(&|c| c.data_pages = u32::MAX),
        invalid(&|c| c.wakeup_bytes = 4097),
        invalid(&|c| c.flags = 1),
        invalid(&|c| c.flags = 1 << 31),
    ];
    for k in 0..6 {
        bad.push(invalid(&|c| c._reserved0[k] = 1 << k));
    }
    for k in 0..12 {
        bad.push(invalid(&|c| c._reserved1[k] = 1));
    }
    let (gp, fixed) = period_limits(&vendor);
    for (i, &max) in gp.iter().enumerate() {
        bad.push(invalid(&|c| c.period_gp[i] = max + 1));
        bad.push(invalid(&|c| c.period_gp[i] = u64::MAX));
    }
    for i in gp.len()..8 {
        bad.push(invalid(&|c| c.period_gp[i] = 1));
    }
    for (i, &max) in fixed.iter().enumerate() {
        bad.push(invalid(&|c| c.period_fixed[i] = max + 1));
    }
    for config in &bad {
        assert_eq!(
            ring_init(&mut m, RING, config, 0),
            Err(OpError::InvalidArgument),
            "{name}: {config:?}"
        );
    }
    // Every edge the rules allow: each period at its maximum, the watermark at the whole
    // area, the largest area.
    let mut edge = config(256, 256 * PAGE as u32, u32::MAX, &[]);
    for (i, &max) in gp.iter().enumerate() {
        edge.period_gp[i] = max;
    }
    for (i, &max) in fixed.iter().enumerate() {
        edge.period_fixed[i] = max;
    }
    assert_eq!(ring_init(&mut m, RING, &edge, 0), Ok(()), "{name}");
    let finish = m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(0, 0));
    assert!(finish.is_ok(), "{name}");
}

#[test]
fn every_invalid_configuration_field_is_einval() {
    for_each_vendor!(configuration_checks);
}

fn state_checks<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = machine(vendor);
    let valid = config(2, 0, 0, &[(false, 0, 1000)]);
    // Frames: the control page not RAM; a data page missing; past 2^64; another domain's.
    assert_eq!(
        m.op(
            SUBJECT,
            XENPMU_OP_RING_INIT,
            &Params::new(guest_frame(1, 0x400), 0)
        ),
        Err(OpError::InvalidArgument),
        "{name}"
    );
    RingGuest::prepare(&mut m.platform, 1, guest_frame(1, 0x300), &valid);
    m.platform.memory.remove(&(1, guest_frame(1, 0x302)));
    let before = Snapshot::take(&m);
    let gfn = guest_frame(1, 0x300);
    assert_eq!(
        m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0)),
        Err(OpError::InvalidArgument),
        "{name}"
    );
    assert_eq!(before, Snapshot::take(&m), "{name}");
    for gfn in [u64::MAX, u64::MAX / PAGE, guest_frame(0, 3)] {
        assert_eq!(
            m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0)),
            Err(OpError::InvalidArgument),
            "{name}: frame {gfn:#x}"
        );
    }
    // No such vCPU; no page; then a ring of the subject.
    assert_eq!(
        ring_init(&mut m, RING, &valid, 2),
        Err(OpError::InvalidArgument),
        "{name}"
    );
    assert_eq!(
        ring_init(&mut m, RING, &valid, 1),
        Err(OpError::NoVpmu),
        "{name}"
    );
    assert_eq!(ring_init(&mut m, RING, &valid, 0), Ok(()), "{name}");
    assert_eq!(
        ring_init(&mut m, 0x200, &valid, 0),
        Err(OpError::AlreadyRegistered),
        "{name}"
    );
    // The sibling registers a page; its ring may not overlap the subject's ring (at either
    // end), nor any page (its own or the subject's).
    let sibling_page = guest_frame(1, 0x211);
    m.platform.add_ram(1, sibling_page, 1);
    let init = m.op(SUBJECT, XENPMU_OP_INIT, &Params::new(sibling_page, 1));
    assert!(init.is_ok(), "{name}: {init:?}");
    for index in [RING - 2, RING + 2, 0x210, 0x211] {
        assert_eq!(
            ring_init(&mut m, index, &valid, 1),
            Err(OpError::FrameInUse),
            "{name}: area from {index:#x}"
        );
    }
    // INIT of a page inside a ring is refused too.
    let inside = m.op(
        SUBJECT,
        XENPMU_OP_INIT,
        &Params::new(guest_frame(1, RING + 1), 1),
    );
    assert_eq!(inside, Err(OpError::AlreadyRegistered), "{name}");
    let finish = m.op(SUBJECT, XENPMU_OP_FINISH, &Params::new(0, 1));
    assert!(finish.is_ok(), "{name}");
    let inside = m.op(
        SUBJECT,
        XENPMU_OP_INIT,
        &Params::new(guest_frame(1, RING + 2), 1),
    );
    assert_eq!(inside, Err(OpError::FrameInUse), "{name}");
    // No room to map.
    assert!(
        m.op(SUBJECT, XENPMU_OP_INIT, &Params::new(sibling_page, 1))
            .is_ok()
    );
    m.platform.mapping_limit = m.platform.mappings.len() + m.platform.rings.len();
    assert_eq!(
        ring_init(&mut m, 0x220, &valid, 1),
        Err(OpError::MapFailed),
        "{name}"
    );
    m.platform.mapping_limit = usize::MAX;
    assert_eq!(ring_init(&mut m, 0x220, &valid, 1), Ok(()), "{name}");
    // RING_FINISH: val must be 0; no such vCPU; no ring.
    for (val, vcpu, expected) in [
        (1, 0, OpError::InvalidArgument),
        (0, 2, OpError::InvalidArgument),
        (0, u32::MAX, OpError::InvalidArgument),
    ] {
        let before = Snapshot::take(&m);
        let result = m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(val, vcpu));
        assert_eq!(result, Err(expected), "{name}");
        assert_eq!(before, Snapshot::take(&m), "{name}");
    }
    for vcpu in [1, 0] {
        assert!(
            m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(0, vcpu))
                .is_ok()
        );
        assert_eq!(
            m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(0, vcpu)),
            Err(OpError::NoVpmu),
            "{name}"
        );
    }
    assert!(m.platform.rings.is_empty(), "{name}: every ring unmapped");
    // A platform without rings.
    m.platform.ring_support = false;
    for op in [XENPMU_OP_RING_INIT, XENPMU_OP_RING_FINISH] {
        assert_eq!(
            m.op(SUBJECT, op, &Params::new(guest_frame(1, RING), 0)),
            Err(OpError::NotSupported),
            "{name}"
        );
    }
}

#[test]
fn frames_overlaps_and_registrations_give_their_errors() {
    for_each_vendor!(state_checks);
}

fn cached_sample_is_busy<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = machine(vendor);
    m.program(SUBJECT, &[sampling(0, 5)]);
    m.run(0, 5);
    assert!(
        matches!(m.vcpu(SUBJECT).state(), VcpuState::Cached { .. }),
        "{name}"
    );
    assert_eq!(
        ring_init(&mut m, RING, &config(1, 0, 0, &[]), 0),
        Err(OpError::Busy),
        "{name}"
    );
}

#[test]
fn a_cached_sample_is_ebusy() {
    for_each_vendor!(cached_sample_is_busy);
}

fn registration_writes<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = machine(vendor);
    let gfn = guest_frame(1, RING);
    let ring = RingGuest::prepare(&mut m.platform, 1, gfn, &config(2, 0, 0, &[(false, 0, 7)]));
    // Garbage everywhere past the configuration, the data area included.
    let junk: Vec<u8> = (0..3 * PAGE - 256).map(|k| (k * 7 + 3) as u8).collect();
    assert!(m.platform.write_physical(1, gfn * PAGE + 256, &junk));
    assert!(
        m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0))
            .is_ok()
    );
    let control = ring.control(&m.platform);
    let info = control.info;
    assert_eq!(info.magic, XENPMU_RING_MAGIC, "{name}");
    assert_eq!(
        (info.version_major, info.version_minor),
        (XENPMU_VERSION_MAJOR, XENPMU_VERSION_MINOR),
        "{name}"
    );
    assert_eq!(
        (
            info.data_offset,
            info.data_size,
            info.record_max,
            info.wakeup_bytes
        ),
        (4096, 8192, XENPMU_RECORD_MAX as u32, 4096),
        "{name}: 0 is half the data area"
    );
    assert_eq!(info.tsc_khz, SimPlatform::TSC_KHZ, "{name}");
    assert_eq!(info._reserved0, [0; 4], "{name}");
    assert_eq!(
        (control.producer, control.consumer),
        Default::default(),
        "{name}"
    );
    assert!(control._reserved.iter().all(|&w| w == 0), "{name}");
    let mut data = vec![0u8; 2 * PAGE as usize];
    assert!(m.platform.read_physical(1, (gfn + 1) * PAGE, &mut data));
    assert_eq!(
        data,
        junk[(PAGE as usize - 256)..],
        "{name}: the data area is left alone"
    );
    // The configuration was copied once: a later edit (period 7 → 1) changes nothing.
    let mut edited = config(2, 0, 0, &[(false, 0, 1)]);
    edited.flags = 0xffff;
    assert!(m.platform.write_physical(1, gfn * PAGE, edited.as_bytes()));
    m.program(SUBJECT, &[sampling(0, 7)]);
    let pmis = m.run(0, 70);
    assert_eq!(pmis.len(), 10, "{name}: re-armed every 7, as registered");
    assert_eq!(ring.producer(&m.platform).records, 10, "{name}");
}

#[test]
fn ring_init_copies_the_configuration_once_and_writes_the_control_page() {
    for_each_vendor!(registration_writes);
}

fn teardowns<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    // RING_FINISH: samples go back to the page (a cached window, counters stopped).
    let mut m = machine(vendor.clone());
    let mut ring = RingGuest::prepare(
        &mut m.platform,
        1,
        guest_frame(1, RING),
        &config(1, 0, 0, &[(false, 0, 5)]),
    );
    assert!(
        m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(ring.gfn, 0))
            .is_ok()
    );
    m.program(SUBJECT, &[sampling(0, 5)]);
    assert_eq!(m.run(0, 20).len(), 4, "{name}");
    assert!(
        m.op(SUBJECT, XENPMU_OP_RING_FINISH, &Params::new(0, 0))
            .is_ok()
    );
    // The records stay readable.
    assert_eq!(
        ring.consume(&mut m.platform).expect("well formed").len(),
        4,
        "{name}"
    );
    let pmi = m.run(0, 5).pop().expect("a PMI");
    assert!(
        matches!(pmi.outcome, Some(PmiOutcome::Delivered { .. })),
        "{name}"
    );
    assert!(
        matches!(m.vcpu(SUBJECT).state(), VcpuState::Cached { .. }),
        "{name}"
    );
    let page = PageView::new(m.platform.frame(1, guest_frame(1, 0))).expect("a page");
    assert!(page.is_cached(), "{name}");
    assert_eq!(
        page.sample_info().expect("1.2 details").sequence,
        5,
        "{name}"
    );
    assert_eq!(
        ring.producer(&m.platform).records,
        4,
        "{name}: nothing more in the ring"
    );
    // FINISH of the page takes the ring down with it.
    let mut m = machine(vendor.clone());
    RingGuest::prepare(
        &mut m.platform,
        1,
        guest_frame(1, RING),
        &config(1, 0, 0, &[]),
    );
    assert!(
        m.op(
            SUBJECT,
            XENPMU_OP_RING_INIT,
            &Params::new(guest_frame(1, RING), 0)
        )
        .is_ok()
    );
    assert!(m.op(SUBJECT, XENPMU_OP_FINISH, &Params::new(0, 0)).is_ok());
    assert_eq!(m.vcpu(SUBJECT).ring(), None, "{name}");
    assert!(m.platform.rings.is_empty(), "{name}");
    // So does the domain's destruction.
    let mut m = machine(vendor);
    RingGuest::prepare(
        &mut m.platform,
        1,
        guest_frame(1, RING),
        &config(1, 0, 0, &[]),
    );
    assert!(
        m.op(
            SUBJECT,
            XENPMU_OP_RING_INIT,
            &Params::new(guest_frame(1, RING), 0)
        )
        .is_ok()
    );
    m.teardown(SUBJECT);
    assert_eq!(m.vcpu(SUBJECT).ring(), None, "{name}");
    assert!(
        m.platform.rings.is_empty() && m.platform.mappings.is_empty(),
        "{name}"
    );
}

#[test]
fn finish_and_teardown_take_the_ring_down() {
    for_each_vendor!(teardowns);
}

fn latency_wakeups<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let mut m = machine(vendor);
    // Watermark: the whole area; latency bound 100 µs = 100,000 ticks of the 1 GHz clock.
    let mut ring = RingGuest::prepare(
        &mut m.platform,
        1,
        guest_frame(1, RING),
        &config(1, 4096, 100, &[(false, 0, 5)]),
    );
    assert!(
        m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(ring.gfn, 0))
            .is_ok()
    );
    m.program(SUBJECT, &[sampling(0, 5)]);
    assert!(
        !m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, SUBJECT)
            .unwrap(),
        "{name}"
    );
    m.run(0, 5);
    assert!(m.platform.virqs.is_empty(), "{name}: a lone record waits");
    assert!(
        !m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, SUBJECT)
            .unwrap(),
        "{name}"
    );
    m.platform.clock += 100_000;
    assert!(
        m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, SUBJECT)
            .unwrap(),
        "{name}"
    );
    assert_eq!(
        m.platform.virqs.drain(..).collect::<Vec<_>>(),
        [SUBJECT],
        "{name}"
    );
    assert_eq!(ring.producer(&m.platform).wakeups, 1, "{name}");
    assert!(
        !m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, SUBJECT)
            .unwrap(),
        "{name}: once"
    );
    // A record published after the bound passed for an older one wakes at once.
    m.run(0, 5);
    m.platform.clock += 200_000;
    m.run(0, 5);
    assert_eq!(m.platform.virqs.len(), 1, "{name}");
    let records = ring.consume(&mut m.platform).expect("well formed");
    assert_eq!(
        records
            .iter()
            .filter(|r| matches!(r, Record::Sample(..)))
            .count(),
        3
    );
    // Without a clock rate every record wakes (the bound is 0).
    let mut m = machine(m.vendor.clone());
    m.platform.tsc_khz = 0;
    let ring = RingGuest::prepare(
        &mut m.platform,
        1,
        guest_frame(1, RING),
        &config(1, 4096, 100, &[(false, 0, 5)]),
    );
    assert!(
        m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(ring.gfn, 0))
            .is_ok()
    );
    assert_eq!(ring.info(&m.platform).tsc_khz, 0, "{name}");
    m.program(SUBJECT, &[sampling(0, 5)]);
    m.run(0, 15);
    assert_eq!(m.platform.virqs.len(), 3, "{name}: a wakeup per record");
    assert_eq!(
        m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, VcpuId { domain: 1, vcpu: 9 }),
        Err(vpmu::CoreError::NoSuchVcpu(VcpuId { domain: 1, vcpu: 9 })),
        "{name}"
    );
    assert!(
        !m.vpmu
            .ring_poll(&mut m.platform, &m.vcpus, SIBLING)
            .unwrap(),
        "{name}: no ring"
    );
}

#[test]
fn ring_poll_wakes_the_owner_once_the_latency_bound_passed() {
    for_each_vendor!(latency_wakeups);
}
