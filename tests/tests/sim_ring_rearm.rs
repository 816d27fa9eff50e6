//! Re-arm exactness of the sample ring (ABI 1.4) on the four test shapes (Intel v5 with
//! full-width writes, Intel v2 without, AMD PerfMonV2, AMD K7): a counter sampling with period
//! *p*, its events arriving in bursts so that each PMI finds it counted past its wrap, is
//! re-armed by the hypervisor to carry that overshoot into the next period. After any number
//! of overflows the periods add up to what it counted: one PMI per whole period, and the
//! counter reads `(counted mod p) - p`. A burst longer than a period keeps the phase. The
//! overflow never reaches the guest's virtual overflow status, and a counter with period 0
//! is left counting from its wrapped value.

use vpmu::abi::ops::Params;
use vpmu::abi::{XENPMU_MODE_SELF, XENPMU_OP_RING_INIT};
use vpmu::{PmiOutcome, PmuBackend, VcpuId};
use vpmu_sim::helpers::sampling;
use vpmu_sim::ring::{Record, RingGuest, config};
use vpmu_sim::workload::function_base;
use vpmu_sim::{Instruction, Machine, SimVendor, guest_frame};
use vpmu_tests::for_each_vendor;

const SUBJECT: VcpuId = VcpuId { domain: 1, vcpu: 0 };
const FIXED0: u32 = 32;

/// A machine whose subject samples `ctr` with `period` through a ring that re-arms it with
/// `ring_period` (0: not re-armed).
fn machine<V: SimVendor>(
    vendor: V,
    ctr: u32,
    period: u64,
    ring_period: u64,
) -> (Machine<V>, RingGuest) {
    let mut m = Machine::new(vendor, 1, &[1, 1], XENPMU_MODE_SELF);
    m.schedule(0, Some(SUBJECT));
    m.register_page(SUBJECT);
    let gfn = guest_frame(1, 0x100);
    let fixed = ctr >= FIXED0;
    let index = (ctr % FIXED0) as usize;
    let ring = RingGuest::prepare(
        &mut m.platform,
        1,
        gfn,
        &config(4, 0, 0, &[(fixed, index, ring_period)]),
    );
    let init = m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0));
    assert!(init.is_ok(), "ring_init: {init:?}");
    m.program(SUBJECT, &[sampling(ctr, period)]);
    (m, ring)
}

/// The width of counter `ctr` on `vendor`.
fn width<V: SimVendor>(vendor: &V, ctr: u32) -> u8 {
    let caps = *vendor.backend().capabilities();
    if ctr >= FIXED0 {
        caps.fixed_width
    } else {
        caps.gp_width
    }
}

fn kernel_insn(k: u64) -> Instruction {
    Instruction {
        rip: function_base(1, 0) + 4 * (k % 0x4000),
        cpl: 0,
        branch: false,
    }
}

/// Bursts whose sizes a small generator picks below `limit`; returns (events, PMIs, records
/// read).
fn drive<V: SimVendor>(
    m: &mut Machine<V>,
    ring: &mut RingGuest,
    bursts: u32,
    limit: u64,
) -> (u64, u64, u64) {
    let (mut counted, mut pmis, mut records) = (0u64, 0u64, 0u64);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..bursts {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let burst = 1 + (state >> 11) % limit.max(1);
        counted += burst;
        if let Some(record) = m.retire_burst(0, &kernel_insn(u64::from(k)), burst) {
            assert!(
                matches!(record.outcome, Some(PmiOutcome::Delivered { to, .. }) if to == SUBJECT),
                "{record:?}"
            );
            pmis += 1;
        }
        for record in ring.consume(&mut m.platform).expect("a well-formed ring") {
            if let Record::Sample(..) = record {
                records += 1;
            }
        }
    }
    (counted, pmis, records)
}

/// The counter as its owner reads it.
fn counter<V: SimVendor>(m: &mut Machine<V>, ctr: u32) -> u64 {
    let msr = m.vendor.driver().read_counter(ctr);
    m.read(SUBJECT, msr)
}

fn periods_add_up<V: SimVendor>(vendor: V) {
    let driver = vendor.driver();
    let mut counters = vec![
        0,
        driver
            .counters()
            .iter()
            .copied()
            .filter(|&c| c < FIXED0)
            .max()
            .unwrap(),
    ];
    if driver.counters().contains(&FIXED0) {
        counters.push(FIXED0);
    }
    let full_width = vendor.backend().capabilities().full_width_writes;
    let amd = !driver.is_intel();
    for ctr in counters {
        let w = width(&vendor, ctr);
        let mask = if w >= 64 { u64::MAX } else { (1 << w) - 1 };
        // Periods near the top of each counter's rule: 2^31 - 1 through the legacy alias,
        // beyond it with full-width writes, fixed counters and AMD's 48-bit ones.
        let big = if ctr < FIXED0 && !full_width && !amd {
            (1 << 31) - 1
        } else {
            (1 << 40) + 7
        };
        for period in [97u64, 1_000_003, big] {
            let name = format!("{} ctr {ctr} period {period}", vendor.name());
            let (mut m, mut ring) = machine(vendor.clone(), ctr, period, period);
            let (counted, pmis, records) = drive(&mut m, &mut ring, 300, period);
            assert!(pmis > 3, "{name}: {pmis} overflows");
            assert_eq!(pmis, counted / period, "{name}: one PMI per whole period");
            assert_eq!(records, pmis, "{name}: one record per PMI");
            assert_eq!(
                counter(&mut m, ctr),
                (counted % period).wrapping_sub(period) & mask,
                "{name}: the periods add up to what the counter counted ({counted})"
            );
            // Nothing left in the guest's overflow status.
            if let Some(status) = driver.status_msr() {
                assert_eq!(m.read(SUBJECT, status) & (1 << ctr), 0, "{name}: status");
            }
            m.assert_conservation();
        }
    }
}

#[test]
fn re_armed_periods_add_up_to_what_was_counted() {
    for_each_vendor!(periods_add_up);
}

fn long_skid_keeps_the_phase<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let period = 1000;
    let (mut m, mut ring) = machine(vendor, 0, period, period);
    // A burst of 2.5 periods: one PMI, two whole periods skipped, the phase kept.
    let burst = 2 * period + period / 2;
    let record = m.retire_burst(0, &kernel_insn(0), burst).expect("a PMI");
    assert!(
        matches!(record.outcome, Some(PmiOutcome::Delivered { .. })),
        "{name}"
    );
    assert_eq!(
        counter(&mut m, 0),
        (burst % period).wrapping_sub(period) & ((1 << 48) - 1),
        "{name}"
    );
    // And the next period is whole again.
    let (counted, pmis, _) = drive(&mut m, &mut ring, 100, period);
    assert_eq!(pmis, (burst % period + counted) / period, "{name}");
}

#[test]
fn a_skid_longer_than_the_period_keeps_the_phase() {
    for_each_vendor!(long_skid_keeps_the_phase);
}

fn period_zero_is_not_re_armed<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let period = 500;
    let (mut m, mut ring) = machine(vendor, 0, period, 0);
    let record = m
        .retire_burst(0, &kernel_insn(0), period + 3)
        .expect("a PMI");
    assert!(
        matches!(record.outcome, Some(PmiOutcome::Delivered { .. })),
        "{name}"
    );
    // The counter keeps counting from its wrapped value, as on bare metal: no PMI for a long
    // while.
    assert_eq!(counter(&mut m, 0), 3, "{name}");
    let (_, pmis, _) = drive(&mut m, &mut ring, 50, period);
    assert_eq!(pmis, 0, "{name}");
    assert_eq!(ring.producer(&m.platform).records, 1, "{name}");
}

#[test]
fn a_counter_with_period_zero_keeps_counting_from_its_wrap() {
    for_each_vendor!(period_zero_is_not_re_armed);
}

/// The hardware accesses of one ring PMI that re-arms `counters` of `counters` sampling
/// counters (docs/core.md quotes them): no save, no load, no LVTPC mask; the overflow status
/// read and acknowledged (PerfMonV2 and Intel) or each armed counter read (K7), then one read
/// and one write per re-armed counter.
fn accesses_per_ring_pmi<V: SimVendor>(vendor: V) {
    let name = vendor.name();
    let driver = vendor.driver();
    for sampling_counters in [1u32, 3] {
        let mut m = Machine::new(vendor.clone(), 1, &[1, 1], XENPMU_MODE_SELF);
        m.schedule(0, Some(SUBJECT));
        m.register_page(SUBJECT);
        let gfn = guest_frame(1, 0x100);
        let periods: Vec<(bool, usize, u64)> = (0..sampling_counters as usize)
            .map(|c| (false, c, 100))
            .collect();
        let mut ring = RingGuest::prepare(&mut m.platform, 1, gfn, &config(4, 0, 0, &periods));
        assert!(
            m.op(SUBJECT, XENPMU_OP_RING_INIT, &Params::new(gfn, 0))
                .is_ok()
        );
        let setups: Vec<_> = (0..sampling_counters).map(|c| sampling(c, 100)).collect();
        m.program(SUBJECT, &setups);
        m.run(0, 99);
        let before = m.hw_stats()[0];
        // All of them overflow at the same instruction.
        let pmi = m.run(0, 1).pop().expect("a PMI");
        assert!(
            matches!(pmi.outcome, Some(PmiOutcome::Delivered { .. })),
            "{name}"
        );
        let after = m.hw_stats()[0];
        let (reads, writes) = (after.reads - before.reads, after.writes - before.writes);
        let detect = if driver.has_global() {
            (1, 1)
        } else {
            (sampling_counters, 0)
        };
        assert_eq!(
            (reads, writes),
            (
                u64::from(detect.0 + sampling_counters),
                u64::from(detect.1 + sampling_counters)
            ),
            "{name}: {sampling_counters} re-armed"
        );
        println!("{name}: {sampling_counters} counters re-armed: {reads} reads, {writes} writes");
        ring.consume(&mut m.platform).expect("well formed");
    }
}

#[test]
fn a_ring_pmi_costs_the_status_and_a_read_and_write_per_re_armed_counter() {
    for_each_vendor!(accesses_per_ring_pmi);
}
