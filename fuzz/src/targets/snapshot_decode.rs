//! vCPU PMU snapshots (`vpmu::snapshot`, docs/snapshot.md) from any bytes: decoded, and when
//! they decode restored into a fresh vCPU of a simulated machine, which then runs. Nothing
//! panics; a restore that succeeds leaves a state the restore took as it was (the snapshot
//! taken again is the decoded one, under the mode in force), which runs on a pCPU, flushes
//! its page if it has a sample cached, and leaves nothing able to count once switched out.
//!
//! Input: byte 0 picks the shape (`% 4`: Intel v5, Intel v2, AMD PerfMonV2, AMD K7), byte 1
//! bit 0 says whether the harness recomputes the checksum (so that the fuzzer reaches the
//! validators behind it: the checksum guards against damage, the validators against a crafted
//! snapshot); the rest is the snapshot. [`seeds`] are real snapshots of busy vCPUs.

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_SELF, XENPMU_OP_FLUSH, XENPMU_OP_RING_INIT};
use vpmu::snapshot::{SnapshotBackend, SnapshotState, VcpuSnapshot, reseal};
use vpmu::{VcpuId, VcpuState};
use vpmu_models::{ExecMode, HwEvent, SoftwarePmu};
use vpmu_sim::helpers::{counting, sampling};
use vpmu_sim::migrate::{restore_bytes, take_bytes};
use vpmu_sim::ring::{RingGuest, config};
use vpmu_sim::{Machine, SimVendor, amd_legacy, amd_v2, guest_frame, intel_v2, intel_v5};

use crate::seeds::Seed;

/// Milestone: a snapshot was restored.
pub const RESTORED: &str = "snapshot_decode: a snapshot restored";
/// Milestone: a snapshot with a sample cached in its page was restored and flushed.
pub const RESTORED_CACHED: &str = "snapshot_decode: a restored cached sample flushed";
/// Milestone: a snapshot with a ring was restored.
pub const RESTORED_RING: &str = "snapshot_decode: a snapshot with a ring restored";

/// The vCPU restored into.
const VCPU: VcpuId = VcpuId { domain: 1, vcpu: 0 };
/// The ring's control page (one data page follows it).
fn ring_frame() -> u64 {
    guest_frame(VCPU.domain, 0x40)
}

/// The target.
pub fn run(data: &[u8]) {
    let [shape, flags, snapshot @ ..] = data else {
        return;
    };
    let mut bytes = snapshot.to_vec();
    if flags & 1 != 0 {
        reseal(&mut bytes);
    }
    match shape % 4 {
        0 => restore_and_run(intel_v5(), &bytes),
        1 => restore_and_run(intel_v2(), &bytes),
        2 => restore_and_run(amd_v2(), &bytes),
        _ => restore_and_run(amd_legacy(), &bytes),
    }
}

/// A destination machine: 2 pCPUs, domain 1 with the RAM of its page and ring.
fn machine<V: SimVendor>(vendor: V) -> Machine<V> {
    let mut m = Machine::new(vendor, 2, &[1, 1], XENPMU_MODE_SELF);
    m.platform.add_ram(VCPU.domain, ring_frame(), 2);
    m
}

fn restore_and_run<V: SimVendor>(vendor: V, bytes: &[u8])
where
    V::Backend: SnapshotBackend,
{
    let Ok(mut decoded) = VcpuSnapshot::decode(bytes) else {
        return;
    };
    let mut m = machine(vendor);
    if restore_bytes(&mut m, VCPU, bytes).is_err() {
        return;
    }
    crate::reached(RESTORED);
    if decoded.ring.is_some() {
        crate::reached(RESTORED_RING);
    }
    decoded.mode = m.vpmu.mode();
    let again = m.vpmu.take_snapshot(&m.vcpu(VCPU));
    assert_eq!(
        again,
        Ok(decoded),
        "the restore took the snapshot as it was"
    );
    m.platform.set_lvtpc_masked(VCPU, false);
    m.schedule(1, Some(VCPU));
    m.run(1, 64);
    if matches!(m.vcpu(VCPU).state(), VcpuState::Cached { .. }) {
        let cached = decoded.state == SnapshotState::SampleCached;
        if m.op(VCPU, XENPMU_OP_FLUSH, &Params::new(0, 0)).is_ok() && cached {
            crate::reached(RESTORED_CACHED);
        }
        m.run(1, 64);
    }
    m.schedule(1, None);
    assert!(
        V::nothing_can_count(m.pcpus[1].hw()),
        "a restored vCPU switched out left something counting"
    );
}

/// A busy vCPU's snapshot on `vendor`: counters counting and sampling (period 40), a page,
/// with `ring` a ring, run for `work` instructions and switched out with `in_flight` more
/// counted whose PMI was not taken.
fn busy<V: SimVendor>(vendor: V, ring: bool, work: u64, in_flight: u64) -> Vec<u8>
where
    V::Backend: SnapshotBackend,
{
    let mut m = machine(vendor);
    m.schedule(0, Some(VCPU));
    m.platform.set_lvtpc_masked(VCPU, false);
    m.register_page(VCPU);
    if ring {
        let config = config(1, 0, 0, &[(false, 0, 40)]);
        RingGuest::prepare(&mut m.platform, VCPU.domain, ring_frame(), &config);
        let init = m.op(VCPU, XENPMU_OP_RING_INIT, &Params::new(ring_frame(), 0));
        assert!(init.is_ok(), "ring init: {init:?}");
    }
    m.program(VCPU, &[sampling(0, 40), counting(1, (1 << 48) - 30)]);
    m.run(0, work);
    let kernel = ExecMode {
        cpl: 0,
        host: false,
    };
    m.pcpus[0]
        .hw_mut()
        .count(HwEvent::Instructions, in_flight, kernel);
    m.schedule(0, None);
    take_bytes(&m, VCPU).expect("a switched-out vCPU")
}

/// Real snapshots of each shape: a sample cached in the page, a pending PMI, a ring, and a
/// vCPU that never used its PMU.
pub fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let mut add = |name: &str, shape: u8, bytes: Vec<u8>| {
        let mut input = vec![shape, 0];
        input.extend(bytes);
        seeds.push(Seed {
            target: "snapshot_decode",
            name: format!("seed-{name}"),
            bytes: input,
        });
    };
    let shapes: [(&str, u8); 4] = [
        ("intel-v5", 0),
        ("intel-v2", 1),
        ("amd-v2", 2),
        ("amd-k7", 3),
    ];
    for (name, shape) in shapes {
        let of = |ring, work, in_flight| match shape {
            0 => busy(intel_v5(), ring, work, in_flight),
            1 => busy(intel_v2(), ring, work, in_flight),
            2 => busy(amd_v2(), ring, work, in_flight),
            _ => busy(amd_legacy(), ring, work, in_flight),
        };
        add(&format!("{name}-cached"), shape, of(false, 50, 0));
        add(&format!("{name}-pending"), shape, of(false, 20, 30));
        add(&format!("{name}-ring"), shape, of(true, 130, 0));
    }
    let unused = {
        let mut m = machine(intel_v5());
        m.schedule(0, Some(VCPU));
        m.schedule(0, None);
        take_bytes(&m, VCPU).expect("switched out")
    };
    add("intel-v5-unused", 0, unused);
    seeds
}
